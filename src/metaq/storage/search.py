"""Searching a partition log: the first offset at or after a timestamp (time index, then batch headers),
and the records with a key and/or in a time range (``metaq admin find``: the per-segment key index).

PartitionLog's ``offset_for_timestamp`` and ``find_messages`` call these. A search pins each segment while
it reads it (retention and truncation skip pinned segments) and never holds the log's lock while reading.
"""

from __future__ import annotations

import threading
from typing import Protocol

from metaq.errors import CorruptRecordError, InvalidArgument, StorageError
from metaq.protocol.records import BatchHeader, decode_batch
from metaq.storage.errors import DamagedData, LogClosedError
from metaq.storage.files import FileCache
from metaq.storage.keyindex import DEFAULT_MAX_ENTRIES, FindResult, find_in_segment
from metaq.storage.scan import iter_headers, pread_exact
from metaq.storage.segment import Segment


class SearchedLog(Protocol):
    """What a search uses of a :class:`~metaq.storage.log.PartitionLog`: its segment list under its lock, and
    its pins. Declared here, so this module need not import log.py, which calls it."""

    _lock: threading.Lock
    _find_lock: threading.Lock
    _closed: bool
    _segments: list[Segment]
    _end_offset: int
    _files: FileCache

    @property
    def log_start_offset(self) -> int: ...

    def offset_for_timestamp(self, timestamp_ms: int) -> int: ...

    def _unpin(self, segment: Segment) -> None: ...


def offset_for_timestamp(plog: SearchedLog, timestamp_ms: int) -> int:
    """The first offset whose record timestamp is >= ``timestamp_ms``; the log end when none is."""
    with plog._lock:
        if plog._closed:
            raise LogClosedError(f"{plog} is closed")
        candidates = list(plog._segments)
    for segment in candidates:
        with plog._lock:
            if segment.base_offset < plog._segments[0].base_offset or plog._closed:
                continue  # removed by retention meanwhile
            segment.pins += 1
            size_limit = segment.size_bytes
        try:
            if segment.max_timestamp() < timestamp_ms:
                continue
            found = _search_timestamp(plog, segment, timestamp_ms, size_limit)
            if found is not None:
                return found
        finally:
            plog._unpin(segment)
    return plog._end_offset


def _search_timestamp(plog: SearchedLog, segment: Segment, timestamp_ms: int, size_limit: int) -> int | None:
    _, time_index = segment.loaded_indexes()
    relative = time_index.start_before(timestamp_ms)
    handle = plog._files.acquire(segment.log_path, on_close=segment.on_log_fd_closed)
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
        plog._files.release(handle)
    return None


def find_messages(plog: SearchedLog, key: bytes | None, from_ms: int = -1, to_ms: int = -1, limit: int = 100, *,
                  max_key_entries: int = DEFAULT_MAX_ENTRIES) -> FindResult:
    """The records with this key (any key when None) and a timestamp in ``[from_ms, to_ms]`` (-1 =
    open), in offset order, at most ``limit`` (``truncated`` when more exist). Blocking (disk).

    The start comes from the time index (the first offset with a timestamp >= from_ms); by key, the
    per-segment key index gives candidates that are checked against the records; by time only, the
    records from the start are scanned until ``limit`` or the end of the log.
    """
    if limit <= 0:
        raise InvalidArgument(f"limit must be > 0, not {limit}")
    with plog._find_lock:
        return _find_locked(plog, key, from_ms, to_ms, limit, max_key_entries)


def _find_locked(plog: SearchedLog, key: bytes | None, from_ms: int, to_ms: int, limit: int,
                 max_key_entries: int) -> FindResult:
    result = FindResult()
    start = plog.log_start_offset if from_ms < 0 else plog.offset_for_timestamp(from_ms)
    with plog._lock:
        if plog._closed:
            raise LogClosedError(f"{plog} is closed")
        candidates = list(plog._segments)
    for segment in candidates:
        with plog._lock:
            if segment.base_offset < plog._segments[0].base_offset or plog._closed \
                    or segment not in plog._segments:
                continue  # removed by retention or truncation meanwhile
            segment.pins += 1
            size_limit, next_limit = segment.size_bytes, segment.next_offset
        try:
            if next_limit <= start:
                continue
            handle = plog._files.acquire(segment.log_path, on_close=segment.on_log_fd_closed)
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
                plog._files.release(handle)
        except (DamagedData, StorageError, CorruptRecordError) as exc:
            result.problems.append(f"segment {segment.base_offset}: {exc}; the rest of it was not searched")
            continue
        finally:
            plog._unpin(segment)
        if done:
            break
    return result
