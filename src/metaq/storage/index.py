"""Sparse offset and time indexes of one segment: in memory as arrays, on disk as flat entry files.

``<base>.index``: entries of 8 bytes, big-endian::

    0  4  relative_offset  u32   batch base offset - segment base offset
    4  4  position         u32   byte position of that batch in the .log file

``<base>.timeindex``: entries of 12 bytes, big-endian::

    0  8  timestamp        i64   largest batch max_timestamp seen up to and including this batch
    8  4  relative_offset  u32   base offset of that batch - segment base offset

One offset entry is added for the first batch that starts at least ``index_interval_bytes`` after the
previous entry's batch (no entry for the segment's first batch: position 0 is implied). A time entry
is added at the same moments, only when the running maximum timestamp grew, and once more when the
segment is sealed. Both files are derived data: they are written after the log bytes they describe
are fsynced, never fsynced on the hot path, validated when loaded, and rebuilt from the log when bad.
"""

from __future__ import annotations

import itertools
import struct
import sys
from array import array
from bisect import bisect_left, bisect_right

OFFSET_ENTRY = struct.Struct(">II")
TIME_ENTRY = struct.Struct(">qI")
OFFSET_ENTRY_BYTES = OFFSET_ENTRY.size
TIME_ENTRY_BYTES = TIME_ENTRY.size
_U32_MAX = (1 << 32) - 1
_LITTLE = sys.byteorder == "little"

assert array("I").itemsize == 4 and array("q").itemsize == 8


class IndexCorrupt(Exception):
    """An index file that cannot be trusted; the caller rebuilds it from the log."""


def _from_be(typecode: str, data: bytes) -> array:
    arr = array(typecode)
    arr.frombytes(data)
    if _LITTLE:
        arr.byteswap()
    return arr


def _strictly_increasing(values: array) -> bool:
    return all(a < b for a, b in itertools.pairwise(values))


class OffsetIndex:
    """(relative offset, position) entries, both strictly increasing. Appends happen under the log lock;
    readers may look up concurrently (array appends are atomic under the GIL)."""

    __slots__ = ("_pending", "positions", "relative_offsets")

    def __init__(self) -> None:
        self.relative_offsets = array("I")
        self.positions = array("I")
        self._pending = bytearray()

    def __len__(self) -> int:
        return len(self.positions)

    def append(self, relative_offset: int, position: int) -> None:
        if self.positions:
            assert relative_offset > self.relative_offsets[-1], "index offsets must grow"
            assert position > self.positions[-1], "index positions must grow"
        assert 0 <= relative_offset <= _U32_MAX and 0 <= position <= _U32_MAX
        self.relative_offsets.append(relative_offset)
        self.positions.append(position)
        self._pending += OFFSET_ENTRY.pack(relative_offset, position)

    @property
    def pending_bytes(self) -> int:
        """Bytes of the entries appended since the last :meth:`take_pending`."""
        return len(self._pending)

    def take_pending(self) -> bytes:
        """Entries appended since the last call, encoded for the file (the caller writes them)."""
        data = bytes(self._pending)
        self._pending.clear()
        return data

    def last(self) -> tuple[int, int]:
        """The last entry, or (0, 0): the first batch of a segment is at position 0."""
        if not self.positions:
            return 0, 0
        return self.relative_offsets[-1], self.positions[-1]

    def floor(self, relative_offset: int, position_limit: int | None = None) -> tuple[int, int]:
        """The last entry with offset <= ``relative_offset`` (and position < ``position_limit``)."""
        i = bisect_right(self.relative_offsets, relative_offset)
        if position_limit is not None:
            i = min(i, bisect_left(self.positions, position_limit))
        if i == 0:
            return 0, 0
        return self.relative_offsets[i - 1], self.positions[i - 1]

    def floor_position(self, position: int) -> int:
        """The largest indexed batch position <= ``position`` (0 when none)."""
        i = bisect_right(self.positions, position)
        return self.positions[i - 1] if i else 0

    def floor_entry_at_position(self, position: int) -> tuple[int, int]:
        """The entry (relative offset, position) with the largest position <= ``position``; (0, 0) if none."""
        i = bisect_right(self.positions, position)
        return (self.relative_offsets[i - 1], self.positions[i - 1]) if i else (0, 0)

    def to_bytes(self) -> bytes:
        both = array("I", bytes(8 * len(self.positions)))
        both[0::2] = self.relative_offsets
        both[1::2] = self.positions
        if _LITTLE:
            both.byteswap()
        return both.tobytes()

    def truncate(self, count: int) -> None:
        del self.relative_offsets[count:]
        del self.positions[count:]
        self._pending.clear()

    @classmethod
    def parse(cls, data: bytes, log_size_bytes: int, offset_span: int | None) -> OffsetIndex:
        """Validate and load an index file's bytes. IndexCorrupt unless every entry is plausible:
        whole entries, both columns strictly increasing, positions inside the log, offsets inside the
        segment's offset span."""
        if len(data) % OFFSET_ENTRY_BYTES:
            raise IndexCorrupt(f"index has {len(data)} bytes, not a multiple of {OFFSET_ENTRY_BYTES}")
        both = _from_be("I", data)
        index = cls()
        index.relative_offsets = both[0::2]
        index.positions = both[1::2]
        if index.positions:
            if index.positions[-1] >= log_size_bytes:
                raise IndexCorrupt(f"index points at position {index.positions[-1]}, past the log's "
                                   f"{log_size_bytes} bytes")
            if offset_span is not None and index.relative_offsets[-1] >= offset_span:
                raise IndexCorrupt(f"index holds relative offset {index.relative_offsets[-1]}, past the "
                                   f"segment's {offset_span} offsets")
            if not (_strictly_increasing(index.positions) and _strictly_increasing(index.relative_offsets)):
                raise IndexCorrupt("index entries are not strictly increasing")
        return index


