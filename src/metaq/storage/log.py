"""PartitionLog: one partition's append-only log of record batches, split into segments.

Threads: one writer appends (the caller guarantees it); any thread may read, flush, run retention
or close. ``_lock`` guards the segment list and the writer's state and is held only for short,
non-blocking work (the append's single ``pwritev`` to the page cache included). The durability
bookkeeping lives in the partition's flush state (storage/partition_flush.py), whose sync lock serialises
the blocking syncs, which run without ``_lock`` so appends go on during an fdatasync.

Here: open, append, roll, read. The log's other parts are modules of their own, under the same locks and on
the same segment list: opening and recovering it (recovery.py), durability (partition_flush.py), a follower's
writes (follower.py), search by time and key (search.py), retention (retention.py), the scrub (verify.py),
and closing it (closing.py). Each of those modules declares, as a Protocol, what it uses of a PartitionLog
(``RecoveringLog``, ``FlushedLog``, ...), so none imports this one; mypy checks PartitionLog against each
where it hands itself over.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from bisect import bisect_right
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from metaq.errors import InvalidArgument, StorageError
from metaq.fsutil import datasync
from metaq.protocol.records import (
    PRODUCER_STAMPED,
    STAMPED_BYTES,
    BatchHeader,
    producer_stamp,
    stamp_prefix,
    validate_batch,
)
from metaq.storage import follower, search
from metaq.storage.checkpoint import (
    CLEAN_SHUTDOWN_FILE,
    CleanState,
    read_partition_clean_state,
)
from metaq.storage.closing import LogClosing
from metaq.storage.config import LogConfig
from metaq.storage.errors import DamagedData, LogClosedError, OffsetOutOfRange, storage_error
from metaq.storage.files import FileCache, FileHandle
from metaq.storage.fileslice import FileSlice, hint_readahead
from metaq.storage.flush import Flusher
from metaq.storage.keyindex import (
    DEFAULT_MAX_ENTRIES,
    FindResult,
)
from metaq.storage.partition_flush import AppendResult, PartitionFlush, Unsynced
from metaq.storage.producers import (
    ProducerStateTable,
    write_snapshot,
)
from metaq.storage.recovery import RecoveryReport, load_producers, load_segments
from metaq.storage.retention import apply_retention
from metaq.storage.segment import OFFSET_MAX, Segment
from metaq.storage.verify import DamagedRange, PartitionReport, verify_partition
from metaq.types import BROKER_ID_MAX, make_message_id, partition_tag, validate_partition, validate_topic

log = logging.getLogger(__name__)

_STANDALONE_MAX_OPEN_FILES = 64


class PartitionLog(LogClosing):
    """The log of one partition. Create with :meth:`open`."""

    # A broker holds thousands of these: slots save about 1.2 KiB each (of ~4.4 KiB, tracemalloc).
    __slots__ = (
        "_active", "_appending", "_bases", "_clock", "_config", "_damaged",
        "_end_offset", "_failure", "_files", "_find_lock", "_flush", "_flusher", "_id_base", "_lock",
        "_marker_present", "_own_files", "_partition", "_segments", "_size_bytes", "_sync", "_tag", "_tail",
        "_topic", "_truncations", "device", "directory", "producers", "recovery",
    )
    _flush: PartitionFlush

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
            load_producers(plog)
        except BaseException:
            plog._release_files(plog._segments)
            raise
        return plog

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
                assert next_offset <= OFFSET_MAX, "offset space exhausted"
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

    # ------------------------------------------------------------------ a follower's writes (storage/follower.py)

    def append_replicated(self, data: bytes | memoryview) -> AppendResult | None:
        """Store batches already stamped by the master, byte for byte (a follower's append; ReplicaGap or
        CorruptRecordError, nothing stored, for batches that do not follow the log end intact)."""
        return follower.append_replicated(self, data)

    def start_empty_at(self, offset: int) -> None:
        """Make an empty log start at ``offset`` (a new follower of a master whose retention removed the
        offsets below it); InvalidArgument for a log holding a batch."""
        follower.start_empty_at(self, offset)

    def truncate_to(self, offset: int) -> int:
        """Cut the log back so that ``offset`` (a batch boundary) becomes its end, durably and crash-safe;
        returns the messages removed."""
        return follower.truncate_to(self, offset)

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
            raise storage_error(f"cannot open {segment.log_path}", exc) from exc
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
            raise storage_error(f"cannot append to {segment.log_path}", exc) from exc
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
            raise storage_error(f"cannot start segment {segment.log_path}", exc) from exc
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

    # ------------------------------------------------------------------ search (storage/search.py)

    def offset_for_timestamp(self, timestamp_ms: int) -> int:
        """The first offset whose record timestamp is >= ``timestamp_ms``; the log end when none is."""
        return search.offset_for_timestamp(self, timestamp_ms)

    def find_messages(self, key: bytes | None, from_ms: int = -1, to_ms: int = -1, limit: int = 100, *,
                      max_key_entries: int = DEFAULT_MAX_ENTRIES) -> FindResult:
        """The records with this key (any key when None) and a timestamp in ``[from_ms, to_ms]`` (-1 =
        open), in offset order, at most ``limit`` (``truncated`` when more exist). Blocking (disk)."""
        return search.find_messages(self, key, from_ms, to_ms, limit, max_key_entries=max_key_entries)

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
        """Check every stored byte and index entry of the partition (blocking; storage/verify.py)."""
        return verify_partition(self)

    # ------------------------------------------------------------------ retention

    def apply_retention(self, now_ms: int | None = None) -> list[int]:
        """Remove (or archive) the oldest segments past the topic's deletePolicy age (storage/retention.py);
        returns the removed base offsets."""
        return apply_retention(self, now_ms)

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
