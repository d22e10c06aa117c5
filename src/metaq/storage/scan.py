"""Walking the batches of a segment file: cheap header walks for reads, full checks for recovery.

Reads trust the file (it was checked when the log was opened) and only parse headers. Recovery
checks every batch it walks: the structure (magic, length inside the file), offsets contiguous from
the expected one, count and last offset delta agreeing, the partition tag and offset inside the stamped
base message id, and the CRC32C of everything the producer wrote. The first batch that fails ends
the valid part of the file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import crc32c as _crc32c

from metaq.errors import CorruptRecordError
from metaq.protocol.records import HEADER_BYTES, STAMPED_BYTES, BatchHeader, read_header

_CHUNK_BYTES = 64 * 1024
_CHECK_CHUNK_BYTES = 1 << 20
_ID_LOW_MASK = (1 << 112) - 1  # tag and offset bits of a message id; the broker id bits may differ


def pread_exact(fd: int, size: int, position: int) -> bytes:
    """``size`` bytes at ``position``, or fewer only at the end of the file."""
    data = os.pread(fd, size, position)
    if len(data) == size or not data:
        return data
    parts = [data]
    got = len(data)
    while got < size:
        more = os.pread(fd, size - got, position + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def iter_headers(fd: int, position: int, end_position: int,
                 chunk_bytes: int = _CHUNK_BYTES) -> Iterator[tuple[int, BatchHeader]]:
    """(position, header) of each whole batch in ``[position, end_position)``.

    Stops at a batch that would run past ``end_position``; CorruptRecordError on a damaged header.
    Batches larger than the chunk are skipped over without being read.
    """
    while end_position - position >= HEADER_BYTES:
        buf = pread_exact(fd, min(chunk_bytes, end_position - position), position)
        p = 0
        n = len(buf)
        if n < HEADER_BYTES:
            return
        while n - p >= HEADER_BYTES:
            header = read_header(buf, p)
            if position + p + header.total_bytes > end_position:
                return
            yield position + p, header
            p += header.total_bytes
        position += p


@dataclass(slots=True)
class CheckResult:
    """How far a segment file is valid, and what its last valid batch said."""

    valid_end_position: int
    next_offset: int
    last_batch_position: int
    last_batch_base_offset: int
    max_timestamp_ms: int
    problem: str | None


def check_batches(fd: int, position: int, file_size_bytes: int, expected_offset: int, tag: int,
                  on_batch: Callable[[int, BatchHeader], None] | None = None) -> CheckResult:
    """Check batches from ``position`` to the end of the file; stop at the first bad one.

    ``problem`` is None when the walk reached the end of the file exactly, else what was wrong.
    Damage to the broker-id bits of the base message id or to the append time (bytes 13-14 and
    29-36 of a batch) cannot be seen: those are stamped by the broker outside the CRC and have no
    redundancy. Everything else in a batch is checked.
    """
    result = CheckResult(position, expected_offset, -1, -1, -1, None)
    while position < file_size_bytes:
        remaining = file_size_bytes - position
        if remaining < HEADER_BYTES:
            result.problem = f"{remaining} bytes at position {position} are too few for a batch header"
            break
        buf = pread_exact(fd, min(_CHECK_CHUNK_BYTES, remaining), position)
        p = 0
        stop = False
        while len(buf) - p >= HEADER_BYTES:
            where = position + p
            try:
                header = read_header(buf, p)
            except CorruptRecordError as exc:
                result.problem = f"batch at position {where}: {exc}"
                stop = True
                break
            total = header.total_bytes
            if where + total > file_size_bytes:
                result.problem = f"batch at position {where} is cut off ({total} bytes, " \
                                 f"{file_size_bytes - where} in the file)"
                stop = True
                break
            problem = _check_fields(header, expected_offset, tag)
            if problem is None:
                if p + total <= len(buf):
                    crc = _crc32c.crc32c(memoryview(buf)[p + STAMPED_BYTES:p + total])
                else:
                    crc = _crc_of_file_range(fd, where + STAMPED_BYTES, total - STAMPED_BYTES)
                if crc != header.crc:
                    problem = "CRC32C does not match"
            if problem is not None:
                result.problem = f"batch at position {where} (offset {expected_offset}): {problem}"
                stop = True
                break
            if on_batch is not None:
                on_batch(where, header)
            result.last_batch_position = where
            result.last_batch_base_offset = header.base_offset
            result.max_timestamp_ms = max(result.max_timestamp_ms, header.max_timestamp_ms)
            expected_offset = header.next_offset
            result.next_offset = expected_offset
            p += total
            result.valid_end_position = where + total
            if p > len(buf):
                break
        if stop:
            break
        position = result.valid_end_position
    return result


def _check_fields(header: BatchHeader, expected_offset: int, tag: int) -> str | None:
    if header.base_offset != expected_offset:
        return f"base offset is {header.base_offset}, expected {expected_offset}"
    if header.record_count < 1 or header.last_offset_delta != header.record_count - 1:
        return f"record count {header.record_count} and last offset delta {header.last_offset_delta} disagree"
    expected_id_low = ((tag << 64) | (expected_offset & ((1 << 64) - 1))) & _ID_LOW_MASK
    if header.base_message_id & _ID_LOW_MASK != expected_id_low:
        return "base message id does not match the partition and offset"
    return None


def _crc_of_file_range(fd: int, position: int, size: int) -> int:
    crc = 0
    end = position + size
    while position < end:
        chunk = os.pread(fd, min(_CHECK_CHUNK_BYTES, end - position), position)
        if not chunk:
            break
        crc = _crc32c.crc32c(chunk, crc)
        position += len(chunk)
    return crc
