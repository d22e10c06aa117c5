"""Errors the storage layer adds to metaq.errors; every one is a StorageError.

They carry the facts a caller needs to answer a client (the valid offset range, the id asked for), so
the broker can map them to wire errors without parsing messages.
"""

from __future__ import annotations

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
