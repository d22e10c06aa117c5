"""The pieces behind /metrics and closed partitions that can be checked without a broker process: the
latency histogram's buckets, the exposition of a snapshot, and the partition state file."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from metaq.broker.metrics import Snapshot, render
from metaq.broker.partition_state import FILE_NAME, PartitionStateStore
from metaq.broker.stats import LatencyHistogram
from metaq.errors import ConfigError


def test_histogram_buckets_are_cumulative_and_bounds_inclusive() -> None:
    h = LatencyHistogram((0.001, 0.01))
    for seconds in (0.0005, 0.001, 0.002, 0.5):
        h.observe(seconds)
    buckets, count, total = h.cumulative()
    assert buckets == [(0.001, 2), (0.01, 3), (float("inf"), 4)]  # le: 0.001 counts in the first bucket
    assert count == 4 and total == pytest.approx(0.5035)


def test_timed_observes_failures_too() -> None:
    h = LatencyHistogram()

    def failing_sync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    with pytest.raises(OSError):
        h.timed(failing_sync)(3)
    h.timed(lambda fd: None)(3)
    assert h.count == 2


def test_histogram_loses_no_observation_across_threads() -> None:
    h = LatencyHistogram()

    def observe() -> None:
        for _ in range(20_000):
            h.observe(0.0001)

    threads = [threading.Thread(target=observe) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert h.count == 80_000 and h.cumulative()[0][-1][1] == 80_000


def test_a_snapshot_renders_as_parseable_prometheus_text(tmp_path: Path) -> None:
    empty = LatencyHistogram().cumulative()
    snap = Snapshot(broker_id=3, role="slave", data_path=str(tmp_path), uptime_s=1.5, connections=2,
                    connections_total=5, connections_refused=0, connections_timed_out=1, partial_frames_refused=0,
                    waiting_fetches=1, waiting_fetches_max=10, counters=[("t\"x", "3-0", (1, 2, 3, 4, 5, 6, 7, 8, 9))],
                    logs=[("t\"x", "3-0", 0, 10, 100, 1, 1)], append=empty, fetch=empty, fsync=empty,
                    group_offsets=[("g", "t\"x", "3-0", 4, 6)], group_members=[("g", 2)],
                    replication=[("t\"x", "3-0", 7, 0.25, 0, 1)],
                    store_damage={"damaged_records": {"offsets": 2}, "torn_tails": {"txlog": 1}, "recent": []})
    families = {f.name: f for f in text_string_to_metric_families(render(snap).decode())}
    damaged = {s.labels["store"]: s.value for s in families["metaq_store_damaged_records"].samples}
    assert damaged["offsets"] == 2 and damaged["acls"] == 0 and len(damaged) == 8
    assert {s.labels["store"]: s.value for s in families["metaq_store_torn_tails"].samples}["txlog"] == 1
    assert families["metaq_messages_in"].type == "counter"
    (sample,) = families["metaq_messages_in"].samples
    assert (sample.name, sample.labels, sample.value) == ("metaq_messages_in_total",
                                                          {"topic": "t\"x", "partition": "3-0"}, 1)
    assert [s.value for s in families["metaq_fetch_corrupt"].samples] == [9]
    assert [s.value for s in families["metaq_partition_closed"].samples] == [1]
    assert [s.value for s in families["metaq_consumer_group_lag_messages"].samples] == [6]
    assert [s.value for s in families["metaq_replication_lag_seconds"].samples] == [0.25]
    assert families["metaq_fsync_duration_seconds"].type == "histogram"
    assert families["metaq_data_dir_free_bytes"].samples[0].value > 0


def test_partition_state_round_trip_and_a_crash_mid_write(tmp_path: Path) -> None:
    store = PartitionStateStore(tmp_path)
    assert store.load() == {}  # no file yet: everything open
    store.save({"a": {2, 0}, "b": set()})
    assert (tmp_path / FILE_NAME).read_text() == '{"closed": {"a": [0, 2]}}\n'
    (tmp_path / f"{FILE_NAME}.tmp").write_text('{"closed": {"a": [')  # a write cut short by a crash
    assert store.load() == {"a": {0, 2}}
    assert not (tmp_path / f"{FILE_NAME}.tmp").exists()


def test_a_damaged_partition_state_file_is_named_in_the_error(tmp_path: Path) -> None:
    (tmp_path / FILE_NAME).write_text("not json")
    with pytest.raises(ConfigError, match=f"{FILE_NAME}: not a partition state document"):
        PartitionStateStore(tmp_path).load()
