"""Walking the batches of a segment file: header walks for reads, full checks for recovery and scrubs.

Every header read is checked (``records.read_header`` verifies its ``header_crc``), so an offset, a
length or an id is never taken from damaged bytes. Reads check headers and offset continuity only;
recovery and ``verify`` also check each body's CRC32C and that the stamped id belongs to this partition
and offset.

After a damaged header the batch boundaries are lost. :func:`find_next_batch` finds them again: it
looks for the next position holding an intact header of this partition (magic, header CRC, the
partition tag and offset inside the message id, an offset past the damage), which is where intact
data resumes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import crc32c as _crc32c

from metaq.errors import CorruptRecordError
from metaq.protocol.records import HEADER_BYTES, MAGIC, STAMPED_BYTES, BatchHeader, read_header

_CHUNK_BYTES = 64 * 1024
_CHECK_CHUNK_BYTES = 1 << 20
_MAGIC_AT = 12
_MAGIC_BYTE = bytes([MAGIC])
_U64 = (1 << 64) - 1
_TAG_MASK = (1 << 48) - 1


class DamagedHeader(CorruptRecordError):
    """A batch header that fails its checks, at ``position`` of the file."""

    def __init__(self, position: int, problem: str) -> None:
        self.position = position
        self.problem = problem
        super().__init__(f"batch at byte {position}: {problem}")


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
    """(position, header) of each whole batch in ``[position, end_position)``, every header checked.

    Stops at a batch that would run past ``end_position``; :class:`DamagedHeader` (a
    CorruptRecordError) at a header that fails its checks. Batches larger than the chunk are skipped
    over without being read.
    """
    while end_position - position >= HEADER_BYTES:
        buf = pread_exact(fd, min(chunk_bytes, end_position - position), position)
        p = 0
        n = len(buf)
        if n < HEADER_BYTES:
            return
        while n - p >= HEADER_BYTES:
            try:
                header = read_header(buf, p)
            except CorruptRecordError as exc:
                raise DamagedHeader(position + p, str(exc)) from None
            if position + p + header.total_bytes > end_position:
                return
            yield position + p, header
            p += header.total_bytes
        position += p


def belongs_here(header: BatchHeader, tag: int) -> bool:
    """Whether the batch's stamped id names this partition (tag) and its own base offset."""
    base_id = header.base_message_id
    return (base_id & _U64) == (header.base_offset & _U64) and ((base_id >> 64) & _TAG_MASK) == tag


def find_next_batch(fd: int, position: int, end_position: int, after_offset: int,
                    tag: int) -> tuple[int, BatchHeader] | None:
    """The first intact batch of this partition starting in ``[position, end_position)`` whose base
    offset is above ``after_offset``, and where it starts; None if there is none.

    Used after a damaged header, when the length that led to the next batch cannot be trusted. A
    candidate must carry this format's magic, pass its header CRC, lie inside the range, and carry this
    partition's tag and its own offset in its message id: a batch stored inside a payload (another
    partition's, or an old copy) is not mistaken for a boundary.
    """
    step = _CHECK_CHUNK_BYTES
    while position < end_position:
        buf = pread_exact(fd, min(step + HEADER_BYTES, end_position - position), position)
        if len(buf) < HEADER_BYTES:
            return None
        scan_end = min(step, len(buf) - HEADER_BYTES + 1)
        at = buf.find(_MAGIC_BYTE, _MAGIC_AT, scan_end + _MAGIC_AT)
        while at >= 0:
            p = at - _MAGIC_AT
            try:
                header = read_header(buf, p)
            except CorruptRecordError:
                header = None
            if header is not None and header.base_offset > after_offset and belongs_here(header, tag) \
                    and position + p + header.total_bytes <= end_position:
                return position + p, header
            at = buf.find(_MAGIC_BYTE, at + 1, scan_end + _MAGIC_AT)
        position += scan_end
    return None


@dataclass(slots=True)
class Damage:
    """A damaged stretch of a segment file found by :func:`walk_batches`.

    Offsets ``[first_offset, resume_offset)`` cannot be read; intact batches resume at byte
    ``resume_position`` (the end of the file, and ``resume_offset`` -1, when none was found).
    """

    position: int
    resume_position: int
    first_offset: int
    resume_offset: int
    problem: str

    @property
    def bytes(self) -> int:
        return self.resume_position - self.position


@dataclass(slots=True)
class CheckResult:
    """How far a segment file is valid, and what its last valid batch said."""

    valid_end_position: int
    next_offset: int
    last_batch_position: int
    last_batch_base_offset: int
    max_timestamp_ms: int
    problem: str | None


