"""A clean-shutdown record is a hint, never trusted blindly: stale, lying or damaged ones mean a full check.

Each case writes a log, closes it cleanly (the record is written), reopens it, appends more and
"crashes" (no record), tears the last batch, and then puts a bad record in place. A trusting open would
keep the torn batch or report the wrong end; the open must instead check the newest segment batch by
batch, cut the torn batch, keep every whole one, remove the record, and not crash on any content.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from storage_helpers import make_batch, no_sync, read_all

from metaq.storage import LogConfig, LogManager, PartitionLog
from metaq.storage.checkpoint import CLEAN_SHUTDOWN_FILE
from metaq.storage.index import OFFSET_ENTRY
from metaq.storage.manager import CHECKPOINT_FILE

CONFIG = LogConfig(unflush_threshold=1000, segment_bytes_max=1 << 20, index_interval_bytes=256)
FIRST_BATCHES = 5
LATER_BATCHES = 3
PER_BATCH = 2
TEAR_BYTES = 5


@dataclass
class Crashed:
    """A partition after a clean close, more appends, a crash and a torn last batch."""

    directory: Path
    clean_record: bytes
    """The record the clean close wrote (stale now: appends followed it)."""
    values: list[bytes]
    """Every payload in the whole batches, in offset order (the torn batch's are not here)."""
    file_bytes: int
    """The newest segment's size as the crash left it (torn)."""
    torn_batch_bytes: int


def open_manager(data_dir: Path) -> LogManager:
    return LogManager(data_dir, 3, CONFIG, sync=no_sync).open()


def crash(manager: LogManager) -> None:
    """What a killed process leaves: no flush, no record, the data dir lock released."""
    for partition_log in manager.logs():
        partition_log.abandon()
    manager.flusher.stop()
    manager._unlock_data_dir()


def append_batches(log: PartitionLog, count: int) -> tuple[list[bytes], list[int]]:
    values, sizes = [], []
    for _ in range(count):
        batch, batch_values = make_batch(count=PER_BATCH)
        log.append(batch)
        values.extend(batch_values)
        sizes.append(len(batch))
    return values, sizes


def tear(directory: Path, values: list[bytes], sizes: list[int], record: bytes) -> Crashed:
    segment = directory / "00000000000000000000.log"
    os.truncate(segment, segment.stat().st_size - TEAR_BYTES)
    return Crashed(directory, record, values[:-PER_BATCH], segment.stat().st_size, sizes[-1] - TEAR_BYTES)


@pytest.fixture
def crashed_manager(tmp_path: Path) -> Crashed:
    data_dir = tmp_path / "data"
    manager = open_manager(data_dir)
    values, sizes = append_batches(manager.get_or_create("t", 0), FIRST_BATCHES)
    manager.close()
    record = (data_dir / CHECKPOINT_FILE).read_bytes()
    manager = open_manager(data_dir)
    more_values, more_sizes = append_batches(manager.get_or_create("t", 0), LATER_BATCHES)
    crash(manager)
    return tear(data_dir / "t-0", values + more_values, sizes + more_sizes, record)


def manager_record(partitions: object, version: object = 1) -> bytes:
    return json.dumps({"broker_id": 3, "partitions": partitions, "version": version}).encode()


def lying(crashed: Crashed) -> dict[str, int]:
    """A record that matches the torn file exactly and claims the torn batch was whole."""
    return {"segment_base_offset": 0, "size_bytes": crashed.file_bytes,
            "log_end_offset": (FIRST_BATCHES + LATER_BATCHES) * PER_BATCH}


RECORDS: dict[str, Callable[[Crashed], bytes]] = {
    "stale: an older clean close": lambda c: c.clean_record,
    "lies: size matches, the torn batch counted": lambda c: manager_record({"t-0": lying(c)}),
    "lies: end offset one too many": lambda c: manager_record(
        {"t-0": {**lying(c), "log_end_offset": len(c.values) + 1}}),
    "names a segment that is not the newest": lambda c: manager_record(
        {"t-0": {**lying(c), "segment_base_offset": 1000}}),
    "for another partition only": lambda c: manager_record({"u-0": lying(c)}),
    "garbage": lambda c: b"{this is not json",
    "truncated": lambda c: c.clean_record[: len(c.clean_record) // 2],
    "empty": lambda c: b"",
    "binary": lambda c: bytes(range(256)) * 4,
    "not an object": lambda c: b"[1, 2, 3]",
    "another version": lambda c: manager_record({"t-0": lying(c)}, version=99),
    "partitions not a map": lambda c: manager_record([lying(c)]),
    "partition entry not a map": lambda c: manager_record({"t-0": "clean"}),
    "partition entry null": lambda c: manager_record({"t-0": None}),
    "missing field": lambda c: manager_record({"t-0": {"segment_base_offset": 0, "size_bytes": c.file_bytes}}),
    "text for a number": lambda c: manager_record({"t-0": {**lying(c), "size_bytes": "many"}}),
    "negative numbers": lambda c: manager_record({"t-0": {**lying(c), "log_end_offset": -1}}),
    "a list for a number": lambda c: manager_record({"t-0": {**lying(c), "size_bytes": [c.file_bytes]}}),
    "NaN": lambda c: manager_record({"t-0": {**lying(c), "size_bytes": float("nan")}}),
    "huge number": lambda c: manager_record({"t-0": {**lying(c), "size_bytes": 10 ** 40}}),
}

# these once crashed the open (OverflowError from int(float('inf'))) and kept the broker from starting
RECORDS_THAT_CRASHED: dict[str, Callable[[Crashed], bytes]] = {
    "Infinity": lambda c: manager_record({"t-0": {**lying(c), "size_bytes": float("inf")}}),
    "1e400 (a float beyond the double range)": lambda c: manager_record({"t-0": lying(c)}).replace(
        str(c.file_bytes).encode(), b"1e400"),
}
CASES = [pytest.param(name, make, id=name) for name, make in RECORDS.items()] + \
        [pytest.param(name, make, id=name) for name, make in RECORDS_THAT_CRASHED.items()]

# "lies" cases once left the torn bytes in the file: the fallback check stopped where the tail check had
CUT_CASES = [pytest.param(name, make, id=name) for name, make in RECORDS.items()]


def assert_fully_checked(log: PartitionLog, crashed: Crashed) -> None:
    assert not log.recovery.clean, "a record that does not hold was trusted"
    assert log.log_end_offset == len(crashed.values)
    assert [m.data for m in read_all(log)] == crashed.values
    batch, values = make_batch(count=PER_BATCH)
    assert log.append(batch).base_offset == len(crashed.values)
    assert [m.data for m in read_all(log)] == crashed.values + values


@pytest.mark.parametrize(("name", "make_record"), CASES)
def test_a_bad_checkpoint_means_a_full_check_not_trust_and_not_a_crash(
        crashed_manager: Crashed, name: str, make_record: Callable[[Crashed], bytes]) -> None:
    data_dir = crashed_manager.directory.parent
    (data_dir / CHECKPOINT_FILE).write_bytes(make_record(crashed_manager))
    manager = open_manager(data_dir)
    assert not (data_dir / CHECKPOINT_FILE).exists(), "the record must go before the first append"
    log = manager.get("t", 0)
    assert log is not None
    assert_fully_checked(log, crashed_manager)
    manager.close()
    # After the recovery, a clean close writes a record that holds, and it is trusted again.
    manager = open_manager(data_dir)
    log = manager.get("t", 0)
    assert log is not None and log.recovery.clean
    assert [m.data for m in read_all(log)][: len(crashed_manager.values)] == crashed_manager.values
    manager.close()


@pytest.mark.parametrize(("name", "make_record"), CUT_CASES)
def test_the_torn_batch_is_cut_from_the_file(crashed_manager: Crashed, name: str,
                                             make_record: Callable[[Crashed], bytes]) -> None:
    data_dir = crashed_manager.directory.parent
    (data_dir / CHECKPOINT_FILE).write_bytes(make_record(crashed_manager))
    manager = open_manager(data_dir)
    log = manager.get("t", 0)
    assert log is not None and log.recovery.truncated_bytes == crashed_manager.torn_batch_bytes
    segment = crashed_manager.directory / "00000000000000000000.log"
    assert segment.stat().st_size == crashed_manager.file_bytes - crashed_manager.torn_batch_bytes
    manager.close()


def test_a_checkpoint_that_holds_is_trusted(crashed_manager: Crashed) -> None:
    """The control case: with a record that describes the files, the open is clean and checks only the tail."""
    data_dir = crashed_manager.directory.parent
    segment = crashed_manager.directory / "00000000000000000000.log"
    os.truncate(segment, crashed_manager.file_bytes - crashed_manager.torn_batch_bytes)  # cut the torn batch
    whole = {"segment_base_offset": 0, "size_bytes": segment.stat().st_size,
             "log_end_offset": len(crashed_manager.values)}
    (data_dir / CHECKPOINT_FILE).write_bytes(manager_record({"t-0": whole}))
    manager = open_manager(data_dir)
    log = manager.get("t", 0)
    assert log is not None and log.recovery.clean and log.recovery.truncated_bytes == 0
    assert [m.data for m in read_all(log)] == crashed_manager.values
    manager.close()


# -- a log closed on its own keeps its record in its directory ----------------------------------------

@pytest.fixture
def crashed_log(open_log: Callable[..., PartitionLog]) -> Crashed:
    log = open_log()
    values, sizes = append_batches(log, FIRST_BATCHES)
    log.close()
    record = (log.directory / CLEAN_SHUTDOWN_FILE).read_bytes()
    log = open_log()
    more_values, more_sizes = append_batches(log, LATER_BATCHES)
    log.abandon()
    return tear(log.directory, values + more_values, sizes + more_sizes, record)


def partition_record(state: object) -> bytes:
    return json.dumps({"partition": state, "version": 1}).encode()


PARTITION_RECORDS: dict[str, Callable[[Crashed], bytes]] = {
    "stale: an older clean close": lambda c: c.clean_record,
    "lies: size matches, the torn batch counted": lambda c: partition_record(lying(c)),
    "garbage": lambda c: b"\x00\x01not json",
    "truncated": lambda c: c.clean_record[:-3],
    "wrong shape": lambda c: partition_record([1, 2, 3]),
}


@pytest.mark.parametrize("name", sorted(PARTITION_RECORDS))
def test_a_bad_partition_record_means_a_full_check(crashed_log: Crashed, open_log: Callable[..., PartitionLog],
                                                   name: str) -> None:
    marker = crashed_log.directory / CLEAN_SHUTDOWN_FILE
    marker.write_bytes(PARTITION_RECORDS[name](crashed_log))
    log = open_log()
    assert log.recovery.truncated_bytes == crashed_log.torn_batch_bytes or name.startswith("lies")
    assert_fully_checked(log, crashed_log)


def _index_file_bytes(directory: Path) -> int:
    path = directory / "00000000000000000000.index"
    return path.stat().st_size if path.exists() else 0


def _append_durably(log: PartitionLog, batches: int) -> list[bytes]:
    """Append ``batches`` batches of two 60-byte messages, each waited for until durable; their payloads."""
    sent: list[bytes] = []
    for _ in range(batches):
        batch, values = make_batch(count=2, size=60)
        log.append(batch).durable.result(10)
        sent.extend(values)
    return sent


def _index_entries(log: PartitionLog) -> list[tuple[int, int]]:
    index = log._active.index  # type: ignore[attr-defined]
    return list(zip(index.relative_offsets, index.positions, strict=True))


def test_the_active_segments_index_is_written_in_4_kib_runs_and_a_clean_open_indexes_the_rest(tmp_path):
    """A sync of a quiet partition writes no index file and neither does its clean close (10,000
    partitions: two creates and two fsyncs each); a clean open checks and indexes the batches after the
    last entry on disk, so lookups find every entry, and a crash loses none that a reader needs (the newest
    segment is checked whole and its index rebuilt)."""
    from metaq.storage.partition_flush import ACTIVE_INDEX_WRITE_BYTES

    config = LogConfig(unflush_threshold=1, index_interval_bytes=100)
    directory = tmp_path / "t-0"
    log = PartitionLog.open(directory, "t", 0, config, 1)
    sent = _append_durably(log, 5)
    assert _index_file_bytes(directory) == 0, "synced, but under 4 KiB of entries: nothing written yet"
    entries = _index_entries(log)
    assert len(entries) >= 3
    log.close()
    assert not (directory / "00000000000000000000.index").exists(), "the clean close created no index file"
    log = PartitionLog.open(directory, "t", 0, config, 1)
    assert log.recovery.clean and [bytes(m.data) for m in read_all(log)] == sent
    assert _index_entries(log) == entries, "the clean open indexed the batches the file does not cover"
    assert _index_file_bytes(directory) == 0, "and wrote nothing: the entries wait for a 4 KiB run"
    for _ in range(2000):  # enough entries for a run of their own: written by a sync, before any close
        batch, values = make_batch(count=2, size=60)
        log.append(batch).durable.result(10)
        sent.extend(values)
        if _index_file_bytes(directory) > 0:
            break
    written = _index_file_bytes(directory)
    assert written >= ACTIVE_INDEX_WRITE_BYTES // 2, f"a sync wrote {written} bytes of entries, not a 4 KiB run"
    on_disk = (directory / "00000000000000000000.index").read_bytes()
    assert [OFFSET_ENTRY.unpack_from(on_disk, i) for i in range(0, 8 * len(entries), 8)] == entries, \
        "the run starts with the entries the clean open made"
    log.abandon()  # a crash: the entries after the last run were never written
    log = PartitionLog.open(directory, "t", 0, config, 1)
    assert [bytes(m.data) for m in read_all(log)] == sent
    middle = len(sent) // 2
    assert [bytes(m.data) for m in read_all(log, start=middle)] == sent[middle:], "lookups through the index"
    assert log.verify().ok
    sent += _append_durably(log, 30)  # past the last run: entries in memory only
    everything = _index_entries(log)
    assert _index_file_bytes(directory) < 8 * len(everything)
    log.close()
    log = PartitionLog.open(directory, "t", 0, config, 1)
    assert log.recovery.clean
    assert _index_entries(log) == everything, "a clean open of a file behind the log indexes the rest"
    assert [bytes(m.data) for m in read_all(log, start=len(sent) - 7)] == sent[-7:]
    log.close()


def test_recovery_after_a_crash_creates_no_index_files_for_a_small_active_segment(tmp_path):
    """A start after kill -9 of 10,000 partitions created two index files each (7-13 s instead of 1.3 s):
    the newest segment's entries, rebuilt by its whole check, now wait for a 4 KiB run as after a clean
    open, and every lookup still goes through them."""
    config = LogConfig(unflush_threshold=1, index_interval_bytes=100)
    directory = tmp_path / "t-0"
    log = PartitionLog.open(directory, "t", 0, config, 1)
    sent = _append_durably(log, 8)
    entries = _index_entries(log)
    assert len(entries) >= 5
    log.abandon()
    log = PartitionLog.open(directory, "t", 0, config, 1)
    assert not log.recovery.clean
    assert sorted(p.name for p in directory.iterdir()) == ["00000000000000000000.log"]
    assert _index_entries(log) == entries
    for start in range(len(sent)):
        assert [bytes(m.data) for m in read_all(log, start=start)] == sent[start:]
    log.close()
    log = PartitionLog.open(directory, "t", 0, config, 1)
    assert log.recovery.clean and _index_entries(log) == entries
    assert [bytes(m.data) for m in read_all(log)] == sent
    log.close()
