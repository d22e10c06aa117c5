"""PartitionLog: appends, reads, rolls, indexes, timestamps, limits and recovery."""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import pytest
from storage_helpers import batch_with_timestamps, make_batch, read_all

from metaq.errors import CorruptRecordError, InvalidArgument, StorageError
from metaq.protocol.records import decode_batch, encode_values, iter_batches, validate_batch
from metaq.storage import OffsetOutOfRange
from metaq.storage.checkpoint import CLEAN_SHUTDOWN_FILE
from metaq.types import make_message_id, partition_tag


def segment_files(path: Path, suffix: str = ".log") -> list[Path]:
    return sorted(p for p in path.iterdir() if p.name.endswith(suffix))


def test_append_read_round_trip_stamps_offsets_ids_and_time(open_log):
    log = open_log()
    expected = []
    for i in range(20):
        batch, values = make_batch(count=1 + i % 5)
        result = log.append(batch, now_ms=5000 + i)
        assert result.base_offset == len(expected)
        assert result.last_offset == len(expected) + len(values) - 1
        assert result.base_message_id == make_message_id(7, partition_tag("t", 0), result.base_offset)
        assert result.append_time_ms == 5000 + i
        assert result.record_count == len(values)
        expected.extend(values)
    messages = read_all(log)
    assert [m.data for m in messages] == expected
    assert [m.offset for m in messages] == list(range(len(expected)))
    assert all(m.id == make_message_id(7, log.tag, m.offset) for m in messages)
    assert log.log_end_offset == len(expected)
    assert log.size_bytes == sum(p.stat().st_size for p in segment_files(log.directory))


def test_append_with_caller_validated_header(open_log):
    log = open_log()
    batch, values = make_batch()
    header = validate_batch(batch, 1 << 20, 1 << 20)
    log.append(memoryview(batch), header)
    assert [m.data for m in read_all(log)] == values


