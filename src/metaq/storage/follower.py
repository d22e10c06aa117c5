"""A follower's operations on a partition log: storing batches replicated from the master byte for byte,
moving an empty log to the master's start offset, and cutting back a tail the master never had.

They are PartitionLog's (``append_replicated``, ``start_empty_at``, ``truncate_to`` call these), kept here
beside the rules they follow: replicated batches roll segments as appends do, and a cut is durable and
crash-safe step by step. Like the log's own methods they work under its locks and on its segment list.
"""

from __future__ import annotations

import logging
import os
import threading
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, Protocol

from metaq.errors import InvalidArgument, StorageError
from metaq.protocol.records import PRODUCER_STAMPED, BatchHeader, producer_stamp
from metaq.storage.checkpoint import fsync_directory
from metaq.storage.config import LogConfig
from metaq.storage.errors import OffsetOutOfRange, storage_error
from metaq.storage.files import FileCache
from metaq.storage.keyindex import key_index_path, remove_key_index
from metaq.storage.partition_flush import AppendResult, PartitionFlush
from metaq.storage.producers import ProducerStateTable, list_snapshots, remove_snapshot
from metaq.storage.replica import ReplicaGap, check_replicated
from metaq.storage.scan import iter_headers
from metaq.storage.segment import OFFSET_MAX, Segment
from metaq.storage.verify import DamagedRange

log = logging.getLogger(__name__)


class FollowerLog(Protocol):
    """What a follower's operations use of a :class:`~metaq.storage.log.PartitionLog`: the writer's state and
    methods, the segment list and the flush state, under the log's locks. Declared here, so this module need
    not import log.py, which calls it."""

    directory: Path
    producers: ProducerStateTable
    _topic: str
    _partition: int
    _tag: int
    _id_base: int
    _config: LogConfig
    _sync: Callable[[int], None]
    _files: FileCache
    _flush: PartitionFlush
    _lock: threading.Lock
    _appending: bool
    _marker_present: bool
    _failure: StorageError | None
    _segments: list[Segment]
    _bases: list[int]
    _active: Segment
    _end_offset: int
    _size_bytes: int
    _tail: tuple[int, int, Segment, int, bytes, memoryview] | None
    _damaged: dict[int, DamagedRange]
    _truncations: int

    @property
    def log_start_offset(self) -> int: ...

    def _check_writable(self) -> None: ...

    def _invalidate_marker(self) -> None: ...

    def _write_locked(self, segment: Segment, parts: tuple[bytes, memoryview], position: int, total: int) -> None: ...

    def _roll_locked(self) -> Segment: ...


class _Run(NamedTuple):
    """Replicated batches written with one write: [start, end) of the buffer, into one segment."""

    roll: bool
    start: int
    end: int
    batches: list[tuple[int, BatchHeader]]


def _runs_per_segment(batches: list[tuple[int, BatchHeader]], active_bytes: int,
                      segment_bytes_max: int) -> list[_Run]:
    """Split replicated batches where the append rule would roll a segment (same rule as ``append``)."""
    runs: list[_Run] = []
    current: list[tuple[int, BatchHeader]] = []
    size = active_bytes
    roll = False
    for start, header in batches:
        total = header.total_bytes
        if size and size + total > segment_bytes_max:
            if current:
                runs.append(_Run(roll, current[0][0], start, current))
            current, size, roll = [], 0, True
        current.append((start, header))
        size += total
    last_start, last = current[-1]
    runs.append(_Run(roll, current[0][0], last_start + last.total_bytes, current))
    return runs


