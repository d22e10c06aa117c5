"""The per-segment key index and PartitionLog.find_messages (by key, by time range, both)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from metaq.protocol.records import encode_columns
from metaq.storage.keyindex import HEADER, KEYINDEX_SUFFIX, read_key_index


def keyed_batch(keys: list[bytes | None], timestamps: list[int] | None = None) -> bytes:
    n = len(keys)
    ts = timestamps if timestamps is not None else [1000] * n
    return encode_columns([b"v%d" % i for i in range(n)], ts, keys=keys)


def fill(log, batches: int = 40, per_batch: int = 5, key_count: int = 7) -> dict[bytes, list[int]]:
    """Append keyed batches (every 4th record unkeyed); returns the offsets of each key."""
    where: dict[bytes, list[int]] = {}
    offset = log.log_end_offset
    for b in range(batches):
        keys: list[bytes | None] = []
        for r in range(per_batch):
            i = b * per_batch + r
            key = None if i % 4 == 3 else b"key-%d" % (i % key_count)
            keys.append(key)
            if key is not None:
                where.setdefault(key, []).append(offset + r)
        log.append(keyed_batch(keys, [10_000 + b * per_batch + r for r in range(per_batch)]))
        offset += per_batch
    log.flush()
    return where


def keyindex_files(log) -> list[str]:
    return sorted(n for n in os.listdir(log.directory) if n.endswith(KEYINDEX_SUFFIX))


def offsets(result) -> list[int]:
    return [row[0] for row in result.rows]


def test_find_by_key_returns_exactly_the_offsets_holding_it_in_order(open_log):
    log = open_log(segment_bytes_max=2000)
    where = fill(log)
    assert log.segment_count > 3
    for key, expected in where.items():
        result = log.find_messages(key, limit=1000)
        assert offsets(result) == expected
        assert all(row[2] == key for row in result.rows)
        assert not result.truncated and result.scanned_segments == 0 and not result.problems
    assert offsets(log.find_messages(b"absent")) == []
    assert len(keyindex_files(log)) == log.segment_count


def test_message_ids_and_timestamps_match_the_stored_records(open_log):
    log = open_log()
    fill(log, batches=4)
    result = log.find_messages(b"key-1", limit=100)
    fetched = {m.offset: m for m in __import__("storage_helpers").read_all(log)}
    for offset, message_id, key, ts in result.rows:
        assert fetched[offset].id == message_id and fetched[offset].key == key
        assert fetched[offset].timestamp_ms == ts


def test_limit_truncates_and_says_so(open_log):
    log = open_log(segment_bytes_max=2000)
    where = fill(log)
    result = log.find_messages(b"key-2", limit=3)
    assert offsets(result) == where[b"key-2"][:3] and result.truncated


def test_time_range_is_exact(open_log):
    log = open_log(segment_bytes_max=2000)
    fill(log)  # record i has timestamp 10_000 + i
    result = log.find_messages(None, 10_050, 10_079, limit=1000)
    assert offsets(result) == list(range(50, 80))
    result = log.find_messages(b"key-0", 10_050, 10_079, limit=1000)
    assert offsets(result) == [o for o in range(50, 80) if o % 4 != 3 and o % 7 == 0]
    assert offsets(log.find_messages(None, 10_195, -1, limit=1000)) == list(range(195, 200))
    assert offsets(log.find_messages(None, -1, 10_002, limit=1000)) == [0, 1, 2]
    assert offsets(log.find_messages(None, 20_000, -1)) == []


def test_active_segment_index_is_extended_by_later_searches(open_log):
    log = open_log()
    fill(log, batches=2)
    first = offsets(log.find_messages(b"key-1", limit=100))
    where = fill(log, batches=2)
    assert offsets(log.find_messages(b"key-1", limit=100)) == first + where[b"key-1"]


def test_rebuilt_after_a_crash_and_when_missing_or_damaged(open_log):
    log = open_log(segment_bytes_max=2000)
    where = fill(log)
    assert offsets(log.find_messages(b"key-4", limit=1000)) == where[b"key-4"]
    log.abandon()
    log = open_log(segment_bytes_max=2000)
    assert offsets(log.find_messages(b"key-4", limit=1000)) == where[b"key-4"]
    names = keyindex_files(log)
    os.unlink(log.directory / names[0])
    (log.directory / names[1]).write_bytes(b"garbage")
    last = log.directory / names[-1]
    data = bytearray(last.read_bytes())
    data[4:8] = (1 << 30).to_bytes(4, "big")  # claims more bytes than the log holds: stale
    last.write_bytes(bytes(data))
    middle = log.directory / names[2]
    data = bytearray(middle.read_bytes())
    data[HEADER.size + 9] ^= 0xFF  # an entry, as a torn write could leave it
    middle.write_bytes(bytes(data))
    assert read_key_index(str(middle), 1 << 20) is None
    assert offsets(log.find_messages(b"key-4", limit=1000)) == where[b"key-4"]
    assert read_key_index(str(last), 1 << 20) is not None


def test_recovery_cut_removes_the_index_of_the_cut_segment(open_log):
    log = open_log()
    where = fill(log, batches=10)
    assert offsets(log.find_messages(b"key-5", limit=1000)) == where[b"key-5"]
    log.abandon()
    path = log.directory / f"{0:020d}.log"
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - 7)  # a torn last batch
    log = open_log()
    assert log.log_end_offset == 45
    assert keyindex_files(log) == []
    assert offsets(log.find_messages(b"key-5", limit=1000)) == [o for o in where[b"key-5"] if o < 45]


def test_truncate_to_removes_indexes_and_new_data_is_found(open_log):
    log = open_log(segment_bytes_max=2000)
    where = fill(log)
    log.find_messages(b"key-6", limit=1000)
    log.truncate_to(100)
    assert len(keyindex_files(log)) < log.segment_count or log.segment_count == 1
    again = fill(log, batches=4)
    expected = [o for o in where[b"key-6"] if o < 100] + again[b"key-6"]
    assert offsets(log.find_messages(b"key-6", limit=1000)) == expected


def test_retention_removes_the_index_with_its_segment(open_log):
    log = open_log(segment_bytes_max=2000, delete_policy="delete,1s")
    fill(log)
    log.find_messages(b"key-0", limit=1000)
    count = log.segment_count
    then = time.time() - 3600
    for base in log.segment_base_offsets[:2]:
        os.utime(log.directory / f"{base:020d}.log", (then, then))
    removed = log.apply_retention()
    assert len(removed) == 2 and log.segment_count == count - 2
    assert len(keyindex_files(log)) == log.segment_count
    assert all(o >= log.log_start_offset for o in offsets(log.find_messages(b"key-0", limit=1000)))


def test_stray_key_index_without_its_log_is_removed_on_open(open_log):
    log = open_log()
    fill(log, batches=2)
    log.close()
    stray = Path(log.directory) / f"{12345:020d}{KEYINDEX_SUFFIX}"
    stray.write_bytes(HEADER.pack(b"MQK2", 0, 0, 0, 0, 0))
    log = open_log()
    assert not stray.exists()


def test_past_the_bound_the_segment_is_scanned_and_reported(open_log):
    log = open_log()
    where = fill(log, batches=10)
    result = log.find_messages(b"key-1", limit=1000, max_key_entries=8)
    assert offsets(result) == where[b"key-1"]
    assert result.scanned_segments == 1
    index = read_key_index(str(log.directory / keyindex_files(log)[0]), 1 << 20)
    assert index is not None and index.full and len(index) <= 8
    again = log.find_messages(b"key-1", limit=1000, max_key_entries=8)
    assert offsets(again) == where[b"key-1"] and again.scanned_segments == 1


def test_damage_is_reported_and_other_segments_are_still_searched(open_log):
    from metaq.protocol.records import HEADER_BYTES, iter_batches

    log = open_log(segment_bytes_max=2000)
    where = fill(log)
    log.close()
    first = log.directory / f"{0:020d}.log"
    data = bytearray(first.read_bytes())
    batches = list(iter_batches(bytes(data)))
    position, header = batches[2]
    data[position + HEADER_BYTES + 2] ^= 0xFF  # the offset-delta column of one batch's body
    first.write_bytes(bytes(data))
    log = open_log(segment_bytes_max=2000)
    second_base = log.segment_base_offsets[1]
    result = log.find_messages(b"key-0", limit=1000)
    assert result.problems
    assert [o for o in offsets(result) if o >= second_base] == [o for o in where[b"key-0"] if o >= second_base]
    assert [o for o in offsets(result) if o < header.base_offset] == \
        [o for o in where[b"key-0"] if o < header.base_offset]


@pytest.mark.parametrize("mask", [0xFF, 0x01, 0x04, 0x80])
def test_every_flipped_byte_of_a_key_index_gives_the_same_answers(open_log, mask):
    """The key index is derived data: whatever byte is damaged, a search answers exactly what the log holds
    (a damaged header or entry makes it rebuild the file; before the header had its checksum a flipped
    covered_bytes skipped records or listed them twice)."""
    log = open_log()
    where = fill(log, batches=6)
    for key, expected in where.items():
        assert offsets(log.find_messages(key, limit=1000)) == expected
    (name,) = keyindex_files(log)
    path = Path(log.directory) / name
    clean = path.read_bytes()
    for i in range(len(clean)):
        damaged = bytearray(clean)
        damaged[i] ^= mask
        path.write_bytes(bytes(damaged))
        for key, expected in where.items():
            result = log.find_messages(key, limit=1000)
            assert offsets(result) == expected and not result.problems, (i, key)
        assert path.read_bytes() == clean or i >= HEADER.size, f"byte {i}: a damaged header is rebuilt"
