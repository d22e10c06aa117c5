"""`metaq bench`: the project's own benchmark (figures go into docs/benchmarks.md)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from typing import Any

import click

from metaq.cli.options import credentials_from_env, tls_config, tls_options
from metaq.cli.text import plural


def _common(fn: Any) -> Any:
    options = [
        click.option("-s", "--servers", default=None,
                     help="Brokers to measure; default: start an embedded broker for the run."),
        click.option("--brokers", type=click.IntRange(1, 16), default=None,
                     help="Start a local cluster for the run instead: a real ZooKeeper and this many brokers in "
                          "ZooKeeper mode (--partitions on each)."),
        click.option("--zk", default=None, metavar="HOST:PORT",
                     help="Measure the running cluster registered in this ZooKeeper (every broker of it)."),
        click.option("--zk-root", default="/meta", show_default=True, help="The cluster's ZooKeeper root (--zk)."),
        click.option("--size", type=click.IntRange(8), default=100, show_default=True, help="Message payload bytes."),
        click.option("-n", "--count", type=click.IntRange(1), default=1_000_000, show_default=True,
                     help="Messages to send/read (the run also stops at --duration)."),
        click.option("-d", "--duration", "duration_s", type=click.FloatRange(0.1), default=60.0, show_default=True,
                     help="Upper bound of the measured phase, seconds."),
        click.option("--partitions", type=click.IntRange(1), default=4, show_default=True,
                     help="Partitions of the topic on each broker."),
        click.option("--flush", default="group", show_default=True,
                     help="Embedded broker's unflushThreshold: group (0: group commit), sync (1: fsync per "
                          "batch) or a number N."),
        click.option("--processes", type=click.IntRange(1, 64), default=1, show_default=True,
                     help="Client processes."),
        click.option("--linger-ms", type=click.FloatRange(0), default=5.0, show_default=True),
        click.option("--batch-bytes", type=click.IntRange(1024), default=256 * 1024, show_default=True,
                     help="Producer batch size (one frame per partition batch)."),
        click.option("--compression", type=click.Choice(["none", "lz4", "zstd"]), default="none", show_default=True),
        click.option("--event-loop", type=click.Choice(["uvloop", "asyncio"]), default="uvloop", show_default=True),
        click.option("--json", "as_json", is_flag=True, help="Print the result as JSON."),
        click.option("--no-progress", is_flag=True, help="No progress bar."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return tls_options(fn)


def _run(mode: str, as_json: bool, no_progress: bool, brokers: int | None, **kwargs: Any) -> None:
    from metaq.bench.client_bench import BenchSpec, run_bench

    if sum(x is not None for x in (kwargs["servers"], brokers, kwargs["zk"])) > 1:
        raise click.UsageError("give at most one of --servers, --brokers and --zk")
    tls = tls_config(kwargs.pop("tls"), kwargs.pop("ca_file"), kwargs.pop("cert_file"), kwargs.pop("key_file"))
    tls.update(credentials_from_env())
    if tls.get("tls") and kwargs["servers"] is None and kwargs["zk"] is None:
        raise click.UsageError("--tls measures running TLS brokers: give --servers HOST:SSLPORT (or --zk)")
    spec = BenchSpec(mode=mode, brokers=brokers or 0, tls=tls, **kwargs)
    try:
        result = run_bench(spec, progress=not (as_json or no_progress))
    except ValueError as exc:  # --zk: no broker registered
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(asdict(result)))
        return
    lat = result.latency_ms
    api = result.api + (" idempotent" if spec.idempotent else "")
    click.echo(f"{mode} api={api} size={spec.size}B brokers={len(result.broker.split(','))} "
               f"partitions={spec.partitions} per broker flush={spec.flush} processes={spec.processes}"
               + (" cpus: broker {} producer {} consumer {}".format(*("any" if c is None else c for c in spec.cpus))
                  if spec.cpus else ""))
    click.echo(f"  {result.messages} messages in {result.seconds:.2f}s: {result.msgs_per_s:,.0f} msg/s, "
               f"{result.mb_per_s:.1f} MB/s" + (f", {result.failures} failed" if result.failures else ""))
    if result.client_msgs_per_cpu_s:
        click.echo(f"  client CPU: {result.client_msgs_per_cpu_s:,.0f} msg per CPU second of the client processes")
    if lat:
        what = "append-to-delivery" if mode == "e2e" else "commit" if result.api == "transaction" else "ack"
        click.echo(f"  {what} latency ms: p50 {lat['p50']}  p99 {lat['p99']}  p999 {lat['p999']}  max {lat['max']}")
    by_place = result.latency_by_place_ms
    first = by_place.get("1", {}).get("count", 0)
    places = [(place, row) for place, row in by_place.items()
              if row["count"] * 10 >= first]  # places most bursts reach (a late tick sends more than its share)
    if len(places) > 1:
        click.echo("  by place in its 1 ms burst, p50 ms: "
                   + "  ".join(f"#{place} {row['p50']}" for place, row in places[:8]))
    if result.cpu_us_per_msg:
        click.echo("  CPU us per message: " + ", ".join(f"{k} {v}" for k, v in result.cpu_us_per_msg.items()))
    sync = result.fdatasync_ms
    if sync:
        click.echo(f"  the disk's fdatasync ms (same run, the broker's data directory): p50 {sync['p50']}  "
                   f"p99 {sync['p99']}  max {sync['max']}")
    rtt = result.loopback_rtt_ms
    if rtt:
        click.echo(f"  the machine's loopback round trip ms (same run, two processes, {spec.size} B): "
                   f"p50 {rtt['p50']}  p99 {rtt['p99']}  max {rtt['max']}")


@click.group("bench")
def bench_group() -> None:
    """Measure throughput and latency against a real broker (embedded unless --servers)."""


_selector_option = click.option(
    "--selector", type=click.Choice(["roundrobin", "sticky"]), default="roundrobin", show_default=True,
    help="Partition selector: roundrobin (RoundRobinSelector, per message) or sticky (StickyRoundRobinSelector, "
         "per batch).")
_multi_produce_option = click.option(
    "--multi-produce/--no-multi-produce", default=True, show_default=True,
    help="The producer sends the batches of several partitions that leave together as one MultiProduce request "
         "(multi_produce); --no-multi-produce: one Produce per batch, as before.")


@bench_group.command("produce")
@_common
@click.option("--api", type=click.Choice(["batch", "async", "async-yield", "many", "sync", "oneway", "transaction"]),
              default="batch", show_default=True,
              help="batch: send_batch; async: send_async per message; async-yield: send_async, the event loop run "
              "between two sends (as from request handlers, one message each); many: send_async_many, "
              "--batch messages per call; sync: send and wait; oneway: no acks; transaction: local transactions of "
              "--batch messages, committed one after another.")
@click.option("--batch", type=click.IntRange(1), default=1000, show_default=True,
              help="Messages per send_batch call (--api batch), per send_async_many call (--api many), or per "
              "transaction (--api transaction).")
@click.option("--concurrency", type=click.IntRange(1, 256), default=8, show_default=True,
              help="send_batch calls in flight per process.")
@click.option("--idempotent", is_flag=True, help="An idempotent producer (enable_idempotence: batches stamped, "
              "retried duplicates dropped by the broker).")
@_selector_option
@_multi_produce_option
def bench_produce(**kwargs: Any) -> None:
    """Producer throughput and ack latency."""
    _run("produce", **kwargs)


@bench_group.command("consume")
@_common
@click.option("--batch", type=click.IntRange(1), default=1000, show_default=True, help="Preload batch size.")
@click.option("--api", type=click.Choice(["fetch", "iterate", "columns"]), default="fetch", show_default=True,
              help="fetch: Fetcher.fetch, a list of Messages per 1 MiB fetch; iterate: PullConsumer.iterate, one "
              "Message at a time; columns: PullConsumer.iterate_columns, one MessageBatch (columns, payloads as "
              "memoryviews) per stored batch.")
@click.option("--tune-allocator", is_flag=True,
              help="The consumer process fixes glibc's heap trim and mmap thresholds first (metaq.tune_allocator(); "
              "Linux with glibc only): with ~1 MB messages glibc otherwise gives the freed reply buffers back to the "
              "kernel and faults them in again for each message (docs/client.md, \"Large messages\").")
def bench_consume(**kwargs: Any) -> None:
    """Consumer throughput: preload --count messages, then read them all back."""
    _run("consume", **kwargs)


@bench_group.command("e2e")
@_common
@click.option("--rate", type=click.IntRange(1), default=20_000, show_default=True,
              help="Messages per second the producer offers.")
@click.option("--pacing", type=click.Choice(["tick", "even"]), default="tick", show_default=True,
              help="tick: every millisecond, the messages due since the last tick, sent together (bursts of "
                   "rate/1000); even: each message at its own time, start + i/rate (a pacing thread), so that a "
                   "message usually leaves alone.")
@click.option("--consumer", type=click.Choice(["partition", "multi"]), default="partition", show_default=True,
              help="partition: one iterate_batches per partition (a connection and a long poll each); multi: one "
                   "PullConsumer.get_many loop over every partition (one MultiFetch long poll, one connection).")
@_selector_option
@_multi_produce_option
@click.option("--gc-freeze/--no-gc-freeze", default=True, show_default=True,
              help="The producer and consumer processes freeze what is alive once connected (gc.freeze(), as the "
                   "broker does after start-up), so that a full garbage collection does not stop them for 10-30 ms.")
@click.option("--cpus", callback=lambda _ctx, _param, value: _parse_cpus(value), default=None, metavar="B,P,C",
              help="Run the embedded broker, the producer and the consumer each on one CPU, '-' for where the "
                   "scheduler puts it (e.g. 0,-,0: the broker and the consumer on CPU 0, the producer anywhere); "
                   "default: all where the kernel's scheduler puts them (Linux).")
def bench_e2e(**kwargs: Any) -> None:
    """End-to-end latency (producer append to consumer delivery) at a fixed offered rate."""
    if kwargs.get("cpus") is not None and (kwargs.get("servers") or kwargs.get("brokers") or kwargs.get("zk")):
        raise click.UsageError("--cpus pins the embedded broker: give it without --servers, --brokers or --zk")
    _run("e2e", **kwargs)


def _parse_cpus(value: str | None) -> tuple[int | None, int | None, int | None] | None:
    if value is None:
        return None
    parts = value.split(",")
    try:
        cpus = [None if part.strip() == "-" else int(part) for part in parts]
    except ValueError:
        cpus = []
    if len(cpus) != 3:
        raise click.BadParameter(f"expected three CPU numbers (or '-') B,P,C; got {value!r}")
    usable = os.sched_getaffinity(0)
    unknown = sorted({cpu for cpu in cpus if cpu is not None} - usable)
    if unknown:
        raise click.BadParameter(f"CPU {unknown[0]} is not one this process may use ({sorted(usable)})")
    return cpus[0], cpus[1], cpus[2]


@bench_group.command("group")
@click.option("-s", "--servers", default=None, help="Brokers to measure; default: an embedded broker for the run.")
@click.option("--members", type=click.IntRange(1, 32), multiple=True, default=(1, 2, 4), show_default=True,
              help="Group sizes to measure (repeat the option).")
@click.option("-n", "--count", type=click.IntRange(1), default=1_200_000, show_default=True)
@click.option("--size", type=click.IntRange(1), default=100, show_default=True)
@click.option("--partitions", type=click.IntRange(1), default=12, show_default=True)
@click.option("--listener", type=click.Choice(["async", "sync"]), default="async", show_default=True)
@click.option("-d", "--duration", "duration_s", type=click.FloatRange(1), default=120.0, show_default=True)
@click.option("--fetch", type=click.Choice(["multi", "single", "both"]), default="multi", show_default=True,
              help="multi: MultiFetch over one connection per broker; single: one Fetch per partition (a connection "
                   "per long-polling partition, the old way); both: single then multi, same run.")
@click.option("--json", "as_json", is_flag=True)
def bench_group_consume(servers: str | None, members: tuple[int, ...], count: int, size: int, partitions: int,
                        listener: str, duration_s: float, fetch: str, as_json: bool) -> None:
    """Group consumption msg/s with 1, 2 and 4 members (each a process) sharing a topic."""
    import tempfile

    from metaq.broker.launcher import BrokerLauncher
    from metaq.client.group.bench import fetch_modes, run_group_bench

    results = []
    for n, multi in ((n, multi) for n in members for multi in fetch_modes(fetch)):
        with tempfile.TemporaryDirectory(prefix="metaq-bench-") as tmp:
            broker = None if servers else BrokerLauncher(f"{tmp}/data", {"numPartitions": partitions,
                                                                         "unflushThreshold": 0}).start()
            try:
                target = servers or (broker.servers if broker else "")
                results.append(run_group_bench(target, None, n, duration_s, messages=count, message_bytes=size,
                                               partitions=partitions, listener=listener, multi_fetch=multi))
            finally:
                if broker is not None:
                    broker.stop()
    if as_json:
        click.echo(json.dumps(results))
        return
    for r in results:
        click.echo(json.dumps(r))


@bench_group.command("cluster-refresh")
@click.option("--brokers", type=click.IntRange(2, 16), default=3, show_default=True,
              help="Brokers of the local cluster started for the run (the last one leaves and joins).")
@click.option("--rounds", type=click.IntRange(1, 100), default=5, show_default=True, help="Leave/join rounds.")
@click.option("--partitions", type=click.IntRange(1), default=2, show_default=True,
              help="Partitions of the topic on each broker.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def bench_cluster_refresh(brokers: int, rounds: int, partitions: int, as_json: bool) -> None:
    """How fast a cluster-mode producer follows a broker leaving (SIGTERM) and joining: ms from the
    event in ZooKeeper until a plain watcher sees it, the producer's metadata has it, and (join) the
    producer's first message acknowledged by the broker."""
    from metaq.bench.cluster_refresh import run_cluster_refresh

    if not as_json:
        click.echo(f"cluster-refresh: {brokers} brokers (ZooKeeper mode, {partitions} partitions each), broker "
                   f"{brokers} leaves and joins {plural(rounds, 'time')} under round-robin sends")
    result = run_cluster_refresh(brokers, rounds, partitions, report=(lambda line: None) if as_json else click.echo)
    if as_json:
        click.echo(json.dumps(result))
        return
    s = {k: f"{v['median']} ({v['max']})" for k, v in result["summary"].items()}
    click.echo("median (max) ms:")
    click.echo(f"  leave: SIGTERM -> watcher sees it gone {s['leave_watch_ms']}, -> producer's metadata without it "
               f"{s['leave_metadata_ms']}; failed sends {result['summary']['leave_failures']['max']} at most")
    click.echo(f"  join:  registered -> watcher sees it {s['join_watch_ms']}, -> producer's metadata lists it "
               f"{s['join_metadata_ms']}, -> first message acknowledged by it {s['join_used_ms']}")