def append_replicated(plog: FollowerLog, data: bytes | memoryview) -> AppendResult | None:
    """Store batches already stamped by the master, byte for byte (a follower's append).

    ``data`` is whole batches back to back, as a fetch reply from the master carries them (the
    caller drops a cut-off tail and any batch below the log end first). Every batch is checked
    (``replica.check_replicated``: header and body CRC, this broker id's and partition's ids, offset
    continuity from the log end) before anything is written: ReplicaGap for a gap or an overlap,
    CorruptRecordError for damage; nothing is stored then. Batches roll segments by the same rule
    as appends, so with the master's ``segment_bytes_max`` the segment files match too. Returns
    None for empty ``data``, else the result of the whole run (base of the first batch, last offset
    of the last, the first batch's id, the last batch's append time) with the flush policy's future.
    """
    assert not plog._appending, "concurrent appends to one partition"
    plog._appending = True
    try:
        view = memoryview(data)
        if not view.nbytes:
            return None
        with plog._lock:
            plog._check_writable()
        where = f"{plog._topic}-{plog._partition}"
        checked = check_replicated(view, plog._end_offset, plog._id_base >> 112, plog._tag, where)
        if plog._marker_present:
            plog._invalidate_marker()
        config = plog._config
        with plog._lock:
            plog._check_writable()
            if checked.batches[0][1].base_offset != plog._end_offset:  # the log moved (a truncate)
                raise ReplicaGap(where, plog._end_offset, checked.batches[0][1].base_offset)
            rolled = False
            written = 0
            failure: StorageError | None = None
            for run in _runs_per_segment(checked.batches, plog._active.size_bytes, config.segment_bytes_max):
                try:
                    if run.roll:
                        plog._roll_locked()
                        rolled = True
                    segment = plog._active
                    position = segment.size_bytes
                    plog._write_locked(segment, (b"", view[run.start:run.end]), position, run.end - run.start)
                except StorageError as exc:  # the runs before it stay written (whole batches) and accounted
                    failure = exc
                    break
                for start, header in run.batches:
                    segment.note_batch(position + start - run.start, header)
                    plog._end_offset = header.next_offset
                    written += header.record_count
                    if header.attributes & PRODUCER_STAMPED:
                        stamp = producer_stamp(view, header, start)
                        assert stamp is not None
                        plog.producers.record(stamp, header.record_count, header.base_offset,
                                              header.append_time_ms)
                plog._size_bytes += run.end - run.start
            accounted = plog._flush.account_locked(plog._active, written, rolled) if written else None
        if accounted is not None:
            future, wait, handover = accounted
            if handover is not None:
                plog._flush.hand_over(handover, future, wait)
        if failure is not None:
            raise failure
        assert accounted is not None
        first, last = checked.batches[0][1], checked.batches[-1][1]
        return AppendResult(first.base_offset, last.last_offset, first.base_message_id, last.append_time_ms,
                            checked.record_count, future, wait)
    finally:
        plog._appending = False


def start_empty_at(plog: FollowerLog, offset: int) -> None:
    """Make an empty log start at ``offset`` (a new follower of a master whose retention removed the
    offsets below it: its first fetch must be at the master's log start).

    Only for a log holding no batch (InvalidArgument otherwise): its one empty segment is replaced by
    an empty segment named ``offset``. Crash-safe: the new file is created and the directory synced
    before the old file is removed; a crash in between leaves two empty segments, which recovery
    resolves back to the old one (calling this again finishes).
    """
    assert not plog._appending, "start_empty_at while an append runs"
    if not 0 <= offset <= OFFSET_MAX:
        raise InvalidArgument(f"offset {offset} is outside 0..{OFFSET_MAX}")
    with plog._flush.sync_lock, plog._lock:
        plog._check_writable()
        if plog._size_bytes or len(plog._segments) != 1:
            raise InvalidArgument(f"{plog} holds offsets {plog.log_start_offset}..{plog._end_offset - 1}: only "
                                  "an empty log can be moved to another start offset")
        old = plog._active
        if old.base_offset == offset:
            return
        fresh = Segment(str(plog.directory), offset, plog._files, plog._config.index_interval_bytes, plog._tag)
        try:
            handle = plog._files.acquire(fresh.log_path, create=True, on_close=fresh.on_log_fd_closed)
            plog._files.release(handle)
            fresh.start_empty_indexes()
            fsync_directory(plog.directory, plog._sync, opener=plog._files.open_raw)
            for path in (old.log_path, old.index_path, old.timeindex_path):
                plog._files.discard(path)
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
            fsync_directory(plog.directory, plog._sync, opener=plog._files.open_raw)
        except OSError as exc:
            raise storage_error(f"cannot move {plog} to start at offset {offset}", exc) from exc
        plog._segments = [fresh]
        plog._bases = [offset]
        plog._active = fresh
        plog._end_offset = offset
        plog._tail = None
        plog._flush.unsynced_sealed = []
        plog._damaged = {}
    if plog._marker_present:
        plog._invalidate_marker()
    log.info("%s now starts at offset %d (empty)", plog, offset)


