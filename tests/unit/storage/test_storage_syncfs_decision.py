"""Where a flush round may be made durable by one syncfs (storage/flush.py, decide_syncfs): only on a
filesystem known to honour it, and not when the operator turned it off. The FUSE case, where syncfs persists
nothing, runs against a real FUSE mount in tests/system/storage/test_storage_power_loss.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from metaq.fsutil import FILESYSTEM_NAMES, SYNCFS_DURABLE_FILESYSTEMS, filesystem_name, filesystem_type
from metaq.storage import LogConfig, LogManager
from metaq.storage.flush import decide_syncfs


def test_the_filesystem_of_a_directory_is_named_from_statfs(tmp_path: Path) -> None:
    magic = filesystem_type(tmp_path)
    assert magic is not None and magic == filesystem_type(tmp_path / ".." / tmp_path.name)
    assert filesystem_name(tmp_path) == FILESYSTEM_NAMES.get(magic, f"0x{magic:08x}")
    assert filesystem_name("/proc") == "0x00009fa0"  # procfs: not in the table, named by its magic number
    assert filesystem_name(tmp_path / "missing") == "unknown"


def test_syncfs_is_used_on_an_allow_listed_filesystem_unless_turned_off(tmp_path: Path) -> None:
    name = filesystem_name(tmp_path)
    if name not in SYNCFS_DURABLE_FILESYSTEMS:
        pytest.skip(f"the test directory is on {name}")
    used = decide_syncfs(tmp_path, enabled=True, min_logs=32)
    assert used.used and used.filesystem == name and "32 or more partitions" in used.reason
    off = decide_syncfs(tmp_path, enabled=False, min_logs=32)
    assert not off.used and "syncfs=off" in off.reason
    none = decide_syncfs(tmp_path, enabled=True, min_logs=0)
    assert not none.used and "syncfsMinPartitions=0" in none.reason


def test_a_filesystem_not_on_the_list_gets_no_syncfs() -> None:
    decision = decide_syncfs("/proc", enabled=True, min_logs=2)
    assert not decision.used and decision.filesystem == "0x00009fa0"
    assert "not known to make data durable with syncfs" in decision.reason


def test_the_log_manager_keeps_its_decision_and_a_flusher_without_syncfs_where_it_is_off(tmp_path: Path) -> None:
    with LogManager(tmp_path / "a", 0, LogConfig(), syncfs_min_logs=2, use_syncfs=False) as manager:
        assert manager.flusher.filesystem_sync is None
        described = manager.describe_syncs()
        assert described is not None and described["syncfs"] is False and "syncfs=off" in described["syncfs_reason"]
    if filesystem_name(tmp_path) in SYNCFS_DURABLE_FILESYSTEMS:
        with LogManager(tmp_path / "b", 0, LogConfig(), syncfs_min_logs=2) as manager:
            assert manager.flusher.filesystem_sync is not None
            assert manager.describe_syncs() == {**manager.syncfs_decision.describe(),  # type: ignore[union-attr]
                                                "syncfs_rounds": 0, "syncfs_failures": 0, "syncfs_busy_skips": 0}