@bench_group.command("failover")
@click.option("--faults", default="master-kill,master-stop,slave-kill,zookeeper-kill,promote", show_default=True,
              help="Fault kinds, comma-separated: master-kill, master-stop, slave-kill, zookeeper-kill, promote.")
@click.option("--rounds", type=click.IntRange(1, 100), default=5, show_default=True, help="Rounds of each fault.")
@click.option("--session-ms", type=click.IntRange(1000, 600_000), default=30_000, show_default=True,
              help="The brokers' zk.zkSessionTimeoutMs (MetaQ's default: a failover must not wait for it).")
@click.option("--zk-down", "zk_down_s", type=click.FloatRange(0.5, 60), default=8.0, show_default=True,
              help="Seconds ZooKeeper stays dead in a zookeeper-kill round (its restart comes on top).")
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=None,
              help="Run the cluster in this directory and keep it (the brokers' logs); default: a temporary one.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def bench_failover(faults: str, rounds: int, session_ms: int, zk_down_s: float, directory: str | None,
                   as_json: bool) -> None:
    """HA faults under load: a replica group (a master, two slaves, syncReplication and autoFailover, every other
    setting at its default) on a local cluster with a real ZooKeeper, a cluster-mode producer sending
    throughout; per fault kind the unavailability window (the longest stretch without an acknowledgement)
    p50 / max, the takeover time and the failed sends; every acknowledged message is read back and checked
    at the end (docs/replication.md, docs/benchmarks.md)."""
    from metaq.bench.failover import FAULTS, run_failover_bench

    kinds = [f.strip() for f in faults.split(",") if f.strip()]
    unknown = sorted(set(kinds) - set(FAULTS))
    if unknown:
        raise click.BadParameter(f"unknown fault kind(s) {', '.join(unknown)}; known: {', '.join(FAULTS)}",
                                 param_hint="--faults")
    if not as_json:
        click.echo(f"failover: broker 1 with 2 slaves (syncReplication, autoFailover), zk.zkSessionTimeoutMs "
                   f"{session_ms}, {plural(rounds, 'round')} of {', '.join(kinds)}")
    result = run_failover_bench(kinds, rounds, session_timeout_ms=session_ms, zk_down_s=zk_down_s,
                                directory=directory, progress=(lambda line: None) if as_json else click.echo)
    if as_json:
        click.echo(json.dumps(result))
    else:
        click.echo(f"{'fault':<16}{'window p50':>12}{'window max':>12}{'takeover p50':>14}{'takeover max':>14}"
                   f"{'failed sends':>14}")
        for kind, r in result["faults"].items():
            takeover = ("-", "-") if r["takeover_p50_s"] is None else (f"{r['takeover_p50_s']:.3f}s",
                                                                        f"{r['takeover_max_s']:.3f}s")
            click.echo(f"{kind:<16}{r['window_p50_s']:>11.3f}s{r['window_max_s']:>11.3f}s{takeover[0]:>14}"
                       f"{takeover[1]:>14}{r['failed_sends']:>14}")
        h = result["history"]
        click.echo(f"history: {h['acked']} acked, {h['failed']} failed, {h['read_back']} read back, "
                   f"{len(h['problems'])} problem(s)")
        for problem in h["problems"]:
            click.echo(f"  {problem}")
    if result["history"]["problems"]:
        raise SystemExit(1)


