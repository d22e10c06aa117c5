"""What the demo prints: the live table of finished windows, and the final check of both sinks.

Everything here is plain Python over plain rows (dicts with the columns of
``metaq.spark.pipeline.AGGREGATE_SCHEMA``), so it is testable without Spark.

**End-to-end delay** of a window, as the demo reports it: the time its aggregate row appeared in the
aggregates topic (the broker's append time of the message) minus the latest event time in the window
(``max_event_ts``: the wall-clock time, taken by the generator just before the logging call, of the
window's last request). It covers the handler's queue, the broker, Spark's trigger, the watermark
wait, the aggregation and the metaq sink. With append output a window can only be written once the
watermark has passed its end, so the watermark delay is a floor of it.
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from metaq.types import PartitionId

Row = Mapping[str, Any]

_print_lock = threading.Lock()


def say(text: str = "", out: TextIO | None = None) -> None:
    """Print a line at once; the live table and the status lines come from different threads."""
    with _print_lock:
        stream = out or sys.stdout
        stream.write(text + "\n")
        stream.flush()


def epoch(value: Any) -> float:
    """A timestamp as seconds since the epoch, from a datetime (naive: local, as PySpark gives) or ISO text."""
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, str):
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return float(value)


def clock(ts: float) -> str:
    return datetime.fromtimestamp(ts).strftime("%H:%M:%S")


@dataclass
class WindowSummary:
    """All aggregate rows of one window."""

    start: float
    end: float
    total: Row | None = None
    by_status: dict[int, Row] = field(default_factory=dict)
    by_endpoint: dict[str, Row] = field(default_factory=dict)
    written_at: float | None = None

    def add(self, row: Row, written_at: float | None = None) -> None:
        kind = row["kind"]
        if kind == "window":
            self.total = row
        elif kind == "status":
            self.by_status[int(row["status"])] = row
        elif kind == "endpoint":
            self.by_endpoint[str(row["endpoint"])] = row
        if written_at is not None:
            self.written_at = max(self.written_at or 0.0, written_at)

    @property
    def requests(self) -> int:
        return int(self.total["requests"]) if self.total else sum(int(r["requests"]) for r in self.by_status.values())

    @property
    def errors(self) -> int:
        return int(self.total["errors"]) if self.total else 0

    @property
    def delay(self) -> float | None:
        if self.total is None or self.written_at is None or self.total.get("max_event_ts") is None:
            return None
        return self.written_at - float(self.total["max_event_ts"])


def group_windows(rows: Iterable[Row], written_at_key: str | None = "written_at") -> list[WindowSummary]:
    """Rows -> one WindowSummary per window, in time order."""
    windows: dict[float, WindowSummary] = {}
    for row in rows:
        start = epoch(row["window_start"])
        ws = windows.get(start)
        if ws is None:
            ws = windows[start] = WindowSummary(start, epoch(row["window_end"]))
        written = row.get(written_at_key) if written_at_key else None
        ws.add(row, epoch(written) if written is not None else None)
    return [windows[k] for k in sorted(windows)]


HEADER = (f"{'window':<17} {'requests':>8} {'5xx':>5} {'err%':>6} {'p95 ms':>8} {'delay':>6}  "
          "slowest endpoints by p95 (ms)")


def window_line(ws: WindowSummary, top: int = 3, closed_early: bool = False) -> str:
    total = ws.total or {}
    rate = ws.errors / ws.requests if ws.requests else 0.0
    p95 = total.get("p95_latency_ms")
    slow = sorted(ws.by_endpoint.values(), key=lambda r: -float(r["p95_latency_ms"] or 0))[:top]
    endpoints = "  ".join(f"{r['endpoint']} {float(r['p95_latency_ms']):,.0f}" for r in slow)
    delay = " final" if closed_early else f"{ws.delay:5.1f}s" if ws.delay is not None else "     -"
    p95_text = f"{float(p95):8.1f}" if p95 is not None else f"{'-':>8}"
    return (f"{clock(ws.start)}-{clock(ws.end)} {ws.requests:>8,} {ws.errors:>5,} {rate:>6.1%} {p95_text} {delay}  "
            f"{endpoints}")


def status_line(ws: WindowSummary, top: int = 6) -> str:
    counts = sorted(ws.by_status.items(), key=lambda kv: -int(kv[1]["requests"]))
    shown = "  ".join(f"{status}:{int(r['requests']):,}" for status, r in counts[:top])
    rest = sum(int(r["requests"]) for _, r in counts[top:])
    return f"{'':17}   status {shown}" + (f"  other:{rest:,}" if rest else "")


class LivePrinter:
    """The archive query's callback: prints each window once, when its rows reach the aggregates topic."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out
        self.windows_printed = 0
        self.shutdown_at: float | None = None
        """When the demo began to wind down: windows written later were closed by the punctuation
        record, not by the watermark, so their delay is not shown."""
        self._header_done = False

    def __call__(self, batch_id: int, rows: list[dict[str, Any]]) -> None:
        windows = group_windows(rows)
        if not windows:
            return
        if not self._header_done:
            say("", self.out)
            say(HEADER, self.out)
            self._header_done = True
        for ws in windows:
            closed_early = self.shutdown_at is not None and (ws.written_at or 0) >= self.shutdown_at
            say(window_line(ws, closed_early=closed_early), self.out)
            say(status_line(ws), self.out)
            self.windows_printed += 1


