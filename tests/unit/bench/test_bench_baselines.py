"""The same-run baselines `metaq bench` prints beside its figures: the disk's fdatasync and the machine's
loopback round trip between two processes."""

from __future__ import annotations

import logging
import sys

from metaq.bench.baselines import measure_fdatasync, measure_loopback_rtt, percentiles


def test_the_loopback_round_trip_times_each_echo_of_a_child_process() -> None:
    samples = measure_loopback_rtt(200, size=100, warmup=5)
    assert len(samples) == 200
    assert all(0 < s < 30_000 for s in samples)  # milliseconds, each bounded by the socket timeout
    p = percentiles(samples)
    assert 0 < p["p50"] <= p["p99"] <= p["max"]


def test_a_loopback_round_trip_that_cannot_be_measured_is_left_out_with_a_warning(monkeypatch, caplog) -> None:
    # no interpreter to start the echo process with: the bench goes on without that baseline
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    with caplog.at_level(logging.WARNING, logger="metaq.bench.baselines"):
        assert measure_loopback_rtt(10) == []
    assert "the loopback round trip was not measured (0 of 10 round trips)" in caplog.text


def test_the_fdatasync_probe_syncs_and_removes_its_file(tmp_path) -> None:
    samples = measure_fdatasync(str(tmp_path), 5)
    assert len(samples) == 5 and all(s > 0 for s in samples)
    assert list(tmp_path.iterdir()) == []