@bench_group.command("rebalance")
@click.option("--brokers", type=click.IntRange(2, 16), default=3, show_default=True,
              help="Brokers of the local cluster started for the run (a real ZooKeeper, ZooKeeper mode).")
@click.option("--partitions", type=click.IntRange(1), default=4, show_default=True,
              help="Partitions of the topic on each broker.")
@click.option("--members", type=click.IntRange(1, 32), default=3, show_default=True,
              help="Members of the group (one more joins and one leaves in every round).")
@click.option("--rounds", type=click.IntRange(1, 100), default=5, show_default=True)
@click.option("--no-brokers-churn", is_flag=True, help="Only members join and leave (no broker stop/start).")
@click.option("--json", "as_json", is_flag=True)
def bench_rebalance(brokers: int, partitions: int, members: int, rounds: int, no_brokers_churn: bool,
                    as_json: bool) -> None:
    """Rebalance time: from a member joining or leaving, or a broker leaving or joining, to the group's new
    assignment fully claimed and fetching. Measured with ZooKeeper's group (cluster mode) and, as the
    baseline, the broker-coordinated group, on the same local cluster."""
    import asyncio
    import tempfile

    from metaq.client.group.rebalance_bench import run_rebalance_bench
    from metaq.devcluster import DevCluster

    topic = "rebalance"
    results = []
    with tempfile.TemporaryDirectory(prefix="metaq-bench-") as tmp, \
            DevCluster(f"{tmp}/cluster", brokers, partitions=partitions,
                       topics=f"[topic={topic}]\nnumPartitions={partitions}\n") as cluster:
        last = cluster.brokers[brokers]
        churn: dict[str, Any] = {} if no_brokers_churn else {
            "broker_leave": lambda: last.stop_or_kill(30), "broker_join": last.start, "broker_id": brokers}
        for coordination, connect in (("zookeeper", {"zk_connect": cluster.zk_connect, "zk_root": cluster.zk_root}),
                                      ("broker", {"servers": cluster.servers})):
            result = asyncio.run(run_rebalance_bench(connect, topic, members=members, rounds=rounds, **churn))
            results.append({"coordination": coordination, "brokers": brokers, **result})
            if not as_json:
                click.echo(json.dumps(results[-1]))
    if as_json:
        click.echo(json.dumps(results))