def truncate_to(plog: FollowerLog, offset: int) -> int:
    """Cut the log back so that ``offset`` becomes its end; returns the messages removed.

    For a follower whose tail the master never had (planned: an old master returning as a slave,
    a slave after an unclean election). ``offset`` must be a batch boundary in
    ``[log_start_offset, log_end_offset]`` (InvalidArgument inside a batch, OffsetOutOfRange outside).
    Durable and crash-safe: everything is synced first, the clean-shutdown record is removed, the
    segments past ``offset`` are removed newest first (log file before its indexes), then the
    segment holding ``offset`` is cut, fdatasynced and its indexes rewritten and synced, then the
    directory is synced. A crash at any step leaves a valid log whose end lies between ``offset`` and
    the old end, which the next open recovers like any unclean stop; calling ``truncate_to`` again
    finishes the job. Blocks on the disk (never on an event loop); it is the writer's call, so no
    append runs meanwhile. A reader already holding a slice of the cut bytes may get a short read.
    """
    assert not plog._appending, "truncate_to while an append runs"
    plog._appending = True
    try:
        with plog._lock:
            plog._check_writable()
            end = plog._end_offset
            start = plog._segments[0].base_offset
        if not start <= offset <= end:
            raise OffsetOutOfRange(offset, start, end, f"{plog._topic}-{plog._partition}")
        if offset == end:
            return 0
        plog._flush.flush_pending()
        if plog._marker_present:
            plog._invalidate_marker()
        with plog._flush.sync_lock, plog._lock:
            plog._check_writable()
            try:
                _truncate_locked(plog, offset)
            except OSError as exc:
                plog._failure = StorageError(f"truncating {plog} to offset {offset} failed: {exc}; the log "
                                             "is offline until restart (recovery finishes the cut)")
                raise plog._failure from exc
        log.warning("%s truncated to offset %d: %d messages removed", plog, offset, end - offset)
        return end - offset
    finally:
        plog._appending = False


def _truncate_locked(plog: FollowerLog, offset: int) -> None:
    i = bisect_right(plog._bases, offset) - 1
    keep = plog._segments[i]
    index, time_index = keep.loaded_indexes()
    keep.sealed = False  # it becomes the active segment: its indexes stay loaded from here on
    handle = plog._files.acquire(keep.log_path, on_close=keep.on_log_fd_closed)
    try:
        if offset == keep.base_offset:
            position = 0
        else:
            position, header = keep.find_batch(handle.fd, offset, keep.size_bytes, keep.next_offset)
            if header.base_offset != offset:
                raise InvalidArgument(f"{plog}: offset {offset} is inside the batch of offsets "
                                      f"{header.base_offset}..{header.last_offset}; truncate to a batch "
                                      f"boundary ({header.base_offset} or {header.next_offset})")
        doomed = plog._segments[i + 1:]
        for segment in reversed(doomed):  # newest first: a crash leaves a contiguous prefix
            for path in (segment.log_path, segment.index_path, segment.timeindex_path):
                plog._files.discard(path)
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
            remove_key_index(key_index_path(segment.log_path))
        remove_key_index(key_index_path(keep.log_path))  # rebuilt from the cut log when next searched
        del plog._segments[i + 1:]
        del plog._bases[i + 1:]
        os.ftruncate(handle.fd, position)
        plog._sync(handle.fd)
        relative = offset - keep.base_offset
        index.truncate(bisect_left(index.relative_offsets, relative))
        time_index.truncate(bisect_left(time_index.relative_offsets, relative))
        max_ts = time_index.max_timestamp_ms
        last_base = -1
        for _, header in iter_headers(handle.fd, index.last()[1], position):
            max_ts = max(max_ts, header.max_timestamp_ms)
            last_base = header.base_offset
    finally:
        plog._files.release(handle)
    keep.size_bytes = keep.synced_bytes = position
    keep.next_offset = offset
    keep.max_timestamp_ms = max_ts
    keep.last_batch_base_offset = last_base
    keep.tail = None
    keep.index, keep.time_index = index, time_index
    keep.rewrite_index_files()
    keep.sync_index_files(plog._sync)
    fsync_directory(plog.directory, plog._sync, opener=plog._files.open_raw)
    plog._active = keep
    plog._truncations += 1  # a reader that pinned before this may meet the cut: not damage
    plog._end_offset = offset
    plog._tail = None
    plog._size_bytes = sum(s.size_bytes for s in plog._segments)
    plog._flush.unsynced_sealed = [s for s in plog._flush.unsynced_sealed if s in plog._segments and s is not keep]
    plog._damaged = {k: r for k, r in plog._damaged.items() if r.first_offset < offset}
    plog.producers.forget_from(offset)
    for snap in list_snapshots(plog.directory):
        if snap > offset:
            remove_snapshot(plog.directory, snap)