# -- reading the sinks back ------------------------------------------------------------------------

@dataclass
class TopicReadBack:
    rows: list[dict[str, Any]]
    messages: int
    duplicates: int
    keys: set[str]


def read_topic(servers: str, topic: str, start_offsets: Mapping[PartitionId, int]) -> TopicReadBack:
    """Every aggregate message written since ``start_offsets``, de-duplicated by key (at-least-once sink).

    ``written_at`` of each row is the broker's append time of its message.
    """
    from metaq.client import connect

    rows: dict[str, dict[str, Any]] = {}
    messages = 0
    with connect(servers) as session:
        consumer = session.create_pull_consumer()
        for p in session.partitions(topic):
            start = start_offsets.get(p.id, 0)
            for m in consumer.iterate(topic, p, start, stop_at_end=True):
                messages += 1
                key = (m.key or b"").decode()
                row = json.loads(m.data)
                row["written_at"] = m.append_time_ms / 1000
                rows.setdefault(key, row)
    return TopicReadBack(list(rows.values()), messages, messages - len(rows), set(rows))


@dataclass
class ParquetReadBack:
    rows: list[dict[str, Any]]
    files: int
    keys: set[str]


def read_parquet(directory: str | Path) -> ParquetReadBack:
    """The archive's Parquet files, read with pyarrow (no Spark), one row per aggregate."""
    import pyarrow.dataset as ds

    path = Path(directory)
    if not path.exists():
        return ParquetReadBack([], 0, set())
    dataset = ds.dataset(str(path), format="parquet", partitioning="hive")
    rows = dataset.to_table().to_pylist()
    return ParquetReadBack(rows, len(dataset.files), {str(r["key"]) for r in rows})


def delay_stats(windows: Iterable[WindowSummary], written_before: float | None = None) -> dict[str, float] | None:
    """min / median / p95 / max of the windows' delays (only windows written before ``written_before``)."""
    delays = sorted(ws.delay for ws in windows
                    if ws.delay is not None and (written_before is None or (ws.written_at or 0) < written_before))
    if not delays:
        return None
    return {"count": len(delays), "min": delays[0], "median": statistics.median(delays),
            "p95": delays[min(len(delays) - 1, round(0.95 * (len(delays) - 1)))], "max": delays[-1]}


def by_kind(rows: Iterable[Row]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for r in rows:
        counts[str(r["kind"])] += 1
    return dict(sorted(counts.items()))


# -- the self-check --------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunTotals:
    """What one demo run generated, what Spark read, and what the sinks hold: the self-check's input."""

    requests: int
    """access events the generator logged (each must be counted in exactly one window)"""
    counted: int
    """requests counted over the windows read back from the aggregates topic"""
    spark_rows: int
    """events query 'aggregate' read"""
    spark_batches: int
    """its micro-batches"""
    parquet_same: bool
    """the archive's Parquet rows are the aggregates topic's rows"""


def self_check(t: RunTotals) -> list[str]:
    """The demo's PROBLEM lines; none means every check passed. A run that saw nothing fails: no request
    generated, or Spark read nothing, is a problem, not an empty success."""
    problems = []
    if t.requests == 0:
        problems.append("the generator logged no request: nothing was checked")
    if t.spark_batches == 0 or t.spark_rows == 0:
        problems.append(f"Spark processed nothing: query 'aggregate' read {t.spark_rows:,} events in "
                        f"{t.spark_batches} micro-batches (a saturated machine? see docs/demo.md)")
    if t.counted < t.requests:
        problems.append(f"{t.requests - t.counted:,} of {t.requests:,} generated request(s) are missing from "
                        "the aggregates")
    elif t.counted > t.requests:
        problems.append(f"the aggregates count {t.counted - t.requests:,} request(s) more than the "
                        f"{t.requests:,} generated")
    if not t.parquet_same:
        problems.append("the Parquet rows differ from the aggregates topic")
    return problems
