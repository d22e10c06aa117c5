"""The dashboard's rolling history without a broker: rates from counter differences over the real
interval, fsync latency of the interval alone, lag per group, and a ring buffer that never grows past
its bound."""

from __future__ import annotations

from typing import Any

import pytest

from metaq.broker.dashboard.history import History
from metaq.broker.metrics import COUNTER_FIELDS, Snapshot
from metaq.broker.stats import LatencyHistogram
from metaq.testing import FakeClock


def counters(put_messages: int, put_bytes: int, get_messages: int = 0, get_bytes: int = 0) -> tuple[int, ...]:
    values = dict.fromkeys(COUNTER_FIELDS, 0)
    values.update(put_messages=put_messages, put_bytes=put_bytes, get_messages=get_messages, get_bytes=get_bytes)
    return tuple(values[f] for f in COUNTER_FIELDS)


def snapshot(rows: list[tuple[str, str, tuple[int, ...]]], fsync: LatencyHistogram,
             group_offsets: list[tuple[str, str, str, int, int]] | None = None) -> Snapshot:
    empty: Any = ([], 0, 0.0)
    return Snapshot(broker_id=0, role="master", data_path="/nonexistent", uptime_s=1.0, connections=0,
                    connections_total=0, connections_refused=0, connections_timed_out=0, partial_frames_refused=0,
                    waiting_fetches=0, waiting_fetches_max=0, counters=rows, logs=[], append=empty, fetch=empty,
                    fsync=fsync.cumulative(), group_offsets=group_offsets or [], group_members=[], replication=[])


def test_rates_are_counter_differences_over_the_elapsed_time() -> None:
    clock, fsync = FakeClock(), LatencyHistogram()
    history = History(None, clock=clock, wall_clock=lambda: 1_700_000_000.0)  # type: ignore[arg-type]
    assert history.sample(snapshot([("t", "0-0", counters(100, 1000))], fsync)) is None  # the baseline
    clock.advance_s(2.0)
    fsync.observe(0.002)
    fsync.observe(0.004)
    lags = [("g", "t", "0-0", 250, 50), ("g", "t", "0-1", 5, 5), ("h", "t", "0-0", 0, 300)]
    sample = history.sample(snapshot([("t", "0-0", counters(300, 5000, 50, 400)), ("t", "0-1", counters(10, 10))],
                                     fsync, lags))
    assert sample is not None
    assert (sample.rates.in_msgs, sample.rates.in_bytes) == (105.0, 2005.0)  # (200 + 10) / 2 s, (4000 + 10) / 2 s
    assert (sample.rates.out_msgs, sample.rates.out_bytes) == (25.0, 200.0)
    assert history.partition_rates[("t", "0-1")].in_msgs == 5.0
    assert sample.fsyncs == 2 and sample.fsync_mean_ms == pytest.approx(3.0)
    assert sample.fsync_max_bucket_ms == 5.0  # the 4 ms fsync fell in the (2.5 ms, 5 ms] bucket
    assert sample.lag == {"g": 55, "h": 300}
    assert sample.to_json()["t"] == 1_700_000_000_000
    clock.advance_s(1.0)  # nothing happened: zero rates, no fsync figure
    quiet = history.sample(snapshot([("t", "0-0", counters(300, 5000, 50, 400))], fsync))
    assert quiet is not None and quiet.rates.in_msgs == 0.0 and quiet.fsync_mean_ms is None


def test_the_ring_buffer_keeps_only_the_newest_samples() -> None:
    clock, fsync = FakeClock(), LatencyHistogram()
    history = History(None, clock=clock, samples_max=5)  # type: ignore[arg-type]
    for i in range(20):
        clock.advance_s(1.0)
        history.sample(snapshot([("t", "0-0", counters(i * 10, i * 100))], fsync))
    assert len(history.samples) == 5
    assert [s.rates.in_msgs for s in history.samples] == [10.0] * 5
    newest = history.samples[-1].t_ms
    assert history.to_json(since_ms=newest)["samples"] == []