@bench_group.command("logging")
@click.option("-s", "--servers", default=None, help="Broker to log to; default: an embedded broker for the run.")
@click.option("-n", "--count", type=click.IntRange(1), default=100_000, show_default=True,
              help="Records logged in each case.")
@click.option("--json", "as_json", is_flag=True)
def bench_logging(servers: str | None, count: int, as_json: bool) -> None:
    """metaq.logging.MetaqHandler: what a logging call costs the application, broker up and broker down."""
    import tempfile

    from metaq.broker.launcher import BrokerLauncher

    with tempfile.TemporaryDirectory(prefix="metaq-bench-") as tmp:
        broker = None if servers else BrokerLauncher(f"{tmp}/data", {"numPartitions": 4,
                                                                     "unflushThreshold": 0}).start()
        try:
            up = _log_records(servers or (broker.servers if broker else ""), count, wait_for_acks=True)
        finally:
            if broker is not None:
                broker.stop()
    down = _log_records(f"127.0.0.1:{_refused_port()}", count, wait_for_acks=False)
    result = {"records": count, "broker_up": up, "broker_down": down}
    if as_json:
        click.echo(json.dumps(result))
        return
    click.echo(f"MetaqHandler, {plural(count, 'record', thousands=True)} logged from one thread "
               "(JSON, two extra fields)")
    click.echo(f"  broker up:   emit {up['emit_us']:.1f} us/record ({up['records_per_s']:,.0f} records/s); "
               f"all acknowledged {up['acked_s']:.2f}s after the first call")
    click.echo(f"  broker down: emit {down['emit_us']:.1f} us/record ({down['records_per_s']:,.0f} records/s); "
               f"{down['pending']:,} pending, {down['dropped']} dropped")


