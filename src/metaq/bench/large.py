"""`metaq bench large`: large messages (1 MB by default) read through the broker, beside the machine's own copy of the
same files over loopback (``sendfile``, and ``pread`` + ``send``), in the same run.

For each broker event loop asked for (a fresh broker each, group commit, one topic of ``partitions`` partitions):

- the consumer of `metaq bench consume`: ``count`` messages of ``size`` bytes are produced with ``send_batch``
  (not measured), then one consumer process reads them back from the first offset, every record checked (CRC):
  MB/s of payload. ``api`` ``fetch``: ``Fetcher.fetch`` in a loop, one fetch of max_bytes 1 MiB per request and
  one in flight per partition; ``iterate``: ``PullConsumer.iterate`` (a Message at a time; it sends the next
  fetch before handing out a reply); ``columns``: ``iterate_columns`` (payloads as views of the reply);
- the same messages through the broker by the blocking client's raw Fetch (a thread per partition, nothing
  decoded or checked): the broker and the socket without the consumer's per-record work;
- the baselines, on the same segment files (in the page cache, as the consumer read them): pushed to a receiver
  process over loopback TCP with ``os.sendfile`` (the broker's reply path without protocol or client), and with
  ``pread`` + ``sendall`` (what the broker does under uvloop, which has no loop.sendfile), 1 MiB per call.

The broker's resident set is given idle and after the consume, with the CPU seconds and minor page faults it
spent on the produce and the consume. ``malloc_env`` puts glibc's ``MALLOC_MMAP_THRESHOLD_`` and
``MALLOC_TRIM_THRESHOLD_`` into the environment of the broker, the consumer, both or neither (this process's own
are not passed on); ``tune_allocator`` has the consumer call ``metaq.tune_allocator()``.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metaq.bench.baselines import raw_fetch, send_files
from metaq.bench.client_bench import BenchSpec, run_bench
from metaq.bench.processes import minor_faults, process_cpu_s, rss_mib
from metaq.bench.report import Report, markdown_table, share
from metaq.broker.launcher import BrokerLauncher

TOPIC = "large"
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "134217728"}
"""glibc's heap tuning by environment (``malloc_env``): read once, at a process's start."""


@dataclass
class LargeSpec:
    count: int = 1000
    size: int = 1_000_000
    partitions: int = 1
    batch: int = 4
    """Messages per send_batch call of the preload."""
    concurrency: int = 2
    """send_batch calls in flight (preload)."""
    duration_s: float = 120.0
    """Upper bound of each phase."""
    api: str = "fetch"
    loops: list[str] = field(default_factory=lambda: ["uvloop", "asyncio"])
    baselines: list[str] = field(default_factory=lambda: ["sendfile", "pread"])
    raw: bool = True
    malloc_env: str = "none"
    tune_allocator: bool = False
    broker_options: dict[str, str] = field(default_factory=dict)


def run_case(loop: str, spec: LargeSpec, work: Path, report: Report) -> dict[str, Any]:
    data_dir = work / f"data-{loop}"
    options: dict[str, Any] = {"unflushThreshold": 0, "maxTransferSize": 1 << 20, "event-loop": loop,
                               **spec.broker_options}
    config = f"[system]\nnumPartitions=1\n\n[topic={TOPIC}]\nnumPartitions={spec.partitions}\n"
    row: dict[str, Any] = {"loop": loop}
    broker_env = MALLOC_ENV if spec.malloc_env in ("broker", "both") else {}
    consumer_env = MALLOC_ENV if spec.malloc_env in ("consumer", "both") else {}
    saved = {key: os.environ.pop(key) for key in MALLOC_ENV if key in os.environ}  # passed on only where asked
    try:
        with BrokerLauncher(data_dir, options, config_text=config, ready_timeout_s=120, env=broker_env) as launcher:
            row["rss_idle_mib"] = rss_mib(launcher.pid)
            bench = BenchSpec(mode="consume", servers=launcher.servers, topic=TOPIC, partitions=spec.partitions,
                              size=spec.size, count=spec.count, batch=spec.batch, concurrency=spec.concurrency,
                              duration_s=spec.duration_s, api=spec.api, tune_allocator=spec.tune_allocator)
            report(f"[{loop}] produce {spec.count} x {spec.size:,} B (not measured), then consume ...")
            os.environ.update(consumer_env)  # the spawned consumer process inherits it
            cpu_before, faults_before = process_cpu_s(launcher.pid) or 0.0, minor_faults(launcher.pid)
            try:
                result = run_bench(bench)
            finally:
                for key in consumer_env:
                    os.environ.pop(key, None)
            row["rss_after_mib"] = rss_mib(launcher.pid)
            # the produce (preload) and the consume together: the broker's share of a run
            row["broker_cpu_s"] = (process_cpu_s(launcher.pid) or 0.0) - cpu_before
            row["broker_faults"] = minor_faults(launcher.pid) - faults_before
            row.update(consume_mb_s=result.mb_per_s, messages=result.messages, consume_s=result.seconds)
            report(f"[{loop}] consume: {result.messages} messages, {result.bytes / 1e6:,.0f} MB of payload in "
                   f"{result.seconds:.2f}s: {result.mb_per_s:,.1f} MB/s")
            raw = raw_fetch(launcher.servers, TOPIC, spec.partitions, spec.duration_s) if spec.raw else {"mb_s": 0.0}
            row["raw_mb_s"] = raw["mb_s"]
            if spec.raw:
                report(f"[{loop}] raw fetch of the same (records not decoded): {raw['mb_s']:,.1f} MB/s")
    finally:
        os.environ.update(saved)
    files = sorted(data_dir.glob(f"{TOPIC}-*/*.log"))
    for how in spec.baselines:
        nbytes, seconds = send_files(files, how, spec.duration_s)
        row[f"{how}_mb_s"] = nbytes / seconds / 1e6
        report(f"[{loop}] raw {how} of the same {len(files)} segment files: {nbytes / 1e6:,.0f} MB in "
               f"{seconds:.2f}s = {nbytes / seconds / 1e6:,.1f} MB/s")
    return row


def run(spec: LargeSpec, report: Report, work_dir: str | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="metaq-bench-large-", dir=work_dir) as tmp:
        rows = [run_case(loop, spec, Path(tmp), report) for loop in spec.loops]
    return {"count": spec.count, "size": spec.size, "partitions": spec.partitions, "api": spec.api,
            "malloc_env": spec.malloc_env, "tune_allocator": spec.tune_allocator, "runs": rows}


def table(result: dict[str, Any]) -> str:
    rows = []
    for r in result["runs"]:
        sf = r.get("sendfile_mb_s", 0.0)
        rows.append([r["loop"], f"{r['consume_mb_s']:,.1f}", f"{r['raw_mb_s']:,.1f}", f"{sf:,.1f}",
                     share(r["consume_mb_s"], sf), f"{r.get('pread_mb_s', 0.0):,.1f}",
                     f"{r['rss_idle_mib']:.0f} / {r['rss_after_mib']:.0f}", f"{r['broker_cpu_s']:.2f}",
                     f"{r['broker_faults']:,}"])
    tuned = ", the consumer calls tune_allocator()" if result["tune_allocator"] else ""
    return (f"{result['count']} messages of {result['size']:,} B, {result['partitions']} partition(s), consumer "
            f"--api {result['api']}, malloc env {result['malloc_env']}{tuned}; MB/s of 10^6 B:\n\n"
            + markdown_table(["broker loop", "consume MB/s", "raw fetch MB/s", "sendfile MB/s (baseline)",
                              "consume / sendfile", "pread + send MB/s", "broker RSS MiB idle / after",
                              "broker CPU s", "broker minor faults"], rows, right=[1, 2, 3, 4, 5, 7, 8]))
