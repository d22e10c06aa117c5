"""`metaq bench group|rebalance|cluster-refresh|replication|read-from`: consumer groups, clusters and replicas."""

from __future__ import annotations

from typing import Any

import click

from metaq.cli.bench_common import comma_list, json_option, run_and_print, work_dir_option


@click.command("group")
@click.option("-s", "--servers", default=None, help="Brokers to measure; default: an embedded broker for each run.")
@click.option("--members", type=click.IntRange(1, 32), multiple=True, default=(1, 2, 4), show_default=True,
              help="Group sizes to measure (repeat the option).")
@click.option("-n", "--count", type=click.IntRange(1), default=1_200_000, show_default=True,
              help="Messages produced first, then consumed by the group.")
@click.option("--size", type=click.IntRange(1), default=100, show_default=True, help="Message payload bytes.")
@click.option("--partitions", type=click.IntRange(1), default=12, show_default=True)
@click.option("--listener", type=click.Choice(["async", "sync"]), default="async", show_default=True,
              help="async: a coroutine listener; sync: a function, run in the consumer's thread pool.")
@click.option("-d", "--duration", "duration_s", type=click.FloatRange(1), default=120.0, show_default=True,
              help="Upper bound of each run, seconds.")
@click.option("--fetch", type=click.Choice(["multi", "single", "both"]), default="multi", show_default=True,
              help="multi: MultiFetch over one connection per broker; single: one Fetch per partition (a connection "
                   "per long-polling partition); both: single, then multi, same run.")
@json_option
def bench_group_consume(as_json: bool, **kwargs: Any) -> None:
    """Group consumption msg/s with 1, 2 and 4 members (each a process) sharing a topic, once the group is
    stable."""
    from metaq.bench import group

    run_and_print(as_json, lambda report: group.run(report=report, **kwargs), group.table)


@click.command("rebalance")
@click.option("--brokers", type=click.IntRange(2, 16), default=3, show_default=True,
              help="Brokers of the local cluster started for the run (a real ZooKeeper, ZooKeeper mode).")
@click.option("--partitions", type=click.IntRange(1), default=4, show_default=True,
              help="Partitions of the topic on each broker.")
@click.option("--members", type=click.IntRange(1, 32), default=3, show_default=True,
              help="Members of the group (one more joins and one leaves in every round).")
@click.option("--rounds", type=click.IntRange(1, 100), default=5, show_default=True)
@click.option("--no-brokers-churn", is_flag=True, help="Only members join and leave (no broker stop/start).")
@work_dir_option
@json_option
def bench_rebalance(brokers: int, partitions: int, members: int, rounds: int, no_brokers_churn: bool,
                    work_dir: str | None, as_json: bool) -> None:
    """Rebalance time: from a member joining or leaving, or a broker leaving or joining, to the group's new
    assignment fully claimed and fetching; ZooKeeper's group beside the broker-coordinated one, same cluster."""
    from metaq.bench import rebalance

    run_and_print(as_json, lambda report: rebalance.run(brokers, partitions, members, rounds, not no_brokers_churn,
                                                        report, work_dir), rebalance.table)


@click.command("cluster-refresh")
@click.option("--brokers", type=click.IntRange(2, 16), default=3, show_default=True,
              help="Brokers of the local cluster started for the run (the last one leaves and joins).")
@click.option("--rounds", type=click.IntRange(1, 100), default=5, show_default=True, help="Leave/join rounds.")
@click.option("--partitions", type=click.IntRange(1), default=2, show_default=True,
              help="Partitions of the topic on each broker.")
@json_option
def bench_cluster_refresh(brokers: int, rounds: int, partitions: int, as_json: bool) -> None:
    """How fast a cluster-mode producer follows a broker leaving (SIGTERM) and joining: ms from the event in
    ZooKeeper until a plain watcher sees it, the producer's metadata has it, and (join) the producer's first
    message acknowledged by the broker."""
    from metaq.bench.cluster_refresh import run_cluster_refresh, table

    run_and_print(as_json, lambda report: run_cluster_refresh(brokers, rounds, partitions, report), table)


@click.command("replication")
@click.option("-n", "--count", type=click.IntRange(1), default=2_000_000, show_default=True,
              help="Messages each case produces (the case also stops at --duration).")
@click.option("-d", "--duration", "duration_s", type=click.FloatRange(0.1), default=60.0, show_default=True,
              help="Upper bound of each case's produce, seconds.")
@click.option("--partitions", type=click.IntRange(1), default=4, show_default=True)
@click.option("--series", type=click.IntRange(1), default=3, show_default=True, help="Times every case runs.")
@click.option("--cases", "modes", default="none,async,sync", show_default=True,
              callback=comma_list(("none", "async", "sync")),
              help="Which cases, in this order: none (no slave: the baseline), async (one async slave), sync (one "
                   "sync slave, HA mode).")
@work_dir_option
@json_option
def bench_replication(as_json: bool, **kwargs: Any) -> None:
    """Produce throughput and ack latency with no slave, an async slave and a sync slave (a local cluster each),
    and the slave's lag under that load."""
    from metaq.bench import replication

    run_and_print(as_json, lambda report: replication.run(report=report, **kwargs), replication.table)


@click.command("read-from")
@click.option("-n", "--count", type=click.IntRange(1), default=1_000_000, show_default=True,
              help="Messages preloaded (and fully replicated) before the reads.")
@click.option("--partitions", type=click.IntRange(1), default=4, show_default=True)
@click.option("--series", type=click.IntRange(1), default=3, show_default=True,
              help="Reads of the master and of the slave, in turn.")
@work_dir_option
@json_option
def bench_read_from(as_json: bool, **kwargs: Any) -> None:
    """Consumers reading the master or its async slave (read_from), same run, and how long a prefer-slave
    consumer's deliveries stop when its slave is killed -9."""
    from metaq.bench import read_from

    run_and_print(as_json, lambda report: read_from.run(report=report, **kwargs), read_from.table)


COMMANDS = [bench_group_consume, bench_rebalance, bench_cluster_refresh, bench_replication, bench_read_from]
