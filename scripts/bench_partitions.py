"""Many partitions on one broker: produce throughput, RSS, open files, start-up and recovery time.

Issue 13: a topic of --small partitions (8) against one of --large partitions (10,000) on one broker,
the same run, each case a fresh broker process (group commit, uvloop, a [topic=bench] section with
numPartitions):

- the broker's RSS (VmRSS of /proc/<pid>/status) and open descriptors (/proc/<pid>/fd) after start and
  after producing, and the difference per partition;
- produce msg/s round robin through the real client, as `metaq bench produce` measures it (child
  processes): ``batch`` is send_batch of --batch messages (each call goes to the next partition),
  ``async`` is send_async per message (the default round-robin selector, batched per partition by the
  producer's accumulator); ``async-sticky`` the same with StickyRoundRobinSelector (a partition per batch);
- a new broker's time to create the partitions, and its clean stop after producing;
- start-up of a broker holding --large partitions and --fill-bytes of data: the data directory is
  filled through the storage library (not measured), then the broker is started after a clean close,
  stopped with SIGTERM and started again (clean), then killed with SIGKILL and started again (every
  partition recovered); the time from spawning the process to its ready line, the "opened in" time the
  broker logs, RSS and descriptors once ready.

Every loop is bounded by a count and a deadline. A quick run:

    .venv/bin/python scripts/bench_partitions.py --large 1000 -n 200000 -d 10 --fill-bytes 50e6

The figures of docs/benchmarks.md ("10,000 partitions"; the code before a change is measured in the same
run by putting its ``src`` first on PYTHONPATH):

    .venv/bin/python scripts/bench_partitions.py --large 10000 -n 2000000 --batch 100 -d 20 --fill-bytes 1e9
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from metaq.bench.client_bench import BenchSpec, run_bench
from metaq.broker.launcher import BrokerLauncher
from metaq.protocol.records import encode_values
from metaq.storage import LogConfig, LogManager

TOPIC = "bench"
OPENED_RE = re.compile(r"opened in ([0-9.]+)s")


def proc_stats(pid: int) -> tuple[int, int]:
    """(RSS in KiB, open descriptors) of a process, from /proc."""
    rss_kib = 0
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                rss_kib = int(line.split()[1])
                break
    return rss_kib, len(os.listdir(f"/proc/{pid}/fd"))


def broker(data_dir: Path, partitions: int, extra: dict[str, Any] | None = None) -> BrokerLauncher:
    options: dict[str, Any] = {"unflushThreshold": 0, "maxTransferSize": 1 << 20, "event-loop": "uvloop"}
    options.update(extra or {})
    config = f"[system]\nnumPartitions=1\n\n[topic={TOPIC}]\nnumPartitions={partitions}\n"
    return BrokerLauncher(data_dir, options, config_text=config, ready_timeout_s=900)


def timed_start(launcher: BrokerLauncher) -> tuple[float, float]:
    """Start; (seconds from spawn to the ready line, the 'opened in' seconds the broker logged)."""
    launcher.log_lines.clear()
    t0 = time.perf_counter()
    launcher.start()
    spawn_to_ready = time.perf_counter() - t0
    opened = -1.0
    for line in launcher.log_lines:
        match = OPENED_RE.search(line)
        if match:
            opened = float(match.group(1))
    return spawn_to_ready, opened


def produce_case(partitions: int, apis: list[str], args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    rows = []
    data_dir = work / f"produce-{partitions}"
    extra: dict[str, Any] = {"maxOpenFiles": args.max_open_files} if args.max_open_files else {}
    if args.unflush_threshold is not None:
        extra["unflushThreshold"] = args.unflush_threshold
    extra.update(broker_options(args))
    launcher = broker(data_dir, partitions, extra)
    start_s, _opened = timed_start(launcher)
    try:
        rss0, fd0 = proc_stats(launcher.pid)
        for api in apis:
            # "async-sticky": send_async with StickyRoundRobinSelector (the field is left out otherwise, so
            # the code before it can run this script too)
            base_api, _, selector = api.partition("-")
            more: dict[str, Any] = {"selector": selector} if selector else {}
            if args.batch_bytes:
                more["batch_bytes"] = args.batch_bytes
            if args.no_multi_produce:
                more["multi_produce"] = False
            spec = BenchSpec(mode="produce", servers=launcher.servers, topic=TOPIC, partitions=partitions,
                             api=base_api, count=args.count, duration_s=args.duration, size=args.size,
                             batch=args.batch, concurrency=args.concurrency, **more)
            result = run_bench(spec)
            rss1, fd1 = proc_stats(launcher.pid)
            rows.append({"partitions": partitions, "api": api, "msgs_per_s": result.msgs_per_s,
                         "messages": result.messages, "failures": result.failures,
                         "p99_ms": result.latency_ms.get("p99", -1), "rss_start_mib": rss0 / 1024,
                         "fds_start": fd0, "rss_after_mib": rss1 / 1024, "fds_after": fd1})
            print(f"  produce partitions={partitions} api={api}: {result.msgs_per_s:,.0f} msg/s "
                  f"({result.messages} messages, {result.failures} failed); RSS {rss0 / 1024:.1f} -> "
                  f"{rss1 / 1024:.1f} MiB, fds {fd0} -> {fd1}", flush=True)
    finally:
        t_stop = time.perf_counter()
        launcher.stop_or_kill(600)
    stop_s = time.perf_counter() - t_stop
    print(f"  partitions={partitions}: a new broker creating them ready in {start_s:.2f}s; clean stop after "
          f"producing {stop_s:.2f}s", flush=True)
    for row in rows:
        row.update(start_s=start_s, stop_s=stop_s)
    return rows


def broker_options(args: argparse.Namespace) -> dict[str, str]:
    """--broker-option NAME=VALUE pairs, as the broker's command line takes them."""
    options = {}
    for item in args.broker_option:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"--broker-option wants NAME=VALUE, not {item!r}")
        options[name] = value
    return options


