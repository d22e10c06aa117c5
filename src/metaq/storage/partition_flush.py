"""PartitionFlush: one partition's durability bookkeeping, what the flusher (storage/flush.py) drives.

The rule, written once: an append is accounted under the log's lock (:meth:`PartitionFlush.account_locked`),
which says which future its ack may wait for and whether to wait; what the flush policy then asks of the
flusher (or, for a log without one, of an inline sync) is done after the lock (:meth:`PartitionFlush.hand_over`).

=====================  ===================================================================================
unflush_threshold      an append
=====================  ===================================================================================
1                      gets a future of its own and a forced fdatasync of its segment; the ack waits
<= 0 (group commit)    shares the partition's pending future; the ack waits; the next round syncs it
N > 1                  shares the pending future; the ack does not wait; a sync is asked for at N unflushed
                       messages or ``unflush_interval_ms`` after the first unflushed append
=====================  ===================================================================================

A roll asks for a sync of the sealed segment at once. A flush takes, under the log's lock, what is unsynced
now and the acks waiting for it (:meth:`PartitionFlush.flush_pending`), syncs it outside that lock (under its
own sync lock, so appends go on), then resolves those acks. A flush round that syncs the whole filesystem
splits that in two around the syncfs (:meth:`begin_covered_flush`, :meth:`end_covered_flush`).

The log and its flush state are one unit split for size: this class reads the log's segment list, lock,
files and failure state, and sets its failure when a sync fails.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import NamedTuple, Protocol

from metaq.errors import StorageError
from metaq.storage.checkpoint import fsync_directory
from metaq.storage.config import LogConfig
from metaq.storage.errors import LogClosedError
from metaq.storage.files import SHORTAGE_ERRNOS, FileCache
from metaq.storage.flush import Flusher, new_durable_future, resolve
from metaq.storage.segment import Segment

log = logging.getLogger(__name__)

FLUSH_RETRY_MS = 100
"""How soon a flush that could not open a file for want of descriptors is tried again."""
ACTIVE_INDEX_WRITE_BYTES = 4096
"""A sync writes the active segment's new index entries once they hold this much (about 200 entries, some
800 KiB of log at the default index interval), at a seal, and at a clean close only past
``CLEAN_OPEN_WALK_BYTES`` (storage/closing.py). Only a clean open reads the active segment's index files (after a
crash the newest segment is checked whole and its indexes rebuilt), and it indexes the batches after their
last entry again from their headers, so an entry not written costs that walk at the next open, never an
answer; a sync of a quiet partition among 10,000 then opens and writes no index file (two opens, two
writes and usually two evictions a partition a round), and neither does its clean close (two creates and
two fsyncs a partition)."""


class AppendResult(NamedTuple):
    """What an append assigned, and how to wait for it to be on disk.

    ``durable`` resolves (with None, or StorageError) once the batch is fsynced; it cannot be cancelled.
    ``wait_for_durable`` says whether the flush policy wants the ack to wait for it.
    """

    base_offset: int
    last_offset: int
    base_message_id: int
    append_time_ms: int
    record_count: int
    durable: Future[None]
    wait_for_durable: bool


class Handover(NamedTuple):
    """What an append's accounting asks for once the log's lock is released (:meth:`PartitionFlush.hand_over`)."""

    forced: Segment | None
    """unflush_threshold=1: the segment to fdatasync for this append."""
    request: bool
    """A sync of the partition is due (threshold reached, group commit, a roll)."""
    first_unflushed_ms: int
    flusher: Flusher | None
    """The flusher to hand it to; None: sync inline when due."""


class Unsynced(NamedTuple):
    """What one flush took under the log's lock (:meth:`PartitionFlush.take_unsynced_locked`)."""

    sealed: list[tuple[Segment, bytes, bytes]]
    """Sealed segments not yet synced, each with its index entries not yet written."""
    active: Segment
    target_bytes: int
    """The active segment's size when taken: what the flush makes durable."""
    active_index: tuple[bytes, bytes]
    forced: Segment | None
    pending: Future[None] | None
    """The acks waiting for this flush."""
    first_unflushed_ms: int
    pinned: list[Segment]
    failure: StorageError | None
    """The log's failure when taken: nothing is synced, the acks fail with it."""