def _refused_port() -> int:
    """A loopback port nothing listens on: connecting is refused at once."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _log_records(servers: str, count: int, *, wait_for_acks: bool) -> dict[str, Any]:
    import logging
    import time

    from metaq.logging import MetaqHandler

    handler = MetaqHandler(servers, "bench-logging", max_buffered_records=count, error_interval_s=3600)
    quiet, logging.raiseExceptions = logging.raiseExceptions, False  # no reports of the broker being down
    log = logging.getLogger(f"metaq-bench-logging-{time.monotonic_ns()}")
    log.propagate = False
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    try:
        started = time.perf_counter()
        for i in range(count):
            log.info("request %d served", i, extra={"seq": i, "path": f"/api/orders/{i % 7}"})
        emitted = time.perf_counter() - started
        acked: float | None = None
        if wait_for_acks:
            if not handler.drain(600):
                raise click.ClickException(f"the broker at {servers} did not acknowledge the records in 600 s")
            acked = time.perf_counter() - started
        stats = handler.stats()
    finally:
        log.removeHandler(handler)
        handler.close(timeout=0 if not wait_for_acks else None)
        logging.raiseExceptions = quiet
    return {"emit_us": round(emitted / count * 1e6, 2), "records_per_s": round(count / emitted),
            "acked_s": None if acked is None else round(acked, 3), "pending": stats.pending, "dropped": stats.dropped}


@bench_group.command("storage")
@click.option("--json", "as_json", is_flag=True)
@click.option("--seconds", type=click.FloatRange(0.1), default=2.0, show_default=True)
def bench_storage(as_json: bool, seconds: float) -> None:
    """In-process storage engine: appends/s under each flush mode, reads, beside the disk's own figures."""
    import importlib

    storage = importlib.import_module("metaq.bench.storage")
    args = ["--seconds", str(seconds)] + (["--json"] if as_json else [])
    storage.main(args)


