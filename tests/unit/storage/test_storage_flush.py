"""Flush modes: MetaQ's unflushThreshold semantics, durable futures, and a flusher that survives errors."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest
from storage_helpers import FakeClock, make_batch, read_all

from metaq.errors import StorageError
from metaq.protocol.records import encode_values
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


def test_group_commit_coalesces_pending_appends_into_one_round(tmp_path):
    # One syncing thread: held in g0's sync, it takes nothing else, so what piles up meanwhile on every
    # log waits for one next sync per log (with helper threads, g1 and g2 would start their syncs at once).
    flusher = Flusher(sync_workers=1)
    flusher.start()
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
    flusher.stop()


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


class CoverageSync:
    """An fdatasync that records, once it returned, which file it synced and how long that file was when
    it started: an ack is only honest if such a record covers its batch. Syncs of one chosen file can
    be held at a gate."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done: list[tuple[int, int, str]] = []  # (inode, size at the start, thread name)
        self.held_inode = -1
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def __call__(self, fd: int) -> None:
        st = os.fstat(fd)
        if st.st_ino == self.held_inode:
            self.entered.set()
            assert self.gate.wait(WAIT_S)
        os.fdatasync(fd)
        with self.lock:
            self.done.append((st.st_ino, st.st_size, threading.current_thread().name))

    def covered(self, inode: int, size: int) -> bool:
        with self.lock:
            return any(i == inode and s >= size for i, s, _ in self.done)


def _segment_file(tmp_path: Path, name: str) -> Path:
    (path,) = (tmp_path / f"{name}-0").glob("*.log")
    return path


def _append_checked(log: PartitionLog, path: Path, sync: CoverageSync, early: list[str]):
    """Append one batch; when its ack resolves, check a finished fdatasync of its file started after it."""
    result = log.append(make_batch()[0])
    st = os.stat(path)  # this test's thread is the log's only writer: the file ends with this batch

    def check(_future: object) -> None:
        if not sync.covered(st.st_ino, st.st_size):
            early.append(f"{log} offset {result.base_offset} acked before a sync covering it")

    result.durable.add_done_callback(check)
    return result


@pytest.mark.parametrize(("sync_workers", "inline_max_logs"), [(1, 2), (4, 1), (4, 2), (4, 8)])
def test_threshold_one_every_ack_follows_a_sync_of_its_batch_whatever_the_threads(tmp_path, sync_workers,
                                                                                  inline_max_logs):
    """Rounds synced in the flusher's own thread (few logs, or no pool) or on the pool (more logs than
    inline_max_logs): every waiter completes, and none before an fdatasync of its log file that started
    after its batch was written."""
    flusher = Flusher(sync_workers=sync_workers, inline_max_logs=inline_max_logs)
    flusher.start()
    sync = CoverageSync()
    names = [f"m{i}" for i in range(6)]
    logs = [open_with(tmp_path, name, 1, flusher, sync) for name in names]  # type: ignore[arg-type]
    for log in logs:
        log.append(make_batch()[0]).durable.result(WAIT_S)
    paths = [_segment_file(tmp_path, name) for name in names]
    early: list[str] = []
    results: list = []

    def writer(pairs: list[tuple[PartitionLog, Path]]) -> None:
        for _ in range(40):
            for log, path in pairs:
                results.append(_append_checked(log, path, sync, early))

    pairs = list(zip(logs, paths, strict=True))
    writers = [threading.Thread(target=writer, args=(pairs[i::3],)) for i in range(3)]
    for w in writers:
        w.start()
    for w in writers:
        w.join(WAIT_S)
    assert len(results) == 6 * 40
    for result in results:
        assert result.wait_for_durable
        assert result.durable.result(WAIT_S) is None
    assert early == []
    assert flusher.drain(WAIT_S)
    threads = {thread for _, _, thread in sync.done}
    if sync_workers == 1 or inline_max_logs >= len(logs):  # every round was synced in the flusher's thread
        assert threads == {"metaq-flusher"}
    for log in logs:
        log.close()
    flusher.stop()


