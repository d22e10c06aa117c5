"""The record batch format: its byte layout, header, producer block and stamping.

A record batch is the unit a producer sends, the broker stores with one write, and a fetch returns.

All integers are big-endian. A batch (format version 2)::

    offset size  field                 who writes it
    ------ ----  --------------------  ---------------------------------------------------
     0     8     base_offset   i64     broker (stamped at append; the producer sends 0)
     8     4     batch_length  i32     producer: bytes after this field (total = 12 + batch_length)
    12     1     magic         i8      producer: format version, 2
    13    16     base_msg_id   u128    broker (stamped; id of message i = base_msg_id + offset_delta)
    29     8     append_time   i64     broker (stamped; ms since the epoch)
    37     4     crc           u32     producer: CRC32C of bytes [45, end) (the body)
    41     4     header_crc    u32     broker (stamped; the producer fills it too): CRC32C of bytes [0, 41)
                                       followed by bytes [45, 71): the whole fixed header but itself
    ------------ crc covers everything below ---------------------------------------------------
    45     2     attributes    i16     bits 0-2: compression of the records (0 none, 1 lz4, 2 zstd);
                                       bit 3: a producer block follows the header (idempotent producer)
                                       bit 7: delayed records (ATTR_DELAYED, docs/delayed.md)
    47     4     last_offset_delta i32 record_count - 1
    51     8     first_timestamp i64   ms, the smallest record timestamp
    59     8     max_timestamp i64     ms, the largest record timestamp
    67     4     record_count  i32     >= 1
    71     16    producer block        only when attribute bit 3 is set (else the records start at 71):
                   producer_id   i64   the idempotent producer's id (> 0)
                   producer_epoch i16  bumped by the producer when it restarts a partition's sequence
                   base_sequence i32   the sequence number of the first record (per producer and partition)
                   flags         i16   0 (reserved)
    71|87  ...   records                (compressed as a whole when attributes say so)

Every byte is covered by a checksum: ``crc`` covers the body [45, end) the producer wrote, and
``header_crc`` covers the rest of the fixed header -- the stamped fields, the length, the magic, ``crc``
itself, and again the counts and timestamps of [45, 71) -- so a flipped bit anywhere in a batch is found
by whoever reads it (tested position by position), and every field a reader navigates by (offsets,
length, record count, last offset delta, max timestamp) is checked by reading the 71-byte header alone,
without the body. The broker stamps base offset, id and append time and recomputes only ``header_crc``
(67 bytes): the body and its ``crc`` are stored exactly as the producer sent them. Version 1 (metaq 0.1)
had no ``header_crc``; its batches are refused with a clear error, never misread.

The records region (after byte 71; compressed as a whole when attributes say so) is COLUMNAR, so the
broker validates a batch with a few C-level array operations instead of a Python loop per message, and a
reader can hand the payload column to Arrow. For a batch of n records::

    section          type                 bytes   meaning
    offset_deltas    int32[n]  LE         4n      0, 1, ..., n-1 as produced (a server-side filter may
                                                  leave gaps: strictly increasing, <= last_offset_delta)
    timestamps       int64[n]  LE         8n      ms since the epoch (the producer's clock)
    key_lengths      int32[n]  LE         4n      -1 = no key
    value_lengths    int32[n]  LE         4n      >= 0
    attr_lengths     int16[n]  LE         2n      -1 = no attribute
    header_counts    int16[n]  LE         2n      >= 0
    keys             bytes                        the keys, concatenated in record order
    values           bytes                        the payloads, concatenated
    attributes       bytes                        the attributes (UTF-8), concatenated
    headers          bytes                        per record, header_counts[i] entries of
                                                  (u16 LE name_len, name UTF-8, i32 LE value_len, value)

The column arrays are little-endian (unlike the batch header) because they are read and written whole
with ``array`` in the machine's order, and every machine metaq targets is little-endian (a big-endian one
byte-swaps). Nothing is padded: the sections add up exactly to the region's length.

The producer block (bit 3) is never compressed and is covered by ``crc`` like the rest of the body, so
the broker reads it at a fixed place without decompressing anything. It lets the broker drop a
retried batch it already stored (docs/transactions.md, "Idempotent producer").

The payload (value) is never altered.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterable
from typing import NamedTuple

import crc32c as _crc32c

from metaq import _compiled
from metaq.errors import CorruptRecordError, InvalidArgument

MAGIC = 2
OLD_MAGICS = {1: "metaq 0.1"}
"""Earlier format versions, refused with a message naming the release that wrote them."""
HEADER_BYTES = 71
HEADER_CRC_COVERS = 41
"""``header_crc`` is the CRC32C of bytes [0, 41) (every header field before it, ``crc`` included), continued
over bytes [45, 71) (the fixed fields after it)."""
STAMPED_BYTES = 45
"""Bytes [0, 45) are what the broker writes at append: the stamped fields and the recomputed header_crc
(length, magic and crc are copied from the producer). The body [45, end) goes to disk untouched."""
LENGTH_PREFIX_BYTES = 12
"""base_offset + batch_length: enough to know where the next batch starts."""
RECORD_OVERHEAD_BYTES = 24
"""Fixed bytes per record in a batch (its six column entries), on top of key, value, attribute and headers: what
a record adds to its batch besides those, and counts against maxMessageSize with them."""

COMPRESSION_MASK = 0x7
"""Attribute bits 0-2: the compression of the records (:class:`~metaq.protocol.records.Compression`)."""
ATTR_DELAYED = 0x80
"""Attribute bit 7: every record of the batch carries a ``metaq.deliver-at`` header and the broker keeps
the batch in its delay store until each record is due (docs/delayed.md). Never set in a partition log."""
PRODUCER_STAMPED = 0x8
"""Attribute bit 3: the 16-byte producer block follows the fixed header."""
KNOWN_ATTRIBUTES = COMPRESSION_MASK | PRODUCER_STAMPED | ATTR_DELAYED
PRODUCER_BLOCK_BYTES = 16
SEQUENCE_LIMIT = 1 << 31
"""Sequence numbers run 0 .. 2**31 - 1 and then wrap to 0."""

_HEADER = struct.Struct(">qibQQqIIhiqqi")
_STAMP = struct.Struct(">qibQQq")  # bytes [0, 37): the part the broker rewrites (crc stays)
_LEN_PREFIX = struct.Struct(">qi")
_U32 = struct.Struct(">I")
CRC_REGION_HEAD = struct.Struct(">hiqqi")
"""Bytes [45, 71): attributes, last offset delta, first and max timestamp, record count."""
_PRODUCER_BLOCK = struct.Struct(">qhih")
_U64 = (1 << 64) - 1

assert _HEADER.size == HEADER_BYTES
assert _STAMP.size == 37 and _STAMP.size + 4 == HEADER_CRC_COVERS
assert STAMPED_BYTES + CRC_REGION_HEAD.size == HEADER_BYTES
assert _PRODUCER_BLOCK.size == PRODUCER_BLOCK_BYTES


# ----------------------------------------------------------------------------------------------
# The records region's columns: little-endian arrays

_LITTLE = sys.byteorder == "little"


def column(typecode: str, items: Iterable[int]) -> bytes:
    """A column of the records region (an ``array`` typecode: i, q, h), little-endian."""
    arr = array(typecode, items)
    if not _LITTLE:
        arr.byteswap()
    return arr.tobytes()


def read_column(typecode: str, data: bytes | memoryview) -> array:
    """A column of the records region read back into an ``array``."""
    arr = array(typecode)
    arr.frombytes(data)
    if not _LITTLE:
        arr.byteswap()
    return arr


HEADER_NAME = struct.Struct("<H")
"""A record header's name length, in the records region's headers section (then the name, UTF-8)."""
HEADER_VALUE = struct.Struct("<i")
"""A record header's value length (then the value)."""

