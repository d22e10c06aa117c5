"""Retention that fails midway: reported, nothing lost, the log keeps working, a later run finishes the job.

Faults are injected at the OS boundary: ``os.unlink`` refusing one file (what a read-only mount, an
immutable file or a permission change does), or the zip archive running out of space.
"""

from __future__ import annotations

import errno
import logging
import os
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from storage_helpers import make_batch, no_sync, read_all

from metaq.errors import StorageError
from metaq.storage import LogConfig, LogManager, PartitionLog

HOUR_MS = 3_600_000


class RefuseUnlink:
    """Makes ``os.unlink`` of the given paths fail with EACCES until :meth:`heal`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: set[str] = set()
        self.refused: list[str] = []
        real = os.unlink

        def unlink(path: str | os.PathLike[str], *args: object, **kwargs: object) -> None:
            if os.fspath(path) in self.paths:
                self.refused.append(os.fspath(path))
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
            real(path, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(os, "unlink", unlink)

    def refuse(self, path: Path) -> None:
        self.paths.add(os.fspath(path))

    def heal(self) -> None:
        self.paths.clear()


@pytest.fixture
def refuse_unlink(monkeypatch: pytest.MonkeyPatch) -> Iterator[RefuseUnlink]:
    yield RefuseUnlink(monkeypatch)


def age_segments(log: PartitionLog, count: int, age_ms: int = 2 * HOUR_MS) -> None:
    then = time.time() - age_ms / 1000
    for base in log.segment_base_offsets[:count]:
        os.utime(log.directory / f"{base:020d}.log", (then, then))


def fill(log: PartitionLog, segments: int) -> list[bytes]:
    values = []
    while log.segment_count < segments:
        batch, batch_values = make_batch(count=2, size=50)
        log.append(batch)
        values.extend(batch_values)
    return values


def segment_path(log: PartitionLog, base: int) -> Path:
    return log.directory / f"{base:020d}.log"


def test_a_segment_that_cannot_be_removed_is_reported_and_the_log_keeps_working(
        open_log: Callable[..., PartitionLog], refuse_unlink: RefuseUnlink) -> None:
    log = open_log(segment_bytes_max=400, delete_policy="delete,1h")
    values = fill(log, 5)
    bases = log.segment_base_offsets
    age_segments(log, 2)
    refuse_unlink.refuse(segment_path(log, bases[0]))
    with pytest.raises(StorageError, match=f"{bases[0]:020d}.log"):
        log.apply_retention()
    assert refuse_unlink.refused
    assert segment_path(log, bases[0]).exists()
    # Appends, reads and offsets still work, and nothing that was not expired is gone.
    batch, more = make_batch(count=2, size=50)
    assert log.append(batch).base_offset == len(values)
    start = log.log_start_offset
    assert start <= bases[2]
    assert [m.data for m in read_all(log)] == values[start:] + more
    log.close()


def test_the_next_run_removes_a_segment_an_earlier_run_could_not(
        open_log: Callable[..., PartitionLog], refuse_unlink: RefuseUnlink) -> None:
    log = open_log(segment_bytes_max=400, delete_policy="delete,1h")
    values = fill(log, 5)
    bases = log.segment_base_offsets
    age_segments(log, 2)
    refuse_unlink.refuse(segment_path(log, bases[0]))
    with pytest.raises(StorageError):
        log.apply_retention()
    refuse_unlink.heal()
    log.apply_retention()
    assert not segment_path(log, bases[0]).exists(), "the segment the first run could not remove is still there"
    assert not segment_path(log, bases[1]).exists()
    assert log.log_start_offset == bases[2]
    log.close()
    log = open_log(segment_bytes_max=400, delete_policy="delete,1h")
    assert log.log_start_offset == bases[2], "a restart brought expired data back"
    assert [m.data for m in read_all(log)] == values[bases[2]:]


def test_a_failed_zip_archive_loses_nothing_and_its_temp_file_goes_at_the_next_open(
        open_log: Callable[..., PartitionLog], monkeypatch: pytest.MonkeyPatch) -> None:
    log = open_log(segment_bytes_max=400, delete_policy="archive,1h,true")
    values = fill(log, 4)
    bases = log.segment_base_offsets
    age_segments(log, 1)

    def no_space(self: zipfile.ZipFile, *args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as patch:
        patch.setattr(zipfile.ZipFile, "write", no_space)
        with pytest.raises(StorageError, match=f"{bases[0]:020d}.log"):
            log.apply_retention()
    assert segment_path(log, bases[0]).exists(), "the segment was removed although its archive failed"
    assert not (log.directory / f"{bases[0]:020d}.log.zip").exists()
    log.close()
    log = open_log(segment_bytes_max=400, delete_policy="archive,1h,true")
    assert not list(log.directory.glob("*.tmp"))
    assert [m.data for m in read_all(log, start=0)] == values
    # And the archive succeeds once there is room.
    age_segments(log, 1)
    assert log.apply_retention() == bases[:1]
    with zipfile.ZipFile(log.directory / f"{bases[0]:020d}.log.zip") as zf:
        assert zf.namelist() == [f"{bases[0]:020d}.log"]
    log.close()


def test_one_partition_failing_does_not_stop_retention_of_the_others(
        tmp_path: Path, refuse_unlink: RefuseUnlink, caplog: pytest.LogCaptureFixture) -> None:
    config = LogConfig(unflush_threshold=1000, segment_bytes_max=400, delete_policy="delete,1h")
    manager = LogManager(tmp_path / "data", 3, config, sync=no_sync).open()
    logs = {name: manager.get_or_create(name, 0) for name in ("a", "b", "c")}
    for log in logs.values():
        fill(log, 4)
    manager.flush_all()  # rolled segments are kept until synced: sync them now rather than race the flusher
    for log in logs.values():
        age_segments(log, 3)
    stuck = segment_path(logs["b"], 0)
    refuse_unlink.refuse(stuck)
    with caplog.at_level(logging.ERROR, logger="metaq.storage.manager"):
        outcome = manager.run_retention()
    removed = outcome.removed
    assert set(removed) == {"a-0", "c-0"} and list(outcome.failures) == ["b-0"]
    assert all(len(bases) == 3 for bases in removed.values()), removed
    assert stuck.name in caplog.text
    for name in ("a", "c"):
        assert logs[name].segment_count == 1
    manager.close()
