"""A backlog off the page cache: consumers reading old data against the disk's sequential read, same run,
and the produce rate while a backlog reader runs against produce alone.

Issue 13 (MetaQ's "亿级堆积": a broker holding 100M+ messages keeps producing at full speed while old data is
read). Steps, every one bounded by a count or a deadline, loopback only:

1. fill: --gb of --message-bytes messages into --partitions partitions of topic ``backlog``, written through
   the storage library (as scripts/bench_partitions.py fills; not measured), fsynced;
2. evict: every file of the data directory fsynced and dropped from the page cache with
   ``posix_fadvise(POSIX_FADV_DONTNEED)`` (needs no privileges); ``fincore`` (util-linux), when installed,
   says how much stayed resident;
3. disk baseline: the segment files read back sequentially by Python, 1 MiB ``readinto`` per call, one
   file after another (what ``dd bs=1M`` does); evict again;
4. a broker (group commit, --loop) opened on that directory; the consumer of ``metaq bench consume`` (one
   process, a fetch of max_bytes 1 MiB per request, one in flight per partition, every record checked and
   turned into a Message) reads every partition from its first offset to the end: MB/s of payload, and
   how much of the backlog was resident in the page cache at the end (to show it was read from disk);
   evicted again, the same read with the blocking client's raw Fetch (headers walked, nothing decoded):
   what the broker and the socket deliver without the consumer's per-record work; then once more, the
   backlog now in the page cache (what the same path does without the disk);
5. evict again; produce alone (``metaq bench produce``, send_batch of 100 B messages into the same topic)
   for --produce-seconds; then the same produce while a reader reads the backlog from the start for about
   as long: the consumer (backlog evicted), a raw fetch (evicted), and a raw fetch of the backlog read
   into the page cache first (the same reads without the disk: what is left is CPU sharing).

The disk baseline is read twice: one file after another (``dd``), and a thread per partition side by side
(what the broker's reads of several partitions look like to the disk); the ratios are against the latter.

Example (the figures in docs/benchmarks.md, "A backlog off the page cache"):

    .venv/bin/python scripts/bench_backlog.py --gb 10 --work-dir /var/tmp
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from metaq.bench.client_bench import BenchSpec, _Progress, _run_workers, run_bench
from metaq.broker.launcher import BrokerLauncher
from metaq.protocol.records import encode_values
from metaq.storage import LogConfig, LogManager
from metaq.testing.fs import evict_from_page_cache

TOPIC = "backlog"
READ_BYTES = 1 << 20


def fill(data_dir: Path, partitions: int, total_bytes: int, message_bytes: int) -> tuple[int, int]:
    """About ``total_bytes`` of ``message_bytes`` messages, round robin over the partitions in batches of
    about 256 KiB (what a producer's default batch holds); fsynced at the end. (messages, stored bytes)."""
    per_batch = max(1, min(10_000, (256 << 10) // message_bytes))
    batch = encode_values([bytes(message_bytes)] * per_batch, int(time.time() * 1000))
    batches = max(partitions, total_bytes // len(batch))
    config = LogConfig(unflush_threshold=1 << 30, unflush_interval_ms=1 << 30)
    messages = stored = 0
    t0 = last = time.perf_counter()
    with LogManager(data_dir, 0, config, sync=os.fdatasync) as manager:
        logs = [manager.get_or_create(TOPIC, p) for p in range(partitions)]
        for i in range(batches):
            logs[i % partitions].append(batch)
            messages += per_batch
            stored += len(batch)
            if time.perf_counter() - last > 10:
                last = time.perf_counter()
                rate = stored / (last - t0) / 1e6
                print(f"  fill: {stored / 1e9:.1f} of {total_bytes / 1e9:.1f} GB ({rate:.0f} MB/s)", flush=True)
    return messages, stored


def data_files(data_dir: Path) -> list[Path]:
    return sorted(p for p in data_dir.rglob("*") if p.is_file())


def segment_files(data_dir: Path) -> list[Path]:
    return sorted(data_dir.glob(f"{TOPIC}-*/*.log"))


def evict(data_dir: Path) -> None:
    """fsync and drop from the page cache every file of ``data_dir`` (clean pages only can be dropped)."""
    evict_from_page_cache(data_files(data_dir))


def resident_bytes(files: list[Path]) -> int:
    """Bytes of ``files`` in the page cache (fincore); -1 when fincore is not installed."""
    if shutil.which("fincore") is None or not files:
        return -1
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", *map(str, files)],
                         capture_output=True, text=True, check=True).stdout
    return sum(int(x) for x in out.split())


def sequential_read(files: list[Path]) -> tuple[int, float]:
    """(bytes, seconds) of reading ``files`` one after another, READ_BYTES per readinto."""
    buf = bytearray(READ_BYTES)
    total = 0
    start = time.perf_counter()
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                total += n
    return total, time.perf_counter() - start


def parallel_read(files: list[Path], streams: int) -> tuple[int, float]:
    """(bytes, seconds) of reading ``files`` by ``streams`` threads (each every n-th partition's files in
    turn), READ_BYTES per readinto: the access pattern of a consumer reading the partitions side by side."""
    by_partition: dict[str, list[Path]] = {}
    for path in files:
        by_partition.setdefault(path.parent.name, []).append(path)
    groups: list[list[Path]] = [[] for _ in range(streams)]
    for i, name in enumerate(sorted(by_partition)):
        groups[i % streams] += by_partition[name]
    totals = [0] * streams

    def one(i: int) -> None:
        totals[i] = sequential_read(groups[i])[0]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(totals), time.perf_counter() - start


def consume(servers: str, args: argparse.Namespace, messages: int, duration_s: float) -> dict[str, Any]:
    """--consumers processes (each every n-th partition) reading every partition of TOPIC from its first
    offset to the end it sees."""
    spec = BenchSpec(mode="consume", servers=servers, topic=TOPIC, partitions=args.partitions,
                     size=args.message_bytes, count=messages, duration_s=duration_s, processes=args.consumers)
    with _Progress(False, messages, "consume") as show:
        results = _run_workers("consume", spec, args.consumers, show)
    seconds = max(r["seconds"] for r in results)
    nbytes = sum(r["bytes"] for r in results)
    return {"messages": sum(r["messages"] for r in results), "bytes": nbytes, "seconds": seconds,
            "mb_s": nbytes / max(seconds, 1e-9) / 1e6}


def raw_fetch(servers: str, topic: str, partitions: int, deadline_s: float) -> dict[str, Any]:
    """Every partition of ``topic`` read from its first offset to its end with the blocking client's raw
    Fetch (1 MiB max_bytes, one request in flight per partition, a thread each): the batches are walked by
    their headers only, nothing decoded or checked, so this is what the broker and the socket deliver
    without the consumer's per-record work. Bytes are the records' bytes."""
    from metaq.client.blocking import BlockingClient
    from metaq.protocol.records import iter_batches

    totals = [0] * partitions
    deadline = time.perf_counter() + deadline_s

    def one(p: int) -> None:
        with BlockingClient(servers) as client:
            offset = client.list_offsets(topic, p, -2).offset
            end = client.list_offsets(topic, p, -1).offset
            while offset < end and time.perf_counter() < deadline:
                records = client.fetch(topic, p, offset, READ_BYTES).records
                for _pos, header in iter_batches(records):
                    offset = header.next_offset
                totals[p] += len(records)

    threads = [threading.Thread(target=one, args=(p,)) for p in range(partitions)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(deadline_s + 60)
    seconds = time.perf_counter() - start
    return {"bytes": sum(totals), "seconds": seconds, "mb_s": sum(totals) / seconds / 1e6}


def produce(servers: str, args: argparse.Namespace) -> tuple[float, float]:
    """(msg/s, p99 ms of a send_batch call's ack) of ``metaq bench produce`` into TOPIC."""
    spec = BenchSpec(mode="produce", servers=servers, topic=TOPIC, partitions=args.partitions, size=100,
                     count=args.produce_count, duration_s=args.produce_seconds, batch=1000, concurrency=8)
    result = run_bench(spec)
    return result.msgs_per_s, result.latency_ms.get("p99", -1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=1.0, help="Backlog size, 10^9 bytes.")
    parser.add_argument("--message-bytes", type=int, default=1000, help="Payload bytes of backlog messages.")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--consumers", type=int, default=1, help="Consumer processes of the backlog reads.")
    parser.add_argument("--loop", default="uvloop", choices=["uvloop", "asyncio"], help="The broker's event loop.")
    parser.add_argument("-d", "--duration", type=float, default=300.0, help="Upper bound of a backlog read, s.")
    parser.add_argument("--produce-seconds", type=float, default=15.0, help="Length of each produce phase, s.")
    parser.add_argument("--produce-count", type=int, default=100_000_000, help="Upper bound of a produce phase.")
    parser.add_argument("--no-warm", dest="warm", action="store_false",
                        help="Skip the raw fetch of the backlog once it is in the page cache.")
    parser.add_argument("--skip-produce", action="store_true", help="Only the backlog read and its baseline.")
    parser.add_argument("--work-dir", default=None, help="Where the data directory goes (default: a temp dir).")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="metaq-backlog-", dir=args.work_dir) as tmp:
        data_dir = Path(tmp) / "data"
        t0 = time.perf_counter()
        messages, stored = fill(data_dir, args.partitions, int(args.gb * 1e9), args.message_bytes)
        fill_s = time.perf_counter() - t0
        segments = segment_files(data_dir)
        print(f"filled {messages:,} messages, {stored / 1e9:.2f} GB in {len(segments)} segment files, "
              f"{args.partitions} partitions, in {fill_s:.0f}s ({stored / fill_s / 1e6:.0f} MB/s, not measured)",
              flush=True)
        evict(data_dir)
        print(f"evicted: {resident_bytes(segments) / 1e6:,.1f} MB of the segments resident", flush=True)
        disk_bytes, disk_s = sequential_read(segments)
        disk_mb_s = disk_bytes / disk_s / 1e6
        print(f"disk: sequential read of the segment files, 1 MiB per read: {disk_bytes / 1e6:,.0f} MB in "
              f"{disk_s:.1f}s = {disk_mb_s:,.1f} MB/s", flush=True)
        evict(data_dir)
        par_bytes, par_s = parallel_read(segments, args.partitions)
        par_mb_s = par_bytes / par_s / 1e6
        print(f"disk: the same, {args.partitions} partitions read side by side (a thread each): "
              f"{par_bytes / 1e6:,.0f} MB in {par_s:.1f}s = {par_mb_s:,.1f} MB/s", flush=True)
        evict(data_dir)
        config = f"[system]\nnumPartitions=1\n\n[topic={TOPIC}]\nnumPartitions={args.partitions}\n"
        options: dict[str, Any] = {"unflushThreshold": 0, "maxTransferSize": 1 << 20, "event-loop": args.loop}
        with BrokerLauncher(data_dir, options, config_text=config, ready_timeout_s=300) as launcher:
            print(f"broker ({args.loop}) up; {resident_bytes(segments) / 1e6:,.1f} MB of the segments resident "
                  f"(evicted again); consuming the backlog ...", flush=True)
            evict(data_dir)
            alone = consume(launcher.servers, args, messages, args.duration)
            resident = resident_bytes(segments)
            print(f"consume, backlog off the page cache: {alone['messages']:,} messages, "
                  f"{alone['bytes'] / 1e6:,.0f} MB of payload in {alone['seconds']:.1f}s = {alone['mb_s']:,.1f} MB/s "
                  f"({alone['mb_s'] / disk_mb_s:.0%} of the disk's sequential read); {resident / 1e6:,.0f} MB "
                  f"resident after", flush=True)
            evict(data_dir)
            raw = raw_fetch(launcher.servers, TOPIC, args.partitions, args.duration)
            print(f"raw fetch (records not decoded), backlog off the page cache: {raw['bytes'] / 1e6:,.0f} MB in "
                  f"{raw['seconds']:.1f}s = {raw['mb_s']:,.1f} MB/s ({raw['mb_s'] / disk_mb_s:.0%} of the disk)",
                  flush=True)
            warm = raw_fetch(launcher.servers, TOPIC, args.partitions, args.duration) if args.warm else raw
            if args.warm:
                print(f"raw fetch again, the backlog now in the page cache ({resident_bytes(segments) / 1e6:,.0f} MB "
                      f"resident): {warm['mb_s']:,.1f} MB/s", flush=True)
            produce_alone = p99_alone = 0.0
            busy: dict[str, dict[str, Any]] = {}
            if not args.skip_produce:
                evict(data_dir)
                produce_alone, p99_alone = produce(launcher.servers, args)
                print(f"produce alone (100 B, send_batch of 1000, 8 in flight): {produce_alone:,.0f} msg/s, ack p99 "
                      f"{p99_alone:.1f} ms", flush=True)
                # each reader starts at the first offset and stops about when the produce phase ends
                reader_s = args.produce_seconds + 3
                readers = {
                    "consumer, backlog off the page cache":
                        lambda: consume(launcher.servers, args, messages, reader_s + 2),  # + its process start
                    "raw fetch, backlog off the page cache":
                        lambda: raw_fetch(launcher.servers, TOPIC, args.partitions, reader_s),
                    "raw fetch, backlog in the page cache":
                        lambda: raw_fetch(launcher.servers, TOPIC, args.partitions, reader_s),
                }
                for label, read in readers.items():
                    if "off the page cache" in label:
                        evict(data_dir)
                    else:
                        sequential_read(segments)  # the page cache holds the whole backlog (RAM permitting)
                    got: dict[str, Any] = {}
                    reader = threading.Thread(target=lambda read=read, got=got: got.update(read()))
                    reader.start()
                    rate, p99 = produce(launcher.servers, args)
                    reader.join(args.duration + 180)
                    busy[label] = {"produce": rate, "p99": p99, "reader_mb_s": got.get("mb_s", 0.0)}
                    print(f"produce while a {label}: {rate:,.0f} msg/s ({rate / max(produce_alone, 1e-9):.0%} of "
                          f"alone), ack p99 {p99:.1f} ms; the reader read {got.get('mb_s', 0.0):,.1f} MB/s", flush=True)
    print(f"\nbacklog {stored / 1e9:.2f} GB, {args.message_bytes} B messages, {args.partitions} partitions, "
          f"broker on {args.loop}:")
    print("| disk, 1 stream MB/s | disk, a stream per partition MB/s | consume MB/s (payload) | raw fetch MB/s "
          "| raw fetch, page cache MB/s |")
    print("|---:|---:|---:|---:|---:|")
    print(f"| {disk_mb_s:,.1f} | {par_mb_s:,.1f} | {alone['mb_s']:,.1f} ({alone['mb_s'] / par_mb_s:.0%}) "
          f"| {raw['mb_s']:,.1f} ({raw['mb_s'] / par_mb_s:.0%}) | {warm['mb_s']:,.1f} |")
    if produce_alone:
        print(f"\n| produce msg/s (100 B, send_batch) | with / alone | ack p99 ms | the reader's MB/s |\n"
              f"|---|---:|---:|---:|\n| alone: {produce_alone:,.0f} | | {p99_alone:.1f} | |")
        for label, r in busy.items():
            print(f"| with a {label}: {r['produce']:,.0f} | {r['produce'] / produce_alone:.0%} | {r['p99']:.1f} "
                  f"| {r['reader_mb_s']:,.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
