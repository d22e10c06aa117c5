"""The dashboard's rolling history: one sample a second, the last ten minutes, in a bounded ring buffer.

The broker counts as it always does (:mod:`metaq.broker.stats`: plain adds per batch); the sampler
reads those counters once a second on the event loop and keeps the differences, so rates cost the
produce and fetch paths nothing and a broker whose dashboard is off pays nothing at all. The same
pass keeps each partition's latest rates (what the topics view shows) and each group's total lag.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from metaq.broker.metrics import COUNTER_FIELDS, Cumulative, Snapshot, take_snapshot

if TYPE_CHECKING:
    from metaq.broker.core import Broker

log = logging.getLogger("metaq.broker.dashboard")

SAMPLE_INTERVAL_S = 1.0
HISTORY_SAMPLES_MAX = 600
"""Ten minutes at one sample a second: the ring buffer never holds more."""
GROUPS_IN_HISTORY_MAX = 50
"""Groups whose lag each sample keeps (the largest lags first): a bound on a sample's size."""

_PUT_MSGS, _PUT_BYTES = COUNTER_FIELDS.index("put_messages"), COUNTER_FIELDS.index("put_bytes")
_GET_MSGS, _GET_BYTES = COUNTER_FIELDS.index("get_messages"), COUNTER_FIELDS.index("get_bytes")


@dataclass
class Rates:
    """Per second over the last sampling interval."""

    in_msgs: float = 0.0
    in_bytes: float = 0.0
    out_msgs: float = 0.0
    out_bytes: float = 0.0

    def to_json(self) -> dict[str, float]:
        return {"in_msg_s": round(self.in_msgs, 1), "in_bytes_s": round(self.in_bytes, 1),
                "out_msg_s": round(self.out_msgs, 1), "out_bytes_s": round(self.out_bytes, 1)}


@dataclass
class Sample:
    t_ms: int
    """Wall clock, ms since the epoch (what the browser draws its time axis with)."""
    rates: Rates
    fsyncs: int
    """fsyncs during the interval."""
    fsync_mean_ms: float | None
    fsync_max_bucket_ms: float | None
    """Upper bound of the slowest latency bucket that saw an fsync during the interval (None: none did)."""
    lag: dict[str, int] = field(default_factory=dict)
    """group -> messages behind, over this broker's partitions."""

    def to_json(self) -> dict[str, Any]:
        return {"t": self.t_ms, **self.rates.to_json(), "fsyncs": self.fsyncs, "fsync_mean_ms": self.fsync_mean_ms,
                "fsync_max_ms": self.fsync_max_bucket_ms, "lag": self.lag}


def _fsync_delta(before: Cumulative | None, after: Cumulative) -> tuple[int, float | None, float | None]:
    buckets, count, total = after
    if before is None:
        return 0, None, None
    old_buckets, old_count, old_total = before
    n = count - old_count
    if n <= 0:
        return 0, None, None
    slowest = None
    previous_new = previous_old = 0
    for (bound, cum_new), (_b, cum_old) in zip(buckets, old_buckets, strict=True):
        if (cum_new - previous_new) - (cum_old - previous_old) > 0:
            slowest = bound
        previous_new, previous_old = cum_new, cum_old
    max_ms = None if slowest is None or slowest == float("inf") else slowest * 1000
    return n, round((total - old_total) / n * 1000, 3), max_ms


class History:
    """Samples the broker every second while the dashboard serves; ``latest`` is the newest snapshot."""

    def __init__(self, broker: Broker, *, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time, samples_max: int = HISTORY_SAMPLES_MAX) -> None:
        self.broker = broker
        self.samples: deque[Sample] = deque(maxlen=samples_max)
        self.partition_rates: dict[tuple[str, str], Rates] = {}
        """(topic, brokerId-partition) -> its rates over the last interval."""
        self.rates = Rates()
        """The whole broker's rates over the last interval."""
        self._clock = clock
        self._wall_clock = wall_clock
        self._previous: tuple[float, dict[tuple[str, str], tuple[int, ...]], Cumulative] | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="metaq-dashboard-history")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            try:
                self.sample(take_snapshot(self.broker))
            except Exception:  # a broker mid-change (a topic being deleted): the next second will do
                log.warning("dashboard: cannot sample the broker", exc_info=True)
            await asyncio.sleep(SAMPLE_INTERVAL_S)

    def sample(self, snap: Snapshot) -> Sample | None:
        """Add one sample from ``snap`` (the first call only sets the baseline: rates need two)."""
        now = self._clock()
        counters = {(topic, label): values for topic, label, values in snap.counters}
        previous, self._previous = self._previous, (now, counters, snap.fsync)
        if previous is None:
            return None
        then, old_counters, old_fsync = previous
        elapsed = max(now - then, 1e-3)
        total = Rates()
        rates: dict[tuple[str, str], Rates] = {}
        for key, values in counters.items():
            old = old_counters.get(key)
            if old is None:
                old = (0,) * len(values)
            r = Rates(in_msgs=max(values[_PUT_MSGS] - old[_PUT_MSGS], 0) / elapsed,
                      in_bytes=max(values[_PUT_BYTES] - old[_PUT_BYTES], 0) / elapsed,
                      out_msgs=max(values[_GET_MSGS] - old[_GET_MSGS], 0) / elapsed,
                      out_bytes=max(values[_GET_BYTES] - old[_GET_BYTES], 0) / elapsed)
            rates[key] = r
            total.in_msgs += r.in_msgs
            total.in_bytes += r.in_bytes
            total.out_msgs += r.out_msgs
            total.out_bytes += r.out_bytes
        self.partition_rates, self.rates = rates, total
        lag: dict[str, int] = {}
        for group, _topic, _label, _offset, behind in snap.group_offsets:
            lag[group] = lag.get(group, 0) + behind
        if len(lag) > GROUPS_IN_HISTORY_MAX:
            lag = dict(sorted(lag.items(), key=lambda kv: -kv[1])[:GROUPS_IN_HISTORY_MAX])
        fsyncs, mean_ms, max_ms = _fsync_delta(old_fsync, snap.fsync)
        sample = Sample(int(self._wall_clock() * 1000), total, fsyncs, mean_ms, max_ms, lag)
        self.samples.append(sample)
        return sample

    def to_json(self, since_ms: int = 0) -> dict[str, Any]:
        return {"interval_s": SAMPLE_INTERVAL_S, "samples_max": self.samples.maxlen,
                "samples": [s.to_json() for s in self.samples if s.t_ms > since_ms]}