class FlushedLog(Protocol):
    """What the flush state uses of its :class:`~metaq.storage.log.PartitionLog`: the segments and files it
    syncs, the log's lock and failure state, and its flush for the flusher to call back. Declared here, so
    this module need not import log.py, which holds a PartitionFlush."""

    directory: Path
    device: int
    _config: LogConfig
    _clock: Callable[[], float]
    _sync: Callable[[int], None]
    _flusher: Flusher | None
    _files: FileCache
    _lock: threading.Lock
    _closed: bool
    _abandoned: bool
    _failure: StorageError | None
    _active: Segment

    def flush_pending(self, forced_segment: Segment | None = None, future: Future[None] | None = None) -> None: ...


class PartitionFlush:
    """The durability state of one :class:`~metaq.storage.log.PartitionLog` (see the module doc)."""

    __slots__ = ("first_unflushed_ms", "flush_requested", "parent_unsynced", "pending_future", "plog",
                 "sync_lock", "unflushed_messages", "unsynced_sealed")

    def __init__(self, plog: FlushedLog, *, parent_unsynced: bool) -> None:
        self.plog = plog
        self.sync_lock = threading.Lock()
        """Serialises the blocking syncs, which run without the log's lock so appends go on meanwhile."""
        self.pending_future: Future[None] | None = None
        """What the acks of appends not yet taken by a flush wait for (group commit, N > 1)."""
        self.unflushed_messages = 0
        self.first_unflushed_ms = -1
        self.flush_requested = False
        self.unsynced_sealed: list[Segment] = []
        """Sealed segments whose bytes and index files a flush has yet to sync (retention keeps them)."""
        self.parent_unsynced = parent_unsynced
        """The partition's directory is new: its entry in the data directory is yet to be made durable."""

    # ------------------------------------------------------------------ an append

    def account_locked(self, segment: Segment, record_count: int, rolled: bool,
                       ) -> tuple[Future[None], bool, Handover | None]:
        """Account an append just written to ``segment`` (under the log's lock): (the future its ack waits
        for, whether it waits, what to hand over after the lock, or None when nothing is to be done then)."""
        plog = self.plog
        config = plog._config
        flusher = plog._flusher
        if flusher is not None and not flusher.accepting:
            flusher = None
        request = rolled and not self.flush_requested
        threshold = config.unflush_threshold
        if threshold == 1:
            if request:
                self.flush_requested = True
            return new_durable_future(), True, Handover(segment, request, self.first_unflushed_ms, flusher)
        future = self.pending_future
        if future is None:
            future = self.pending_future = new_durable_future()
        wait = threshold <= 0
        if wait:
            request = request or not self.flush_requested
        else:
            self.unflushed_messages += record_count
            if self.unflushed_messages >= threshold and not self.flush_requested:
                request = True
            if self.first_unflushed_ms < 0:
                self.first_unflushed_ms = int(plog._clock() * 1000)
                if flusher is not None:
                    flusher.flush_at(plog, self.first_unflushed_ms + config.unflush_interval_ms)
        if request:
            self.flush_requested = True
        elif flusher is not None:
            return future, wait, None  # the common case: an interval under way, the flusher already told
        return future, wait, Handover(None, request, self.first_unflushed_ms, flusher)

    def hand_over(self, handover: Handover, future: Future[None], wait: bool) -> None:
        """Outside the log's lock: hand the append to the flusher, or sync inline when there is none."""
        forced, request, first_unflushed_ms, flusher = handover
        plog = self.plog
        if flusher is not None:
            if forced is not None:
                flusher.sync_append(plog, forced, future)
            elif request:
                flusher.flush_soon(plog)
        elif forced is not None or wait or request or (
                first_unflushed_ms >= 0
                and int(plog._clock() * 1000) - first_unflushed_ms >= plog._config.unflush_interval_ms):
            self.flush_pending(forced, future if forced is not None else None)

    @property
    def pending(self) -> bool:
        """Whether a flush has something to do (a pending ack or a sealed segment)."""
        return self.pending_future is not None or bool(self.unsynced_sealed)

    def abandon_locked(self) -> Future[None] | None:
        """The pending future, taken (the log is being dropped as a crash would)."""
        pending, self.pending_future = self.pending_future, None
        return pending

    # ------------------------------------------------------------------ a flush

    def flush_pending(self, forced_segment: Segment | None = None, future: Future[None] | None = None) -> None:
        """Sync whatever is unsynced, then resolve the durable futures it covers.

        ``forced_segment`` gets an fdatasync even when another sync already covered it (the
        one-sync-per-append rule of unflush_threshold=1); ``future`` is resolved with the rest.
        Raises StorageError (after failing the futures) when a sync fails; the log goes offline. When a
        file to sync cannot even be opened for want of descriptors (EMFILE/ENFILE with none idle in the
        pool) nothing failed to sync: the futures fail, the log stays online, and the flush is tried again
        in FLUSH_RETRY_MS.
        """
        plog = self.plog
        with self.sync_lock:
            with plog._lock:
                if plog._closed:
                    resolve(future, LogClosedError(f"{plog} was abandoned before the flush")
                            if plog._abandoned else None)
                    return
                taken = self.take_unsynced_locked(forced_segment)
            self.complete_flush(taken, future, covered=False)

    def begin_covered_flush(self, device: int) -> Unsynced | None:
        """The first half of a flush whose sync is one sync of the whole filesystem (the flusher's syncfs
        round, :class:`~metaq.storage.flush.FilesystemSync`): takes the sync lock and what is unsynced now,
        which a filesystem sync started after this call covers: the active segment's bytes, and the
        directory entries of a new partition or segment (syncfs writes the filesystem's metadata too, so
        the first flush of 10,000 new partitions needs no directory fsync). None (nothing taken, nothing
        held) when the log is not on filesystem ``device``, another flush holds it, or this flush needs
        more than that (a sealed segment and its index files, a failed or closed log): :meth:`flush_pending`
        does those. Always follow with :meth:`end_covered_flush`."""
        plog = self.plog
        if plog.device != device or not self.sync_lock.acquire(blocking=False):
            return None
        with plog._lock:
            plain = not (plog._closed or plog._failure is not None or self.unsynced_sealed)
            taken = self.take_unsynced_locked(None) if plain else None
        if taken is None:
            self.sync_lock.release()
        return taken

    def end_covered_flush(self, taken: Unsynced, synced: bool) -> None:
        """The second half: ``synced`` when the filesystem sync succeeded (the bytes taken are durable);
        else this log fdatasyncs them itself, so that a write-back error is reported for the file it hit.
        Resolves the acks taken; raises StorageError as :meth:`flush_pending` does."""
        try:
            self.complete_flush(taken, None, covered=synced)
        finally:
            self.sync_lock.release()

    def take_unsynced_locked(self, forced_segment: Segment | None) -> Unsynced:
        """What a flush syncs: the unsynced bytes as of now and the acks waiting for them (segments pinned)."""
        active = self.plog._active
        pending = self.pending_future
        self.pending_future = None
        first_unflushed_ms = self.first_unflushed_ms
        self.unflushed_messages = 0
        self.first_unflushed_ms = -1
        self.flush_requested = False
        sealed = [(s, *s.take_pending_index_bytes()) for s in self.unsynced_sealed]
        active_index = active.take_pending_index_bytes(ACTIVE_INDEX_WRITE_BYTES)
        pinned = [s for s, _, _ in sealed] + [active]
        if forced_segment is not None and forced_segment not in pinned:
            pinned.append(forced_segment)
        for segment in pinned:
            segment.pins += 1
        return Unsynced(sealed, active, active.size_bytes, active_index, forced_segment, pending,
                        first_unflushed_ms, pinned, self.plog._failure)

    def complete_flush(self, taken: Unsynced, future: Future[None] | None, *, covered: bool) -> None:
        """Sync what was taken (nothing to sync but the bookkeeping when ``covered``: a filesystem sync did
        it), then resolve its acks and ``future``. Under the sync lock."""
        plog = self.plog
        sealed, active, active_index = taken.sealed, taken.active, taken.active_index
        error: StorageError | None = taken.failure
        deferred = False
        try:
            if error is None:
                self._sync_segments(sealed, active, taken.target_bytes, active_index, taken.forced, covered=covered)
        except OSError as exc:
            deferred = exc.errno in SHORTAGE_ERRNOS  # from an open: no sync failed
            error = StorageError(f"cannot flush {plog} now: {exc}; tried again in {FLUSH_RETRY_MS} ms"
                                 if deferred else f"cannot flush {plog}: {exc}; the log is offline until restart")
        finally:
            with plog._lock:
                for segment in taken.pinned:
                    segment.pins -= 1
                if error is None:
                    done = {id(s) for s, _, _ in sealed}
                    self.unsynced_sealed = [s for s in self.unsynced_sealed if id(s) not in done]
                elif deferred:
                    self._defer_flush_locked(sealed, active, active_index, taken.first_unflushed_ms)
                elif plog._failure is None:
                    plog._failure = error
        resolve(taken.pending, error)
        resolve(future, error)
        if deferred and plog._flusher is not None:
            try:
                plog._flusher.flush_at(plog, int(plog._clock() * 1000) + FLUSH_RETRY_MS)
            except StorageError:  # the flusher is stopping: the close's own flush takes it
                pass
        if error is not None:
            raise error

    def _defer_flush_locked(self, sealed: list[tuple[Segment, bytes, bytes]], active: Segment,
                            active_index: tuple[bytes, bytes], first_unflushed_ms: int) -> None:
        """A flush that could not open a file: what it took must be synced by the next one. Its bytes
        stay unsynced (``synced_bytes`` only moves after a sync) and its sealed segments listed; index
        entries it took may not be written, so those index files are dropped, to be written whole from
        memory by the next sync; the unflushed clock goes back to its start."""
        for segment, index_bytes, timeindex_bytes in sealed:
            if index_bytes or timeindex_bytes:
                segment.drop_index_files()
        if active_index[0] or active_index[1]:
            active.drop_index_files()
        if first_unflushed_ms < 0:
            first_unflushed_ms = int(self.plog._clock() * 1000)
        if self.first_unflushed_ms < 0 or first_unflushed_ms < self.first_unflushed_ms:
            self.first_unflushed_ms = first_unflushed_ms

    def _sync_segments(self, sealed: list[tuple[Segment, bytes, bytes]], active: Segment, target_bytes: int,
                       active_index: tuple[bytes, bytes], forced: Segment | None, *, covered: bool = False) -> None:
        """``covered``: a sync of the whole filesystem, started after the flush took its state, made the
        active segment's bytes durable, and the directory entries made before (the partition's in the data
        directory, the active segment's in the partition's): only a flush with no sealed segment or forced
        sync is covered. The flags say which entries are durable; a flush that is not covered fsyncs the
        directories itself."""
        plog = self.plog
        if self.parent_unsynced:
            if not covered:
                fsync_directory(plog.directory.parent, plog._sync, opener=plog._files.open_raw)
            self.parent_unsynced = False
        dir_unsynced = not active.dir_synced or any(not s.dir_synced for s, _, _ in sealed)
        for segment, index_bytes, timeindex_bytes in sealed:
            if segment.synced_bytes < segment.size_bytes or segment is forced:
                self._fdatasync(segment)
                segment.synced_bytes = segment.size_bytes
            self.write_indexes(segment, index_bytes, timeindex_bytes, sync_files=True)
        if forced is not None and forced is not active and all(forced is not s for s, _, _ in sealed):
            self._fdatasync(forced)
        if not covered and (active.synced_bytes < target_bytes or forced is active):
            self._fdatasync(active)
        if target_bytes > active.synced_bytes:
            active.synced_bytes = target_bytes
        if dir_unsynced:
            if not covered:
                fsync_directory(plog.directory, plog._sync, opener=plog._files.open_raw)
            for segment, _, _ in sealed:
                segment.dir_synced = True
            active.dir_synced = True
        # Index entries only go to disk after the bytes they point at are synced (see recovery.py).
        self.write_indexes(active, *active_index, sync_files=False)

    def write_indexes(self, segment: Segment, index_bytes: bytes, timeindex_bytes: bytes, *,
                      sync_files: bool) -> None:
        """Write (and at a seal, fsync) index entries. Indexes are derived data: a failure here (a full
        disk) drops the segment's index files, to be rebuilt from the log, and is not a log failure."""
        try:
            segment.write_index_bytes(index_bytes, timeindex_bytes)
            if sync_files:
                segment.sync_index_files(self.plog._sync)
        except OSError as exc:
            segment.drop_index_files()
            log.warning("%s: cannot write the index of segment %d (%s); its index files are dropped and rebuilt "
                        "from the log when next needed", self.plog, segment.base_offset, exc)

    def _fdatasync(self, segment: Segment) -> None:
        files = self.plog._files
        handle = files.acquire(segment.log_path, on_close=segment.on_log_fd_closed)
        try:
            self.plog._sync(handle.fd)
        finally:
            files.release(handle)
