"""Per topic and partition counters, and rates over a sliding window (MetaQ's `stat`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(slots=True)
class PartitionCounters:
    put_requests: int = 0
    put_messages: int = 0
    put_bytes: int = 0
    put_failures: int = 0
    get_requests: int = 0
    get_bytes: int = 0
    get_misses: int = 0
    """Fetches that returned nothing (after any long poll)."""
    corrupt_reads: int = 0
    """Fetches answered STORED_DATA_CORRUPT (a damaged stored batch where the fetch started)."""


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
                                           "get_requests": 0, "get_bytes": 0, "put_tps": 0.0})
            tstats["partitions"][str(p)] = entry
            tstats["put_messages"] += c.put_messages
            tstats["put_bytes"] += c.put_bytes
            tstats["get_requests"] += c.get_requests
            tstats["get_bytes"] += c.get_bytes
            tstats["put_tps"] = round(tstats["put_tps"] + entry["put_tps"], 1)
        return {"uptime_s": round(now - self.started_s, 3), "rate_window_s": round(elapsed, 3),
                "connections": self.connections, "connections_total": self.connections_total,
                "connections_refused": self.connections_refused, "connections_timed_out": self.connections_timed_out,
                "partial_frame_bytes": self.partial_frame_bytes, "partial_frames_refused": self.partial_frames_refused,
                "topics": topics}
