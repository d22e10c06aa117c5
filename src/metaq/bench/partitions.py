"""`metaq bench partitions`: many partitions on one broker beside a few, in the same run: produce throughput, RSS,
open descriptors, start-up and recovery time.

A topic of ``small`` partitions (8: the same-run baseline) against one of ``large`` (10,000), each case a fresh
broker process (uvloop, a ``[topic=bench]`` section with numPartitions):

- the broker's RSS (VmRSS) and open descriptors after start and after producing, and the difference per
  partition;
- produce msg/s round robin through the real client, as `metaq bench produce` measures it: ``batch`` is
  send_batch of ``batch`` messages (each call goes to the next partition), ``async`` send_async per message (the
  round-robin selector, batched per partition by the producer), ``async-sticky`` the same with
  StickyRoundRobinSelector (a partition per batch);
- a new broker's time to create the partitions, and its clean stop after producing;
- start-up of a broker holding ``large`` partitions and ``fill_bytes`` of data (filled through the storage
  library, not measured): started after a clean close, stopped with SIGTERM and started again, then killed -9
  and started again (every partition recovered); the time from spawning the process to its ready line, the
  "opened in" time the broker logs, RSS and descriptors once ready.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metaq.bench.client_bench import BenchSpec, run_bench
from metaq.bench.processes import open_fds, rss_mib
from metaq.bench.report import Report, markdown_table, share
from metaq.broker.launcher import BrokerLauncher
from metaq.protocol.records import encode_values
from metaq.storage import LogConfig, LogManager


@dataclass
class PartitionsSpec:
    small: int = 8
    large: int = 10_000
    count: int = 1_000_000
    """Messages per produce case."""
    duration_s: float = 20.0
    """Upper bound of a produce case."""
    size: int = 100
    batch: int = 1000
    """Messages per send_batch call (api batch)."""
    batch_bytes: int = 256 * 1024
    concurrency: int = 8
    apis: list[str] = field(default_factory=lambda: ["batch", "async"])
    fill_bytes: float = 1e9
    """Data for the start-up cases (0: no start-up cases)."""
    fill_message_bytes: int = 1000
    unflush_threshold: int = 0
    multi_produce: bool = True
    broker_options: dict[str, str] = field(default_factory=dict)
    """Further broker options of the produce cases (maxOpenFiles, unflushInterval...)."""
    produce: bool = True


TOPIC = "bench"
OPENED_RE = re.compile(r"opened in ([0-9.]+)s")


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


def produce_case(partitions: int, spec: PartitionsSpec, work: Path, report: Report) -> list[dict[str, Any]]:
    rows = []
    launcher = broker(work / f"produce-{partitions}", partitions,
                      {"unflushThreshold": spec.unflush_threshold, **spec.broker_options})
    start_s, _opened = timed_start(launcher)
    try:
        rss0, fd0 = rss_mib(launcher.pid), open_fds(launcher.pid)
        for api in spec.apis:
            base_api, _, selector = api.partition("-")  # async-sticky: send_async with the sticky selector
            result = run_bench(BenchSpec(mode="produce", servers=launcher.servers, topic=TOPIC, partitions=partitions,
                                         api=base_api, selector=selector or "roundrobin", count=spec.count,
                                         duration_s=spec.duration_s, size=spec.size, batch=spec.batch,
                                         batch_bytes=spec.batch_bytes, concurrency=spec.concurrency,
                                         multi_produce=spec.multi_produce))
            rss1, fd1 = rss_mib(launcher.pid), open_fds(launcher.pid)
            rows.append({"partitions": partitions, "api": api, "msgs_per_s": result.msgs_per_s,
                         "messages": result.messages, "failures": result.failures,
                         "p99_ms": result.latency_ms.get("p99", -1), "rss_start_mib": rss0, "fds_start": fd0,
                         "rss_after_mib": rss1, "fds_after": fd1, "cpu_us_per_msg": result.cpu_us_per_msg})
            report(f"  {partitions:,} partitions, {api}: {result.msgs_per_s:,.0f} msg/s ({result.messages:,} "
                   f"messages, {result.failures} failed); RSS {rss0:.1f} -> {rss1:.1f} MiB, fds {fd0} -> {fd1}")
    finally:
        t_stop = time.perf_counter()
        launcher.stop_or_kill(600)
    stop_s = time.perf_counter() - t_stop
    report(f"  {partitions:,} partitions: a new broker creating them ready in {start_s:.2f}s; clean stop after "
           f"producing {stop_s:.2f}s")
    for row in rows:
        row.update(start_s=start_s, stop_s=stop_s)
    return rows


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


def startup_case(spec: PartitionsSpec, work: Path, report: Report) -> list[dict[str, Any]]:
    partitions = spec.large
    data_dir = work / "startup"
    t0 = time.perf_counter()
    messages, stored = fill(data_dir, partitions, int(spec.fill_bytes), spec.fill_message_bytes)
    report(f"  filled {partitions:,} partitions with {messages:,} messages, {stored / 1e6:,.0f} MB in "
           f"{time.perf_counter() - t0:.1f}s (not measured)")
    rows = []
    launcher = broker(data_dir, partitions, {k: v for k, v in spec.broker_options.items() if k == "maxOpenFiles"})
    for label in ("clean (after the fill)", "clean (after SIGTERM)", "after kill -9"):
        stop_s = None
        if label == "after kill -9":
            launcher.kill()
        elif launcher.running:
            t_stop = time.perf_counter()
            launcher.stop(600)
            stop_s = time.perf_counter() - t_stop
        ready_s, opened_s = timed_start(launcher)
        rss, fds = rss_mib(launcher.pid), open_fds(launcher.pid)
        rows.append({"case": label, "stop_before_s": stop_s, "ready_s": ready_s, "opened_s": opened_s,
                     "rss_mib": rss, "fds": fds})
        report(f"  start {label}: ready in {ready_s:.2f}s (opened in {opened_s:.2f}s), RSS {rss:.1f} MiB, fds {fds}"
               + (f"; the clean stop before it took {stop_s:.2f}s" if stop_s is not None else ""))
    launcher.stop(600)
    return rows


def run(spec: PartitionsSpec, report: Report, work_dir: str | None = None) -> dict[str, Any]:
    produce_rows: list[dict[str, Any]] = []
    startup_rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="metaq-bench-partitions-", dir=work_dir) as tmp:
        work = Path(tmp)
        if spec.produce:
            for partitions in (spec.small, spec.large):
                produce_rows += produce_case(partitions, spec, work, report)
        if spec.fill_bytes > 0:
            startup_rows = startup_case(spec, work, report)
    return {"spec": vars(spec).copy(), "produce": produce_rows, "startup": startup_rows}


def table(result: dict[str, Any]) -> str:
    spec = result["spec"]
    parts = []
    rows = result["produce"]
    if rows:
        base = {r["api"]: r["msgs_per_s"] for r in rows if r["partitions"] == spec["small"]}
        parts.append(markdown_table(
            ["partitions", "api", "msg/s", f"of {spec['small']} partitions", "ack p99 ms", "RSS start -> after MiB",
             "fds start -> after", "new broker ready s", "stop after producing s"],
            [[f"{r['partitions']:,}", r["api"], f"{r['msgs_per_s']:,.0f}",
              share(r["msgs_per_s"], base.get(r["api"], 0)), r["p99_ms"],
              f"{r['rss_start_mib']:.1f} -> {r['rss_after_mib']:.1f}", f"{r['fds_start']} -> {r['fds_after']}",
              f"{r['start_s']:.2f}", f"{r['stop_s']:.2f}"] for r in rows], right=[2, 3, 4, 7, 8]))
        small = [r for r in rows if r["partitions"] == spec["small"]]
        large = [r for r in rows if r["partitions"] == spec["large"]]
        if small and large and spec["large"] > spec["small"]:
            extra = spec["large"] - spec["small"]
            rss_start = (large[0]["rss_start_mib"] - small[0]["rss_start_mib"]) * 1024 / extra
            rss_after = (large[-1]["rss_after_mib"] - small[-1]["rss_after_mib"]) * 1024 / extra
            parts.append(f"Per extra partition: RSS {rss_start:.1f} KiB at start, {rss_after:.1f} KiB after producing.")
    if result["startup"]:
        parts.append(f"Start-up with {spec['large']:,} partitions and {spec['fill_bytes'] / 1e9:.2f} GB:\n\n"
                     + markdown_table(["start", "spawn to ready s", "opened in s", "RSS MiB", "fds"],
                                      [[r["case"], f"{r['ready_s']:.2f}", f"{r['opened_s']:.2f}", f"{r['rss_mib']:.1f}",
                                        r["fds"]] for r in result["startup"]], right=[1, 2, 3, 4]))
    return "\n\n".join(parts)
