"""Helpers shared by the storage tests (imported by name: pytest puts this directory on sys.path)."""

from __future__ import annotations

import itertools
import os

from metaq.protocol.records import decode_fetched, encode_messages, encode_values
from metaq.storage import PartitionLog
from metaq.testing import FakeClock as FakeClock  # the one fake clock, for the storage tests that import it here
from metaq.types import Message

_SCALE = float(os.environ.get("METAQ_HYPOTHESIS_SCALE", "1"))


def examples(n: int) -> int:
    """``n`` scaled by $METAQ_HYPOTHESIS_SCALE, for a long fuzzing run (e.g. 50) outside the normal suite."""
    return max(1, int(n * _SCALE))


def no_sync(fd: int) -> None:
    """An fdatasync that does nothing: for tests about layout, not durability."""


_counter = itertools.count()


def make_batch(count: int = 3, size: int = 20, timestamp_ms: int = 1000) -> tuple[bytes, list[bytes]]:
    """A batch of ``count`` distinct payloads, and the payloads."""
    n = next(_counter)
    # fixed-width prefix: a batch's size depends only on (count, size), never on how many came before,
    # so hypothesis sees the same data for the same draws
    values = [f"{n:09d}:{i:04d}:".encode().ljust(size, b"x") for i in range(count)]
    return encode_values(values, timestamp_ms), values


def batch_with_timestamps(timestamps: list[int]) -> bytes:
    return encode_messages([Message("t", f"v{ts}".encode(), timestamp_ms=ts) for ts in timestamps])


def read_all(log: PartitionLog, start: int | None = None, max_bytes: int = 1 << 20) -> list[Message]:
    offset = log.log_start_offset if start is None else start
    out: list[Message] = []
    while offset < log.log_end_offset:
        data = log.read_bytes(offset, max_bytes)
        messages, offset = decode_fetched(data, log.topic, log.partition, offset)
        assert messages, "a read below the log end must make progress"
        out.extend(messages)
    return out


