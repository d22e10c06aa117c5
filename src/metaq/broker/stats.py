"""Per topic and partition counters, rates over a sliding window (MetaQ's `stat`), latency histograms.

Everything here is plain Python numbers kept on the hot path at a cost of a few adds per batch; the
Prometheus endpoint (:mod:`metaq.broker.metrics`) and ``metaq stats`` read them when asked.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from metaq import framing

LATENCY_BUCKETS_S: tuple[float, ...] = (0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01,
                                       0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Upper bounds of the latency buckets, seconds: 50 µs (a page-cache append) to 10 s (a stalled disk)."""


class LatencyHistogram:
    """Counts of observed durations per bucket, their sum and count: one bisect and three adds per call.

    Observed once per batch or per fsync, never per message. fsyncs are observed from the flusher's
    worker threads, hence the lock (uncontended on the event loop; an fsync costs far more).
    """

    __slots__ = ("_lock", "bounds", "buckets", "count", "sum_s")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS_S) -> None:
        assert list(bounds) == sorted(bounds), "bucket bounds must increase"
        self.bounds = bounds
        self.buckets = [0] * (len(bounds) + 1)
        """Per bucket (not cumulative); the last one is above every bound (+Inf)."""
        self.count = 0
        self.sum_s = 0.0
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        i = bisect_left(self.bounds, seconds)
        with self._lock:
            self.buckets[i] += 1
            self.count += 1
            self.sum_s += seconds

    def timed(self, fn: Callable[[int], None]) -> Callable[[int], None]:
        """``fn`` (an fsync taking a descriptor) observed on every call, failures included."""

        def call(fd: int) -> None:
            started = time.perf_counter()
            try:
                fn(fd)
            finally:
                self.observe(time.perf_counter() - started)

        return call

    def cumulative(self) -> tuple[list[tuple[float, int]], int, float]:
        """([(upper bound, observations <= it), ..., (inf, count)], count, sum): a consistent copy."""
        with self._lock:
            buckets, count, total = list(self.buckets), self.count, self.sum_s
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), buckets, strict=True):
            running += n
            out.append((bound, running))
        return out, count, total


@dataclass(slots=True)
class PartitionCounters:
    put_requests: int = 0
    put_messages: int = 0
    put_bytes: int = 0
    put_failures: int = 0
    get_requests: int = 0
    get_bytes: int = 0
    get_messages: int = 0
    """Messages in fetch replies, from the offset asked for to the reply's end (a group's server-side
    filter may leave some out of the reply: they are counted)."""
    get_misses: int = 0
    """Fetches that returned nothing (after any long poll)."""
    corrupt_reads: int = 0
    """Fetches answered STORED_DATA_CORRUPT (a damaged stored batch where the fetch started)."""
    duplicates_dropped: int = 0
    """Retried batches of idempotent producers answered with the original's offsets, not stored again."""


class BrokerStats:
    """Counters are plain integer adds on the hot path; rates are computed only when asked."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.started_s = clock()
        self.counters: dict[tuple[str, int], PartitionCounters] = {}
        self._window: tuple[float, dict[tuple[str, int], tuple[int, int, int]]] = (self.started_s, {})
        self.connections = 0
        self.connections_total = 0
        self.connections_refused = 0
        """Refused for maxConnections."""
        self.connections_timed_out = 0
        """Closed by connectionIdleTimeoutSeconds or connectionHandshakeTimeoutSeconds."""
        self.partial_frame_bytes = 0
        """Bytes of unfinished request frames buffered now (bounded by maxPartialFramesSize)."""
        self.partial_frames_refused = 0
        """Requests refused because maxPartialFramesSize was reached while they arrived."""
        self.append_seconds = LatencyHistogram()
        """Time to check and write one produce batch (not the wait for its fsync)."""
        self.fetch_seconds = LatencyHistogram()
        """Time to find a fetch reply's batches in the log (not the long-poll wait, nor reading or sending them)."""
        self.fsync_seconds = LatencyHistogram()
        """Each sync of the partition logs (segment data, indexes, directories, and syncfs rounds)."""
        self.delayed: Callable[[], dict[str, Any]] | None = None
        """The delay store's state for the snapshot (docs/delayed.md), once the broker has one."""
        self.transactions: Callable[[], dict[str, Any] | None] | None = None
        """The transactions' counts (docs/transactions.md), once the transaction log is open."""
        self.durability: Callable[[], dict[str, Any] | None] | None = None
        """How the data directory's flushes are made durable (LogManager.describe_syncs), once it is open."""

    def partition(self, topic: str, partition: int) -> PartitionCounters:
        key = (topic, partition)
        c = self.counters.get(key)
        if c is None:
            c = self.counters[key] = PartitionCounters()
        return c

    def forget_topic(self, topic: str) -> None:
        for key in [k for k in self.counters if k[0] == topic]:
            del self.counters[key]

    def roll_window(self) -> None:
        """Start a new rate window (called periodically by the broker)."""
        snap = {k: (c.put_messages, c.put_bytes, c.get_bytes) for k, c in self.counters.items()}
        self._window = (self._clock(), snap)

    def snapshot(self, topic: str | None = None) -> dict[str, Any]:
        now = self._clock()
        since, base = self._window
        elapsed = max(now - since, 1e-9)
        topics: dict[str, Any] = {}
        for (t, p), c in sorted(self.counters.items()):
            if topic is not None and t != topic:
                continue
            m0, b0, g0 = base.get((t, p), (0, 0, 0))
            entry = asdict(c)
            entry["put_tps"] = round((c.put_messages - m0) / elapsed, 1)
            entry["put_bytes_per_s"] = round((c.put_bytes - b0) / elapsed, 1)
            entry["get_bytes_per_s"] = round((c.get_bytes - g0) / elapsed, 1)
            tstats = topics.setdefault(t, {"partitions": {}, "put_messages": 0, "put_bytes": 0,
                                           "get_requests": 0, "get_bytes": 0, "get_messages": 0,
                                           "put_tps": 0.0})
            tstats["partitions"][str(p)] = entry
            tstats["put_messages"] += c.put_messages
            tstats["put_bytes"] += c.put_bytes
            tstats["get_requests"] += c.get_requests
            tstats["get_bytes"] += c.get_bytes
            tstats["get_messages"] += c.get_messages
            tstats["put_tps"] = round(tstats["put_tps"] + entry["put_tps"], 1)
        return {"uptime_s": round(now - self.started_s, 3), "rate_window_s": round(elapsed, 3),
                "connections": self.connections, "connections_total": self.connections_total,
                "connections_refused": self.connections_refused, "connections_timed_out": self.connections_timed_out,
                "partial_frame_bytes": self.partial_frame_bytes, "partial_frames_refused": self.partial_frames_refused,
                "latency": {name: {"count": h.count, "sum_s": round(h.sum_s, 6)} for name, h in
                            (("append", self.append_seconds), ("fetch", self.fetch_seconds),
                             ("fsync", self.fsync_seconds))},
                "topics": topics, "stores": framing.DAMAGE.snapshot(),
                **({"delayed": self.delayed()} if self.delayed is not None else {}),
                **({"transactions": tx} if self.transactions is not None and (tx := self.transactions()) else {}),
                **({"durability": d} if self.durability is not None and (d := self.durability()) else {})}