def test_limits_are_enforced_with_clear_errors(open_log):
    log = open_log(max_message_bytes=100, max_batch_bytes=1000)
    with pytest.raises(InvalidArgument, match="limit is 100"):
        log.append(encode_values([b"x" * 200], 1))
    with pytest.raises(InvalidArgument, match="limit is 1000"):
        log.append(encode_values([b"x" * 50] * 30, 1))
    damaged = bytearray(make_batch()[0])
    damaged[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        log.append(bytes(damaged))
    assert log.log_end_offset == 0 and log.size_bytes == 0


def test_read_at_end_is_empty_and_outside_range_raises_with_range(open_log):
    log = open_log()
    for _ in range(3):
        log.append(make_batch(count=2)[0])
    with log.read(6, 1000) as piece:
        assert piece.size == 0 and piece.fileno() == -1 and piece.read_bytes() == b""
    with pytest.raises(OffsetOutOfRange) as info:
        log.read(7, 1000)
    assert (info.value.earliest, info.value.latest, info.value.offset) == (0, 6, 7)
    with pytest.raises(OffsetOutOfRange):
        log.read(-1, 1000)


def test_read_returns_whole_batches_and_never_stalls(open_log):
    log = open_log()
    sizes = []
    for _ in range(10):
        batch, _ = make_batch(count=4, size=50)
        log.append(batch)
        sizes.append(len(batch))
    with log.read(5, 10) as piece:  # smaller than one batch: the whole first batch anyway
        assert piece.size == sizes[1]
        assert (piece.start_offset, piece.next_offset) == (4, 8)
    with log.read(5, sizes[1] + sizes[2] + 5) as piece:
        assert piece.size == sizes[1] + sizes[2]
        assert piece.next_offset == 12
        data = piece.read_bytes()
    assert [h.base_offset for _, h in iter_batches(data)] == [4, 8]
    with log.read(0, 1 << 20) as piece:
        assert piece.size == sum(sizes) and piece.next_offset == 40


def test_slice_pins_descriptor_and_sendfile_works(open_log, tmp_path):
    log = open_log()
    batch, values = make_batch()
    log.append(batch)
    out = tmp_path / "out"
    with log.read(0, 1 << 20) as piece, open(out, "wb") as f:
        assert piece.send_to(f.fileno()) == piece.size
    data = out.read_bytes()
    assert [m.data for m in decode_batch(data)] == values
    piece = log.read(0, 100)
    piece.release()
    piece.release()
    assert piece.released


def test_roll_at_segment_bytes_max(open_log):
    log = open_log(segment_bytes_max=1000)
    expected = []
    for _ in range(40):
        batch, values = make_batch(count=2, size=40)
        log.append(batch)
        expected.extend(values)
    files = segment_files(log.directory)
    assert len(files) == log.segment_count > 5
    assert all(p.stat().st_size <= 1000 for p in files)
    bases = [int(p.name[:20]) for p in files]
    assert bases == log.segment_base_offsets and bases[0] == 0
    assert [m.data for m in read_all(log, max_bytes=300)] == expected
    # A read stops at the end of a segment; the next read continues in the next one.
    with log.read(0, 1 << 20) as piece:
        assert piece.size == files[0].stat().st_size
        assert piece.next_offset == bases[1]


def test_batch_larger_than_segment_gets_its_own_segment(open_log):
    log = open_log(segment_bytes_max=300)
    small, _ = make_batch(count=1)
    big, big_values = make_batch(count=10, size=60)
    log.append(small)
    log.append(big)
    log.append(small)
    assert log.segment_count == 3
    assert [m.data for m in read_all(log)][1:11] == big_values


def test_locate_matches_a_scan_of_the_files(open_log):
    log = open_log(segment_bytes_max=3000, index_interval_bytes=200)
    rng = random.Random(1)
    for _ in range(80):
        log.append(make_batch(count=rng.randint(1, 6), size=rng.randint(1, 80))[0])
    truth = {}
    for path in segment_files(log.directory):
        base = int(path.name[:20])
        for position, header in iter_batches(path.read_bytes()):
            for offset in range(header.base_offset, header.next_offset):
                truth[offset] = (base, position)
    assert len(truth) == log.log_end_offset
    for offset, where in truth.items():
        assert log.locate(offset) == where
    log.close()
    log = type(log).open(log.directory, "t", 0, log.config, 7)
    for offset in rng.sample(sorted(truth), 50):
        assert log.locate(offset) == truth[offset]
    log.close()


def test_index_files_are_sparse_and_match_the_log(open_log):
    """A sealed segment's index file holds every entry (the active one's: 4 KiB runs, see
    test_storage_clean_shutdown)."""
    log = open_log(index_interval_bytes=500, segment_bytes_max=6000)
    for _ in range(30):
        log.append(make_batch(count=2, size=100)[0])
    log.close()
    logs = sorted(log.directory.glob("*.log"))
    assert len(logs) >= 2
    for sealed in logs[:-1]:
        base = int(sealed.stem)
        index = sealed.with_suffix(".index").read_bytes()
        assert len(index) % 8 == 0 and 0 < len(index) // 8 < 30
        positions = {p: h.base_offset - base for p, h in iter_batches(sealed.read_bytes())}
        previous = 0
        for i in range(0, len(index), 8):
            relative, position = int.from_bytes(index[i:i + 4], "big"), int.from_bytes(index[i + 4:i + 8], "big")
            assert positions[position] == relative
            assert position - previous >= 500
            previous = position


@pytest.mark.parametrize("reopen", [False, True])
def test_offset_for_timestamp_matches_brute_force(open_log, reopen):
    log = open_log(segment_bytes_max=2000, index_interval_bytes=150)
    rng = random.Random(5)
    stamps: list[int] = []
    for i in range(60):
        batch_stamps = [1000 + 10 * i + rng.randint(-40, 40) for _ in range(rng.randint(1, 5))]
        log.append(batch_with_timestamps(batch_stamps))
        stamps.extend(batch_stamps)
    if reopen:
        log.close()
        log = type(log).open(log.directory, "t", 0, log.config, 7)
    for target in [*range(900, 1700, 7), -5, 10**12]:
        expected = next((o for o, ts in enumerate(stamps) if ts >= target), len(stamps))
        assert log.offset_for_timestamp(target) == expected, target
    if reopen:
        log.close()


def test_missing_or_damaged_sealed_indexes_are_rebuilt(open_log):
    log = open_log(segment_bytes_max=1500, index_interval_bytes=100)
    rng = random.Random(2)
    stamps = []
    for i in range(50):
        batch_stamps = [i * 10 + rng.randint(0, 9) for _ in range(3)]
        log.append(batch_with_timestamps(batch_stamps))
        stamps.extend(batch_stamps)
    expected = read_all(log)
    log.close()
    indexes = segment_files(log.directory, ".index")
    indexes[0].unlink()
    (log.directory / indexes[1].name.replace(".index", ".timeindex")).unlink()
    indexes[2].write_bytes(bytes(range(16)) * 3)
    indexes[3].write_bytes(b"\xff" * 8)  # points past the log
    log = type(log).open(log.directory, "t", 0, log.config, 7)
    assert [m.data for m in read_all(log, max_bytes=100)] == [m.data for m in expected]
    for target in range(0, 500, 13):
        assert log.offset_for_timestamp(target) == next(o for o, ts in enumerate(stamps) if ts >= target)
    log.close()
    assert indexes[0].exists() and indexes[0].stat().st_size % 8 == 0


def test_clean_close_writes_marker_and_first_append_removes_it(open_log):
    log = open_log()
    log.append(make_batch()[0])
    log.close()
    marker = log.directory / CLEAN_SHUTDOWN_FILE
    assert marker.exists()
    log = open_log()
    assert log.recovery.clean
    log.append(make_batch()[0])
    assert not marker.exists()


def test_torn_tail_is_cut_and_appends_continue(open_log):
    log = open_log()
    sizes = []
    for _ in range(5):
        batch, _ = make_batch(count=2)
        log.append(batch)
        sizes.append(len(batch))
    log.abandon()
    path = log.directory / "00000000000000000000.log"
    os.truncate(path, sum(sizes) - 3)
    log = open_log()
    assert not log.recovery.clean and log.recovery.truncated_bytes == sizes[-1] - 3
    assert log.log_end_offset == 8
    batch, values = make_batch(count=2)
    assert log.append(batch).base_offset == 8
    assert [m.data for m in read_all(log, start=8)] == values


def test_zero_filled_tail_is_cut(open_log):
    log = open_log()
    log.append(make_batch()[0])
    log.abandon()
    path = log.directory / "00000000000000000000.log"
    with open(path, "ab") as f:
        f.write(bytes(4096))
    log = open_log()
    assert log.log_end_offset == 3 and log.recovery.truncated_bytes == 4096


def test_torn_tail_of_a_just_rolled_segment_drops_its_successors(open_log):
    log = open_log(segment_bytes_max=500)
    while log.segment_count < 3:
        log.append(make_batch(count=2, size=60)[0])
    bases = log.segment_base_offsets
    log.abandon()
    middle = log.directory / f"{bases[1]:020d}.log"
    data = middle.read_bytes()
    last_position = [p for p, _ in iter_batches(data)][-1]
    os.truncate(middle, last_position + 10)
    log = open_log(segment_bytes_max=500)
    assert log.segment_base_offsets == bases[:2]
    assert log.recovery.removed_segments == [bases[2]]
    messages = read_all(log)
    assert [m.offset for m in messages] == list(range(log.log_end_offset))


def test_short_write_is_completed(open_log, monkeypatch):
    log = open_log()
    real_pwritev = os.pwritev

    def short_pwritev(fd, buffers, position):
        joined = b"".join(bytes(b) for b in buffers)
        return real_pwritev(fd, [joined[:10]], position)

    monkeypatch.setattr(os, "pwritev", short_pwritev)
    batch, values = make_batch()
    log.append(batch)
    monkeypatch.undo()
    assert [m.data for m in read_all(log)] == values


def test_failed_write_leaves_no_partial_batch(open_log, monkeypatch):
    log = open_log()
    first, values = make_batch()
    log.append(first)
    real_pwritev = os.pwritev

    def failing_pwritev(fd, buffers, position):
        real_pwritev(fd, [bytes(buffers[0])], position)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwritev", failing_pwritev)
    with pytest.raises(StorageError, match="No space"):
        log.append(make_batch()[0])
    monkeypatch.undo()
    assert (log.directory / "00000000000000000000.log").stat().st_size == len(first)
    batch, more = make_batch()
    assert log.append(batch).base_offset == 3
    assert [m.data for m in read_all(log)] == values + more


def test_closed_log_refuses_calls(open_log):
    log = open_log()
    log.append(make_batch()[0])
    log.close()
    with pytest.raises(StorageError):
        log.append(make_batch()[0])
    with pytest.raises(StorageError):
        log.read(0, 100)


def test_delete_removes_the_directory(open_log):
    log = open_log()
    log.append(make_batch()[0])
    log.delete()
    assert not log.directory.exists()


def test_a_read_at_the_last_batch_follows_appends_truncation_and_reopen(open_log):
    """A fetch at the end of the log starts at the last batch written (not at the index entry before it):
    each offset of that batch, after every append, after a truncation and new appends, and after a reopen."""
    log = open_log()
    sent: list[bytes] = []
    for i in range(40):  # many batches past the last index entry (index_interval_bytes 256)
        batch, values = make_batch(count=1 + i % 3)
        base = log.append(batch).base_offset
        sent.extend(values)
        for offset in range(base, log.log_end_offset):
            piece = decode_batch(log.read_bytes(offset, 1 << 20))
            assert [m.data for m in piece if m.offset >= offset] == sent[offset:]
    cut = log.log_end_offset - 4  # the last batches: 4 messages of counts 3 and 1 (i = 38, 39)
    log.truncate_to(cut)
    del sent[cut:]
    assert decode_batch(log.read_bytes(cut - 1, 1 << 20))[-1].data == sent[cut - 1]
    batch, values = make_batch(count=2)
    log.append(batch)
    sent.extend(values)
    assert [m.data for m in decode_batch(log.read_bytes(cut, 1 << 20))] == values
    log.close()
    log = open_log()
    assert [m.data for m in decode_batch(log.read_bytes(cut + 1, 1 << 20)) if m.offset >= cut + 1] == values[1:]
    batch, values = make_batch(count=1)
    log.append(batch)
    assert [m.data for m in decode_batch(log.read_bytes(cut + 2, 1 << 20))] == values
    assert [m.data for m in read_all(log)] == [*sent, *values]


def test_an_appended_tail_is_the_batch_as_the_file_holds_it_until_dropped(open_log):
    """append(keep_tail=True) keeps the batch just written readable from memory (a woken long poll answers
    with it): byte for byte what the file holds at the place a read of its offset gives, only while it is the
    log's last batch, and never after drop_tail or a truncation."""
    log = open_log(segment_bytes_max=600)  # small segments: some appends roll first
    for i in range(12):
        batch, _values = make_batch(count=1 + i % 4)
        base = log.log_end_offset
        result = log.append(batch, now_ms=7000 + i, keep_tail=True)
        tail = log.appended_tail(base)
        with log.read(base, 1 << 20) as piece:  # carries the kept bytes; its place is the file's
            in_file = os.pread(piece.fileno(), piece.size, piece.position)
            assert piece.read_bytes() == in_file
            assert (piece.start_offset, piece.next_offset) == (base, result.last_offset + 1)
        assert tail == (in_file, result.last_offset + 1)
        assert log.appended_tail(base + 1) is None and log.appended_tail(base - 1) is None
        if i % 3 == 0:
            log.drop_tail()
            assert log.appended_tail(base) is None
    assert len(segment_files(log.directory)) > 1
    kept_base = log.log_end_offset
    log.append(make_batch()[0], keep_tail=True)
    log.append(make_batch()[0])  # a later append without keep_tail: the kept batch is no longer the last
    assert log.appended_tail(kept_base) is None
    base = log.log_end_offset
    log.append(make_batch()[0], keep_tail=True)
    log.truncate_to(base)
    assert log.appended_tail(base) is None
    log.append(make_batch(count=3)[0])  # the same offsets again, other bytes: never the old tail
    assert log.appended_tail(base) is None
