"""One segment: a ``<base>.log`` file of whole record batches and its two sparse indexes.

A segment knows its files, sizes and indexes; it does not lock (its PartitionLog does) and it does not
decide when to roll or flush. Only the newest segment of a log is written; older ones are sealed.
Sealed segments load their indexes lazily and drop them again when their log descriptor is closed
by the FileCache, so thousands of idle segments cost a few hundred bytes each.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator

from metaq.errors import StorageError
from metaq.protocol.records import LENGTH_PREFIX_BYTES, BatchHeader
from metaq.storage.errors import DamagedData
from metaq.storage.files import FileCache
from metaq.storage.index import IndexCorrupt, OffsetIndex, TimeIndex
from metaq.storage.scan import DamagedHeader, belongs_here, find_next_batch, iter_headers

OFFSET_MAX = (1 << 63) - 1
"""The largest offset a log may assign (a signed 64-bit field on the wire)."""

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIMEINDEX_SUFFIX = ".timeindex"
OFFSET_DIGITS = 20
_LOOKUP_CHUNK_BYTES = 16 * 1024
_EXTENT_CHUNK_BYTES = 8 * 1024


def segment_file_name(base_offset: int, suffix: str = LOG_SUFFIX) -> str:
    return f"{base_offset:0{OFFSET_DIGITS}d}{suffix}"


def parse_segment_file_name(name: str, suffix: str = LOG_SUFFIX) -> int | None:
    """The base offset of ``00000000000000000123.log``; None for anything else (archives, temp files)."""
    if not name.endswith(suffix):
        return None
    stem = name[: -len(suffix)]
    if len(stem) != OFFSET_DIGITS or not stem.isdigit():
        return None
    return int(stem)


class Segment:
    """State of one segment. Fields are changed by the log's writer under the log's lock."""

    __slots__ = (
        "_load_lock", "base_offset", "dir_synced", "directory", "files", "index", "index_file_bytes",
        "index_interval_bytes", "index_path", "last_batch_base_offset", "log_path", "max_timestamp_ms",
        "next_offset", "pins", "sealed", "size_bytes", "synced_bytes", "tag", "tail", "time_index",
        "timeindex_file_bytes", "timeindex_path",
    )

    def __init__(self, directory: str, base_offset: int, files: FileCache, index_interval_bytes: int, tag: int, *,
                 size_bytes: int = 0, next_offset: int | None = None, sealed: bool = False) -> None:
        assert base_offset >= 0
        self.directory = directory
        self.tag = tag
        """The partition tag inside every stamped message id of this segment (to resync after damage)."""
        self.base_offset = base_offset
        self.files = files
        self.index_interval_bytes = index_interval_bytes
        self.log_path = os.path.join(directory, segment_file_name(base_offset))
        self.index_path = os.path.join(directory, segment_file_name(base_offset, INDEX_SUFFIX))
        self.timeindex_path = os.path.join(directory, segment_file_name(base_offset, TIMEINDEX_SUFFIX))
        self.size_bytes = size_bytes
        self.synced_bytes = size_bytes
        self.next_offset = base_offset if next_offset is None else next_offset
        self.sealed = sealed
        self.index: OffsetIndex | None = None
        self.time_index: TimeIndex | None = None
        self.index_file_bytes = 0
        self.timeindex_file_bytes = 0
        self.max_timestamp_ms = -1
        self.last_batch_base_offset = -1
        self.tail: tuple[int, int] | None = None
        """(base offset, position) of the last batch written: where a fetch at the log end starts its walk
        (one tuple, replaced whole, so a reader never pairs an offset with another batch's position)."""
        self.pins = 0
        self.dir_synced = True
        self._load_lock = threading.Lock()

    def __repr__(self) -> str:
        state = "sealed" if self.sealed else "active"
        return f"Segment({self.base_offset}, {self.size_bytes} bytes, next {self.next_offset}, {state})"

    # ------------------------------------------------------------------ writer side (under the log lock)

    def start_empty_indexes(self) -> None:
        self.index = OffsetIndex()
        self.time_index = TimeIndex()

    def note_batch(self, position: int, header: BatchHeader, base_offset: int | None = None) -> None:
        """Account for a batch just written (or found by recovery) at ``position``: sizes and indexes.
        ``base_offset``: the offset it was stored at, when ``header`` is the producer's (an append)."""
        index, time_index = self.index, self.time_index
        assert index is not None and time_index is not None, "indexes of a written segment are loaded"
        base = header.base_offset if base_offset is None else base_offset
        assert base == self.next_offset, "offsets must be contiguous"
        self.max_timestamp_ms = index_batch(index, time_index, self.index_interval_bytes, self.base_offset,
                                            position, base, header.max_timestamp_ms, self.max_timestamp_ms)
        self.last_batch_base_offset = base
        self.tail = (base, position)
        self.size_bytes = position + LENGTH_PREFIX_BYTES + header.batch_length
        self.next_offset = base + header.last_offset_delta + 1

    def seal(self) -> None:
        """No more writes: record the segment's largest timestamp as the last time index entry."""
        if self.time_index is not None and self.last_batch_base_offset >= 0:
            self.time_index.maybe_append(self.max_timestamp_ms, self.last_batch_base_offset - self.base_offset)
        self.sealed = True

    def unindexed_bytes(self) -> int:
        """Log bytes after the last entry of the offset index file: what a clean open walks."""
        on_disk = self.index_file_bytes // 8 if self.index_file_bytes > 0 else 0
        last = self.index.positions[on_disk - 1] if on_disk and self.index is not None else 0
        return self.size_bytes - last

    def take_pending_index_bytes(self, at_least: int = 0) -> tuple[bytes, bytes]:
        """The index entries not written yet, encoded; none unless they hold ``at_least`` bytes."""
        if self.index is None or self.time_index is None or \
                self.index.pending_bytes + self.time_index.pending_bytes < at_least:
            return b"", b""
        return self.index.take_pending(), self.time_index.take_pending()

    def write_index_bytes(self, index_bytes: bytes, timeindex_bytes: bytes) -> None:
        """Append encoded entries to the index files (serialised by the log's sync lock). After the files
        were dropped (a failed write), the whole in-memory indexes are written anew instead."""
        if self.index_file_bytes < 0 or self.timeindex_file_bytes < 0:
            self.rewrite_index_files()
            return
        if index_bytes:
            self.index_file_bytes += _pwrite_file(self.files, self.index_path, index_bytes,
                                                  self.index_file_bytes)
        if timeindex_bytes:
            self.timeindex_file_bytes += _pwrite_file(self.files, self.timeindex_path, timeindex_bytes,
                                                      self.timeindex_file_bytes)

    def rewrite_index_files(self) -> None:
        """Replace both index files with the in-memory indexes (after recovery or a rebuild)."""
        assert self.index is not None and self.time_index is not None
        self.index.take_pending()
        self.time_index.take_pending()
        for path, data in ((self.index_path, self.index.to_bytes()),
                           (self.timeindex_path, self.time_index.to_bytes())):
            self.files.discard(path)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                _write_all(fd, data, 0)
            finally:
                os.close(fd)
        self.index_file_bytes = 8 * len(self.index)
        self.timeindex_file_bytes = 12 * len(self.time_index)

    def drop_index_files(self) -> None:
        """Remove both index files after a failed write (removing needs no space): a reopen rebuilds them
        from the log, and the next write rewrites them whole from memory. Never raises."""
        for path in (self.index_path, self.timeindex_path):
            self.files.discard(path)
            try:
                os.unlink(path)
            except OSError:
                pass
        self.index_file_bytes = self.timeindex_file_bytes = -1

    def sync_index_files(self, sync: Callable[[int], None], *, create: bool = True) -> None:
        """fsync both index files (at a seal, so that a reopen can trust them; at a clean close, what earlier
        flushes wrote). ``create=False``: a file that does not exist is left so (a clean close)."""
        for path, size in ((self.index_path, self.index_file_bytes),
                           (self.timeindex_path, self.timeindex_file_bytes)):
            try:
                # An empty segment needs no index files: creating and syncing two per partition made
                # the first close of 10,000 new partitions take seconds.
                handle = self.files.acquire(path, create=create and bool(self.size_bytes or size))
            except FileNotFoundError:
                continue
            try:
                if os.fstat(handle.fd).st_size != size:
                    os.ftruncate(handle.fd, size)
                sync(handle.fd)
            finally:
                self.files.release(handle)

    # ------------------------------------------------------------------ reader side

    def on_log_fd_closed(self) -> None:
        """FileCache callback: a sealed segment with complete index files forgets its loaded indexes."""
        if self.sealed and self.index is not None and self.index_file_bytes == 8 * len(self.index) \
                and self.time_index is not None and self.timeindex_file_bytes == 12 * len(self.time_index):
            self.index = None
            self.time_index = None

    def loaded_indexes(self) -> tuple[OffsetIndex, TimeIndex]:
        """The indexes, loaded from their files (and rebuilt from the log when bad) if needed."""
        index, time_index = self.index, self.time_index
        if index is not None and time_index is not None:
            return index, time_index
        with self._load_lock:
            index, time_index = self.index, self.time_index
            if index is None or time_index is None:
                index, time_index = self._load_or_rebuild()
                self.index, self.time_index = index, time_index
            return index, time_index

    def _load_or_rebuild(self) -> tuple[OffsetIndex, TimeIndex]:
        span = self.next_offset - self.base_offset
        try:
            index = OffsetIndex.parse(_read_file(self.index_path), self.size_bytes, span)
            time_index = TimeIndex.parse(_read_file(self.timeindex_path), span)
            if self.sealed and self.size_bytes and not len(time_index):
                raise IndexCorrupt("sealed segment has an empty time index")
            self.index_file_bytes = 8 * len(index)
            self.timeindex_file_bytes = 12 * len(time_index)
            return index, time_index
        except (OSError, IndexCorrupt):
            return self._rebuild_indexes()

    def _rebuild_indexes(self) -> tuple[OffsetIndex, TimeIndex]:
        """Walk the log's headers to rebuild both indexes, then rewrite their files.

        A damaged stretch is stepped over (the walk resyncs on the next intact batch), so entries after
        it are rebuilt too. Works on local objects only: readers may be using this segment's fields
        concurrently.
        """
        index, time_index = OffsetIndex(), TimeIndex()
        max_ts = -1
        last_base = -1
        handle = self.files.acquire(self.log_path, on_close=self.on_log_fd_closed)
        try:
            for position, header in headers_stepping_over_damage(handle.fd, 0, self.size_bytes, self.base_offset,
                                                                  self.tag):
                if header.base_offset < self.base_offset or header.last_offset >= self.next_offset:
                    break
                max_ts = index_batch(index, time_index, self.index_interval_bytes, self.base_offset,
                                     position, header.base_offset, header.max_timestamp_ms, max_ts)
                last_base = header.base_offset
        finally:
            self.files.release(handle)
        if last_base >= 0:
            time_index.maybe_append(max_ts, last_base - self.base_offset)
        self.index, self.time_index = index, time_index
        try:
            self.rewrite_index_files()
        except OSError:
            pass  # the rebuilt indexes serve from memory; the files are rebuilt again next time
        return index, time_index

    def find_batch(self, fd: int, offset: int, size_limit: int, next_offset_at_limit: int) -> tuple[int, BatchHeader]:
        """Position and header of the batch holding ``offset`` (which must be in this segment).

        Every header on the way is checked, and so is offset continuity. A damaged stretch before the
        batch is stepped over; :class:`DamagedData` when ``offset`` itself lies in one. A sealed segment
        whose index leads to a bad position gets its indexes rebuilt once.
        """
        tail = self.tail
        for attempt in (0, 1):
            if tail is not None and tail[0] <= offset and tail[1] < size_limit and not self.sealed and not attempt:
                # a fetch at the end of the active segment, the common case: start at the last batch
                # written, not at the index entry before it (up to index_interval_bytes of headers to read)
                start, position = tail
            else:
                index, _ = self.loaded_indexes()
                entry_relative, position = index.floor(offset - self.base_offset, size_limit)
                start = self.base_offset + entry_relative
            try:
                return self._walk_to(fd, offset, position, start, size_limit,
                                     next_offset_at_limit, trust_entry=attempt == 1 or not self.sealed)
            except IndexCorrupt as exc:
                if attempt:
                    raise StorageError(f"segment {self.log_path}: {exc}") from None
                with self._load_lock:
                    self.index, self.time_index = self._rebuild_indexes()
        raise AssertionError("unreachable")

    def _walk_to(self, fd: int, offset: int, position: int, expected: int, size_limit: int,
                 next_offset_at_limit: int, *, trust_entry: bool) -> tuple[int, BatchHeader]:
        entry = position
        while True:
            try:
                for at, header in iter_headers(fd, position, size_limit, _LOOKUP_CHUNK_BYTES):
                    if header.base_offset != expected:
                        if at == entry and not trust_entry:
                            raise IndexCorrupt(f"index says offset {expected} is at byte {at}, "
                                               f"the log has offset {header.base_offset} there")
                        if header.base_offset > expected and belongs_here(header, self.tag):
                            if header.base_offset > offset:
                                raise DamagedData(self._where(), expected, header.base_offset, at,
                                                  f"offsets {expected}..{header.base_offset - 1} are missing")
                            expected = header.base_offset
                        else:
                            raise DamagedHeader(at, f"base offset is {header.base_offset}, expected {expected}")
                    if header.next_offset > offset:
                        return at, header
                    expected = header.next_offset
            except DamagedHeader as exc:
                if exc.position == entry and not trust_entry:
                    raise IndexCorrupt(f"index entry at byte {entry}: {exc.problem}") from None
                found = find_next_batch(fd, exc.position + 1, size_limit, expected, self.tag)
                if found is None or found[1].base_offset > offset:
                    resume = found[1].base_offset if found is not None else next_offset_at_limit
                    raise DamagedData(self._where(), expected, resume, exc.position, exc.problem) from None
                position, expected, entry = found[0], found[1].base_offset, -1
                continue
            raise StorageError(f"offset {offset} is not in segment {self.log_path} "
                               f"[{self.base_offset}, {self.next_offset})")

    def _where(self) -> str:
        return f"partition {os.path.basename(self.directory)}, segment {self.base_offset}"

    def extent(self, fd: int, position: int, header: BatchHeader, max_bytes: int, size_limit: int,
               next_offset_at_limit: int) -> tuple[int, int]:
        """(bytes, next offset) of the whole batches from ``position`` that fit in ``max_bytes``.

        The first batch is always included, even when it alone is larger than ``max_bytes``: a
        consumer whose limit is below one batch must still progress (MetaQ's maxTransferSize stall).
        The extent stops before a header that fails its checks or breaks offset continuity, so a
        reply carries the intact batches before a damaged one and the next fetch meets the damage.
        """
        end = position + header.total_bytes
        limit = min(size_limit, position + max_bytes)
        if end >= limit:
            return header.total_bytes, header.next_offset
        index, _ = self.loaded_indexes()
        entry_relative, entry_position = index.floor_entry_at_position(limit)
        if entry_position > end:
            start, expected = entry_position, self.base_offset + entry_relative
        else:
            start, expected = end, header.next_offset
        end, next_offset = start, expected
        try:
            for at, h in iter_headers(fd, start, size_limit, _EXTENT_CHUNK_BYTES):
                if h.base_offset != expected or at + h.total_bytes > limit:
                    break
                end = at + h.total_bytes
                next_offset = expected = h.next_offset
            else:
                if end == size_limit:
                    next_offset = next_offset_at_limit
        except DamagedHeader:
            pass  # the reply ends before it; the next fetch, starting there, reports the damage
        return end - position, next_offset

    def max_timestamp(self) -> int:
        """The largest batch timestamp in the segment (-1 when empty)."""
        if not self.sealed:
            return self.max_timestamp_ms
        _, time_index = self.loaded_indexes()
        return time_index.max_timestamp_ms

    def mtime_ms(self) -> int:
        return os.stat(self.log_path).st_mtime_ns // 1_000_000


def index_batch(index: OffsetIndex, time_index: TimeIndex, interval_bytes: int, segment_base_offset: int,
                position: int, base_offset: int, max_timestamp_ms: int, running_max_ms: int) -> int:
    """Add the index entries due for a batch (its base offset and largest timestamp) at ``position``; returns
    the new running max timestamp.

    One rule for appends, recovery and rebuilds, so a rebuilt index equals the one written live.
    """
    max_ts = max_timestamp_ms if max_timestamp_ms > running_max_ms else running_max_ms
    positions = index.positions  # index.last()'s position, without a call and a tuple per batch
    if position and position - (positions[-1] if positions else 0) >= max(interval_bytes, 1):
        relative = base_offset - segment_base_offset
        index.append(relative, position)
        time_index.maybe_append(max_ts, relative)
    return max_ts


def headers_stepping_over_damage(fd: int, position: int, end_position: int, expected: int,
                                 tag: int) -> Iterator[tuple[int, BatchHeader]]:
    """The intact headers of a file in order, resyncing past damaged stretches (for index rebuilds)."""
    while True:
        try:
            for at, header in iter_headers(fd, position, end_position):
                if header.base_offset < expected:
                    raise DamagedHeader(at, f"base offset {header.base_offset} goes back (expected {expected})")
                yield at, header
                expected = header.next_offset
            return
        except DamagedHeader as exc:
            found = find_next_batch(fd, exc.position + 1, end_position, expected, tag)
            if found is None:
                return
            position, expected = found[0], found[1].base_offset


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _write_all(fd: int, data: bytes, position: int) -> int:
    view = memoryview(data)
    done = 0
    while done < len(view):
        n = os.pwrite(fd, view[done:], position + done)
        if n <= 0:
            raise OSError(f"pwrite wrote {n} bytes")
        done += n
    return done


def _pwrite_file(files: FileCache, path: str, data: bytes, position: int) -> int:
    handle = files.acquire(path, create=True)
    try:
        return _write_all(handle.fd, data, position)
    finally:
        files.release(handle)