def fill(data_dir: Path, partitions: int, total_bytes: int, message_bytes: int) -> tuple[int, int]:
    """Write about ``total_bytes`` into ``partitions`` partitions of TOPIC through the storage library
    (one fsync of everything at the end); returns (messages, bytes)."""
    per_partition = max(1, total_bytes // partitions)
    per_batch = max(1, min(1000, (256 << 10) // message_bytes, per_partition // message_bytes))
    values = [bytes(message_bytes)] * per_batch
    batch = encode_values(values, int(time.time() * 1000))
    batches = max(1, round(per_partition / len(batch)))
    config = LogConfig(unflush_threshold=1 << 30, unflush_interval_ms=1 << 30)
    messages = stored = 0
    with LogManager(data_dir, 0, config, sync=lambda fd: None, max_open_files=256) as manager:
        for p in range(partitions):
            plog = manager.get_or_create(TOPIC, p)
            for _ in range(batches):
                plog.append(batch)
                messages += per_batch
                stored += len(batch)
    os.sync()
    return messages, stored


def startup_case(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    partitions = args.large
    data_dir = work / "startup"
    t0 = time.perf_counter()
    messages, stored = fill(data_dir, partitions, int(args.fill_bytes), args.fill_message_bytes)
    print(f"  filled {partitions} partitions with {messages:,} messages, {stored / 1e6:,.0f} MB in "
          f"{time.perf_counter() - t0:.1f}s (not measured)", flush=True)
    rows = []
    extra: dict[str, Any] = {}
    if args.max_open_files:
        extra["maxOpenFiles"] = args.max_open_files
    launcher = broker(data_dir, partitions, extra)
    for label in ("clean (after fill)", "clean (after SIGTERM)", "after kill -9"):
        if label == "after kill -9":
            assert launcher.running
            launcher.kill()
        elif launcher.running:
            t_stop = time.perf_counter()
            launcher.stop(600)
            print(f"  clean stop took {time.perf_counter() - t_stop:.2f}s", flush=True)
        ready_s, opened_s = timed_start(launcher)
        rss, fds = proc_stats(launcher.pid)
        rows.append({"case": label, "ready_s": ready_s, "opened_s": opened_s, "rss_mib": rss / 1024, "fds": fds})
        print(f"  start {label}: ready in {ready_s:.2f}s (opened in {opened_s:.2f}s), RSS {rss / 1024:.1f} MiB, "
              f"fds {fds}", flush=True)
    launcher.stop(600)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=8, help="Partitions of the baseline topic.")
    parser.add_argument("--large", type=int, default=10_000, help="Partitions of the many-partitions topic.")
    parser.add_argument("-n", "--count", type=int, default=1_000_000, help="Messages per produce case.")
    parser.add_argument("-d", "--duration", type=float, default=20.0, help="Upper bound of a produce case, s.")
    parser.add_argument("--size", type=int, default=100, help="Payload bytes of produced messages.")
    parser.add_argument("--batch", type=int, default=1000, help="Messages per send_batch call.")
    parser.add_argument("--batch-bytes", type=int, default=0,
                        help="The producer's batch_bytes (0: the bench's default, 256 KiB).")
    parser.add_argument("--concurrency", type=int, default=8, help="send_batch calls in flight.")
    parser.add_argument("--apis", default="batch,async", help="Producer APIs to measure (batch,async,async-sticky: "
                        "send_async with StickyRoundRobinSelector).")
    parser.add_argument("--fill-bytes", type=float, default=1e9, help="Data for the start-up cases (0: skip them).")
    parser.add_argument("--fill-message-bytes", type=int, default=1000, help="Payload bytes of the filled data.")
    parser.add_argument("--max-open-files", type=int, default=0, help="The broker's maxOpenFiles (0: its default).")
    parser.add_argument("--unflush-threshold", type=int, default=None,
                        help="The broker's unflushThreshold (default 0: group commit, every ack after its fsync).")
    parser.add_argument("--no-multi-produce", action="store_true",
                        help="One Produce request per batch (the producer's multi_produce=False), as before MultiProduce.")
    parser.add_argument("--broker-option", action="append", default=[], metavar="NAME=VALUE",
                        help="Another broker option for the produce cases (repeatable), e.g. unflushInterval=60000.")
    parser.add_argument("--skip-produce", action="store_true")
    parser.add_argument("--work-dir", default=None, help="Where the data directories go (default: a temp dir).")
    args = parser.parse_args(argv)
    apis = [a for a in args.apis.split(",") if a]
    with tempfile.TemporaryDirectory(prefix="metaq-partitions-", dir=args.work_dir) as tmp:
        work = Path(tmp)
        produce_rows: list[dict[str, Any]] = []
        if not args.skip_produce:
            for partitions in (args.small, args.large):
                produce_rows += produce_case(partitions, apis, args, work)
        startup_rows = startup_case(args, work) if args.fill_bytes > 0 else []
    if produce_rows:
        print("\n| partitions | api | msg/s | vs small | ack p99 ms | RSS start MiB | RSS after MiB | fds start "
              "| fds after | new broker ready s | stop after producing s |")
        print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        base = {r["api"]: r["msgs_per_s"] for r in produce_rows if r["partitions"] == args.small}
        for r in produce_rows:
            ratio = r["msgs_per_s"] / base[r["api"]] if base.get(r["api"]) else 0.0
            print(f"| {r['partitions']:,} | {r['api']} | {r['msgs_per_s']:,.0f} | {ratio:.0%} | {r['p99_ms']} "
                  f"| {r['rss_start_mib']:.1f} | {r['rss_after_mib']:.1f} | {r['fds_start']} | {r['fds_after']} "
                  f"| {r['start_s']:.2f} | {r['stop_s']:.2f} |")
        small = [r for r in produce_rows if r["partitions"] == args.small]
        large = [r for r in produce_rows if r["partitions"] == args.large]
        if small and large and args.large > args.small:
            extra = args.large - args.small
            rss_start = (large[0]["rss_start_mib"] - small[0]["rss_start_mib"]) * 1024 / extra
            rss_after = (large[-1]["rss_after_mib"] - small[-1]["rss_after_mib"]) * 1024 / extra
            fds_start = (large[0]["fds_start"] - small[0]["fds_start"]) / extra
            fds_after = (large[-1]["fds_after"] - small[-1]["fds_after"]) / extra
            print(f"\nper extra partition: RSS at start {rss_start:.1f} KiB, after producing {rss_after:.1f} KiB; "
                  f"fds at start {fds_start:.3f}, after producing {fds_after:.3f}")
    if startup_rows:
        print(f"\nstart-up with {args.large:,} partitions, {args.fill_bytes / 1e9:.2f} GB:")
        print("| start | spawn to ready s | opened in s | RSS MiB | fds |")
        print("|---|---:|---:|---:|---:|")
        for r in startup_rows:
            print(f"| {r['case']} | {r['ready_s']:.2f} | {r['opened_s']:.2f} | {r['rss_mib']:.1f} | {r['fds']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