@pytest.mark.parametrize("n_logs", [2, 3])
def test_threshold_one_a_small_round_syncs_in_the_flusher_thread_a_larger_one_on_the_pool(tmp_path, n_logs):
    """While log 0's sync hangs, appends pile up on every log; the next round holds them all. Two logs
    (inline_max_logs) are synced in the flusher's own thread, three on the pool with the flusher taking
    one; either way each ack waits for a sync of its own log that began after its batch was written."""
    flusher = Flusher(sync_workers=4, inline_max_logs=2)
    flusher.start()
    sync = CoverageSync()
    names = [f"r{i}" for i in range(n_logs)]
    logs = [open_with(tmp_path, name, 1, flusher, sync) for name in names]  # type: ignore[arg-type]
    for log in logs:
        log.append(make_batch()[0]).durable.result(WAIT_S)
    paths = [_segment_file(tmp_path, name) for name in names]
    early: list[str] = []
    sync.held_inode = os.stat(paths[0]).st_ino
    sync.gate.clear()
    held = _append_checked(logs[0], paths[0], sync, early)
    assert sync.entered.wait(WAIT_S)  # round 1 (log 0 alone) hangs in its fdatasync
    piled = [_append_checked(log, path, sync, early) for _ in range(3) for log, path in zip(logs, paths, strict=True)]
    assert not held.durable.done() and not any(r.durable.done() for r in piled)
    with sync.lock:
        before = len(sync.done)
    sync.gate.set()
    for result in [held, *piled]:
        assert result.durable.result(WAIT_S) is None
    assert early == []
    assert flusher.drain(WAIT_S)
    with sync.lock:
        threads = {thread for _, _, thread in sync.done[before:]}
    if n_logs <= 2:
        assert threads == {"metaq-flusher"}
    else:
        assert "metaq-flusher" in threads and any(t.startswith("metaq-flusher-sync") for t in threads)
    for log in logs:
        log.close()
    flusher.stop()


class RecordingFlusher:
    """What a log asks of its flusher, recorded (never started: nothing is synced unless the test flushes)."""

    accepting = True

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def flush_at(self, log: PartitionLog, at_ms: int) -> None:
        self.calls.append(("flush_at", at_ms))

    def flush_soon(self, log: PartitionLog) -> None:
        self.calls.append(("flush_soon", 0))

    def sync_append(self, log: PartitionLog, segment: object, future: object) -> None:
        self.calls.append(("sync_append", 0))


@pytest.mark.parametrize("threshold", [0, 1, 4, 6, 9, 1000])
def test_what_each_append_asks_of_the_flusher_and_what_its_ack_waits_for(tmp_path, threshold):
    """The flush policy of docs/storage.md, append by append (a roll every few batches, two explicit
    flushes): unflushThreshold=1 gets a future and a forced sync of its own; group commit shares the pending
    future and asks for one round per flush; N > 1 shares it without waiting, starts the interval's clock at
    its first append, and asks for a sync when N messages are unflushed or at a roll."""
    clock = FakeClock()
    recorder = RecordingFlusher()
    config = LogConfig(unflush_threshold=threshold, unflush_interval_ms=500, segment_bytes_max=700)
    log = PartitionLog.open(tmp_path / "t-0", "t", 0, config, 1, flusher=recorder,  # type: ignore[arg-type]
                            sync=CountingSync(), clock=clock)
    futures: list[object] = []
    unflushed, requested, interval_started = 0, False, False
    segments = 1
    for i, count in enumerate([3, 3, 1, 2, 4, 1, 1, 5, 2, 3, 3, 1, 2, 2, 6, 1]):
        clock.advance_ms(7)
        before = len(recorder.calls)
        result = log.append(encode_values([f"{i}:{j}".encode().ljust(20 + i, b"x") for j in range(count)], 1000))
        calls = [name for name, _ in recorder.calls[before:]]
        rolled = log.segment_count > segments
        segments = log.segment_count
        if threshold == 1:
            assert result.wait_for_durable and result.durable not in futures
            assert calls == ["sync_append"]
        else:
            assert result.wait_for_durable is (threshold <= 0)
            assert not futures or (result.durable is futures[-1]) is (interval_started or requested)
            expected = []
            if threshold > 1:
                unflushed += count
                if not interval_started:
                    expected.append("flush_at")
                    interval_started = True
            if not requested and (rolled or threshold <= 0 or unflushed >= threshold):
                expected.append("flush_soon")
                requested = True
            assert calls == expected, (i, calls, expected)
        futures.append(result.durable)
        if i in (5, 11):
            log.flush()  # resolves the shared futures; unflushThreshold=1's are the flusher's jobs
            assert threshold == 1 or all(f.done() for f in futures)  # type: ignore[attr-defined]
            unflushed, requested, interval_started = 0, False, False
    assert segments > 2
    log.close()
