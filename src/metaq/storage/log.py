"""PartitionLog: one partition's append-only log of record batches, split into segments.

Threads: one writer appends (the caller guarantees it); any thread may read, flush, run retention
or close. ``_lock`` guards the segment list and the writer's state and is held only for short,
non-blocking work (the append's single ``pwritev`` to the page cache included). The durability
bookkeeping lives in the partition's flush state (storage/partition_flush.py), whose sync lock serialises
the blocking syncs, which run without ``_lock`` so appends go on during an fdatasync.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import NamedTuple

from metaq.errors import CorruptRecordError, InvalidArgument, StorageError
from metaq.fsutil import datasync
from metaq.protocol.records import (
    HEADER_BYTES,
    PRODUCER_BLOCK_BYTES,
    PRODUCER_STAMPED,
    STAMPED_BYTES,
    BatchHeader,
    decode_batch,
    producer_stamp,
    stamp_prefix,
    validate_batch,
)
from metaq.storage.checkpoint import (
    CLEAN_SHUTDOWN_FILE,
    CleanState,
    fsync_directory,
    read_partition_clean_state,
    write_partition_clean_state,
)
from metaq.storage.config import LogConfig
from metaq.storage.errors import DamagedData, DiskFull, LogClosedError, OffsetOutOfRange, is_disk_full
from metaq.storage.files import FileCache, FileHandle
from metaq.storage.fileslice import FileSlice, hint_readahead
from metaq.storage.flush import Flusher, resolve
from metaq.storage.keyindex import (
    DEFAULT_MAX_ENTRIES,
    FindResult,
    find_in_segment,
    key_index_path,
    remove_key_index,
)
from metaq.storage.partition_flush import PartitionFlush, Unsynced
from metaq.storage.producers import (
    ProducerStateTable,
    list_snapshots,
    read_snapshot,
    remove_snapshot,
    write_snapshot,
)
from metaq.storage.recovery import RecoveryReport, load_segments
from metaq.storage.replica import ReplicaGap, check_replicated
from metaq.storage.retention import dispose_segment
from metaq.storage.scan import iter_headers, pread_exact
from metaq.storage.segment import Segment
from metaq.storage.verify import DamagedRange, PartitionReport, verify_segment
from metaq.types import BROKER_ID_MAX, make_message_id, partition_tag, validate_partition, validate_topic

log = logging.getLogger(__name__)

_OFFSET_MAX = (1 << 63) - 1
_STANDALONE_MAX_OPEN_FILES = 64
CLEAN_OPEN_WALK_BYTES = 1 << 20
"""A clean close writes the active segment's pending index entries when the log after the last entry on
disk holds this much or more; otherwise the next clean open reads that stretch's batch headers instead."""


def _storage_error(what: str, exc: OSError) -> StorageError:
    """DiskFull (the partition stays usable: the next write with room succeeds) or a plain StorageError."""
    if is_disk_full(exc):
        return DiskFull(f"{what}: the disk is full ({exc.strerror}); nothing was written, reads go on, and "
                        "writes succeed again once space is freed")
    return StorageError(f"{what}: {exc}")


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


