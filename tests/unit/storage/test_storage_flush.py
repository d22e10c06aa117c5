"""Flush modes: MetaQ's unflushThreshold semantics, durable futures, and a flusher that survives errors."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest
from storage_helpers import FakeClock, make_batch, read_all

from metaq.errors import StorageError
from metaq.storage import Flusher, LogConfig, PartitionLog

WAIT_S = 10


class CountingSync:
    """An fdatasync that counts calls, can be held at a gate, and can fail on demand."""

    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self.fail_fds: set[int] = set()
        self.fail_all = False

    def __call__(self, fd: int) -> None:
        with self.lock:
            self.calls += 1
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(WAIT_S)
        if self.fail_all:
            raise OSError(errno.EIO, "Input/output error")
        os.fdatasync(fd)

    def reset(self) -> None:
        with self.lock:
            self.calls = 0
        self.entered.clear()


@pytest.fixture
def flusher():
    f = Flusher()
    f.start()
    yield f
    f.stop()


def open_with(tmp_path: Path, name: str, threshold: int, flusher: Flusher | None, sync: CountingSync,
              clock: FakeClock | None = None, interval_ms: int = 10_000) -> PartitionLog:
    config = LogConfig(unflush_threshold=threshold, unflush_interval_ms=interval_ms)
    extra = {"clock": clock} if clock is not None else {}
    return PartitionLog.open(tmp_path / f"{name}-0", name, 0, config, 1, flusher=flusher, sync=sync,
                             **extra)  # type: ignore[arg-type]


def test_threshold_one_acks_only_after_a_sync_that_started_after_the_write(tmp_path, flusher):
    sync = CountingSync()
    log = open_with(tmp_path, "a", 1, flusher, sync)
    log.append(make_batch()[0]).durable.result(WAIT_S)  # first sync also syncs the new directories
    sync.reset()
    sync.gate = threading.Event()  # hold the next sync: appends pile up behind it
    first = log.append(make_batch()[0])
    assert sync.entered.wait(WAIT_S)
    piled = [log.append(make_batch()[0]) for _ in range(25)]
    assert not first.durable.done()  # its sync has started but not finished: no ack yet
    assert not any(r.durable.done() for r in piled)  # written after that sync began: not covered by it
    calls_before_release = sync.calls
    sync.gate.set()
    for result in [first, *piled]:
        assert result.wait_for_durable
        assert result.durable.result(WAIT_S) is None
    # the piled-up appends of this one log shared the next sync (each ack still waited for a sync that
    # began after its write), instead of queueing 25 syncs behind each other
    assert calls_before_release == 1
    assert 2 <= sync.calls <= 4
    log.close()


def test_threshold_one_without_flusher_is_durable_on_return(tmp_path):
    sync = CountingSync()
    log = open_with(tmp_path, "a", 1, None, sync)
    log.append(make_batch()[0])
    sync.reset()
    for _ in range(5):
        result = log.append(make_batch()[0])
        assert result.durable.done() and result.wait_for_durable
    assert sync.calls == 5
    log.close()


def test_group_commit_coalesces_pending_appends_into_one_round(tmp_path, flusher):
    sync = CountingSync()
    logs = [open_with(tmp_path, f"g{i}", 0, flusher, sync) for i in range(3)]
    for log in logs:
        log.append(make_batch()[0]).durable.result(WAIT_S)
    sync.reset()
    sync.gate = threading.Event()
    sync.entered.clear()
    first = logs[0].append(make_batch()[0])
    assert sync.entered.wait(WAIT_S)  # the flusher is inside the first round's fdatasync
    later = [log.append(make_batch()[0]) for _ in range(20) for log in logs]
    assert not any(r.durable.done() for r in later)
    sync.gate.set()
    for result in [first, *later]:
        assert result.wait_for_durable
        result.durable.result(WAIT_S)
    # One fdatasync for the first round, then one per log for everything that piled up.
    assert sync.calls == 1 + len(logs)
    assert len({id(r.durable) for r in later}) == len(logs)
    for log in logs:
        log.close()


def test_threshold_n_acks_at_once_and_syncs_after_n_messages(tmp_path, flusher):
    sync = CountingSync()
    log = open_with(tmp_path, "n", 10, flusher, sync)
    early = [log.append(make_batch(count=3)[0]) for _ in range(3)]  # 9 messages
    assert not any(r.wait_for_durable for r in early)
    assert not early[0].durable.done()
    last = log.append(make_batch(count=1)[0])  # the 10th
    last.durable.result(WAIT_S)
    assert all(r.durable.done() for r in early)
    log.close()


def test_threshold_n_syncs_after_the_interval(tmp_path):
    clock = FakeClock()
    flusher = Flusher(clock=clock)
    flusher.start()
    try:
        sync = CountingSync()
        log = open_with(tmp_path, "i", 1000, flusher, sync, clock=clock, interval_ms=2000)
        result = log.append(make_batch()[0])
        clock.advance_ms(1000)
        flusher.wake()
        assert flusher.drain(WAIT_S)
        assert not result.durable.done()
        clock.advance_ms(1001)
        flusher.wake()
        result.durable.result(WAIT_S)
        log.close()
    finally:
        flusher.stop()


def test_interval_without_flusher_flushes_inline(tmp_path):
    clock = FakeClock()
    sync = CountingSync()
    log = open_with(tmp_path, "s", 1000, None, sync, clock=clock, interval_ms=500)
    first = log.append(make_batch()[0])
    assert not first.durable.done()
    clock.advance_ms(600)
    log.append(make_batch()[0])
    assert first.durable.done()
    log.close()


def test_flusher_survives_a_failing_sync(tmp_path, flusher):
    sync_bad, sync_good = CountingSync(), CountingSync()
    bad = open_with(tmp_path, "bad", 1, flusher, sync_bad)
    good = open_with(tmp_path, "good", 0, flusher, sync_good)
    sync_bad.fail_all = True
    result = bad.append(make_batch()[0])
    with pytest.raises(StorageError, match="Input/output error"):
        result.durable.result(WAIT_S)
    with pytest.raises(StorageError, match="offline"):
        bad.append(make_batch()[0])
    good.append(make_batch()[0]).durable.result(WAIT_S)
    assert flusher.errors >= 1 and flusher.running
    good.close()
    with pytest.raises(StorageError):
        bad.close()


def test_durable_future_cannot_be_cancelled(tmp_path, flusher):
    sync = CountingSync()
    sync.gate = threading.Event()
    log = open_with(tmp_path, "c", 0, flusher, sync)
    result = log.append(make_batch()[0])
    assert not result.durable.cancel()
    sync.gate.set()
    result.durable.result(WAIT_S)
    log.close()


def test_mode_change_resolves_waiting_acks(tmp_path, flusher):
    sync = CountingSync()
    log = open_with(tmp_path, "m", 1000, flusher, sync)
    result = log.append(make_batch()[0])
    log.set_config(LogConfig(unflush_threshold=0))
    result.durable.result(WAIT_S)
    after = log.append(make_batch()[0])
    assert after.wait_for_durable
    after.durable.result(WAIT_S)
    assert len(read_all(log)) == 6
    log.close()


def test_close_flushes_and_stop_finishes_queued_work(tmp_path):
    flusher = Flusher()
    sync = CountingSync()
    log = open_with(tmp_path, "q", 1, flusher, sync)  # flusher not started: jobs queue up
    results = [log.append(make_batch()[0]) for _ in range(3)]
    log.close()
    flusher.start()
    flusher.stop()
    for r in results:
        r.durable.result(WAIT_S)
    with pytest.raises(StorageError):
        flusher.flush_soon(log)
