"""Leftovers of interrupted work are removed on open, and never mistaken for data.

A crash can leave ``.tmp`` files (a checkpoint or a zip archive half written), index files whose log
is gone (retention deletes the log first), index files of a segment whose log was never created (a
roll cut short), and ``<topic>-<partition>.deleting`` directories (a topic deletion cut short). The
next open removes them and the data is exactly what it was.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from storage_helpers import make_batch, no_sync, read_all

from metaq.storage import LogConfig, LogManager, PartitionLog

ORPHAN_INDEX_ENTRY = struct.pack(">II", 1, 10)
"""A plausible offset index entry (relative offset 1 at byte 10) that points inside a batch."""
ORPHAN_TIME_ENTRY = struct.pack(">qI", 10**12, 1)


def fill(log: PartitionLog, batches: int) -> list[bytes]:
    values = []
    for _ in range(batches):
        batch, batch_values = make_batch(count=2)
        log.append(batch)
        values.extend(batch_values)
    return values


def names(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir()}


def plant_strays(directory: Path, future_base: int) -> set[str]:
    """Leftovers of interrupted work; returns their names."""
    strays = {
        "clean-shutdown.json.tmp": b'{"partition": {"segment_base_offset": 0',
        "00000000000000000000.log.zip.tmp": b"PK\x03\x04 half a zip",
        "00000000000000000000.index.tmp": ORPHAN_INDEX_ENTRY,
        "anything.tmp": b"",
        # retention removed the log of segment 7 and was stopped before its indexes
        "00000000000000000007.index": ORPHAN_INDEX_ENTRY,
        "00000000000000000007.timeindex": ORPHAN_TIME_ENTRY,
        # a roll created the next segment's indexes and was stopped before its log
        f"{future_base:020d}.index": ORPHAN_INDEX_ENTRY,
        f"{future_base:020d}.timeindex": ORPHAN_TIME_ENTRY,
    }
    for name, data in strays.items():
        (directory / name).write_bytes(data)
    return set(strays)


@pytest.mark.parametrize("clean", [True, False], ids=["after-clean-close", "after-crash"])
def test_temp_files_and_orphan_indexes_are_removed_and_the_data_is_intact(
        open_log: Callable[..., PartitionLog], clean: bool) -> None:
    log = open_log(index_interval_bytes=64)
    values = fill(log, 600)
    log.flush()  # the index entries are written (4 KiB runs): the clean open must keep that file
    end = log.log_end_offset
    if clean:
        log.close()
    else:
        log.abandon()
    before = names(log.directory)
    kept_index = (log.directory / "00000000000000000000.index").read_bytes() if clean else None
    assert kept_index is None or len(kept_index) >= 4096
    strays = plant_strays(log.directory, end)

    log = open_log(index_interval_bytes=64)
    assert log.recovery.clean == clean
    assert not strays & names(log.directory), f"left behind: {sorted(strays & names(log.directory))}"
    assert before <= names(log.directory) | {"clean-shutdown.json"}
    if kept_index is not None:
        assert (log.directory / "00000000000000000000.index").read_bytes() == kept_index
    assert [m.data for m in read_all(log)] == values
    for offset in range(end):  # every lookup goes through the (kept) index and finds its batch
        assert read_all(log, start=offset)[0].data == values[offset]
    log.close()


def test_the_manager_removes_deleting_directories_and_ignores_foreign_ones(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    manager = LogManager(data_dir, 3, LogConfig(unflush_threshold=1000), sync=no_sync).open()
    values = fill(manager.get_or_create("t", 0), 4)
    manager.close()
    doomed = data_dir / "gone-1.deleting"
    (doomed / "sub").mkdir(parents=True)
    (doomed / "00000000000000000000.log").write_bytes(b"old data")
    (doomed / "sub" / "x").write_bytes(b"x")
    foreign = data_dir / "not a partition"
    foreign.mkdir()
    (foreign / "keep.txt").write_bytes(b"someone else's")
    (data_dir / "t-0" / "00000000000000000000.log.zip.tmp").write_bytes(b"half")

    manager = LogManager(data_dir, 3, LogConfig(unflush_threshold=1000), sync=no_sync).open()
    assert not doomed.exists()
    assert (foreign / "keep.txt").read_bytes() == b"someone else's"
    assert manager.topics() == {"t": [0]}
    log = manager.get("t", 0)
    assert log is not None and log.recovery.clean
    assert not (data_dir / "t-0" / "00000000000000000000.log.zip.tmp").exists()
    assert [m.data for m in read_all(log)] == values
    manager.close()
    assert os.path.isdir(foreign)
