"""Errors the storage layer adds to metaq.errors; every one is a StorageError.

They carry the facts a caller needs to answer a client (the valid offset range, the id asked for), so
the broker can map them to wire errors without parsing messages.
"""

from __future__ import annotations

import errno

from metaq.errors import StorageError


class OffsetOutOfRange(StorageError):
    """The offset asked for is outside ``[earliest, latest]`` of the partition.

    ``latest`` is the log end offset (the next offset to be assigned); reading at it is allowed and
    returns nothing, so consumers can long-poll at the tail.
    """

    def __init__(self, offset: int, earliest: int, latest: int, where: str = "") -> None:
        self.offset = offset
        self.earliest = earliest
        self.latest = latest
        place = f" of {where}" if where else ""
        super().__init__(f"offset {offset} is outside the valid range [{earliest}, {latest}]{place}")


class MessageNotFound(StorageError):
    """No stored message has this id: another broker's id, an unknown partition tag, or deleted."""

    def __init__(self, message_id: int, reason: str) -> None:
        self.message_id = message_id
        super().__init__(f"message id {message_id:032x} not found: {reason}")


class LogClosedError(StorageError):
    """The partition log was closed (or deleted, or abandoned) and cannot serve the call."""


class DamagedData(StorageError):
    """Stored bytes at ``offset`` fail their checks: a damaged batch found while reading.

    ``resume_offset`` is the first offset after the damage whose batch is intact (-1 if none was found
    before the end of the segment); offsets in ``[offset, resume_offset)`` cannot be read.
    """

    def __init__(self, where: str, offset: int, resume_offset: int, position: int, problem: str) -> None:
        self.offset = offset
        self.resume_offset = resume_offset
        self.position = position
        self.problem = problem
        lost = f"; intact data resumes at offset {resume_offset} ({resume_offset - offset} messages unreadable)" \
            if resume_offset >= 0 else "; no intact batch follows in its segment"
        super().__init__(f"{where}: stored batch at offset {offset} (byte {position}) is damaged: {problem}{lost}")


class DiskFull(StorageError):
    """A write failed because the disk (or the quota) is full: nothing was stored, nothing is broken.

    The partition stays readable and writable: the next write that finds space succeeds.
    """


_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS


def storage_error(what: str, exc: OSError) -> StorageError:
    """DiskFull (the partition stays usable: the next write with room succeeds) or a plain StorageError."""
    if is_disk_full(exc):
        return DiskFull(f"{what}: the disk is full ({exc.strerror}); nothing was written, reads go on, and "
                        "writes succeed again once space is freed")
    return StorageError(f"{what}: {exc}")
