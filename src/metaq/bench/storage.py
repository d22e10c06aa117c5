"""`metaq bench storage`: appends and reads of metaq.storage in process under each flush mode, beside the raw
disk's own figures in the same run.

Batches are 100 messages of 100 bytes, built once with ``records.encode_values`` and validated once
(the broker validates each produce request itself; this measures the storage engine). Each mode runs
for ``--seconds`` or ``--max-batches``, whichever ends first. For comparison the same run measures the
disk: ``dd oflag=dsync`` with the batch size, and a Python loop of write + fdatasync.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from metaq.bench.report import Report, markdown_table
from metaq.protocol.records import encode_values, validate_batch
from metaq.storage import LogConfig, LogManager

MESSAGES_PER_BATCH = 100
MESSAGE_BYTES = 100


class CountingSync:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, fd: int) -> None:
        self.calls += 1
        os.fdatasync(fd)


def _batch() -> tuple[bytes, Any]:
    batch = encode_values([bytes([65 + i % 26]) * MESSAGE_BYTES for i in range(MESSAGES_PER_BATCH)],
                          int(time.time() * 1000))
    return batch, validate_batch(batch, 1 << 20, 1 << 24)


def _result(mode: str, batches: int, elapsed_s: float, batch_bytes: int, syncs: int | None = None,
            **extra: Any) -> dict[str, Any]:
    row = {
        "mode": mode,
        "batches": batches,
        "seconds": round(elapsed_s, 3),
        "appends_per_s": round(batches / elapsed_s, 1),
        "messages_per_s": round(batches * MESSAGES_PER_BATCH / elapsed_s, 1),
        "mb_per_s": round(batches * batch_bytes / elapsed_s / 1e6, 1),
    }
    if syncs is not None:
        row["fdatasyncs"] = syncs
    row.update(extra)
    return row


def bench_appends(root: Path, mode: str, threshold: int, threads: int, window: int, seconds: float,
                  max_batches: int) -> dict[str, Any]:
    """``threads`` appenders, each on its own partition, each keeping ``window`` acks outstanding."""
    batch, header = _batch()
    sync = CountingSync()
    config = LogConfig(unflush_threshold=threshold, unflush_interval_ms=10_000)
    directory = root / mode.replace(" ", "_").replace(",", "").replace("=", "")
    manager = LogManager(directory, 1, config, sync=sync).open()
    logs = [manager.get_or_create("bench", p) for p in range(threads)]
    counts = [0] * threads
    per_thread = max_batches // threads
    start_gate = threading.Barrier(threads + 1)
    stop_at = [0.0]

    def run(index: int) -> None:
        log = logs[index]
        outstanding: deque[Future[None]] = deque()
        start_gate.wait()
        n = 0
        while n < per_thread and (n % 64 or time.perf_counter() < stop_at[0]):
            result = log.append(batch, header)
            if result.wait_for_durable:
                outstanding.append(result.durable)
                if len(outstanding) >= window:
                    outstanding.popleft().result()
            n += 1
        for future in outstanding:
            future.result()
        counts[index] = n

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    begin = time.perf_counter()
    stop_at[0] = begin + seconds
    start_gate.wait()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - begin
    total = sum(counts)
    rounds = manager.flusher.rounds
    manager.close()
    return _result(mode, total, elapsed, len(batch), sync.calls, threads=threads, window=window,
                   flusher_rounds=rounds)


def bench_reads(root: Path, seconds: float, max_bytes: int = 1 << 20) -> list[dict[str, Any]]:
    """Sequential reads of a ~256 MB partition from the page cache: read_bytes, and sendfile."""
    batch, header = _batch()
    manager = LogManager(root / "reads", 1, LogConfig(unflush_threshold=100_000), sync=lambda fd: None).open()
    log = manager.get_or_create("bench", 0)
    target = 256 * 1024 * 1024 // len(batch)
    for _ in range(target):
        log.append(batch, header)
    log.flush()
    rows = []
    for how in ("read_bytes", "sendfile"):
        sink = os.open(os.devnull, os.O_WRONLY)
        moved = 0
        begin = time.perf_counter()
        try:
            while time.perf_counter() - begin < seconds:
                offset = log.log_start_offset
                while offset < log.log_end_offset:
                    with log.read(offset, max_bytes) as piece:
                        if how == "read_bytes":
                            moved += len(piece.read_bytes())
                        else:
                            moved += piece.send_to(sink)
                        offset = piece.next_offset
                if time.perf_counter() - begin >= seconds:
                    break
        finally:
            os.close(sink)
        elapsed = time.perf_counter() - begin
        rows.append({"mode": f"read ({how}, {max_bytes >> 10} KiB per read)", "seconds": round(elapsed, 3),
                     "mb_per_s": round(moved / elapsed / 1e6, 1), "bytes": moved})
    manager.close()
    return rows


def bench_dd(root: Path, batch_bytes: int, count: int) -> dict[str, Any]:
    """``dd oflag=dsync``: one synchronous write per batch, the disk's floor for fsync-per-ack."""
    target = root / "dd.out"
    if shutil.which("dd") is None:
        return {"mode": "dd oflag=dsync", "error": "dd not found"}
    command = ["dd", "if=/dev/zero", f"of={target}", f"bs={batch_bytes}", f"count={count}", "oflag=dsync"]
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    target.unlink(missing_ok=True)
    match = re.search(r"copied, ([\d.,]+) s", proc.stderr)
    if proc.returncode or match is None:
        return {"mode": "dd oflag=dsync", "error": proc.stderr.strip()[-200:]}
    elapsed = float(match.group(1).replace(",", "."))
    return {**_result("dd oflag=dsync (raw disk)", count, elapsed, batch_bytes), "command": " ".join(command)}


