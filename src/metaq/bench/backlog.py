"""`metaq bench backlog`: a backlog read off the disk (not the page cache) against the disk's own sequential read,
and the produce rate while a backlog reader runs against produce alone, in the same run.

MetaQ's claim (a broker holding 100M+ messages keeps producing at full speed while old data is read). Steps,
each bounded by a count or a deadline, loopback only:

1. fill: ``gb`` of ``message_bytes`` messages into ``partitions`` partitions of topic ``backlog``, written through
   the storage library (not measured), fsynced;
2. evict: every file of the data directory fsynced and dropped from the page cache (``posix_fadvise(DONTNEED)``,
   no privileges needed); ``fincore`` (util-linux), where installed, says how much stayed resident;
3. the disk baseline: the segment files read back one after another, 1 MiB per read (what ``dd bs=1M`` does),
   then a thread per partition side by side (the broker's reads of several partitions as the disk meets them);
   the ratios are against the latter;
4. a broker (group commit, ``loop``) on that directory; the consumer of `metaq bench consume` reads every
   partition from its first offset to the end (evicted first): MB/s of payload; then the blocking client's raw
   Fetch of the same (evicted again; nothing decoded: the broker and the socket without the consumer's
   per-record work); then once more, the backlog now in the page cache;
5. produce alone (`metaq bench produce`, ``send_batch`` of 100 B messages into the same topic) for
   ``produce_seconds``; then the same produce while a reader reads the backlog from the start: the consumer
   (evicted), a raw fetch (evicted), and a raw fetch of the backlog read into the page cache first (the same
   reads without the disk: what is left is the two sharing the CPU).
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metaq.bench.baselines import raw_fetch, read_files, read_files_side_by_side, resident_bytes
from metaq.bench.client_bench import BenchSpec, Progress, run_bench, run_workers
from metaq.bench.report import Report, markdown_table, share
from metaq.broker.launcher import BrokerLauncher
from metaq.fsutil import evict_from_page_cache
from metaq.protocol.records import encode_values
from metaq.storage import LogConfig, LogManager

TOPIC = "backlog"


@dataclass
class BacklogSpec:
    gb: float = 1.0
    """Backlog size, 10^9 bytes."""
    message_bytes: int = 1000
    partitions: int = 4
    consumers: int = 1
    """Consumer processes of the backlog reads."""
    loop: str = "uvloop"
    duration_s: float = 300.0
    """Upper bound of a backlog read."""
    produce_seconds: float = 15.0
    produce_count: int = 100_000_000
    """Upper bound of a produce phase."""
    warm: bool = True
    """Also the raw fetch of the backlog once it is in the page cache."""
    produce: bool = True
    """The produce phases (alone, and beside each reader)."""


def fill(data_dir: Path, partitions: int, total_bytes: int, message_bytes: int, report: Report) -> tuple[int, int]:
    """About ``total_bytes`` of ``message_bytes`` messages, round robin over the partitions in batches of about
    256 KiB (what a producer's default batch holds); fsynced at the end. (messages, stored bytes)."""
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
                report(f"  fill: {stored / 1e9:.1f} of {total_bytes / 1e9:.1f} GB "
                       f"({stored / (last - t0) / 1e6:.0f} MB/s)")
    return messages, stored


def _evict(data_dir: Path) -> None:
    evict_from_page_cache(sorted(p for p in data_dir.rglob("*") if p.is_file()))


def consume(servers: str, spec: BacklogSpec, messages: int, duration_s: float) -> dict[str, Any]:
    """``spec.consumers`` processes (each every n-th partition) reading every partition of TOPIC from its first
    offset to the end it sees."""
    bench = BenchSpec(mode="consume", servers=servers, topic=TOPIC, partitions=spec.partitions,
                      size=spec.message_bytes, count=messages, duration_s=duration_s, processes=spec.consumers)
    with Progress(False, messages, "consume") as show:
        results = run_workers("consume", bench, spec.consumers, show)
    seconds = max(r["seconds"] for r in results)
    nbytes = sum(r["bytes"] for r in results)
    return {"messages": sum(r["messages"] for r in results), "bytes": nbytes, "seconds": seconds,
            "mb_s": nbytes / max(seconds, 1e-9) / 1e6}


def produce(servers: str, spec: BacklogSpec) -> tuple[float, float]:
    """(msg/s, p99 ms of a send_batch call's ack) of `metaq bench produce` into TOPIC."""
    result = run_bench(BenchSpec(mode="produce", servers=servers, topic=TOPIC, partitions=spec.partitions, size=100,
                                 count=spec.produce_count, duration_s=spec.produce_seconds, batch=1000, concurrency=8))
    return result.msgs_per_s, result.latency_ms.get("p99", -1.0)


def run(spec: BacklogSpec, report: Report, work_dir: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"spec": vars(spec).copy()}
    with tempfile.TemporaryDirectory(prefix="metaq-bench-backlog-", dir=work_dir) as tmp:
        data_dir = Path(tmp) / "data"
        t0 = time.perf_counter()
        messages, stored = fill(data_dir, spec.partitions, int(spec.gb * 1e9), spec.message_bytes, report)
        segments = sorted(data_dir.glob(f"{TOPIC}-*/*.log"))
        out.update(messages=messages, stored_bytes=stored)
        report(f"filled {messages:,} messages, {stored / 1e9:.2f} GB in {len(segments)} segment files in "
               f"{time.perf_counter() - t0:.0f}s (not measured)")
        _evict(data_dir)
        disk_bytes, disk_s = read_files(segments)
        out["disk_mb_s"] = disk_bytes / disk_s / 1e6
        _evict(data_dir)
        par_bytes, par_s = read_files_side_by_side(segments, spec.partitions)
        out["disk_side_by_side_mb_s"] = par_bytes / par_s / 1e6
        report(f"disk: {out['disk_mb_s']:,.1f} MB/s one file after another, {out['disk_side_by_side_mb_s']:,.1f} "
               f"MB/s a thread per partition")
        _evict(data_dir)
        config = f"[system]\nnumPartitions=1\n\n[topic={TOPIC}]\nnumPartitions={spec.partitions}\n"
        options: dict[str, Any] = {"unflushThreshold": 0, "maxTransferSize": 1 << 20, "event-loop": spec.loop}
        with BrokerLauncher(data_dir, options, config_text=config, ready_timeout_s=300) as launcher:
            out["resident_after_start_bytes"] = resident_bytes(segments)
            _evict(data_dir)
            out["consume"] = alone = consume(launcher.servers, spec, messages, spec.duration_s)
            out["resident_after_consume_bytes"] = resident_bytes(segments)
            report(f"consume, backlog off the page cache: {alone['mb_s']:,.1f} MB/s of payload "
                   f"({share(alone['mb_s'], out['disk_side_by_side_mb_s'])} of the disk side by side)")
            _evict(data_dir)
            out["raw_fetch"] = raw = raw_fetch(launcher.servers, TOPIC, spec.partitions, spec.duration_s)
            report(f"raw fetch, backlog off the page cache: {raw['mb_s']:,.1f} MB/s")
            if spec.warm:
                out["raw_fetch_cached"] = warm = raw_fetch(launcher.servers, TOPIC, spec.partitions, spec.duration_s)
                report(f"raw fetch again, the backlog now in the page cache: {warm['mb_s']:,.1f} MB/s")
            if spec.produce:
                out["produce"] = _produce_beside_readers(launcher.servers, spec, messages, data_dir, segments, report)
    return out


def _produce_beside_readers(servers: str, spec: BacklogSpec, messages: int, data_dir: Path, segments: list[Path],
                            report: Report) -> dict[str, Any]:
    _evict(data_dir)
    rate, p99 = produce(servers, spec)
    got: dict[str, Any] = {"alone": {"msgs_per_s": rate, "p99_ms": p99}}
    report(f"produce alone (100 B, send_batch of 1000, 8 in flight): {rate:,.0f} msg/s, ack p99 {p99:.1f} ms")
    reader_s = spec.produce_seconds + 3  # each reader starts at the first offset and stops about with the produce
    readers = {
        "a consumer, backlog off the page cache": lambda: consume(servers, spec, messages, reader_s + 2),
        "a raw fetch, backlog off the page cache": lambda: raw_fetch(servers, TOPIC, spec.partitions, reader_s),
        "a raw fetch, backlog in the page cache": lambda: raw_fetch(servers, TOPIC, spec.partitions, reader_s),
    }
    for label, read in readers.items():
        if "off the page cache" in label:
            _evict(data_dir)
        else:
            read_files(segments)  # the page cache holds the whole backlog (RAM permitting)
        read_result: dict[str, Any] = {}
        reader = threading.Thread(target=lambda read=read, into=read_result: into.update(read()))
        reader.start()
        rate, p99 = produce(servers, spec)
        reader.join(spec.duration_s + 180)
        got[label] = {"msgs_per_s": rate, "p99_ms": p99, "reader_mb_s": read_result.get("mb_s", 0.0)}
        report(f"produce beside {label}: {rate:,.0f} msg/s ({share(rate, got['alone']['msgs_per_s'])} of alone), "
               f"ack p99 {p99:.1f} ms; the reader read {read_result.get('mb_s', 0.0):,.1f} MB/s")
    return got


def table(result: dict[str, Any]) -> str:
    spec = result["spec"]
    par = result["disk_side_by_side_mb_s"]
    warm = result.get("raw_fetch_cached", {}).get("mb_s")
    text = (f"backlog {result['stored_bytes'] / 1e9:.2f} GB, {spec['message_bytes']} B messages, {spec['partitions']} "
            f"partitions, broker on {spec['loop']}; MB/s:\n\n"
            + markdown_table(["disk, one file after another", "disk, a thread per partition (baseline)",
                              "consume (payload)", "raw fetch", "raw fetch, page cache"],
                             [[f"{result['disk_mb_s']:,.1f}", f"{par:,.1f}",
                               f"{result['consume']['mb_s']:,.1f} ({share(result['consume']['mb_s'], par)})",
                               f"{result['raw_fetch']['mb_s']:,.1f} ({share(result['raw_fetch']['mb_s'], par)})",
                               f"{warm:,.1f}" if warm is not None else ""]], right=[0, 1, 2, 3, 4]))
    produced = result.get("produce")
    if produced:
        alone = produced["alone"]["msgs_per_s"]
        rows = [[f"{label}", f"{r['msgs_per_s']:,.0f}", share(r["msgs_per_s"], alone), f"{r['p99_ms']:.1f}",
                 f"{r['reader_mb_s']:,.1f}" if "reader_mb_s" in r else ""] for label, r in produced.items()]
        text += "\n\n" + markdown_table(["produce (100 B, send_batch) beside", "msg/s", "of alone", "ack p99 ms",
                                         "the reader's MB/s"], rows, right=[1, 2, 3, 4])
    return text
