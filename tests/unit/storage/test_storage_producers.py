"""Idempotent producers in storage: the producer block of a batch, the per-partition table of what each
producer stored, and that table rebuilt from the log after a clean close, a crash, a roll, a truncation,
and on a follower that stores the master's stamped bytes."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from storage_helpers import no_sync, read_all

from metaq.errors import CorruptRecordError, InvalidArgument
from metaq.protocol.records import (
    PRODUCER_STAMPED,
    SEQUENCE_LIMIT,
    ProducerStamp,
    decode_batch,
    encode_messages,
    encode_values,
    producer_stamp,
    read_header,
    validate_batch,
    with_producer_stamp,
)
from metaq.storage import LogConfig, PartitionLog
from metaq.storage.producers import BATCHES_KEPT, ProducerStateTable, list_snapshots, snapshot_path
from metaq.types import Message

PID = 123456789


def stamped(values: list[bytes], sequence: int, epoch: int = 0, pid: int = PID) -> bytes:
    return with_producer_stamp(encode_values(values, 1000), ProducerStamp(pid, epoch, sequence))


# --------------------------------------------------------------------------- the producer block


def test_a_stamped_batch_validates_and_decodes_like_the_plain_one() -> None:
    messages = [Message("t", b"v%d" % i, key=b"k", headers=[("h", b"x")]) for i in range(5)]
    for compression in ("none", "lz4", "zstd"):
        plain = encode_messages(messages, compression)  # type: ignore[arg-type]
        batch = with_producer_stamp(plain, ProducerStamp(PID, 3, 40))
        header = validate_batch(batch, 1 << 20, 1 << 20)
        assert header.attributes & PRODUCER_STAMPED
        assert producer_stamp(batch, header) == ProducerStamp(PID, 3, 40)
        assert producer_stamp(plain, read_header(plain)) is None
        assert [m.data for m in decode_batch(batch)] == [m.data for m in messages]
        assert [m.headers for m in decode_batch(batch)] == [[("h", b"x")]] * 5


def test_a_flipped_bit_in_the_producer_block_fails_the_crc() -> None:
    batch = bytearray(stamped([b"a", b"b"], 0))
    batch[75] ^= 0x10  # inside the producer id
    with pytest.raises(CorruptRecordError):
        validate_batch(bytes(batch), 1 << 20, 1 << 20)


def test_stamps_out_of_range_and_double_stamps_are_refused() -> None:
    plain = encode_values([b"x"], 1)
    for bad in (ProducerStamp(0, 0, 0), ProducerStamp(1, -1, 0), ProducerStamp(1, 0, SEQUENCE_LIMIT)):
        with pytest.raises(InvalidArgument):
            with_producer_stamp(plain, bad)
    with pytest.raises(InvalidArgument):
        with_producer_stamp(stamped([b"x"], 0), ProducerStamp(1, 0, 0))


# --------------------------------------------------------------------------- the table


def test_the_table_tells_next_duplicate_gap_old_epoch_and_forgotten() -> None:
    table = ProducerStateTable()
    first = ProducerStamp(PID, 0, 0)
    assert table.check(first, 3).kind == "append"
    table.record(first, 3, 100, 5)
    assert table.check(ProducerStamp(PID, 0, 3), 2).kind == "append"
    dup = table.check(first, 3)
    assert dup.kind == "duplicate" and dup.original is not None and dup.original.base_offset == 100
    assert table.check(ProducerStamp(PID, 0, 4), 1).kind == "out-of-order"
    assert table.check(ProducerStamp(PID, 0, 1), 2).kind == "duplicate-unknown"  # not a batch it stored
    assert table.check(ProducerStamp(PID, 1, 0), 1).kind == "append"  # a new epoch starts at 0
    assert table.check(ProducerStamp(PID, 1, 5), 1).kind == "out-of-order"
    table.record(ProducerStamp(PID, 1, 0), 1, 103, 6)
    assert table.check(ProducerStamp(PID, 0, 3), 1).kind == "fenced"
    assert table.check(ProducerStamp(PID + 1, 0, 0), 1).kind == "append"  # an unknown id starts at 0 ...
    assert table.check(ProducerStamp(PID + 1, 0, 77), 1).kind == "unknown-producer"  # ... only: its start is missing


def test_sequences_wrap_around() -> None:
    table = ProducerStateTable()
    near_end = ProducerStamp(PID, 0, SEQUENCE_LIMIT - 2)
    table.record(near_end, 2, 0, 1)
    assert table.check(ProducerStamp(PID, 0, 0), 5).kind == "append"
    table.record(ProducerStamp(PID, 0, 0), 5, 2, 1)
    assert table.check(near_end, 2).kind == "duplicate"


def test_only_the_last_batches_are_remembered_with_offsets() -> None:
    table = ProducerStateTable()
    for i in range(BATCHES_KEPT + 10):
        table.record(ProducerStamp(PID, 0, i), 1, i, 1)
    assert table.check(ProducerStamp(PID, 0, 9), 1).kind == "duplicate-unknown"
    assert table.check(ProducerStamp(PID, 0, 10), 1).kind == "duplicate"


def test_idle_producers_expire() -> None:
    table = ProducerStateTable(expiration_ms=1000)
    table.record(ProducerStamp(PID, 0, 0), 1, 0, 5_000)
    table.record(ProducerStamp(PID + 1, 0, 0), 1, 1, 9_500)
    assert table.expire(10_000) == 1 and table.entry(PID) is None and table.entry(PID + 1) is not None


# --------------------------------------------------------------------------- in the log


def test_the_log_remembers_its_producers_across_close_and_reopen(open_log: Callable[..., PartitionLog]) -> None:
    log = open_log()
    log.append(stamped([b"a", b"b"], 0))
    log.append(stamped([b"c"], 2))
    log.append(encode_values([b"plain"], 1))
    log.close()
    log = open_log()
    verdict = log.producers.check(ProducerStamp(PID, 0, 0), 2)
    assert verdict.kind == "duplicate" and verdict.original is not None and verdict.original.base_offset == 0
    assert log.producers.check(ProducerStamp(PID, 0, 3), 1).kind == "append"


def test_the_log_rebuilds_its_producers_after_a_crash(open_log: Callable[..., PartitionLog]) -> None:
    log = open_log(segment_bytes_max=400)
    for i in range(30):  # several rolls: each writes a snapshot
        log.append(stamped([b"x" * 20, b"y" * 20], 2 * i))
    assert len(list_snapshots(log.directory)) >= 2
    log.abandon()  # as kill -9: no close, no final snapshot
    log = open_log(segment_bytes_max=400)
    for i in (0, 13, 29):
        verdict = log.producers.check(ProducerStamp(PID, 0, 2 * i), 2)
        assert verdict.kind == "duplicate" and verdict.original is not None and verdict.original.base_offset == 2 * i
    assert log.producers.check(ProducerStamp(PID, 0, 60), 1).kind == "append"


def test_a_damaged_or_too_new_snapshot_is_skipped(open_log: Callable[..., PartitionLog]) -> None:
    log = open_log(segment_bytes_max=400)
    for i in range(20):
        log.append(stamped([b"x" * 30], i))
    end = log.log_end_offset
    log.abandon()
    newest = list_snapshots(log.directory)[-1]
    path = snapshot_path(log.directory, newest)
    data = bytearray(path.read_bytes())
    data[-3] ^= 1
    path.write_bytes(bytes(data))
    snapshot_path(log.directory, end + 50).write_bytes(path.read_bytes())  # from bytes a crash took back
    log = open_log(segment_bytes_max=400)
    assert log.producers.check(ProducerStamp(PID, 0, 19), 1).kind == "duplicate"
    assert end + 50 not in list_snapshots(log.directory)


def test_truncation_forgets_what_it_cuts(open_log: Callable[..., PartitionLog]) -> None:
    log = open_log()
    log.append(stamped([b"a"], 0))
    log.append(stamped([b"b"], 1))
    log.truncate_to(1)
    assert log.producers.check(ProducerStamp(PID, 0, 1), 1).kind == "append"
    log.append(stamped([b"b2"], 1))
    log.close()
    log = open_log()
    assert [m.data for m in read_all(log)] == [b"a", b"b2"]
    assert log.producers.check(ProducerStamp(PID, 0, 1), 1).kind == "duplicate"


def test_a_follower_learns_the_producers_from_the_masters_bytes(tmp_path: Path) -> None:
    cfg = LogConfig(unflush_threshold=1000, segment_bytes_max=1 << 20, index_interval_bytes=256)
    master = PartitionLog.open(tmp_path / "m" / "t-0", "t", 0, cfg, 7, sync=no_sync)
    follower = PartitionLog.open(tmp_path / "f" / "t-0", "t", 0, cfg, 7, sync=no_sync)
    master.append(stamped([b"a", b"b"], 0))
    master.append(stamped([b"c"], 2, pid=PID + 5))
    follower.append_replicated(master.read_bytes(0, 1 << 20))
    verdict = follower.producers.check(ProducerStamp(PID + 5, 0, 2), 1)
    assert verdict.kind == "duplicate" and verdict.original is not None and verdict.original.base_offset == 2
    master.close()
    follower.close()


def test_no_snapshot_files_for_a_log_without_idempotent_producers(open_log: Callable[..., PartitionLog]) -> None:
    log = open_log()
    log.append(encode_values([b"a"], 1))
    log.close()
    assert not [n for n in os.listdir(log.directory) if n.endswith(".producers")]


def test_past_the_limit_the_producer_idle_longest_is_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    import metaq.storage.producers as producers
    monkeypatch.setattr(producers, "MAX_PRODUCERS", 3)
    table = ProducerStateTable()
    for pid in (1, 2, 3):
        table.record(ProducerStamp(pid, 0, 0), 1, pid, pid)
    table.record(ProducerStamp(1, 0, 1), 1, 10, 10)  # 1 is busy again: 2 is now the idlest
    table.record(ProducerStamp(4, 0, 0), 1, 11, 11)
    assert table.entry(2) is None and all(table.entry(p) is not None for p in (1, 3, 4))
