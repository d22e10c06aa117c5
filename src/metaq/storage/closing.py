"""Closing a partition log: a clean close, an abandon (as a crash leaves it), a delete.

A clean close flushes, makes the active segment's index durable, snapshots the idempotent producers and
records the clean-shutdown state (:class:`~metaq.storage.checkpoint.CleanState`) that the next open
trusts instead of checking the tail batch by batch (:mod:`metaq.storage.recovery`, the other end). An
abandon drops the log with nothing of that, for tests and fault injection; a delete closes and removes the
partition's directory.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Protocol

from metaq.errors import StorageError
from metaq.storage.checkpoint import CleanState, fsync_directory, write_partition_clean_state
from metaq.storage.errors import LogClosedError
from metaq.storage.files import FileCache
from metaq.storage.flush import resolve
from metaq.storage.producers import ProducerStateTable, list_snapshots, write_snapshot
from metaq.storage.segment import Segment

log = logging.getLogger("metaq.storage.log")

CLEAN_OPEN_WALK_BYTES = 1 << 20
"""A clean close writes the active segment's pending index entries when the log after the last entry on
disk holds this much or more; otherwise the next clean open reads that stretch's batch headers instead."""


class ClosingFlush(Protocol):
    """What closing needs of the partition's flush state (:class:`~metaq.storage.partition_flush.PartitionFlush`)."""

    sync_lock: threading.Lock

    def flush_pending(self) -> None: ...

    def abandon_locked(self) -> Future[None] | None: ...


class LogClosing:
    """close, abandon and delete: a part of :class:`~metaq.storage.log.PartitionLog`, whose attributes
    these are (the two slots here are this part's own state)."""

    __slots__ = ("_abandoned", "_closed")

    directory: Path
    producers: ProducerStateTable
    _active: Segment
    _segments: list[Segment]
    _end_offset: int
    _lock: threading.Lock
    _flush: ClosingFlush
    _files: FileCache
    _own_files: bool
    _sync: Callable[[int], None]
    _closed: bool
    """Set by close, abandon or delete: every operation of the log refuses from then on (LogClosedError)."""
    _abandoned: bool

    def close_writes_index_files(self) -> bool:
        """Whether :meth:`close` is to write (and fsync) the active segment's pending index entries."""
        return self._active.unindexed_bytes() >= CLEAN_OPEN_WALK_BYTES

    def close(self, *, write_marker: bool = True, sync_indexes: bool = True) -> CleanState | None:
        """Flush, sync the index files, and record a clean shutdown; returns the clean state (None if the
        log had failed). ``write_marker=False`` leaves the recording to the caller (the LogManager
        writes one checkpoint for all partitions); ``sync_indexes=False`` when a sync of the whole
        filesystem, after the last index write, already made the index files durable.

        The active segment's index entries not written yet (fewer than ``ACTIVE_INDEX_WRITE_BYTES``) are
        written only when they cover ``CLEAN_OPEN_WALK_BYTES`` of log or more: a clean open walks the
        batches after the last entry on disk anyway, and writing them here created two files per
        partition at the close of many small ones (seconds for 10,000)."""
        if self._closed:
            return None
        error: StorageError | None = None
        try:
            self._flush.flush_pending()
        except StorageError as exc:
            error = exc
        state: CleanState | None = None
        with self._flush.sync_lock:
            with self._lock:
                if self._closed:
                    return None
                self._closed = True
                active = self._active
                segments = list(self._segments)
            try:
                if error is None:
                    written = self.close_writes_index_files()
                    if written:
                        active.write_index_bytes(*active.take_pending_index_bytes())
                    if written or sync_indexes:
                        active.sync_index_files(self._sync, create=False)
                    state = CleanState(active.base_offset, active.size_bytes, self._end_offset)
                    if self.producers or list_snapshots(self.directory):
                        write_snapshot(self.directory, self.producers, self._end_offset)
                    if write_marker:
                        write_partition_clean_state(self.directory, state, sync=self._sync)
            except OSError as exc:
                error = StorageError(f"cannot close {self} cleanly: {exc}")
                state = None
            finally:
                self._release_files(segments)
        if error is not None:
            raise error
        return state

    def abandon(self) -> None:
        """Drop the log as a crash would: no flush, no clean-shutdown record; pending acks fail.

        For tests and fault injection; the files are left as the page cache has them.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._abandoned = True
            pending = self._flush.abandon_locked()
            segments = list(self._segments)
        resolve(pending, LogClosedError(f"{self} was abandoned before the flush"))
        self._release_files(segments)

    def delete(self) -> None:
        """Close the log (without a clean-shutdown record) and remove its directory."""
        if not self._closed:
            try:
                self.close(write_marker=False)
            except StorageError as exc:
                log.warning("deleting %s after a failed close: %s", self, exc)
        doomed = self.directory.with_name(self.directory.name + ".deleting")
        try:
            os.replace(self.directory, doomed)
        except FileNotFoundError:
            return
        except OSError:
            doomed = self.directory
        shutil.rmtree(doomed, ignore_errors=True)
        try:
            fsync_directory(self.directory.parent)
        except OSError:
            pass

    def _release_files(self, segments: list[Segment]) -> None:
        for segment in segments:
            for path in (segment.log_path, segment.index_path, segment.timeindex_path):
                self._files.discard(path)
        if self._own_files:
            self._files.close_all()