_deltas = column("i", range(4096))


def deltas_column(n: int) -> bytes:
    """The offset-delta column of an n-record batch as produced: 0, 1, ..., n-1 (cut from one kept column, grown
    when a batch needs more)."""
    global _deltas
    if 4 * n > len(_deltas):
        _deltas = column("i", range(max(n, len(_deltas) // 2)))
    return _deltas[:4 * n]


# ----------------------------------------------------------------------------------------------
# The header


class BatchHeader(NamedTuple):
    base_offset: int
    batch_length: int
    magic: int
    base_message_id: int
    append_time_ms: int
    crc: int
    header_crc: int
    attributes: int
    last_offset_delta: int
    first_timestamp_ms: int
    max_timestamp_ms: int
    record_count: int

    @property
    def total_bytes(self) -> int:
        return LENGTH_PREFIX_BYTES + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def records_start(self) -> int:
        """Where the records region starts: after the header, and after the producer block when there is one."""
        return HEADER_BYTES + PRODUCER_BLOCK_BYTES if self.attributes & PRODUCER_STAMPED else HEADER_BYTES


def read_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Parse and check the fixed header at ``pos``: CorruptRecordError unless it is whole, of this format
    version, its ``header_crc`` matches and its length can hold it. The body is not looked at."""
    if len(buf) - pos < HEADER_BYTES:
        raise CorruptRecordError(f"record batch header needs {HEADER_BYTES} bytes, {len(buf) - pos} left")
    (base_offset, batch_length, magic, id_hi, id_lo, append_time, crc, header_crc, attributes, last_delta,
     first_ts, max_ts, count) = _HEADER.unpack_from(buf, pos)
    if magic != MAGIC:
        if magic in OLD_MAGICS:
            raise CorruptRecordError(
                f"record batch is in format version {magic}, written by {OLD_MAGICS[magic]}; this metaq reads "
                f"version {MAGIC} only (no migration: start from an empty data directory)")
        raise CorruptRecordError(f"record batch magic is {magic}, expected {MAGIC}")
    view = memoryview(buf)
    if _crc32c.crc32c(view[pos + STAMPED_BYTES:pos + HEADER_BYTES],
                      _crc32c.crc32c(view[pos:pos + HEADER_CRC_COVERS])) != header_crc:
        raise CorruptRecordError(f"record batch header fails its CRC32C check (base offset field says {base_offset})")
    if batch_length < HEADER_BYTES - LENGTH_PREFIX_BYTES:
        raise CorruptRecordError(f"record batch length {batch_length} is shorter than its header")
    return BatchHeader(base_offset, batch_length, magic, (id_hi << 64) | id_lo, append_time, crc, header_crc,
                       attributes, last_delta, first_ts, max_ts, count)


def check_attributes(header: BatchHeader) -> None:
    """CorruptRecordError for attribute bits this format does not have, or a producer block that cannot fit."""
    if header.compression not in (0, 1, 2) or header.attributes & ~KNOWN_ATTRIBUTES:
        raise CorruptRecordError(f"record batch attributes {header.attributes:#x} are not understood")
    if header.attributes & PRODUCER_STAMPED and header.total_bytes < HEADER_BYTES + PRODUCER_BLOCK_BYTES:
        raise CorruptRecordError("record batch says it has a producer block but is too short for one")


def peek_length(buf: bytes | bytearray | memoryview, pos: int = 0) -> tuple[int, int] | None:
    """(base_offset, total_bytes) of the batch at ``pos``, or None if fewer than 12 bytes remain.

    Unchecked (the header CRC needs the whole header): for sizing a read, never for trusting data."""
    if len(buf) - pos < LENGTH_PREFIX_BYTES:
        return None
    base_offset, batch_length = _LEN_PREFIX.unpack_from(buf, pos)
    return base_offset, LENGTH_PREFIX_BYTES + batch_length


def compute_crc(batch: bytes | bytearray | memoryview) -> int:
    """The body checksum (``crc``): CRC32C of bytes [45, end)."""
    return _crc32c.crc32c(memoryview(batch)[STAMPED_BYTES:])


def crc_ok(batch: bytes | bytearray | memoryview, header: BatchHeader) -> bool:
    return compute_crc(batch) == header.crc


# ----------------------------------------------------------------------------------------------
# Stamping: what the broker writes at append, and what an encoder writes first


def prefix(base_offset: int, batch_length: int, base_message_id: int, append_time_ms: int, crc: int,
           fixed_tail: bytes | memoryview) -> bytes:
    """Bytes [0, 45) of a batch: the given fields and the header_crc over them and ``fixed_tail`` ([45, 71))."""
    head = _STAMP.pack(base_offset, batch_length, MAGIC, (base_message_id >> 64) & _U64, base_message_id & _U64,
                       append_time_ms) + _U32.pack(crc)
    return head + _U32.pack(_crc32c.crc32c(fixed_tail, _crc32c.crc32c(head)))


def stamp_prefix_py(header: BatchHeader, base_offset: int, base_message_id: int, append_time_ms: int) -> bytes:
    """:func:`stamp_prefix` in Python: the reference of the compiled one, and what runs without it."""
    tail = CRC_REGION_HEAD.pack(header.attributes, header.last_offset_delta, header.first_timestamp_ms,
                                header.max_timestamp_ms, header.record_count)
    return prefix(base_offset, header.batch_length, base_message_id, append_time_ms, header.crc, tail)


stamp_prefix_compiled = _compiled.speedups.stamp_prefix if _compiled.speedups is not None else None
"""metaq._speedups.stamp_prefix, or None: the same 45 bytes as :func:`stamp_prefix_py` in one call, or None for a
field out of the range struct packs it into (the Python code then raises struct.error)."""


def stamp_prefix(header: BatchHeader, base_offset: int, base_message_id: int, append_time_ms: int) -> bytes:
    """The 45 bytes that replace the producer's prefix (``os.writev`` them before ``batch[45:]``): the stamped
    fields, the producer's length, magic and body crc, and the new header_crc."""
    if stamp_prefix_compiled is not None:
        stamped: bytes | None = stamp_prefix_compiled(header, base_offset, base_message_id, append_time_ms)
        if stamped is not None:
            return stamped
    return stamp_prefix_py(header, base_offset, base_message_id, append_time_ms)


def stamp(batch: bytearray | memoryview, base_offset: int, base_message_id: int, append_time_ms: int) -> None:
    """Rewrite the stamped fields of a batch in place, with its header_crc (the body crc is unaffected)."""
    _, batch_length = _LEN_PREFIX.unpack_from(batch, 0)
    (crc,) = _U32.unpack_from(batch, HEADER_CRC_COVERS - 4)
    batch[0:STAMPED_BYTES] = prefix(base_offset, batch_length, base_message_id, append_time_ms, crc,
                                    bytes(batch[STAMPED_BYTES:HEADER_BYTES]))


# ----------------------------------------------------------------------------------------------
# The producer block (attribute bit 3)


class ProducerStamp(NamedTuple):
    """What the producer block of a batch says (attribute bit 3)."""

    producer_id: int
    producer_epoch: int
    base_sequence: int

    def last_sequence(self, record_count: int) -> int:
        return (self.base_sequence + record_count - 1) % SEQUENCE_LIMIT


def producer_stamp(batch: bytes | bytearray | memoryview, header: BatchHeader, pos: int = 0) -> ProducerStamp | None:
    """The producer block of the batch at ``pos`` (whose header is ``header``), or None without one."""
    if not header.attributes & PRODUCER_STAMPED:
        return None
    producer_id, epoch, sequence, _flags = _PRODUCER_BLOCK.unpack_from(batch, pos + HEADER_BYTES)
    return ProducerStamp(producer_id, epoch, sequence)


def with_producer_stamp(batch: bytes | memoryview, stamp_: ProducerStamp) -> bytes:
    """A copy of an unstamped producer batch with a producer block (bit 3) and its CRCs recomputed.

    Called once per batch by an idempotent producer, when it first sends the batch; a retry sends the
    same bytes again, which is what lets the broker recognise it."""
    header = read_header(batch)
    if header.attributes & PRODUCER_STAMPED:
        raise InvalidArgument("the batch already has a producer block")
    if not 0 < stamp_.producer_id < (1 << 63) or not 0 <= stamp_.producer_epoch < (1 << 15) \
            or not 0 <= stamp_.base_sequence < SEQUENCE_LIMIT:
        raise InvalidArgument(f"producer stamp {stamp_} is out of range")
    view = memoryview(batch)[:header.total_bytes]
    region = b"".join((CRC_REGION_HEAD.pack(header.attributes | PRODUCER_STAMPED, header.last_offset_delta,
                                            header.first_timestamp_ms, header.max_timestamp_ms, header.record_count),
                       _PRODUCER_BLOCK.pack(stamp_.producer_id, stamp_.producer_epoch, stamp_.base_sequence, 0),
                       view[HEADER_BYTES:]))
    return prefix(header.base_offset, len(region) + STAMPED_BYTES - LENGTH_PREFIX_BYTES, header.base_message_id,
                  header.append_time_ms, _crc32c.crc32c(region), region[:HEADER_BYTES - STAMPED_BYTES]) + region