def register(cli: click.Group) -> None:
    cli.add_command(bench_group)


@bench_group.command("http")
@click.option("--url", default=None, help="The HTTP API to measure (http://host:port); default: an embedded broker "
                                          "with httpPort 0 for the run.")
@click.option("--api", type=click.Choice(["single", "batch", "raw"]), default="single", show_default=True,
              help="single: one JSON message per request; batch: --batch messages per JSON request; raw: one "
                   "application/octet-stream message per request.")
@click.option("--batch", type=click.IntRange(1), default=100, show_default=True, help="Messages per request (batch).")
@click.option("--size", type=click.IntRange(1), default=100, show_default=True, help="Message payload bytes.")
@click.option("-n", "--count", type=click.IntRange(1), default=100_000, show_default=True)
@click.option("-d", "--duration", "duration_s", type=click.FloatRange(0.1), default=30.0, show_default=True)
@click.option("--concurrency", type=click.IntRange(1, 1024), default=16, show_default=True,
              help="Requests in flight per process (keep-alive connections).")
@click.option("--processes", type=click.IntRange(1, 64), default=1, show_default=True, help="Client processes.")
@click.option("--partitions", type=click.IntRange(1), default=4, show_default=True)
@click.option("--flush", default="group", show_default=True, help="Embedded broker's unflushThreshold.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def bench_http(as_json: bool, **kwargs: Any) -> None:
    """Produce throughput over the HTTP API (docs/http.md) with keep-alive clients."""
    from metaq.bench.http_bench import HttpBenchSpec, run_http_bench

    spec = HttpBenchSpec(**kwargs)
    result = run_http_bench(spec)
    if as_json:
        click.echo(json.dumps(asdict(result)))
        return
    per = f" x{spec.batch}" if spec.api == "batch" else ""
    click.echo(f"http api={spec.api}{per} size={spec.size}B concurrency={spec.concurrency} "
               f"processes={spec.processes} partitions={spec.partitions} flush={spec.flush}")
    click.echo(f"  {result.messages} messages in {result.requests} requests, {result.seconds:.2f}s: "
               f"{result.msgs_per_s:,.0f} msg/s, {result.requests_per_s:,.0f} req/s, {result.mb_per_s:.1f} MB/s"
               + (f", {result.failures} failed" if result.failures else ""))
    lat = result.latency_ms
    if lat:
        click.echo(f"  request latency ms: p50 {lat['p50']}  p99 {lat['p99']}  max {lat['max']}")


@bench_group.command("kafka")
@click.option("-n", "--count", type=click.IntRange(1), default=1_000_000, show_default=True,
              help="Messages each step sends or reads.")
@click.option("--size", type=click.IntRange(1), default=100, show_default=True, help="Message payload bytes.")
@click.option("--partitions", type=click.IntRange(1), default=4, show_default=True)
@click.option("--rounds", type=click.IntRange(1), default=3, show_default=True,
              help="Rounds of the four steps, interleaved (native produce, kafka produce, native consume, "
                   "kafka consume).")
@click.option("--json", "as_json", is_flag=True)
def bench_kafka(count: int, size: int, partitions: int, rounds: int, as_json: bool) -> None:
    """confluent-kafka on the Kafka listener beside metaq's batch producer and per-message consumer, same run,
    one embedded broker (docs/kafka.md)."""
    from metaq.bench.kafka_bench import run_kafka_bench

    result = run_kafka_bench(count, size, partitions, rounds, progress=not as_json)
    if as_json:
        click.echo(json.dumps(asdict(result)))
        return
    load = ", ".join(f"{x:.2f}" for x in result.load_average)
    click.echo(f"{size}B messages, {partitions} partitions, {count:,} per step; load average {load}; "
               f"confluent-kafka produce() ceiling with no broker: {result.client_produce_ceiling:,.0f} calls/s")
    for i, r in enumerate(result.rounds, 1):
        cpu = r.broker_cpu_us
        click.echo(f"  round {i}: produce native {r.native_produce:,.0f} kafka {r.kafka_produce:,.0f} msg/s "
                   f"({r.kafka_produce / r.native_produce:.0%}); consume native {r.native_consume:,.0f} "
                   f"kafka {r.kafka_consume:,.0f} msg/s ({r.kafka_consume / r.native_consume:.0%}); broker us/msg "
                   + " ".join(f"{k} {v}" for k, v in cpu.items()))