class TimeIndex:
    """(running max timestamp, relative offset) entries; timestamps strictly increase."""

    __slots__ = ("_pending", "relative_offsets", "timestamps")

    def __init__(self) -> None:
        self.timestamps = array("q")
        self.relative_offsets = array("I")
        self._pending = bytearray()

    def __len__(self) -> int:
        return len(self.timestamps)

    @property
    def max_timestamp_ms(self) -> int:
        return self.timestamps[-1] if self.timestamps else -1

    def maybe_append(self, timestamp_ms: int, relative_offset: int) -> None:
        """Record a new running maximum; a timestamp that does not grow the maximum is ignored."""
        if self.timestamps and timestamp_ms <= self.timestamps[-1]:
            return
        assert not self.relative_offsets or relative_offset >= self.relative_offsets[-1]
        self.timestamps.append(timestamp_ms)
        self.relative_offsets.append(relative_offset)
        self._pending += TIME_ENTRY.pack(timestamp_ms, relative_offset)

    @property
    def pending_bytes(self) -> int:
        return len(self._pending)

    def take_pending(self) -> bytes:
        data = bytes(self._pending)
        self._pending.clear()
        return data

    def truncate(self, count: int) -> None:
        del self.timestamps[count:]
        del self.relative_offsets[count:]
        self._pending.clear()

    def start_before(self, timestamp_ms: int) -> int:
        """Relative offset of a batch such that every batch before it holds only older timestamps:
        the last entry whose running maximum is below ``timestamp_ms`` (0 when none)."""
        i = bisect_left(self.timestamps, timestamp_ms)
        return self.relative_offsets[i - 1] if i else 0

    def to_bytes(self) -> bytes:
        return b"".join(TIME_ENTRY.pack(t, r) for t, r in zip(self.timestamps, self.relative_offsets,
                                                              strict=True))

    @classmethod
    def parse(cls, data: bytes, offset_span: int | None) -> TimeIndex:
        if len(data) % TIME_ENTRY_BYTES:
            raise IndexCorrupt(f"time index has {len(data)} bytes, not a multiple of {TIME_ENTRY_BYTES}")
        index = cls()
        for ts, rel in TIME_ENTRY.iter_unpack(data):
            index.timestamps.append(ts)
            index.relative_offsets.append(rel)
        if index.timestamps:
            if offset_span is not None and index.relative_offsets[-1] >= offset_span:
                raise IndexCorrupt("time index points past the segment's offsets")
            if not _strictly_increasing(index.timestamps):
                raise IndexCorrupt("time index timestamps do not strictly increase")
            if not all(a <= b for a, b in zip(index.relative_offsets, index.relative_offsets[1:],
                                              strict=False)):
                raise IndexCorrupt("time index offsets go backwards")
        return index
