"""`metaq bench <what>`: every benchmark of metaq, one command each (docs/benchmarks.md lists them with their
figures). This module holds the group and the client benches (produce, consume, e2e); the others are in the
bench_*_cmds modules beside it, the code of each bench in metaq.bench."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from typing import Any

import click

from metaq.bench.report import finish_machine, machine, machine_line
from metaq.cli.bench_common import command_line
from metaq.cli.options import client_security_options


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
    return client_security_options(fn)


def _run(mode: str, as_json: bool, no_progress: bool, brokers: int | None, **kwargs: Any) -> None:
    from metaq.bench.client_bench import BenchSpec, run_bench

    if sum(x is not None for x in (kwargs["servers"], brokers, kwargs["zk"])) > 1:
        raise click.UsageError("give at most one of --servers, --brokers and --zk")
    tls = kwargs.pop("client_options")
    if tls.get("tls") and kwargs["servers"] is None and kwargs["zk"] is None:
        raise click.UsageError("--tls measures running TLS brokers: give --servers HOST:SSLPORT (or --zk)")
    spec = BenchSpec(mode=mode, brokers=brokers or 0, tls=tls, **kwargs)
    info = machine()
    try:
        result = run_bench(spec, progress=not (as_json or no_progress))
    except ValueError as exc:  # --zk: no broker registered
        raise click.ClickException(str(exc)) from None
    info = finish_machine(info)
    if as_json:
        click.echo(json.dumps({**asdict(result), "command": command_line(), "machine": info}))
        return
    click.echo(machine_line(info))
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
    """Measure metaq on this machine: each bench starts what it measures (a broker, a cluster, peers) unless told
    where it runs, and gives its figures beside a baseline measured in the same run. Figures and how they were
    taken: docs/benchmarks.md."""


_selector_option = click.option(
    "--selector", type=click.Choice(["roundrobin", "sticky"]), default="roundrobin", show_default=True,
    help="Partition selector: roundrobin (RoundRobinSelector, per message) or sticky (StickyRoundRobinSelector, "
         "per batch).")
_multi_produce_option = click.option(
    "--multi-produce/--no-multi-produce", default=True, show_default=True,
    help="The producer sends the batches of several partitions that leave together as one MultiProduce request "
         "(multi_produce); --no-multi-produce: one Produce request per batch.")


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


def _add_subcommands() -> None:
    """The benches other than produce, consume and e2e live in the bench_*_cmds modules (which import nothing of
    this one)."""
    from metaq.cli import bench_client_cmds, bench_cluster_cmds, bench_server_cmds

    for module in (bench_cluster_cmds, bench_server_cmds, bench_client_cmds):
        for command in module.COMMANDS:
            bench_group.add_command(command)


_add_subcommands()