def walk_batches(fd: int, position: int, file_size_bytes: int, expected_offset: int, tag: int, *,
                 resync: bool) -> Iterator[tuple[int, BatchHeader] | Damage]:
    """Check every batch from ``position`` to the end of the file: header, whole inside the file,
    offsets contiguous from ``expected_offset``, count and last offset delta agreeing, the id naming
    this partition and offset, and the body CRC32C. Yields ``(position, header)`` per good batch and a
    :class:`Damage` per bad stretch; without ``resync`` the walk ends at the first Damage (whose resume
    fields are then -1 / the file end).
    """
    buf, buf_start = b"", position
    while position < file_size_bytes:
        remaining = file_size_bytes - position
        if remaining < HEADER_BYTES:
            yield Damage(position, file_size_bytes, expected_offset, -1,
                         f"{remaining} bytes at byte {position} are too few for a batch header")
            return
        if not (buf_start <= position and position + HEADER_BYTES <= buf_start + len(buf)):
            buf, buf_start = pread_exact(fd, min(_CHECK_CHUNK_BYTES, remaining), position), position
        p = position - buf_start
        problem: str | None = None
        header: BatchHeader | None = None
        try:
            header = read_header(buf, p)
        except CorruptRecordError as exc:
            problem = str(exc)
        else:
            total = header.total_bytes
            if position + total > file_size_bytes:
                problem = f"batch is cut off ({total} bytes, {file_size_bytes - position} in the file)"
            else:
                problem = _check_fields(header, expected_offset, tag)
        if problem is None:
            assert header is not None
            if p + total <= len(buf):
                crc = _crc32c.crc32c(memoryview(buf)[p + STAMPED_BYTES:p + total])
            else:
                crc = _crc_of_file_range(fd, position + STAMPED_BYTES, total - STAMPED_BYTES)
            if crc == header.crc:
                yield position, header
            else:
                # the header is intact, so the batch's extent and offsets are still known
                yield Damage(position, position + total, header.base_offset, header.next_offset,
                             f"batch at byte {position} (offset {header.base_offset}): body fails its CRC32C check")
                if not resync:
                    return
            expected_offset = header.next_offset
            position += total
            continue
        message = f"batch at byte {position} (offset {expected_offset}): {problem}"
        if resync and header is not None and header.base_offset > expected_offset and belongs_here(header, tag) \
                and position + header.total_bytes <= file_size_bytes:
            # an intact batch, but offsets before it are missing: a gap of no bytes, then go on from it
            yield Damage(position, position, expected_offset, header.base_offset, message)
            expected_offset = header.base_offset
            continue
        found = find_next_batch(fd, position + 1, file_size_bytes, expected_offset, tag) if resync else None
        if found is None:
            yield Damage(position, file_size_bytes, expected_offset, -1, message)
            return
        yield Damage(position, found[0], expected_offset, found[1].base_offset, message)
        position, expected_offset = found[0], found[1].base_offset


def check_batches(fd: int, position: int, file_size_bytes: int, expected_offset: int, tag: int,
                  on_batch: Callable[[int, BatchHeader], None] | None = None) -> CheckResult:
    """Check batches from ``position`` to the end of the file; stop at the first bad one.

    ``problem`` is None when the walk reached the end of the file exactly, else what was wrong.
    """
    result = CheckResult(position, expected_offset, -1, -1, -1, None)
    for item in walk_batches(fd, position, file_size_bytes, expected_offset, tag, resync=False):
        if isinstance(item, Damage):
            result.problem = item.problem
            break
        where, header = item
        if on_batch is not None:
            on_batch(where, header)
        result.last_batch_position = where
        result.last_batch_base_offset = header.base_offset
        result.max_timestamp_ms = max(result.max_timestamp_ms, header.max_timestamp_ms)
        result.next_offset = header.next_offset
        result.valid_end_position = where + header.total_bytes
    return result


def count_whole_batches(fd: int, position: int, end_position: int, after_offset: int,
                        tag: int) -> tuple[int, int]:
    """(batches, messages) of the intact-looking batches of this partition in a stretch about to be cut,
    found by resyncing past each one: what a recovery cut drops at least."""
    batches = messages = 0
    while True:
        found = find_next_batch(fd, position, end_position, after_offset, tag)
        if found is None:
            return batches, messages
        at, header = found
        batches += 1
        messages += max(header.record_count, 0)
        after_offset = header.last_offset
        position = at + header.total_bytes


def _check_fields(header: BatchHeader, expected_offset: int, tag: int) -> str | None:
    if header.base_offset != expected_offset:
        return f"base offset is {header.base_offset}, expected {expected_offset}"
    if header.record_count < 1 or header.last_offset_delta != header.record_count - 1:
        return f"record count {header.record_count} and last offset delta {header.last_offset_delta} disagree"
    if not belongs_here(header, tag):
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