def bench_python_fdatasync(root: Path, batch_bytes: int, seconds: float, max_count: int) -> dict[str, Any]:
    data = b"x" * batch_bytes
    fd = os.open(root / "py.out", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    n = 0
    begin = time.perf_counter()
    try:
        while n < max_count and time.perf_counter() - begin < seconds:
            os.write(fd, data)
            os.fdatasync(fd)
            n += 1
    finally:
        os.close(fd)
        os.unlink(root / "py.out")
    return _result("python write+fdatasync (raw disk)", n, time.perf_counter() - begin, batch_bytes)


def filesystem(path: Path) -> str:
    proc = subprocess.run(["df", "-T", str(path)], capture_output=True, text=True, check=False)
    lines = proc.stdout.strip().splitlines()
    return lines[-1].split()[1] if len(lines) > 1 else "unknown"


def run(seconds: float, max_batches: int, group_threads: int, report: Report, work_dir: str | None = None
        ) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="metaq-bench-storage-", dir=work_dir))
    try:
        return _run(seconds, max_batches, root, group_threads, report)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _run(seconds: float, max_batches: int, root: Path, group_threads: int, report: Report) -> dict[str, Any]:
    batch, _ = _batch()
    modes: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("threshold=1", lambda: bench_appends(root, "unflushThreshold=1 (fsync per append)", 1, 1, 1,
                                              seconds, max_batches)),
        ("threshold=1, pipelined", lambda: bench_appends(root, "unflushThreshold=1, 4 threads x 16 in flight",
                                                         1, 4, 16, seconds, max_batches)),
        ("threshold=1000", lambda: bench_appends(root, "unflushThreshold=1000, interval 10 s", 1000, 1, 1,
                                                 seconds, max_batches)),
        ("group commit", lambda: bench_appends(root, f"group commit, {group_threads} threads x 64 in flight",
                                               0, group_threads, 64, seconds, max_batches)),
    ]
    rows = []
    for name, fn in modes:
        rows.append(fn())
        report(f"{name}: {rows[-1].get('messages_per_s', 0):,.0f} msg/s")
    rows.extend(bench_reads(root, seconds))
    rows.append(bench_dd(root, len(batch), min(max_batches, 2000)))
    rows.append(bench_python_fdatasync(root, len(batch), seconds, max_batches))
    return {"batch_bytes": len(batch), "messages_per_batch": MESSAGES_PER_BATCH, "message_bytes": MESSAGE_BYTES,
            "filesystem": filesystem(root), "results": rows}


def table(result: dict[str, Any]) -> str:
    rows = []
    for row in result["results"]:
        if "error" in row:
            rows.append([row["mode"], f"error: {row['error']}", "", "", ""])
            continue
        rows.append([row["mode"], f"{row['appends_per_s']:,.0f}" if "appends_per_s" in row else "",
                     f"{row['messages_per_s']:,.0f}" if "messages_per_s" in row else "", f"{row['mb_per_s']:,.1f}",
                     row.get("fdatasyncs", "")])
    return (f"Batches of {result['messages_per_batch']} x {result['message_bytes']} B = {result['batch_bytes']:,} "
            f"bytes, {result['filesystem']}; the raw disk's rows (dd, Python) are the same-run baseline:\n\n"
            + markdown_table(["mode", "appends/s", "messages/s", "MB/s", "fdatasyncs"], rows, right=[1, 2, 3, 4]))
