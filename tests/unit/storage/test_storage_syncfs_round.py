"""A flush round of many partitions made durable by one sync of their filesystem (syncfs(2)) instead of an
fdatasync each (storage/flush.py, FilesystemSync; the broker's syncfsMinPartitions).

What a user relies on: an ack of such a round comes only after a filesystem sync that began after its
append; an append made during that sync waits for a later one; a failed filesystem sync does not pass
for a success (each partition then syncs its own files, and only the one whose file fails goes offline);
all of this with unflushThreshold=1 (an ack per append) as with group commit; what the round cannot cover
(a sealed segment) is still fdatasynced; the directory entries
of new partitions are covered by the syncfs, and fsynced by each partition when the syncfs fails.
The syncs are the real ones (the kernel's syncfs and fdatasync), wrapped to count, hold or fail them."""

from __future__ import annotations

import errno
import os
import threading
from concurrent.futures import Future
from pathlib import Path

import pytest
from storage_helpers import make_batch, read_all

from metaq.errors import StorageError
from metaq.fsutil import WriteBackGauge, syncfs, syncfs_available
from metaq.storage import Flusher, LogConfig, LogManager, PartitionLog
from metaq.storage.flush import (
    CLEAN_UP_INTERVAL_S,
    CLEAN_UP_WRITE_BACK_BYTES,
    QUIET_WRITE_BACK_BYTES,
    FilesystemSync,
)
from metaq.testing import wait_until

pytestmark = pytest.mark.skipif(not syncfs_available(), reason="needs Linux 5.8+ (syncfs reports write-back errors)")

WAIT_S = 10