class PartitionLog:
    """The log of one partition. Create with :meth:`open`."""

    # A broker holds thousands of these: slots save about 1.2 KiB each (of ~4.4 KiB, tracemalloc).
    __slots__ = (
        "_abandoned", "_active", "_appending", "_bases", "_clock", "_closed", "_config", "_damaged",
        "_end_offset", "_failure", "_files", "_find_lock", "_flush", "_flusher", "_id_base", "_lock",
        "_marker_present", "_own_files", "_partition", "_segments", "_size_bytes", "_sync", "_tag", "_tail",
        "_topic", "_truncations", "device", "directory", "producers", "recovery",
    )

    def __init__(self, directory: Path, topic: str, partition: int, config: LogConfig, broker_id: int, *,
                 clock: Callable[[], float], flusher: Flusher | None, files: FileCache, own_files: bool,
                 sync: Callable[[int], None], segments: list[Segment], recovery: RecoveryReport,
                 marker_present: bool, parent_unsynced: bool) -> None:
        self.directory = directory
        self.device = os.stat(directory).st_dev
        """The filesystem the log's files are on (a flusher's syncfs round covers only its own)."""
        self._topic = topic
        self._partition = partition
        self._tag = partition_tag(topic, partition)
        self._id_base = make_message_id(broker_id, self._tag, 0)
        self._config = config
        self._clock = clock
        self._flusher = flusher
        self._files = files
        self._own_files = own_files
        self._sync = sync
        self._lock = threading.Lock()
        self._find_lock = threading.Lock()
        """One search at a time per partition (searches extend the key index files)."""
        self._segments = segments
        self._bases = [s.base_offset for s in segments]
        self._active = segments[-1]
        self._end_offset = self._active.next_offset
        self._size_bytes = sum(s.size_bytes for s in segments)
        self._flush = PartitionFlush(self, parent_unsynced=parent_unsynced)
        """The partition's durability bookkeeping (storage/partition_flush.py)."""
        self._closed = False
        self._abandoned = False
        self._failure: StorageError | None = None
        self._appending = False
        self._marker_present = marker_present
        self._damaged: dict[int, DamagedRange] = {}
        self._truncations = 0
        """How many times truncate_to cut this log (a read pinned across a cut is not damage)."""
        self._tail: tuple[int, int, Segment, int, bytes, memoryview] | None = None
        """What the last ``append(keep_tail=True)`` wrote: (base offset, next offset, its segment, its position
        there, stamped prefix, the rest), until :meth:`drop_tail` (see :meth:`appended_tail`)."""
        self.recovery = recovery
        self.producers = ProducerStateTable()
        """The idempotent producers' last batches (storage/producers.py), rebuilt by :meth:`open`."""

    @classmethod
    def open(cls, directory: Path, topic: str, partition: int, config: LogConfig, broker_id: int, *,
             clock: Callable[[], float] = time.time, flusher: Flusher | None = None,
             files: FileCache | None = None, sync: Callable[[int], None] = datasync,
             clean_state: CleanState | None = None) -> PartitionLog:
        """Open (creating if needed) the partition whose own directory is ``directory``, recovering it.

        ``directory`` is the partition's directory (``<data_dir>/<topic>-<partition>``), not the data
        dir. Without a ``flusher``, appends that must be durable are fsynced inline. ``files`` shares a
        descriptor budget between logs (a private pool of 64 otherwise). ``sync`` syncs a file's data or
        a directory's entries (inject to count or fail). ``clean_state`` comes from the LogManager's checkpoint; without
        it the partition's own clean-shutdown file, if any, is used.
        """
        validate_topic(topic)
        validate_partition(partition)
        if not isinstance(broker_id, int) or not 0 <= broker_id <= BROKER_ID_MAX:
            raise InvalidArgument(f"broker id {broker_id!r} is outside 0..{BROKER_ID_MAX}")
        directory = Path(directory)
        created = not directory.is_dir()
        directory.mkdir(parents=True, exist_ok=True)
        own_files = files is None
        if files is None:
            files = FileCache(_STANDALONE_MAX_OPEN_FILES)
        marker_state = read_partition_clean_state(directory)
        tag = partition_tag(topic, partition)
        segments, report = load_segments(str(directory), files, config.index_interval_bytes, tag,
                                          clean_state or marker_state, sync)
        plog = cls(directory, topic, partition, config, broker_id, clock=clock, flusher=flusher,
                   files=files, own_files=own_files, sync=sync, segments=segments, recovery=report,
                   marker_present=marker_state is not None, parent_unsynced=created)
        try:
            plog._load_producers()
        except BaseException:
            plog._release_files(plog._segments)
            raise
        return plog

    def _load_producers(self) -> None:
        """Rebuild :attr:`producers`: the newest usable snapshot at or below the log end, then the
        stamped batches stored after it (headers and producer blocks only).

        Without a snapshot only the active segment is read: a roll writes one whenever the log has
        producers, so older segments hold none that a snapshot does not have (unless that write failed,
        which was logged; a producer missing from the table is taken at whatever sequence it sends).
        After a clean close without a snapshot nothing is read: a clean close writes one whenever the log
        has producers, so it had none (walking every batch header of a 1 GB active segment read a quarter
        of it from the disk at each start, through the kernel's readahead)."""
        end, start = self._end_offset, self._segments[0].base_offset
        table: ProducerStateTable | None = None
        offset = self._active.base_offset
        for snap in reversed(list_snapshots(self.directory)):
            if snap > end:  # written for bytes a crash took back
                remove_snapshot(self.directory, snap)
                continue
            table = read_snapshot(self.directory, snap, self.producers.expiration_ms)
            if table is not None:
                offset = max(snap, start)
                break
        self.producers = table if table is not None else ProducerStateTable()
        if offset < end and (table is not None or not self.recovery.clean):
            self._scan_producers(offset, end)

    def _scan_producers(self, offset: int, end: int) -> None:
        i = bisect_right(self._bases, offset) - 1
        for segment in self._segments[max(i, 0):]:
            if segment.next_offset <= offset or not segment.size_bytes:
                continue
            handle = self._files.acquire(segment.log_path, on_close=segment.on_log_fd_closed)
            try:
                position = 0
                if offset > segment.base_offset:
                    position, header = segment.find_batch(handle.fd, offset, segment.size_bytes, segment.next_offset)
                    if header.base_offset < offset:
                        position += header.total_bytes
                for at, header in iter_headers(handle.fd, position, segment.size_bytes):
                    if header.attributes & PRODUCER_STAMPED:
                        block = pread_exact(handle.fd, HEADER_BYTES + PRODUCER_BLOCK_BYTES, at)
                        stamp = producer_stamp(block, header)
                        assert stamp is not None
                        self.producers.record(stamp, header.record_count, header.base_offset, header.append_time_ms)
            except (CorruptRecordError, StorageError) as exc:  # damage is reported where it is read
                log.warning("%s: producer state not read past damage in %s: %s", self, segment.log_path, exc)
            finally:
                self._files.release(handle)

    # ------------------------------------------------------------------ properties

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def partition(self) -> int:
        return self._partition

    @property
    def tag(self) -> int:
        """The 48-bit partition tag inside this partition's message ids."""
        return self._tag

    @property
    def config(self) -> LogConfig:
        return self._config

    @property
    def log_start_offset(self) -> int:
        """The earliest offset still stored."""
        return self._segments[0].base_offset

    @property
    def log_end_offset(self) -> int:
        """The next offset to assign; reading here returns nothing. Cheap: poll it for long polling."""
        return self._end_offset

    @property
    def size_bytes(self) -> int:
        return self._size_bytes

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def segment_base_offsets(self) -> list[int]:
        with self._lock:
            return list(self._bases)

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return f"PartitionLog({self._topic}-{self._partition})"

    # ------------------------------------------------------------------ append

    def append(self, batch: bytes | memoryview, header: BatchHeader | None = None, *,
               now_ms: int | None = None, keep_tail: bool = False) -> AppendResult:
        """Store one record batch with one write, stamping base offset, base message id and append time.

        ``header`` is what ``records.validate_batch`` returned for this batch; without it the batch is
        validated here (InvalidArgument / CorruptRecordError). Raises StorageError if the log cannot
        write; a failed write leaves no partial batch behind. ``keep_tail``: while it is the log's last batch
        and until :meth:`drop_tail`, a :meth:`read` of it takes its bytes from memory, not the file
        (:meth:`appended_tail`); it holds ``batch``.
        """
        assert not self._appending, "concurrent appends to one partition"
        self._appending = True
        try:
            config = self._config
            if header is None:
                header = validate_batch(batch, config.max_message_bytes, config.max_batch_bytes)
            view = memoryview(batch)
            total = header.total_bytes
            if view.nbytes != total:
                raise InvalidArgument(f"batch has {view.nbytes} bytes but its header says {total}")
            if now_ms is None:
                now_ms = int(self._clock() * 1000)
            if self._marker_present:
                self._invalidate_marker()
            with self._lock:
                self._check_writable()
                segment = self._active
                rolled = False
                if segment.size_bytes and segment.size_bytes + total > config.segment_bytes_max:
                    segment = self._roll_locked()
                    rolled = True
                base_offset = self._end_offset
                next_offset = base_offset + header.record_count
                assert next_offset <= _OFFSET_MAX, "offset space exhausted"
                message_id = self._id_base | base_offset
                position = segment.size_bytes
                prefix = stamp_prefix(header, base_offset, message_id, now_ms)
                rest = view[STAMPED_BYTES:]
                self._write_locked(segment, (prefix, rest), position, total)
                if keep_tail:
                    self._tail = (base_offset, next_offset, segment, position, prefix, rest)
                segment.note_batch(position, header, base_offset)
                self._size_bytes += total
                self._end_offset = next_offset
                if header.attributes & PRODUCER_STAMPED:
                    stamp = producer_stamp(view, header)
                    assert stamp is not None
                    self.producers.record(stamp, header.record_count, base_offset, now_ms)
                record_count = header.record_count
                future, wait, handover = self._flush.account_locked(segment, record_count, rolled)
            if handover is not None:
                self._flush.hand_over(handover, future, wait)
            return AppendResult(base_offset, next_offset - 1, message_id, now_ms, record_count, future, wait)
        finally:
            self._appending = False

    def appended_tail(self, offset: int) -> tuple[bytes, int] | None:
        """(the bytes, the next offset) of the batch the last ``append(keep_tail=True)`` wrote, as they are in
        the file, when it begins at ``offset`` and is still the log's last batch: what :meth:`read` of
        ``offset`` would find, without reading the file (an append's woken long polls answer from it);
        else None."""
        tail = self._tail
        if tail is None or tail[0] != offset or tail[1] != self._end_offset:
            return None
        return b"".join((tail[4], tail[5])), tail[1]

    def drop_tail(self) -> None:
        """Forget what :meth:`appended_tail` gives (and the batch buffer it holds)."""
        self._tail = None

    def durable_barrier(self) -> tuple[Future[None], bool]:
        """(future, wait) covering everything appended so far, as the flush policy would answer an append
        now: what the ack of a retried duplicate waits for, so that it is never acked before the original
        would have been."""
        with self._lock:
            self._check_writable()
            future, wait, handover = self._flush.account_locked(self._active, 0, False)
        if handover is not None:
            self._flush.hand_over(handover, future, wait)
        return future, wait

    def message_id(self, offset: int) -> int:
        """The message id of ``offset`` in this partition (what an append stamps)."""
        return self._id_base | offset

    def append_replicated(self, data: bytes | memoryview) -> AppendResult | None:
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
        assert not self._appending, "concurrent appends to one partition"
        self._appending = True
        try:
            view = memoryview(data)
            if not view.nbytes:
                return None
            with self._lock:
                self._check_writable()
            where = f"{self._topic}-{self._partition}"
            checked = check_replicated(view, self._end_offset, self._id_base >> 112, self._tag, where)
            if self._marker_present:
                self._invalidate_marker()
            config = self._config
            with self._lock:
                self._check_writable()
                if checked.batches[0][1].base_offset != self._end_offset:  # the log moved (a truncate)
                    raise ReplicaGap(where, self._end_offset, checked.batches[0][1].base_offset)
                rolled = False
                written = 0
                failure: StorageError | None = None
                for run in _runs_per_segment(checked.batches, self._active.size_bytes, config.segment_bytes_max):
                    try:
                        if run.roll:
                            self._roll_locked()
                            rolled = True
                        segment = self._active
                        position = segment.size_bytes
                        self._write_locked(segment, (b"", view[run.start:run.end]), position, run.end - run.start)
                    except StorageError as exc:  # the runs before it stay written (whole batches) and accounted
                        failure = exc
                        break
                    for start, header in run.batches:
                        segment.note_batch(position + start - run.start, header)
                        self._end_offset = header.next_offset
                        written += header.record_count
                        if header.attributes & PRODUCER_STAMPED:
                            stamp = producer_stamp(view, header, start)
                            assert stamp is not None
                            self.producers.record(stamp, header.record_count, header.base_offset,
                                                  header.append_time_ms)
                    self._size_bytes += run.end - run.start
                accounted = self._flush.account_locked(self._active, written, rolled) if written else None
            if accounted is not None:
                future, wait, handover = accounted
                if handover is not None:
                    self._flush.hand_over(handover, future, wait)
            if failure is not None:
                raise failure
            assert accounted is not None
            first, last = checked.batches[0][1], checked.batches[-1][1]
            return AppendResult(first.base_offset, last.last_offset, first.base_message_id, last.append_time_ms,
                                checked.record_count, future, wait)
        finally:
            self._appending = False

    def start_empty_at(self, offset: int) -> None:
        """Make an empty log start at ``offset`` (a new follower of a master whose retention removed the
        offsets below it: its first fetch must be at the master's log start).

        Only for a log holding no batch (InvalidArgument otherwise): its one empty segment is replaced by
        an empty segment named ``offset``. Crash-safe: the new file is created and the directory synced
        before the old file is removed; a crash in between leaves two empty segments, which recovery
        resolves back to the old one (calling this again finishes).
        """
        assert not self._appending, "start_empty_at while an append runs"
        if not 0 <= offset <= _OFFSET_MAX:
            raise InvalidArgument(f"offset {offset} is outside 0..{_OFFSET_MAX}")
        with self._flush.sync_lock, self._lock:
            self._check_writable()
            if self._size_bytes or len(self._segments) != 1:
                raise InvalidArgument(f"{self} holds offsets {self.log_start_offset}..{self._end_offset - 1}: only "
                                      "an empty log can be moved to another start offset")
            old = self._active
            if old.base_offset == offset:
                return
            fresh = Segment(str(self.directory), offset, self._files, self._config.index_interval_bytes, self._tag)
            try:
                handle = self._files.acquire(fresh.log_path, create=True, on_close=fresh.on_log_fd_closed)
                self._files.release(handle)
                fresh.start_empty_indexes()
                fsync_directory(self.directory, self._sync, opener=self._files.open_raw)
                for path in (old.log_path, old.index_path, old.timeindex_path):
                    self._files.discard(path)
                    try:
                        os.unlink(path)
                    except FileNotFoundError:
                        pass
                fsync_directory(self.directory, self._sync, opener=self._files.open_raw)
            except OSError as exc:
                raise _storage_error(f"cannot move {self} to start at offset {offset}", exc) from exc
            self._segments = [fresh]
            self._bases = [offset]
            self._active = fresh
            self._end_offset = offset
            self._tail = None
            self._flush.unsynced_sealed = []
            self._damaged = {}
        if self._marker_present:
            self._invalidate_marker()
        log.info("%s now starts at offset %d (empty)", self, offset)

    def truncate_to(self, offset: int) -> int:
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
        assert not self._appending, "truncate_to while an append runs"
        self._appending = True
        try:
            with self._lock:
                self._check_writable()
                end = self._end_offset
                start = self._segments[0].base_offset
            if not start <= offset <= end:
                raise OffsetOutOfRange(offset, start, end, f"{self._topic}-{self._partition}")
            if offset == end:
                return 0
            self._flush.flush_pending()
            if self._marker_present:
                self._invalidate_marker()
            with self._flush.sync_lock, self._lock:
                self._check_writable()
                try:
                    self._truncate_locked(offset)
                except OSError as exc:
                    self._failure = StorageError(f"truncating {self} to offset {offset} failed: {exc}; the log "
                                                 "is offline until restart (recovery finishes the cut)")
                    raise self._failure from exc
            log.warning("%s truncated to offset %d: %d messages removed", self, offset, end - offset)
            return end - offset
        finally:
            self._appending = False

    def _truncate_locked(self, offset: int) -> None:
        i = bisect_right(self._bases, offset) - 1
        keep = self._segments[i]
        index, time_index = keep.loaded_indexes()
        keep.sealed = False  # it becomes the active segment: its indexes stay loaded from here on
        handle = self._files.acquire(keep.log_path, on_close=keep.on_log_fd_closed)
        try:
            if offset == keep.base_offset:
                position = 0
            else:
                position, header = keep.find_batch(handle.fd, offset, keep.size_bytes, keep.next_offset)
                if header.base_offset != offset:
                    raise InvalidArgument(f"{self}: offset {offset} is inside the batch of offsets "
                                          f"{header.base_offset}..{header.last_offset}; truncate to a batch "
                                          f"boundary ({header.base_offset} or {header.next_offset})")
            doomed = self._segments[i + 1:]
            for segment in reversed(doomed):  # newest first: a crash leaves a contiguous prefix
                for path in (segment.log_path, segment.index_path, segment.timeindex_path):
                    self._files.discard(path)
                    try:
                        os.unlink(path)
                    except FileNotFoundError:
                        pass
                remove_key_index(key_index_path(segment.log_path))
            remove_key_index(key_index_path(keep.log_path))  # rebuilt from the cut log when next searched
            del self._segments[i + 1:]
            del self._bases[i + 1:]
            os.ftruncate(handle.fd, position)
            self._sync(handle.fd)
            relative = offset - keep.base_offset
            index.truncate(bisect_left(index.relative_offsets, relative))
            time_index.truncate(bisect_left(time_index.relative_offsets, relative))
            max_ts = time_index.max_timestamp_ms
            last_base = -1
            for _, header in iter_headers(handle.fd, index.last()[1], position):
                max_ts = max(max_ts, header.max_timestamp_ms)
                last_base = header.base_offset
        finally:
            self._files.release(handle)
        keep.size_bytes = keep.synced_bytes = position
        keep.next_offset = offset
        keep.max_timestamp_ms = max_ts
        keep.last_batch_base_offset = last_base
        keep.tail = None
        keep.index, keep.time_index = index, time_index
        keep.rewrite_index_files()
        keep.sync_index_files(self._sync)
        fsync_directory(self.directory, self._sync, opener=self._files.open_raw)
        self._active = keep
        self._truncations += 1  # a reader that pinned before this may meet the cut: not damage
        self._end_offset = offset
        self._tail = None
        self._size_bytes = sum(s.size_bytes for s in self._segments)
        self._flush.unsynced_sealed = [s for s in self._flush.unsynced_sealed if s in self._segments and s is not keep]
        self._damaged = {k: r for k, r in self._damaged.items() if r.first_offset < offset}
        self.producers.forget_from(offset)
        for snap in list_snapshots(self.directory):
            if snap > offset:
                remove_snapshot(self.directory, snap)

    def _check_writable(self) -> None:
        if self._closed:
            raise LogClosedError(f"{self} is closed")
        if self._failure is not None:
            raise StorageError(f"{self} is offline after an I/O error ({self._failure}); "
                               "restart the broker to recover it")

    def _invalidate_marker(self) -> None:
        """The first append after a clean open makes the clean-shutdown file a lie: remove it."""
        self._marker_present = False
        try:
            os.unlink(self.directory / CLEAN_SHUTDOWN_FILE)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot remove %s: %s", self.directory / CLEAN_SHUTDOWN_FILE, exc)

    def _write_locked(self, segment: Segment, parts: tuple[bytes, memoryview], position: int,
                      total: int) -> None:
        files = self._files
        try:
            handle = files.acquire(segment.log_path, create=True, on_close=segment.on_log_fd_closed)
        except OSError as exc:
            raise _storage_error(f"cannot open {segment.log_path}", exc) from exc
        try:
            written = os.pwritev(handle.fd, parts, position)
            if written != total:
                rest = (parts[0] + bytes(parts[1]))[written:]
                while rest:
                    n = os.pwrite(handle.fd, rest, position + written)
                    if n <= 0:
                        raise OSError(f"pwrite wrote {n} bytes")
                    written += n
                    rest = rest[n:]
        except OSError as exc:
            # Leave no partial batch: cut the file back to the last whole batch.
            try:
                os.ftruncate(handle.fd, position)
            except OSError as cut_exc:
                self._failure = StorageError(f"cannot cut a partial write in {segment.log_path}: {cut_exc}")
            raise _storage_error(f"cannot append to {segment.log_path}", exc) from exc
        finally:
            files.release(handle)

    def _roll_locked(self) -> Segment:
        """Seal the active segment and start a new one at the log end; the old one is synced soon.

        The producer table is snapshotted at the new base (so an open reads at most the active segment
        to rebuild it)."""
        try:
            if self.producers:
                self.producers.expire(int(self._clock() * 1000))
                write_snapshot(self.directory, self.producers, self._end_offset)
        except OSError as exc:  # only costs a longer scan at the next open
            log.warning("%s: cannot write the producer snapshot: %s", self, exc)
        segment = Segment(str(self.directory), self._end_offset, self._files, self._config.index_interval_bytes,
                          self._tag)
        try:  # the new file first: if the disk refuses it, nothing has changed
            handle = self._files.acquire(segment.log_path, create=True, on_close=segment.on_log_fd_closed)
        except OSError as exc:
            raise _storage_error(f"cannot start segment {segment.log_path}", exc) from exc
        self._files.release(handle)
        old = self._active
        old.seal()
        self._flush.unsynced_sealed.append(old)
        segment.start_empty_indexes()
        segment.dir_synced = False
        self._segments.append(segment)
        self._bases.append(segment.base_offset)
        self._active = segment
        return segment

    # ------------------------------------------------------------------ flush

    def flush(self) -> None:
        """fdatasync everything appended so far (blocking; never call it on an event loop)."""
        self._flush.flush_pending()

    # The flusher's side (storage/flush.py: SyncTarget, CoveredTarget): the partition's flush state does it.

    def flush_pending(self, forced_segment: Segment | None = None, future: Future[None] | None = None) -> None:
        """Sync whatever is unsynced, then resolve the durable futures it covers (PartitionFlush.flush_pending)."""
        self._flush.flush_pending(forced_segment, future)

    def begin_covered_flush(self, device: int) -> Unsynced | None:
        return self._flush.begin_covered_flush(device)

    def end_covered_flush(self, taken: Unsynced, synced: bool) -> None:
        self._flush.end_covered_flush(taken, synced)

    # ------------------------------------------------------------------ read

    def read(self, offset: int, max_bytes: int) -> FileSlice:
        """Whole batches from the one holding ``offset``, up to ``max_bytes`` (for sendfile).

        The first batch is returned whole even if it alone exceeds ``max_bytes``, so a consumer
        never stalls on a batch larger than its limit. A read stops at the end of a segment (the
        next fetch continues in the next one). ``offset == log_end_offset`` gives an empty slice;
        an offset outside ``[log_start_offset, log_end_offset]`` raises OffsetOutOfRange.
        Release the slice (or use ``with``): it pins its segment and descriptor.
        """
        if max_bytes < 0:
            raise InvalidArgument(f"max_bytes must be >= 0, not {max_bytes}")
        generation = self._truncations
        segment, size_limit, next_limit = self._pin_segment_for(offset)
        if segment is None:
            return FileSlice.empty(offset)
        handle: FileHandle | None = None
        kept = self.appended_tail(offset)
        try:
            handle = self._files.acquire(segment.log_path, on_close=segment.on_log_fd_closed)
            tail = self._tail
            if kept is not None and tail is not None and tail[2] is segment:
                # the batch just appended (keep_tail), the log's last: its place and bytes are known
                data: bytes | None = kept[0]
                position, size, start_offset, next_offset = tail[3], len(kept[0]), offset, kept[1]
            else:
                data = None
                position, header = segment.find_batch(handle.fd, offset, size_limit, next_limit)
                size, next_offset = segment.extent(handle.fd, position, header, max_bytes, size_limit, next_limit)
                start_offset = header.base_offset
        except BaseException as exc:
            if handle is not None:
                self._files.release(handle)
            self._unpin(segment)
            if isinstance(exc, DamagedData):
                if self._truncations != generation:  # the log was cut under this read: ask again
                    with self._lock:
                        start, end = self._segments[0].base_offset, self._end_offset
                    raise OffsetOutOfRange(offset, start, end, f"{self._topic}-{self._partition}") from None
                self._note_damage(DamagedRange(segment.base_offset, exc.position, -1, exc.offset,
                                               exc.resume_offset, exc.problem))
            raise
        pinned_handle = handle
        if data is None:
            hint_readahead(pinned_handle.fd, position, size, size_limit)

        def release() -> None:
            self._files.release(pinned_handle)
            self._unpin(segment)

        return FileSlice(pinned_handle.fd, position, size, start_offset, next_offset, release, data)

    def read_bytes(self, offset: int, max_bytes: int) -> bytes:
        """``read`` then copy the bytes out (convenience for tests, tools and replication)."""
        with self.read(offset, max_bytes) as piece:
            return piece.read_bytes()

    def locate(self, offset: int) -> tuple[int, int]:
        """(segment base offset, byte position) of the batch holding ``offset``."""
        segment, size_limit, next_limit = self._pin_segment_for(offset)
        if segment is None:
            active = self._active
            return active.base_offset, active.size_bytes
        try:
            handle = self._files.acquire(segment.log_path, on_close=segment.on_log_fd_closed)
            try:
                position, _ = segment.find_batch(handle.fd, offset, size_limit, next_limit)
            finally:
                self._files.release(handle)
        finally:
            self._unpin(segment)
        return segment.base_offset, position

    def _pin_segment_for(self, offset: int) -> tuple[Segment | None, int, int]:
        with self._lock:
            if self._closed:
                raise LogClosedError(f"{self} is closed")
            end = self._end_offset
            if offset == end:
                return None, 0, end
            start = self._segments[0].base_offset
            if not start <= offset < end:
                raise OffsetOutOfRange(offset, start, end, f"{self._topic}-{self._partition}")
            segment = self._segments[bisect_right(self._bases, offset) - 1]
            segment.pins += 1
            return segment, segment.size_bytes, segment.next_offset

    def _unpin(self, segment: Segment) -> None:
        with self._lock:
            segment.pins -= 1

    def offset_for_timestamp(self, timestamp_ms: int) -> int:
        """The first offset whose record timestamp is >= ``timestamp_ms``; the log end when none is."""
        with self._lock:
            if self._closed:
                raise LogClosedError(f"{self} is closed")
            candidates = list(self._segments)
        for segment in candidates:
            with self._lock:
                if segment.base_offset < self._segments[0].base_offset or self._closed:
                    continue  # removed by retention meanwhile
                segment.pins += 1
                size_limit = segment.size_bytes
            try:
                if segment.max_timestamp() < timestamp_ms:
                    continue
                found = self._search_timestamp(segment, timestamp_ms, size_limit)
                if found is not None:
                    return found
            finally:
                self._unpin(segment)
        return self._end_offset

    def _search_timestamp(self, segment: Segment, timestamp_ms: int, size_limit: int) -> int | None:
        _, time_index = segment.loaded_indexes()
        relative = time_index.start_before(timestamp_ms)
        handle = self._files.acquire(segment.log_path, on_close=segment.on_log_fd_closed)
        try:
            position = 0
            if relative:
                position, _ = segment.find_batch(handle.fd, segment.base_offset + relative, size_limit,
                                                 segment.next_offset)
            for at, header in iter_headers(handle.fd, position, size_limit):
                if header.max_timestamp_ms < timestamp_ms:
                    continue
                data = pread_exact(handle.fd, header.total_bytes, at)
                for message in decode_batch(data, header=header, verify=False):
                    if message.timestamp_ms >= timestamp_ms:
                        return message.offset
        finally:
            self._files.release(handle)
        return None

    def find_messages(self, key: bytes | None, from_ms: int = -1, to_ms: int = -1, limit: int = 100, *,
                      max_key_entries: int = DEFAULT_MAX_ENTRIES) -> FindResult:
        """The records with this key (any key when None) and a timestamp in ``[from_ms, to_ms]`` (-1 =
        open), in offset order, at most ``limit`` (``truncated`` when more exist). Blocking (disk).

        The start comes from the time index (the first offset with a timestamp >= from_ms); by key, the
        per-segment key index gives candidates that are checked against the records; by time only, the
        records from the start are scanned until ``limit`` or the end of the log.
        """
        if limit <= 0:
            raise InvalidArgument(f"limit must be > 0, not {limit}")
        with self._find_lock:
            return self._find_locked(key, from_ms, to_ms, limit, max_key_entries)

    def _find_locked(self, key: bytes | None, from_ms: int, to_ms: int, limit: int,
                     max_key_entries: int) -> FindResult:
        result = FindResult()
        start = self.log_start_offset if from_ms < 0 else self.offset_for_timestamp(from_ms)
        with self._lock:
            if self._closed:
                raise LogClosedError(f"{self} is closed")
            candidates = list(self._segments)
        for segment in candidates:
            with self._lock:
                if segment.base_offset < self._segments[0].base_offset or self._closed \
                        or segment not in self._segments:
                    continue  # removed by retention or truncation meanwhile
                segment.pins += 1
                size_limit, next_limit = segment.size_bytes, segment.next_offset
            try:
                if next_limit <= start:
                    continue
                handle = self._files.acquire(segment.log_path, on_close=segment.on_log_fd_closed)
                try:
                    position = 0
                    if start > segment.base_offset:
                        position, _ = segment.find_batch(handle.fd, start, size_limit, next_limit)
                    fd = handle.fd

                    def locate(offset: int, segment: Segment = segment, fd: int = fd, size_limit: int = size_limit,
                               next_limit: int = next_limit) -> tuple[int, BatchHeader]:
                        return segment.find_batch(fd, offset, size_limit, next_limit)

                    done = find_in_segment(result, fd, segment.log_path, segment.base_offset, position, size_limit,
                                           locate, key, start, from_ms, to_ms, limit, max_key_entries)
                finally:
                    self._files.release(handle)
            except (DamagedData, StorageError, CorruptRecordError) as exc:
                result.problems.append(f"segment {segment.base_offset}: {exc}; the rest of it was not searched")
                continue
            finally:
                self._unpin(segment)
            if done:
                break
        return result

    # ------------------------------------------------------------------ damage

    @property
    def damaged_ranges(self) -> list[DamagedRange]:
        """Damaged stretches found so far (by reads and by :meth:`verify`), in offset order."""
        with self._lock:
            return [self._damaged[k] for k in sorted(self._damaged)]

    def _note_damage(self, damaged: DamagedRange) -> None:
        with self._lock:
            known = self._damaged.get(damaged.first_offset)
            if known is not None and known.size_bytes >= 0:
                return  # a scrub's record (with its size) is more precise than a read's
            self._damaged[damaged.first_offset] = damaged
        if known is None:
            log.error("%s-%d: stored data damaged at offsets %d..%d (byte %d of segment %d): %s; consumers get "
                      "STORED_DATA_CORRUPT there (see `metaq admin verify`)", self._topic, self._partition,
                      damaged.first_offset, damaged.resume_offset - 1, damaged.position,
                      damaged.segment_base_offset, damaged.problem)

    def verify(self) -> PartitionReport:
        """Check every stored byte and index entry of the partition (blocking; minutes for a big log).

        Appends go on meanwhile: the active segment is checked up to its size when its turn comes.
        The damaged ranges found replace what reads had recorded for the segments checked.
        """
        report = PartitionReport(self._topic, self._partition)
        with self._lock:
            if self._closed:
                raise LogClosedError(f"{self} is closed")
            segments = list(self._segments)
            report.log_start_offset = self._segments[0].base_offset
        for segment in segments:
            with self._lock:
                if self._closed or segment not in self._segments:
                    continue  # removed by retention meanwhile
                segment.pins += 1
                generation = self._truncations
                size_limit, next_limit, sealed = segment.size_bytes, segment.next_offset, segment.sealed
            try:
                handle = self._files.acquire(segment.log_path, on_close=segment.on_log_fd_closed)
                try:
                    check = verify_segment(handle.fd, segment.base_offset, size_limit, next_limit, self._tag,
                                           segment.index_path if sealed else None,
                                           segment.timeindex_path if sealed else None)
                finally:
                    self._files.release(handle)
            finally:
                self._unpin(segment)
            if self._truncations != generation:  # cut while being checked: the part checked no longer exists
                continue
            report.add(check)
            with self._lock:
                known = {k for k, r in self._damaged.items() if r.segment_base_offset == segment.base_offset}
                for key in known:
                    del self._damaged[key]
                for damaged in check.damaged:
                    if damaged.first_offset in known:  # already reported: refresh it quietly
                        self._damaged[damaged.first_offset] = damaged
            for damaged in check.damaged:
                if damaged.first_offset not in known:
                    self._note_damage(damaged)
        report.log_end_offset = self._end_offset
        return report

    # ------------------------------------------------------------------ retention

    def apply_retention(self, now_ms: int | None = None) -> list[int]:
        """Remove (or archive) the oldest segments past the topic's deletePolicy age.

        Never the active segment, never one pinned by a reader or a sync, never one not yet synced,
        and only a prefix of the log, so offsets stay contiguous. Returns the removed base offsets.
        """
        policy = self._config.retention
        if now_ms is None:
            now_ms = int(self._clock() * 1000)
        victims: list[Segment] = []
        with self._lock:
            if self._closed:
                return []
            unsynced = {id(s) for s in self._flush.unsynced_sealed}
            for segment in self._segments[:-1]:
                if segment.pins or id(segment) in unsynced:
                    break
                try:
                    last_write_ms = segment.mtime_ms()
                except OSError:
                    break
                if not policy.expired(last_write_ms, now_ms):
                    break
                victims.append(segment)
            if not victims:
                return []
            del self._segments[:len(victims)]
            del self._bases[:len(victims)]
            self._size_bytes -= sum(s.size_bytes for s in victims)
            for segment in victims:
                for path in (segment.log_path, segment.index_path, segment.timeindex_path):
                    self._files.discard(path)
        for i, segment in enumerate(victims):
            try:
                dispose_segment(segment.log_path, (segment.index_path, segment.timeindex_path,
                                                   key_index_path(segment.log_path)), policy)
            except OSError as exc:
                if not os.path.exists(segment.log_path):
                    continue  # only an index file is left behind: the next open removes it as an orphan
                # This segment and the later ones are still on disk: they stay the head of the log (a
                # prefix, so offsets stay contiguous) and the next run tries again.
                kept = victims[i:]
                with self._lock:
                    self._segments[:0] = kept
                    self._bases[:0] = [s.base_offset for s in kept]
                    self._size_bytes += sum(s.size_bytes for s in kept)
                raise StorageError(f"retention of {self} could not remove {segment.log_path}: {exc}; "
                                   f"{len(kept)} segment(s) kept, retried at the next run") from exc
        return [s.base_offset for s in victims]

    # ------------------------------------------------------------------ configuration and lifecycle

    def set_config(self, config: LogConfig) -> None:
        """Apply a new topic configuration to a live log (flush policy, retention, limits)."""
        with self._lock:
            self._config = config
            for segment in self._segments:
                segment.index_interval_bytes = config.index_interval_bytes
            pending = self._flush.pending
        if pending and self._flusher is not None and self._flusher.running:
            self._flusher.flush_soon(self)

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
