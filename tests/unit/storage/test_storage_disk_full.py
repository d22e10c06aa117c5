"""A full disk (a real, small tmpfs): writes fail cleanly with DiskFull, nothing acknowledged is lost, no
partial batch stays behind, reads go on, and writes succeed again once space is freed -- no reopen.

Index files are derived data: a failure to write them (the disk full between the log write and the
index write) must not take the partition offline.
"""

from __future__ import annotations

import errno

import pytest
from storage_helpers import make_batch, read_all

from metaq.protocol.records import iter_batches
from metaq.storage import LogConfig, PartitionLog
from metaq.storage import partition_flush as flush_module
from metaq.storage import segment as segment_module
from metaq.storage.errors import DiskFull
from metaq.testing.fs import small_disk


def fill_log_until_full(log: PartitionLog) -> list[bytes]:
    """Append distinct batches until the disk refuses one; the payloads of those it took."""
    acked: list[bytes] = []
    for _ in range(10_000):
        batch, values = make_batch(count=10, size=200)
        try:
            log.append(batch).durable.result(10)
        except DiskFull as exc:
            assert "disk is full" in str(exc)
            return acked
        acked.extend(values)
    raise AssertionError("the disk never filled up")


def test_a_full_disk_refuses_writes_keeps_reads_and_recovers_when_space_returns(tmp_path):
    with small_disk(tmp_path / "disk", 256 * 1024) as disk:
        config = LogConfig(unflush_threshold=1, segment_bytes_max=1 << 20, index_interval_bytes=1024)
        log = PartitionLog.open(disk.path / "t-0", "t", 0, config, 1)
        disk.fill(leave_bytes=64 * 1024)
        acked = fill_log_until_full(log)
        assert acked
        # no partial batch: the file holds exactly the acknowledged batches
        content = (disk.path / "t-0" / "00000000000000000000.log").read_bytes()
        assert sum(h.record_count for _, h in iter_batches(content)) == len(acked)
        assert sum(h.total_bytes for _, h in iter_batches(content)) == len(content)
        # reads go on, and another write is refused again (not a crash, not offline)
        assert [bytes(m.data) for m in read_all(log)] == acked
        with pytest.raises(DiskFull):
            log.append(make_batch(count=10, size=200)[0])
        # the operator frees space: the same log takes writes again
        disk.free()
        batch, values = make_batch(count=10, size=200)
        log.append(batch).durable.result(10)
        assert [bytes(m.data) for m in read_all(log)] == acked + values
        log.close()
        log = PartitionLog.open(disk.path / "t-0", "t", 0, config, 1)
        assert [bytes(m.data) for m in read_all(log)] == acked + values
        log.close()


def test_a_segment_roll_on_a_full_disk_changes_nothing_until_space_returns(tmp_path):
    # no inode left: creating the next segment's file fails while the current one can still grow
    with small_disk(tmp_path / "disk", 4 << 20, inodes=64) as disk:
        config = LogConfig(unflush_threshold=1, segment_bytes_max=8 * 1024, index_interval_bytes=1024)
        log = PartitionLog.open(disk.path / "t-0", "t", 0, config, 1)
        log.append(make_batch()[0]).durable.result(10)
        fillers = []
        for i in range(1000):
            try:
                (disk.path / f"inode-{i}").touch()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
            fillers.append(disk.path / f"inode-{i}")
        acked: list[bytes] = []
        for _ in range(400):
            batch, values = make_batch(count=5, size=200)
            try:
                log.append(batch).durable.result(10)
            except DiskFull:
                break
            acked.extend(values)
        else:
            raise AssertionError("the roll never ran out of inodes")
        segments_before = log.segment_base_offsets
        end_before = log.log_end_offset
        with pytest.raises(DiskFull):
            log.append(make_batch(count=5, size=200)[0])
        assert log.segment_base_offsets == segments_before and log.log_end_offset == end_before
        assert [bytes(m.data) for m in read_all(log)][-len(acked):] == acked
        for filler in fillers:
            filler.unlink()
        batch, values = make_batch(count=5, size=200)
        log.append(batch).durable.result(10)
        assert log.segment_count == len(segments_before) + 1
        assert [bytes(m.data) for m in read_all(log)][-len(acked) - len(values):] == acked + values
        log.close()
        log = PartitionLog.open(disk.path / "t-0", "t", 0, config, 1)
        assert log.recovery.clean and log.verify().ok
        log.close()


def test_a_failed_index_write_does_not_take_the_partition_offline(tmp_path, monkeypatch):
    # every sync writes the active segment's new index entries (by default only once they hold 4 KiB)
    monkeypatch.setattr(flush_module, "ACTIVE_INDEX_WRITE_BYTES", 0)
    config = LogConfig(unflush_threshold=1, segment_bytes_max=1 << 20, index_interval_bytes=100)
    log = PartitionLog.open(tmp_path / "t-0", "t", 0, config, 1)
    sent: list[bytes] = []
    for _ in range(5):
        batch, values = make_batch(count=3, size=50)
        log.append(batch).durable.result(10)
        sent.extend(values)
    real = segment_module._pwrite_file

    def full(files, path, data, position):  # type: ignore[no-untyped-def]
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(segment_module, "_pwrite_file", full)
    for _ in range(5):
        batch, values = make_batch(count=3, size=50)
        log.append(batch).durable.result(10)  # acknowledged: the log bytes are synced
        sent.extend(values)
    assert not (tmp_path / "t-0" / "00000000000000000000.index").exists(), "dropped, to be rebuilt"
    monkeypatch.setattr(segment_module, "_pwrite_file", real)
    batch, values = make_batch(count=3, size=50)
    log.append(batch).durable.result(10)
    sent.extend(values)
    assert (tmp_path / "t-0" / "00000000000000000000.index").stat().st_size > 0, "rewritten whole"
    assert [bytes(m.data) for m in read_all(log)] == sent
    log.close()
    log = PartitionLog.open(tmp_path / "t-0", "t", 0, config, 1)
    assert log.recovery.clean
    assert [bytes(m.data) for m in read_all(log)] == sent
    assert log.verify().ok
    log.close()