def _path_of(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


class Recorder:
    """A real sync (fdatasync or syncfs) that records the file of each call, and can be held or made to fail."""

    def __init__(self, real) -> None:
        self.real = real
        self.paths: list[str] = []
        self.lock = threading.Lock()
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self.fail_under: str | None = None
        """Calls on a file whose path contains this fail with EIO."""

    def __call__(self, fd: int) -> None:
        path = _path_of(fd)
        with self.lock:
            self.paths.append(path)
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(WAIT_S)
        if self.fail_under is not None and self.fail_under in path:
            raise OSError(errno.EIO, "Input/output error")
        self.real(fd)

    def logs_synced(self) -> list[str]:
        """The partition directories whose .log files were synced, in order."""
        with self.lock:
            return [os.path.basename(os.path.dirname(p)) for p in self.paths if p.endswith(".log")]

    def directories_synced(self) -> list[str]:
        """The directories fsynced (their entries made durable), by name, in order."""
        with self.lock:
            return [os.path.basename(p) for p in self.paths if os.path.isdir(p)]


def _open_logs(tmp_path: Path, count: int, flusher: Flusher, fdatasync: Recorder, threshold: int = 0,
               segment_bytes_max: int = 1 << 20) -> list[PartitionLog]:
    config = LogConfig(unflush_threshold=threshold, segment_bytes_max=segment_bytes_max)
    return [PartitionLog.open(tmp_path / f"p-{i}", "p", i, config, 1, flusher=flusher, sync=fdatasync)
            for i in range(count)]


def _settled_logs(tmp_path: Path, count: int, flusher: Flusher, **options: int,
                  ) -> tuple[list[PartitionLog], Recorder, Recorder]:
    """``count`` logs each flushed once (what a new log's first flush does, its directory entries, done
    beforehand, so that a round finds it plain), and the fdatasync and syncfs they are to use, reset."""
    fdatasync, whole = Recorder(os.fdatasync), Recorder(syncfs)
    logs = _open_logs(tmp_path, count, flusher, fdatasync, **options)
    for plog in logs:
        batch, _ = make_batch()
        plog.append(batch)
        plog.flush()
    fdatasync.paths.clear()
    fdatasync.entered.clear()
    return logs, fdatasync, whole


@pytest.fixture
def flusher():
    f = Flusher()
    yield f
    f.stop()


def _durable(plog: PartitionLog) -> tuple[Future[None], list[bytes]]:
    batch, values = make_batch()
    result = plog.append(batch)
    assert result.wait_for_durable
    return result.durable, values


BOTH_ACK_MODES = pytest.mark.parametrize("threshold", [0, 1], ids=["group-commit", "unflushThreshold=1"])


@BOTH_ACK_MODES
def test_a_round_is_acknowledged_after_one_filesystem_sync_that_began_after_its_appends(tmp_path, flusher, threshold):
    logs, fdatasync, whole = _settled_logs(tmp_path, 20, flusher, threshold=threshold)
    acks = [_durable(plog)[0] for plog in logs]  # queued: the flusher is not started yet, so ONE round takes all
    whole.gate = threading.Event()
    flusher.filesystem_sync = FilesystemSync(tmp_path, 8, whole)
    flusher.start()
    try:
        assert whole.entered.wait(WAIT_S)
        assert not any(ack.done() for ack in acks)  # nothing acknowledged before the filesystem sync returns
        later, _ = _durable(logs[0])  # appended while the round's sync runs: that sync may not cover it
    finally:
        whole.gate.set()
    for ack in acks:
        assert ack.result(WAIT_S) is None
    assert later.result(WAIT_S) is None
    assert len(whole.paths) == 1 and flusher.filesystem_sync.syncs == 1
    # the round fdatasynced none of its 20 logs; the later append was synced by a round of its own
    assert fdatasync.logs_synced() == ["p-0"]
    flusher.filesystem_sync.close()


@BOTH_ACK_MODES
def test_a_failed_filesystem_sync_makes_each_partition_sync_its_own_files_and_only_the_failing_one_goes_offline(
        tmp_path, flusher, threshold):
    logs, fdatasync, whole = _settled_logs(tmp_path, 12, flusher, threshold=threshold)
    pending = [_durable(plog) for plog in logs]
    whole.fail_under = str(tmp_path)  # syncfs on the data directory fails (a write-back error somewhere)
    fdatasync.fail_under = "/p-3/"  # ... in partition 3's file
    flusher.filesystem_sync = FilesystemSync(tmp_path, 8, whole)
    flusher.start()
    for i, (ack, _values) in enumerate(pending):
        if i == 3:
            with pytest.raises(StorageError, match="offline"):
                ack.result(WAIT_S)
        else:
            assert ack.result(WAIT_S) is None
    assert flusher.filesystem_sync.failures == 1 and flusher.filesystem_sync.syncs == 0
    assert sorted(fdatasync.logs_synced()) == sorted(f"p-{i}" for i in range(12))  # each synced its own
    with pytest.raises(StorageError):
        logs[3].append(make_batch()[0])
    fdatasync.fail_under = None
    ack, values = _durable(logs[5])  # the others stay online
    assert ack.result(WAIT_S) is None
    assert [bytes(m.data) for m in read_all(logs[5])][-3:] == values
    flusher.filesystem_sync.close()


@BOTH_ACK_MODES
def test_what_a_filesystem_round_cannot_cover_is_fdatasynced_and_everything_reads_back(tmp_path, flusher, threshold):
    logs, fdatasync, whole = _settled_logs(tmp_path, 10, flusher, threshold=threshold, segment_bytes_max=600)
    fresh = PartitionLog.open(tmp_path / "q-0", "q", 0, LogConfig(unflush_threshold=0), 1, flusher=flusher,
                              sync=fdatasync)  # its directory entries not synced yet: the syncfs covers them
    written: dict[str, list[bytes]] = {}
    acks = []
    for plog in [*logs, fresh]:
        ack, values = _durable(plog)
        acks.append(ack)
        written[plog.directory.name] = values
    rolled = logs[7]
    batch, values = make_batch(count=20, size=40)  # past segment_bytes_max: the next append starts a segment
    rolled.append(batch)
    ack, more = _durable(rolled)
    acks.append(ack)
    written["p-7"] += values + more
    assert len(list(rolled.directory.glob("*.log"))) >= 2
    flusher.filesystem_sync = FilesystemSync(tmp_path, 8, whole)
    flusher.start()
    for ack in acks:
        assert ack.result(WAIT_S) is None
    assert len(whole.paths) == 1
    assert sorted(set(fdatasync.logs_synced())) == ["p-7"]  # the sealed segment (and its new file's entry)
    assert fdatasync.directories_synced() == ["p-7"]
    for plog in [*logs, fresh]:
        plog.close()
    for name, values in written.items():
        topic, partition = name.split("-")
        reopened = PartitionLog.open(tmp_path / name, topic, int(partition), LogConfig(), 1)
        try:
            assert reopened.recovery.clean
            assert [bytes(m.data) for m in read_all(reopened)][-len(values):] == values
        finally:
            reopened.close()
    flusher.filesystem_sync.close()


def _new_logs_each_with_an_ack(tmp_path: Path, count: int, flusher: Flusher, fdatasync: Recorder,
                               ) -> tuple[list[PartitionLog], list[Future[None]], dict[str, list[bytes]]]:
    data = tmp_path / "data"
    data.mkdir()
    config = LogConfig(unflush_threshold=0)
    logs = [PartitionLog.open(data / f"n-{i}", "n", i, config, 1, flusher=flusher, sync=fdatasync)
            for i in range(count)]
    acks, written = [], {}
    for plog in logs:
        ack, values = _durable(plog)
        acks.append(ack)
        written[plog.directory.name] = values
    return logs, acks, written


def test_the_first_flush_of_new_partitions_is_one_filesystem_sync_with_no_directory_fsync(tmp_path, flusher):
    """A new partition's first flush made its directory entries durable with two directory fsyncs (the
    partition's directory in the data directory, its first segment file in the partition's directory):
    20,000 for 10,000 new partitions. A syncfs writes the filesystem's metadata as well: the round needs none."""
    fdatasync, whole = Recorder(os.fdatasync), Recorder(syncfs)
    logs, acks, written = _new_logs_each_with_an_ack(tmp_path, 20, flusher, fdatasync)
    flusher.filesystem_sync = FilesystemSync(tmp_path, 8, whole)
    flusher.start()
    for ack in acks:
        assert ack.result(WAIT_S) is None
    assert len(whole.paths) == 1
    assert fdatasync.paths == []  # no fdatasync, no directory fsync
    # marked durable: a later flush of one partition, too small a round for a syncfs, syncs its log only
    later, more = _durable(logs[3])
    assert later.result(WAIT_S) is None
    assert fdatasync.logs_synced() == ["n-3"] and fdatasync.directories_synced() == []
    written["n-3"] += more
    for plog in logs:
        plog.close()
    for name, values in written.items():
        reopened = PartitionLog.open(tmp_path / "data" / name, "n", int(name.split("-")[1]), LogConfig(), 1)
        try:
            assert reopened.recovery.clean and [bytes(m.data) for m in read_all(reopened)] == values
        finally:
            reopened.close()
    flusher.filesystem_sync.close()


def test_new_partitions_whose_filesystem_sync_fails_fsync_their_directories_themselves(tmp_path, flusher):
    fdatasync, whole = Recorder(os.fdatasync), Recorder(syncfs)
    logs, acks, _written = _new_logs_each_with_an_ack(tmp_path, 12, flusher, fdatasync)
    whole.fail_under = str(tmp_path)
    flusher.filesystem_sync = FilesystemSync(tmp_path, 8, whole)
    flusher.start()
    for ack in acks:
        assert ack.result(WAIT_S) is None
    assert sorted(fdatasync.logs_synced()) == sorted(f"n-{i}" for i in range(12))
    directories = fdatasync.directories_synced()
    # each partition's own directory (its segment file's entry) and the data directory (its directory's entry)
    assert sorted(d for d in directories if d != "data") == sorted(f"n-{i}" for i in range(12))
    assert directories.count("data") == 12
    for plog in logs:
        plog.close()
    flusher.filesystem_sync.close()


def test_unflush_threshold_one_acks_of_one_partition_written_during_the_filesystem_sync_wait_for_another(
        tmp_path, flusher):
    """unflushThreshold=1: every ack waits for a sync that began after its own append. Appends to a partition
    made while its round's filesystem sync runs are not acknowledged by it: they wait for the next round."""
    logs, fdatasync, whole = _settled_logs(tmp_path, 4, flusher, threshold=1)
    first = [_durable(plog)[0] for plog in logs]
    whole.gate = threading.Event()
    flusher.filesystem_sync = FilesystemSync(tmp_path, 2, whole)
    flusher.start()
    try:
        assert whole.entered.wait(WAIT_S)
        during = [_durable(plog)[0] for plog in logs[:3]]  # three partitions: the next round is a syncfs too
        assert not any(ack.done() for ack in first + during)
        whole.entered.clear()
        held, whole.gate = whole.gate, threading.Event()  # the next sync is held in its turn
        held.set()
        assert all(ack.result(WAIT_S) is None for ack in first)
        assert whole.entered.wait(WAIT_S)  # the second round's sync has begun ...
        assert not any(ack.done() for ack in during)  # ... so nothing it covers is acknowledged before it ends
    finally:
        whole.gate.set()
    assert all(ack.result(WAIT_S) is None for ack in during)
    assert flusher.filesystem_sync.syncs == 2 and fdatasync.paths == []
    flusher.filesystem_sync.close()


def test_a_log_manager_with_syncfs_acknowledges_every_append_and_keeps_no_descriptor_after_close(tmp_path):
    whole = Recorder(syncfs)
    fds_before = len(os.listdir("/proc/self/fd"))
    manager = LogManager(tmp_path / "data", 0, LogConfig(unflush_threshold=0), syncfs_min_logs=4,
                         sync_filesystem=whole)
    manager.open()
    written: dict[int, list[bytes]] = {}
    try:
        logs = [manager.get_or_create("t", p) for p in range(40)]
        for _ in range(3):
            acks = []
            for plog in logs:
                ack, values = _durable(plog)
                acks.append(ack)
                written.setdefault(plog.partition, []).extend(values)
            for ack in acks:
                assert ack.result(WAIT_S) is None
        assert manager.flusher.filesystem_sync is not None
    finally:
        manager.close()
    assert len(os.listdir("/proc/self/fd")) == fds_before
    with LogManager(tmp_path / "data", 0, LogConfig()) as reopened:
        for partition, values in written.items():
            plog = reopened.get("t", partition)
            assert plog is not None and [bytes(m.data) for m in read_all(plog)] == values


def test_after_a_failed_filesystem_sync_every_round_fdatasyncs_so_an_error_of_a_later_partition_reaches_it(
        tmp_path, flusher):
    """syncfs reports a write-back error once. When the file it belongs to is not in the round whose syncfs
    reported it (the kernel wrote it back on its own), only that file's own fdatasync will report it again:
    a later round synced by syncfs would acknowledge its partition's batches as durable."""
    logs, fdatasync, whole = _settled_logs(tmp_path, 20, flusher)
    first = [_durable(plog)[0] for plog in logs[:10]]
    whole.fail_under = str(tmp_path)  # the first round's syncfs reports an error of partition 15's file
    fdatasync.gate = threading.Event()
    flusher.filesystem_sync = FilesystemSync(tmp_path, 8, whole)
    flusher.start()
    assert fdatasync.entered.wait(WAIT_S)  # the round's partitions fdatasync their own files (held here) ...
    later = [_durable(plog)[0] for plog in logs[10:]]  # ... while partitions 10-19 queue up for the next round
    whole.fail_under = None  # a syncfs would succeed now: the error was reported once
    fdatasync.fail_under = "/p-15/"  # the file's own fdatasync still reports it
    fdatasync.gate.set()
    for ack in first:
        assert ack.result(WAIT_S) is None
    for i, ack in enumerate(later, start=10):
        if i == 15:
            with pytest.raises(StorageError, match="offline"):
                ack.result(WAIT_S)
        else:
            assert ack.result(WAIT_S) is None
    assert flusher.filesystem_sync.failed and len(whole.paths) == 1  # no syncfs after the failed one
    flusher.filesystem_sync.close()


def test_a_filesystem_sync_that_breaks_leaves_no_partition_locked_and_the_flusher_running(tmp_path, flusher):
    """Not an OSError (a bug, an injected fault): the round's partitions still sync themselves and are
    unlocked, their acks resolve, and the flusher keeps serving later rounds."""
    logs, fdatasync, _ = _settled_logs(tmp_path, 10, flusher)
    acks = [_durable(plog)[0] for plog in logs]

    def broken(fd: int) -> None:
        raise RuntimeError("not a sync")

    flusher.filesystem_sync = FilesystemSync(tmp_path, 8, broken)
    flusher.start()
    for ack in acks:
        assert ack.result(WAIT_S) is None
    assert sorted(fdatasync.logs_synced()) == sorted(f"p-{i}" for i in range(10))
    for plog in logs:  # a flush takes each partition's sync lock: none is left held
        plog.flush()
    later, _ = _durable(logs[4])
    assert later.result(WAIT_S) is None and flusher.running
    assert flusher.filesystem_sync.failed
    flusher.filesystem_sync.close()


def _manager_with_unsynced_data(tmp_path: Path, fdatasync: Recorder, whole: Recorder,
                                ) -> tuple[LogManager, dict[int, list[bytes]]]:
    """A manager (syncfs for 4 logs or more) with 30 partitions written and nothing synced since their
    first flush; partition 0 holds over 1 MiB after its last index entry on disk (CLEAN_OPEN_WALK_BYTES),
    partition 1 has index files a flush wrote (a 4 KiB run of entries) and nothing fsynced."""
    manager = LogManager(tmp_path / "data", 0, LogConfig(unflush_threshold=1_000_000, index_interval_bytes=64),
                         syncfs_min_logs=4, sync=fdatasync, sync_filesystem=whole)
    manager.open()
    written: dict[int, list[bytes]] = {}
    for partition in range(30):
        plog = manager.get_or_create("t", partition)
        plog.flush()  # its directory entries
        for _ in range({0: 12, 1: 600}.get(partition, 5)):
            batch, values = make_batch(count=2, size=50_000 if partition == 0 else 100)
            plog.append(batch)
            written.setdefault(partition, []).extend(values)
        if partition == 1:
            plog.flush()
            assert (plog.directory / "00000000000000000000.index").stat().st_size >= 4096 // 2
        for _ in range(5):  # and something unsynced
            batch, values = make_batch()
            plog.append(batch)
            written[partition].extend(values)
    fdatasync.paths.clear()
    whole.paths.clear()
    return manager, written


def _index_files_synced(fdatasync: Recorder) -> list[str]:
    with fdatasync.lock:
        return sorted(os.path.relpath(p, os.path.dirname(os.path.dirname(p))) for p in fdatasync.paths
                      if "index" in p)


def _reopened_clean_with(tmp_path: Path, written: dict[int, list[bytes]]) -> None:
    with LogManager(tmp_path / "data", 0, LogConfig(index_interval_bytes=64)) as reopened:
        for partition, values in written.items():
            plog = reopened.get("t", partition)
            assert plog is not None and plog.recovery.clean, partition
            assert [bytes(m.data) for m in read_all(plog)] == values
            middle = len(values) // 2
            assert [bytes(m.data) for m in read_all(plog, start=middle)] == values[middle:]
            assert plog.offset_for_timestamp(0) == 0


def test_a_clean_close_of_many_partitions_is_one_filesystem_sync_and_creates_no_index_file(tmp_path):
    """10,000 partitions closed with an fdatasync of each log and two index files created and fsynced each
    took 3-8 s; now one syncfs covers every log (and what earlier flushes wrote to index files), and a small
    active segment's index entries are left to the clean open's walk. A partition with 1 MiB or more after
    its last entry on disk still gets them written, and fsynced, since the syncfs came before."""
    fdatasync, whole = Recorder(os.fdatasync), Recorder(syncfs)
    manager, written = _manager_with_unsynced_data(tmp_path, fdatasync, whole)
    manager.close()
    assert len(whole.paths) == 1
    assert not [p for p in fdatasync.paths if p.endswith(".log")], fdatasync.paths
    data = tmp_path / "data"
    assert sorted(str(p.relative_to(data)) for p in data.glob("t-*/*index")) == [
        "t-0/00000000000000000000.index", "t-0/00000000000000000000.timeindex",
        "t-1/00000000000000000000.index", "t-1/00000000000000000000.timeindex"]
    assert (data / "t-0" / "00000000000000000000.index").stat().st_size >= 8 * 11
    assert _index_files_synced(fdatasync) == ["t-0/00000000000000000000.index", "t-0/00000000000000000000.timeindex"]
    _reopened_clean_with(tmp_path, written)


def test_a_clean_close_whose_filesystem_sync_fails_syncs_each_partition_itself(tmp_path):
    fdatasync, whole = Recorder(os.fdatasync), Recorder(syncfs)
    manager, written = _manager_with_unsynced_data(tmp_path, fdatasync, whole)
    whole.fail_under = str(tmp_path)
    manager.close()  # each partition synced its own log: nothing failed that a partition owns
    assert len(whole.paths) == 1
    assert sorted(fdatasync.logs_synced()) == sorted(f"t-{p}" for p in range(30))
    assert _index_files_synced(fdatasync) == [  # what the flush wrote to t-1's files: no syncfs covered it
        "t-0/00000000000000000000.index", "t-0/00000000000000000000.timeindex",
        "t-1/00000000000000000000.index", "t-1/00000000000000000000.timeindex"]
    _reopened_clean_with(tmp_path, written)


class Gauge:
    """What the machine has to write back, as the test says (a real WriteBackGauge reads /proc/meminfo)."""

    def __init__(self) -> None:
        self.value: int | None = 0
        self.calls = 0

    def __call__(self) -> int | None:
        self.calls += 1
        return self.value


def test_a_round_of_a_few_partitions_uses_one_filesystem_sync_only_while_little_else_is_to_be_written_back(
        tmp_path, flusher):
    """syncfsQuietMinPartitions: a round of 2..31 partitions is made durable by one syncfs while the machine
    has at most QUIET_WRITE_BACK_BYTES dirty; with more (or when that cannot be read) each partition fdatasyncs,
    since a syncfs would wait for every other writer's pages; but with up to CLEAN_UP_WRITE_BACK_BYTES, one round a
    second still uses one, which writes back what a one-time write left. A round of one partition never uses it."""
    logs, fdatasync, whole = _settled_logs(tmp_path, 4, flusher, threshold=1)
    gauge = Gauge()
    now = [1000.0]
    flusher.filesystem_sync = FilesystemSync(tmp_path, 32, whole, quiet_min_logs=2, write_back_bytes=gauge,
                                             clock=lambda: now[0])
    flusher.start()

    def one_round(plogs: list[PartitionLog]) -> None:
        assert flusher.drain(WAIT_S)
        fdatasync.paths.clear()
        whole.paths.clear()
        held = whole.gate = threading.Event()  # hold the flusher, so that the next appends make ONE round
        fdatasync.gate = held
        blocker = _durable(logs[0])[0]  # a round of one: fdatasynced, held there
        assert fdatasync.entered.wait(WAIT_S)
        acks = [_durable(plog)[0] for plog in plogs]
        fdatasync.gate = whole.gate = None
        held.set()
        assert blocker.result(WAIT_S) is None
        assert all(ack.result(WAIT_S) is None for ack in acks)
        fdatasync.paths[:1] = []  # the blocker's own fdatasync
        fdatasync.entered.clear()

    one_round(logs)  # quiet: one syncfs for the four
    assert len(whole.paths) == 1 and fdatasync.logs_synced() == [] and flusher.filesystem_sync.busy_skips == 0
    gauge.value = QUIET_WRITE_BACK_BYTES + 1  # another writer's pages are waiting
    one_round(logs)
    assert whole.paths == [] and sorted(fdatasync.logs_synced()) == [f"p-{i}" for i in range(4)]
    assert flusher.filesystem_sync.busy_skips == 1
    gauge.value = None  # /proc/meminfo unreadable: not known to be quiet
    one_round(logs[1:3])
    assert whole.paths == [] and sorted(fdatasync.logs_synced()) == ["p-1", "p-2"]
    assert flusher.filesystem_sync.busy_skips == 2
    gauge.value = QUIET_WRITE_BACK_BYTES
    calls = gauge.calls
    one_round(logs[2:3])  # one partition: its own fdatasync, the gauge not even read
    assert whole.paths == [] and fdatasync.logs_synced() == ["p-2"] and gauge.calls == calls
    one_round(logs[2:4])
    assert len(whole.paths) == 1 and fdatasync.logs_synced() == []
    # a one-time write left more than the quiet figure: one round a second writes it back with its syncfs
    gauge.value = CLEAN_UP_WRITE_BACK_BYTES
    now[0] += CLEAN_UP_INTERVAL_S / 2
    one_round(logs)
    assert whole.paths == [] and len(fdatasync.logs_synced()) == 4 and flusher.filesystem_sync.busy_skips == 3
    now[0] += CLEAN_UP_INTERVAL_S / 2
    one_round(logs)
    assert len(whole.paths) == 1 and fdatasync.logs_synced() == [] and flusher.filesystem_sync.busy_skips == 3
    one_round(logs)  # the next second's turn has not come
    assert whole.paths == [] and len(fdatasync.logs_synced()) == 4 and flusher.filesystem_sync.busy_skips == 4
    gauge.value = CLEAN_UP_WRITE_BACK_BYTES + 1  # a heavy writer: never waited for
    now[0] += 10 * CLEAN_UP_INTERVAL_S
    one_round(logs)
    assert whole.paths == [] and len(fdatasync.logs_synced()) == 4 and flusher.filesystem_sync.busy_skips == 5
    flusher.filesystem_sync.close()


def test_a_quiet_threshold_at_or_above_the_many_partitions_one_is_off(tmp_path):
    whole = FilesystemSync(tmp_path, 4, syncfs, quiet_min_logs=4)
    try:
        assert whole.quiet_min_logs == 0 and not whole.covers(3) and whole.covers(4)
    finally:
        whole.close()


def _filesystem_type(path: Path) -> str:
    best = ("", "")
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        for line in mounts:
            fields = line.split()
            mount_point = fields[1].replace("\\040", " ")
            if str(path.resolve()).startswith(mount_point.rstrip("/") + "/") and len(mount_point) > len(best[0]):
                best = (mount_point, fields[2])
    return best[1]


def test_the_write_back_gauge_sees_pages_written_and_not_yet_synced(tmp_path):
    if _filesystem_type(tmp_path) in ("tmpfs", "ramfs", ""):
        pytest.skip("the temporary directory is in memory: its pages are never dirty")
    gauge = WriteBackGauge()
    try:
        before = gauge()
        assert before is not None and before >= 0
        size = 64 << 20
        with open(tmp_path / "big", "wb") as f:
            f.write(b"\0" * size)
            wait_until(lambda: (gauge() or 0) >= before + size // 2, timeout_s=WAIT_S,
                       message="the 64 MB just written counted as dirty or under write-back")
            os.fsync(f.fileno())
    finally:
        gauge.close()
    assert gauge() is None  # closed
