"""Record batches: the unit a producer sends, the broker stores with one write, and a fetch returns.

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

import gc
import struct
import sys
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, fields
from enum import IntEnum
from itertools import accumulate, pairwise, repeat
from typing import Any, NamedTuple, TypeVar

import crc32c as _crc32c
import lz4.frame as _lz4
import zstandard as _zstd

from metaq import _compiled
from metaq.errors import CorruptRecordError, InvalidArgument, ProtocolError
from metaq.types import Message, PartitionId

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


# ----------------------------------------------------------------------------------------------
# Compression of the records region


class Compression(IntEnum):
    NONE = 0
    LZ4 = 1
    ZSTD = 2

    @classmethod
    def parse(cls, value: str | int | Compression | None) -> Compression:
        if value is None:
            return cls.NONE
        if isinstance(value, Compression):
            return value
        if isinstance(value, int):
            try:
                return cls(value)
            except ValueError:
                raise InvalidArgument(f"unknown compression code {value}; use 0 (none), 1 (lz4), 2 (zstd)") from None
        try:
            return cls[value.strip().upper()]
        except KeyError:
            raise InvalidArgument(f"unknown compression {value!r}; use none, lz4 or zstd") from None


def compress(codec: Compression, data: bytes) -> bytes:
    if codec == Compression.LZ4:
        return bytes(_lz4.compress(data))
    if codec == Compression.ZSTD:
        return bytes(_zstd.ZstdCompressor(level=3).compress(data))
    return data


def _lz4_decompress(data: bytes, max_bytes: int) -> bytes:
    """Inflate step by step, stopping past ``max_bytes`` (LZ4FrameDecompressor preallocates max_length)."""
    declared = _lz4.get_frame_info(data)["content_size"]  # 0 when the frame does not say
    if declared > max_bytes:
        raise CorruptRecordError(f"compressed batch declares {declared} bytes, more than {max_bytes}")
    # +1: a frame whose size is declared ends in one call; a lying size still moves in 64 KiB steps.
    step = max(declared + 1, 1 << 16)
    lz4 = _lz4.LZ4FrameDecompressor()
    parts: list[bytes] = []
    total = 0
    while True:
        piece = lz4.decompress(data, max_length=min(step, max_bytes + 1 - total))
        data = b""
        parts.append(piece)
        total += len(piece)
        if lz4.eof or total > max_bytes:
            return b"".join(parts)
        if lz4.needs_input or not piece:
            raise CorruptRecordError("lz4 frame of the record batch is cut off")


def decompress(codec: int, data: bytes | memoryview, max_bytes: int) -> bytes:
    """Inflate a batch body, never allocating much more than ``max_bytes`` (a tiny bomb must not OOM us)."""
    try:
        if codec == Compression.LZ4:
            out = _lz4_decompress(bytes(data), max_bytes)
        elif codec == Compression.ZSTD:
            # zstandard ignores max_output_size when the frame declares its size: check that first.
            declared = _zstd.frame_content_size(bytes(data))
            if declared > max_bytes:
                raise CorruptRecordError(f"compressed batch declares {declared} bytes, more than {max_bytes}")
            out = bytes(_zstd.ZstdDecompressor().decompress(bytes(data), max_output_size=max_bytes))
        else:
            raise CorruptRecordError(f"unknown compression codec {codec}")
    except CorruptRecordError:
        raise
    except Exception as exc:
        raise CorruptRecordError(f"cannot decompress record batch: {exc}") from None
    if len(out) > max_bytes:
        raise CorruptRecordError(f"decompressed batch has {len(out)} bytes, more than {max_bytes}")
    return out


# ----------------------------------------------------------------------------------------------
# Building batches (producer side)


_RECORD = struct.Struct(">iiqiihh")
"""The row form of one record (:func:`encode_record`): length, delta, timestamp, key/value/attribute lengths, header
count."""
assert _RECORD.size == RECORD_OVERHEAD_BYTES + 4


def encode_headers(headers: Sequence[tuple[str, bytes]]) -> bytes:
    """One record's headers as the headers section holds them: (name length, name, value length, value) each."""
    parts = []
    for name, hvalue in headers:
        raw = name.encode()
        if len(raw) > 0xFFFF:
            raise InvalidArgument(f"header name is {len(raw)} bytes encoded; at most 65535")
        parts.append(HEADER_NAME.pack(len(raw)) + raw + HEADER_VALUE.pack(len(hvalue)) + bytes(hvalue))
    return b"".join(parts)


def columns_region(deltas: Iterable[int], timestamps: Iterable[int], keys: Sequence[bytes | None],
                   values: Sequence[bytes], attrs: Sequence[bytes | None], header_blobs: Sequence[bytes],
                   header_counts: Iterable[int]) -> bytes:
    """The uncompressed records region from per-record fields (see the format's drawing)."""
    return b"".join((
        column("i", deltas), column("q", timestamps),
        column("i", [-1 if k is None else len(k) for k in keys]),
        column("i", map(len, values)),
        column("h", [-1 if a is None else len(a) for a in attrs]),
        column("h", header_counts),
        b"".join([k for k in keys if k]), b"".join(values), b"".join([a for a in attrs if a]),
        b"".join(header_blobs)))


def plain_region_py(values: Sequence[bytes], timestamps: Sequence[int] | int) -> tuple[bytes, int, int]:
    """The records region of a batch of plain records (no key, attribute or headers) and its smallest and largest
    timestamp; ``timestamps`` is one per value, or one int for all. The reference of the compiled
    metaq._speedups.plain_region, and what runs without it."""
    n = len(values)
    if n < 1:
        raise ValueError("a record batch needs at least one record")
    stamps = [timestamps] * n if isinstance(timestamps, int) else list(timestamps)
    if len(stamps) != n:
        raise ValueError("one timestamp per value")
    region = columns_region(range(n), stamps, [None] * n, values, [None] * n, [b""] * n, [0] * n)
    return region, min(stamps), max(stamps)


plain_region_compiled = _compiled.speedups.plain_region if _compiled.speedups is not None else None
"""metaq._speedups.plain_region, or None: :func:`plain_region_py` in one pass, or None when a value is not bytes or
bytearray (a memoryview from ``send_batch``), which the Python code then encodes."""


def plain_region(values: Sequence[bytes], timestamps: Sequence[int] | int) -> tuple[bytes, int, int]:
    """:func:`plain_region_py`, compiled when the module is there: the records region of every ``send_async`` batch
    and ``send_batch`` chunk."""
    if plain_region_compiled is not None:
        built: tuple[bytes, int, int] | None = plain_region_compiled(values, timestamps)
        if built is not None:
            return built
    return plain_region_py(values, timestamps)


def wrap(body: bytes, record_count: int, last_offset_delta: int, first_ts: int, max_ts: int,
         compression: Compression, attributes_extra: int = 0) -> bytes:
    """The whole batch around an uncompressed records region: compressed as asked, header and both CRCs."""
    codec = Compression.parse(compression)
    body = compress(codec, body) if record_count else body
    attributes = (int(codec) if record_count else 0) | attributes_extra
    head = CRC_REGION_HEAD.pack(attributes, last_offset_delta, first_ts, max_ts, record_count)  # [45, 71)
    # one copy of the body, into the batch: the body crc runs over head and body without joining them first
    return b"".join((prefix(0, len(head) + len(body) + STAMPED_BYTES - LENGTH_PREFIX_BYTES, 0, -1,
                            _crc32c.crc32c(body, _crc32c.crc32c(head)), head), head, body))


def _attribute_bytes(attribute: str | None) -> bytes | None:
    encoded = attribute.encode() if attribute is not None else None
    if encoded is not None and len(encoded) > 0x7FFF:
        raise InvalidArgument(f"attribute is {len(encoded)} bytes encoded; at most 32767")
    return encoded


def encode_record(offset_delta: int, timestamp_ms: int, value: bytes, key: bytes | None = None,
                  attribute: str | None = None, headers: Sequence[tuple[str, bytes]] | None = None) -> bytes:
    """One record in ROW form: an intermediate that :func:`assemble_batch` turns into columns.

    For callers that build records one at a time and only later know which batch they go in. Layout:
    the 28-byte big-endian prefix (length, delta, timestamp, key/value/attribute lengths, header count),
    then key, value, attribute, and the headers encoded as in the batch.
    """
    attr = _attribute_bytes(attribute) or b""
    if headers and len(headers) > 0x7FFF:
        raise InvalidArgument(f"a message has {len(headers)} headers; at most 32767")
    hblob = encode_headers(headers) if headers else b""
    body_len = RECORD_OVERHEAD_BYTES + len(key or b"") + len(value) + len(attr) + len(hblob)
    return b"".join((_RECORD.pack(body_len, offset_delta, timestamp_ms, -1 if key is None else len(key),
                                  len(value), -1 if attribute is None else len(attr), len(headers or ())),
                     key or b"", value, attr, hblob))


def record_batch_bytes(row: bytes) -> int:
    """Bytes an :func:`encode_record` row takes once inside a batch (what maxMessageSize limits)."""
    return len(row) - (_RECORD.size - RECORD_OVERHEAD_BYTES)


def assemble_batch(records: bytes, record_count: int, first_ts: int, max_ts: int,
                   compression: Compression = Compression.NONE) -> bytes:
    """A batch from ``record_count`` concatenated :func:`encode_record` rows (stamped fields left for
    the broker: base offset 0, id 0, append time -1)."""
    if record_count < 1:
        raise InvalidArgument("a record batch needs at least one record")
    deltas, tss, keys, values, attrs, hblobs, hcounts = [], [], [], [], [], [], []
    pos, view = 0, memoryview(records)
    for _ in range(record_count):
        length, delta, ts, klen, vlen, alen, hcount = _RECORD.unpack_from(records, pos)
        p = pos + _RECORD.size
        key = None
        if klen >= 0:
            key = bytes(view[p:p + klen])
            p += klen
        values.append(bytes(view[p:p + vlen]))
        p += vlen
        attr = None
        if alen >= 0:
            attr = bytes(view[p:p + alen])
            p += alen
        end = pos + 4 + length
        deltas.append(delta)
        tss.append(ts)
        keys.append(key)
        attrs.append(attr)
        hblobs.append(bytes(view[p:end]))
        hcounts.append(hcount)
        pos = end
    if pos != len(records):
        raise InvalidArgument("records do not add up to record_count rows")
    region = columns_region(deltas, tss, keys, values, attrs, hblobs, hcounts)
    return wrap(region, record_count, record_count - 1, first_ts, max_ts, Compression.parse(compression))


def encode_values(values: Sequence[bytes], timestamp_ms: int,
                  compression: Compression = Compression.NONE) -> bytes:
    """A batch of plain payloads (no key, attribute or headers) sharing one timestamp."""
    n = len(values)
    if n < 1:
        raise InvalidArgument("a record batch needs at least one record")
    region, _, _ = plain_region(values, timestamp_ms)
    return wrap(region, n, n - 1, timestamp_ms, timestamp_ms, Compression.parse(compression))


def encode_columns(values: Sequence[bytes], timestamps: Sequence[int], *,
                   keys: Sequence[bytes | None] | None = None, attributes: Sequence[str | None] | None = None,
                   headers: Sequence[Sequence[tuple[str, bytes]] | None] | None = None,
                   compression: Compression = Compression.NONE) -> bytes:
    """A batch from per-record columns; ``keys``/``attributes``/``headers`` None means none at all.

    The producer's accumulator keeps its open batches in this form, so a message costs a few list
    appends and the batch is assembled once, column by column.
    """
    n = len(values)
    if n < 1:
        raise InvalidArgument("a record batch needs at least one record")
    if keys is None and attributes is None and headers is None:
        region, lo, hi = plain_region(values, timestamps)
        return wrap(region, n, n - 1, lo, hi, Compression.parse(compression))
    attrs = [None] * n if attributes is None else [_attribute_bytes(a) for a in attributes]
    hlists = [None] * n if headers is None else headers
    region = columns_region(range(n), timestamps, [None] * n if keys is None else keys, values, attrs,
                            [encode_headers(h) if h else b"" for h in hlists], [len(h) if h else 0 for h in hlists])
    return wrap(region, n, n - 1, min(timestamps), max(timestamps), Compression.parse(compression))


@dataclass
class BatchBuilder:
    """Accumulates records for one partition until it is full, then builds one batch."""

    max_bytes: int
    compression: Compression = Compression.NONE

    def __post_init__(self) -> None:
        self._timestamps: list[int] = []
        self._keys: list[bytes | None] = []
        self._values: list[bytes] = []
        self._attrs: list[bytes | None] = []
        self._hblobs: list[bytes] = []
        self._hcounts: list[int] = []
        self._size = HEADER_BYTES

    def __len__(self) -> int:
        return len(self._values)

    @property
    def size_bytes(self) -> int:
        return self._size

    def try_append(self, timestamp_ms: int, value: bytes, key: bytes | None = None,
                   attribute: str | None = None, headers: Sequence[tuple[str, bytes]] | None = None) -> bool:
        """Append a record if it fits (the first record always fits); False means build and start anew."""
        attr = _attribute_bytes(attribute)
        if headers and len(headers) > 0x7FFF:
            raise InvalidArgument(f"a message has {len(headers)} headers; at most 32767")
        hblob = encode_headers(headers) if headers else b""
        size = RECORD_OVERHEAD_BYTES + len(value) + len(key or b"") + len(attr or b"") + len(hblob)
        if self._values and self._size + size > self.max_bytes:
            return False
        self._timestamps.append(timestamp_ms)
        self._keys.append(key)
        self._values.append(bytes(value))
        self._attrs.append(attr)
        self._hblobs.append(hblob)
        self._hcounts.append(len(headers) if headers else 0)
        self._size += size
        return True

    def build(self) -> bytes:
        n = len(self._values)
        if n < 1:
            raise InvalidArgument("a record batch needs at least one record")
        region = columns_region(range(n), self._timestamps, self._keys, self._values, self._attrs, self._hblobs,
                                self._hcounts)
        return wrap(region, n, n - 1, min(self._timestamps), max(self._timestamps), self.compression)


def encode_messages(messages: Iterable[Message], compression: Compression = Compression.NONE,
                    now_ms: int = 0) -> bytes:
    """One batch from Message objects (timestamps of -1 become ``now_ms``)."""
    builder = BatchBuilder(max_bytes=1 << 62, compression=compression)
    for m in messages:
        ts = m.timestamp_ms if m.timestamp_ms >= 0 else now_ms
        builder.try_append(ts, bytes(m.data), m.key, m.attribute, m.headers)
    return builder.build()


def rebuild_batch(batch: bytes | memoryview, header: BatchHeader, kept: Sequence[Message]) -> bytes:
    """A copy of a stored batch holding only ``kept`` (a subset of its messages, in order).

    Keeps the stamped fields, compression and last_offset_delta, so offsets and ids are unchanged and a
    reader still advances past the whole original batch (a server-side filter's use). May hold zero
    records. The CRC is recomputed over the new contents.
    """
    base = header.base_offset
    if kept:
        region = columns_region([m.offset - base for m in kept], [m.timestamp_ms for m in kept],
                                [m.key for m in kept], [bytes(m.data) for m in kept],
                                [m.attribute.encode() if m.attribute is not None else None for m in kept],
                                [encode_headers(m.headers) if m.headers else b"" for m in kept],
                                [len(m.headers) if m.headers else 0 for m in kept])
    else:
        region = b""
    out = bytearray(wrap(region, len(kept), header.last_offset_delta, header.first_timestamp_ms,
                         header.max_timestamp_ms, Compression(header.compression) if kept else Compression.NONE))
    stamp(out, header.base_offset, header.base_message_id, header.append_time_ms)
    return bytes(out)


# ----------------------------------------------------------------------------------------------
# Validating a batch's body (broker side, and every reader)


validate_plain = _compiled.speedups.validate_plain if _compiled.speedups is not None else None
"""metaq._speedups.validate_plain, or None: :func:`validate_batch` for what producers send (an uncompressed batch of
plain records) in one call, header, CRCs and columns: the same header, or None for anything else, which
validate_batch's Python code (its reference) then decides."""

plain_columns_ok_compiled = _compiled.speedups.plain_columns_ok if _compiled.speedups is not None else None
"""metaq._speedups.plain_columns_ok, or None: :func:`plain_columns_ok_py` in one pass over the columns."""


def validate_batch(batch: bytes | bytearray | memoryview, max_message_bytes: int,
                   max_batch_bytes: int) -> BatchHeader:
    """Check everything the broker must know before storing a batch; CorruptRecordError otherwise.

    Length, magic, CRC, count, offset deltas (exactly 0..n-1), and that the columns add up so that a
    stored batch always decodes. Raises InvalidArgument (not a protocol error) for a batch or message over the
    size limits. What producers send is checked in one compiled call when the module is there.
    """
    if validate_plain is not None:
        header: BatchHeader | None = validate_plain(batch, max_message_bytes, max_batch_bytes, BatchHeader)
        if header is not None:
            return header
    total = len(batch)
    if total > max_batch_bytes:
        raise InvalidArgument(f"record batch is {total} bytes; the limit is {max_batch_bytes}")
    header = read_header(batch)
    if header.total_bytes != total:
        raise CorruptRecordError(f"record batch length field says {header.total_bytes} bytes, got {total}")
    if header.crc != compute_crc(batch):
        raise CorruptRecordError("record batch CRC32C does not match its contents")
    if header.record_count < 1 or header.last_offset_delta != header.record_count - 1:
        raise CorruptRecordError(
            f"record batch count {header.record_count} and last offset delta {header.last_offset_delta} disagree")
    check_attributes(header)
    body = batch_body(batch, header, max_batch_bytes * 4)
    n = header.record_count
    # the compiled columns check of a compressed batch's inflated records (the Python check below is its reference)
    if plain_columns_ok_compiled is not None and plain_columns_ok_compiled(body, n, max_message_bytes):
        return header
    cols = Columns.parse(body, n, n - 1, producer=True)
    biggest = cols.max_record_bytes_bound()
    if biggest > max_message_bytes:
        exact = cols.record_bytes()
        worst = max(range(len(exact)), key=exact.__getitem__)
        if exact[worst] > max_message_bytes:
            raise InvalidArgument(
                f"message {worst} of the batch is {exact[worst]} bytes; the limit is {max_message_bytes}")
    return header


def plain_columns_ok_py(region: bytes | memoryview, n: int, max_message_bytes: int) -> bool:
    """Whether the records region of an n-record produced batch is one a producer writes without attributes or
    headers (keys allowed), whole, and with no record over ``max_message_bytes``: what :meth:`Columns.parse`
    accepts with no attribute and no header in it. The reference of metaq._speedups.plain_columns_ok."""
    if not isinstance(n, int) or n < 1:
        return False
    try:
        cols = Columns.parse(region, n, n - 1, producer=True)
    except CorruptRecordError:
        return False
    return cols.no_attrs and cols.no_headers and max(cols.record_bytes()) <= max_message_bytes


def batch_body(batch: bytes | bytearray | memoryview, header: BatchHeader, max_bytes: int) -> bytes | memoryview:
    """The records region of a whole batch: a view of its own bytes, or the inflated bytes (at most ``max_bytes``)."""
    view = memoryview(batch)[header.records_start:header.total_bytes]
    if header.compression and header.record_count:
        return decompress(header.compression, view, max_bytes)
    return view


def _non_negative(column: memoryview, width: int) -> bool:
    """Whether every little-endian signed integer of ``width`` bytes in ``column`` is >= 0 (sign bytes only)."""
    return column[width - 1::width].tobytes().isascii()


class Columns:
    """The parsed, checked columns of one batch body (see the format's drawing for the layout)."""

    __slots__ = ("alens", "attrs_at", "body", "deltas", "dense", "hcounts", "headers_at", "keys_at", "klens", "n",
                 "no_attrs", "no_headers", "no_keys", "timestamps", "values_at", "vlens")
    body: bytes | memoryview
    n: int
    dense: bool
    """The offset deltas are 0, 1, ..., n-1 (every batch a producer wrote; not one a server-side filter thinned)."""
    deltas: array
    timestamps: array
    klens: array
    vlens: array
    alens: array
    hcounts: array
    keys_at: int
    values_at: int
    attrs_at: int
    headers_at: int
    no_keys: bool
    no_attrs: bool
    no_headers: bool

    def _read(self, body: bytes | memoryview, n: int) -> memoryview:
        view = memoryview(body)
        self.body = body
        self.n = n
        self.deltas = read_column("i", view[0:4 * n])
        self.timestamps = read_column("q", view[4 * n:12 * n])
        self.klens = read_column("i", view[12 * n:16 * n])
        self.vlens = read_column("i", view[16 * n:20 * n])
        self.alens = read_column("h", view[20 * n:22 * n])
        self.hcounts = read_column("h", view[22 * n:24 * n])
        return view

    @classmethod
    def plain(cls, body: memoryview, n: int) -> Columns:
        """The columns of a batch body the compiled check (``validate_plain``) accepted: n >= 1 records, offset
        deltas 0..n-1, no attributes or headers, keys and values filling the region: what :meth:`parse` finds
        there, without checking it again."""
        self = cls()
        self._read(body, n)
        self.dense = self.no_attrs = self.no_headers = True
        n_no_key = self.klens.count(-1)
        self.no_keys = n_no_key == n
        self.keys_at = fixed = RECORD_OVERHEAD_BYTES * n
        self.values_at = fixed if self.no_keys else fixed + sum(self.klens) + n_no_key
        self.attrs_at = self.headers_at = len(body)
        return self

    @classmethod
    def parse(cls, body: bytes | memoryview, n: int, last_offset_delta: int, *, producer: bool) -> Columns:
        """The columns of an n-record body, checked: CorruptRecordError unless they add up and every record is
        whole. ``producer``: offset deltas must be exactly 0..n-1 (a produced batch; a stored one may have been
        thinned by a server-side filter and needs only increasing deltas within ``last_offset_delta``)."""
        if n < 0:
            raise CorruptRecordError(f"record count {n} is negative")
        fixed = RECORD_OVERHEAD_BYTES * n
        size = len(body)
        if size < fixed:
            raise CorruptRecordError(f"records region has {size} bytes; {n} records need at least {fixed}")
        self = cls()
        view = self._read(body, n)
        if n == 0:
            if size:
                raise CorruptRecordError("an empty record batch has a non-empty records region")
            self.no_keys = self.no_attrs = self.no_headers = self.dense = True
            self.keys_at = self.values_at = self.attrs_at = self.headers_at = 0
            return self
        dense = self.dense = view[0:4 * n] == deltas_column(n)  # 0..n-1: every produced (unfiltered) batch
        if producer:
            if not dense:
                raise CorruptRecordError("offset deltas of a produced batch must be 0, 1, ..., n-1")
        elif not dense and (self.deltas[0] < 0 or self.deltas[-1] > last_offset_delta or (
                n > 1 and not all(map(int.__lt__, self.deltas, self.deltas[1:])))):
            raise CorruptRecordError("offset deltas must increase and stay within the batch")
        # sign bytes first (C speed): only a column holding a negative value needs an element-wise look
        if not _non_negative(view[16 * n:20 * n], 4) or not _non_negative(view[22 * n:24 * n], 2):
            raise CorruptRecordError("a record has a negative value length or header count")
        if (not _non_negative(view[12 * n:16 * n], 4) and min(self.klens) < -1) or (
                not _non_negative(view[20 * n:22 * n], 2) and min(self.alens) < -1):
            raise CorruptRecordError("a record has a key or attribute length below -1")
        n_no_key = self.klens.count(-1)
        n_no_attr = self.alens.count(-1)
        self.no_keys = n_no_key == n
        self.no_attrs = n_no_attr == n
        keys_len = 0 if self.no_keys else sum(self.klens) + n_no_key  # (no sum over a column of -1s)
        values_len = sum(self.vlens)
        attrs_len = 0 if self.no_attrs else sum(self.alens) + n_no_attr
        self.keys_at = fixed
        self.values_at = fixed + keys_len
        self.attrs_at = self.values_at + values_len
        self.headers_at = self.attrs_at + attrs_len
        if self.headers_at > size:
            raise CorruptRecordError("record columns claim more bytes than the records region holds")
        # all-zero header counts: one C-level byte count instead of a sum over the column
        n_headers = 0 if view[22 * n:24 * n].tobytes().count(0) == 2 * n else sum(self.hcounts)
        self.no_headers = n_headers == 0
        if self.no_headers:
            if self.headers_at != size:
                raise CorruptRecordError(f"records region has {size - self.headers_at} bytes after its columns")
        else:
            self._check_headers(view, n_headers)
        if attrs_len and not bytes(view[self.attrs_at:self.headers_at]).isascii():
            self._check_attrs(view)
        return self

    def _check_headers(self, view: memoryview, n_headers: int) -> None:
        p, end = self.headers_at, len(view)
        for _ in range(n_headers):
            if p + 2 > end:
                raise CorruptRecordError("record headers are cut off")
            (nlen,) = HEADER_NAME.unpack_from(view, p)
            if p + 6 + nlen > end:
                raise CorruptRecordError("record header is cut off")
            try:
                bytes(view[p + 2:p + 2 + nlen]).decode()
            except UnicodeDecodeError:
                raise CorruptRecordError("a record header name is not UTF-8") from None
            (hlen,) = HEADER_VALUE.unpack_from(view, p + 2 + nlen)
            if hlen < 0 or p + 6 + nlen + hlen > end:
                raise CorruptRecordError("a record header value runs past the batch")
            p += 6 + nlen + hlen
        if p != end:
            raise CorruptRecordError(f"records region has {end - p} bytes after its headers")

    def _check_attrs(self, view: memoryview) -> None:
        p = self.attrs_at
        for alen in self.alens:
            if alen > 0:
                try:
                    bytes(view[p:p + alen]).decode()
                except UnicodeDecodeError:
                    raise CorruptRecordError("a record attribute is not UTF-8") from None
                p += alen

    def max_record_bytes_bound(self) -> int:
        """An upper bound of the largest record's encoded size (exact when one record dominates)."""
        if not self.n:
            return 0
        return (RECORD_OVERHEAD_BYTES + max(max(self.klens), 0) + max(self.vlens) + max(max(self.alens), 0)
                + (len(self.body) - self.headers_at))

    def record_bytes(self) -> list[int]:
        """Each record's encoded size (column entries + key + value + attribute + its headers)."""
        sizes = [RECORD_OVERHEAD_BYTES + max(k, 0) + v + max(a, 0)
                 for k, v, a in zip(self.klens, self.vlens, self.alens, strict=True)]
        if not self.no_headers:
            for i, hblob in enumerate(self.header_blobs()):
                sizes[i] += len(hblob)
        return sizes

    def header_blobs(self) -> list[bytes]:
        view = memoryview(self.body)
        out, p = [], self.headers_at
        for count in self.hcounts:
            start = p
            for _ in range(count):
                (nlen,) = HEADER_NAME.unpack_from(view, p)
                (hlen,) = HEADER_VALUE.unpack_from(view, p + 2 + nlen)
                p += 6 + nlen + hlen
            out.append(bytes(view[start:p]))
        return out


# ----------------------------------------------------------------------------------------------
# Reading (consumer side)


def _split(raw: bytes, start: int, lengths: array) -> list[bytes | None]:
    out: list[bytes | None] = []
    p = start
    for n in lengths:
        if n < 0:
            out.append(None)
        else:
            out.append(raw[p:p + n])
            p += n
    return out


def _decode_headers(raw: bytes, start: int, counts: array) -> list[list[tuple[str, bytes]] | None]:
    out: list[list[tuple[str, bytes]] | None] = []
    p = start
    for count in counts:
        if not count:
            out.append(None)
            continue
        items = []
        for _ in range(count):
            (nlen,) = HEADER_NAME.unpack_from(raw, p)
            name = raw[p + 2:p + 2 + nlen].decode()
            (hlen,) = HEADER_VALUE.unpack_from(raw, p + 2 + nlen)
            p += 6 + nlen
            items.append((name, raw[p:p + hlen]))
            p += hlen
        out.append(items)
    return out


def iter_batches(buf: bytes | bytearray | memoryview, pos: int = 0) -> Iterator[tuple[int, BatchHeader]]:
    """(position, header) of each whole batch in ``buf``; stops silently at a cut-off tail.

    A fetch reply may end in the middle of a batch (max_bytes); that tail is not an error.
    A damaged header (bad magic, impossible length) raises CorruptRecordError.
    """
    size = len(buf)
    while size - pos >= HEADER_BYTES:
        header = read_header(buf, pos)
        if pos + header.total_bytes > size:
            return
        yield pos, header
        pos += header.total_bytes


def _plain_batch(batch: bytes | memoryview) -> tuple[BatchHeader, Columns] | None:
    """The header and columns of a whole, intact batch of plain records (uncompressed, no attributes or headers),
    checked in one compiled call (``validate_plain``: header, CRCs, columns), or None for anything else (and
    without the compiled module): the general check then decides."""
    if validate_plain is None:
        return None
    header: BatchHeader | None = validate_plain(batch, _NO_LIMIT, _NO_LIMIT, BatchHeader)
    if header is None:
        return None
    return header, Columns.plain(memoryview(batch)[header.records_start:], header.record_count)


def _checked_columns(batch: bytes | memoryview, header: BatchHeader | None, verify: bool,
                     max_uncompressed_bytes: int) -> tuple[BatchHeader, Columns]:
    """The header and checked columns of one whole batch (CRC first when ``verify``); the body is the
    batch's own memory when it is not compressed (no copy), else the inflated bytes."""
    plain = _plain_batch(batch)
    if plain is not None:
        return plain
    if header is None:
        header = read_header(batch)
    view = memoryview(batch)
    if len(view) < header.total_bytes:
        raise CorruptRecordError("record batch is cut off")
    if len(view) > header.total_bytes:
        view = view[: header.total_bytes]
    if verify and header.crc != compute_crc(view):
        raise CorruptRecordError(f"record batch at offset {header.base_offset} fails its CRC32C check")
    check_attributes(header)
    return header, Columns.parse(batch_body(view, header, max_uncompressed_bytes), header.record_count,
                                 header.last_offset_delta, producer=False)


_NO_LIMIT = 1 << 62
"""The size limits a reader's check of a stored batch passes to the compiled one (the broker's limits were checked
when it was stored)."""

_Column = TypeVar("_Column", list[Any], array)
"""A column of a batch's records: decoded values (a list) or a fixed-width field (an array)."""


class MessageBatch:
    """The records of one stored batch, checked, as columns: what a bulk reader takes without a
    :class:`~metaq.types.Message` per record, and what the per-message paths build Messages from.

    Built by :func:`message_batch` and :func:`decode_fetched_batches` (and so by the consumer's
    ``iterate_columns``): the CRC and every column have been checked, exactly as for decoded Messages.
    It holds the records at or after the offset the reader asked for (a fetch starts at the batch
    holding it), at most ``max_messages`` of them when the reader gave a limit.

    Columns (one entry per record, in offset order): :attr:`offsets`, :attr:`ids`, :attr:`timestamps`,
    :attr:`payloads` (``memoryview`` slices of the fetched bytes: no copy; they keep the fetch reply
    alive), :attr:`keys`, :attr:`attributes`, :attr:`headers`. Iterating yields Messages one at a time,
    built when asked for: a message the caller drops is freed at once, and the cyclic GC never has
    thousands of fresh objects to scan. :meth:`messages` builds them all.
    """

    __slots__ = ("_cols", "_hi", "_lo", "_raw", "broker_id", "header", "partition", "topic")

    topic: str
    partition: int
    broker_id: int
    """The partition it was read from (``partition_id``: ``brokerId-partition``)."""
    header: BatchHeader
    """The stored batch's header: ``base_offset``, ``next_offset``, ``append_time_ms``, ``compression``..."""

    def __init__(self, header: BatchHeader, columns: Columns, topic: str = "", partition: int = -1,
                 broker_id: int = -1, lo: int = 0, hi: int | None = None) -> None:
        self.header = header
        self.topic = topic
        self.partition = partition
        self.broker_id = broker_id
        self._cols = columns
        self._lo = lo
        self._hi = columns.n if hi is None else hi
        self._raw: bytes | None = None

    def __len__(self) -> int:
        return self._hi - self._lo

    def __bool__(self) -> bool:
        return self._hi > self._lo

    def __repr__(self) -> str:
        return (f"MessageBatch({self.topic}:{self.broker_id}-{self.partition}, {len(self)} messages, "
                f"offsets {self.first_offset}..{self.next_offset - 1})")

    @property
    def partition_id(self) -> PartitionId:
        return PartitionId(self.broker_id, self.partition)

    @property
    def first_offset(self) -> int:
        """The offset of the first record here (``next_offset`` when there is none)."""
        if self._hi <= self._lo:
            return self.next_offset
        return self.header.base_offset + self._cols.deltas[self._lo]

    @property
    def next_offset(self) -> int:
        """The offset to read after these records: past the whole stored batch, or, when a limit cut it
        short, the offset of the first record left out."""
        if self._hi >= self._cols.n:
            return self.header.next_offset
        return self.header.base_offset + self._cols.deltas[self._hi]

    @property
    def append_time_ms(self) -> int:
        """When the broker appended the batch (ms since the epoch): the same for every record of it."""
        return self.header.append_time_ms

    def _span(self, base: int) -> Sequence[int]:
        lo, hi = self._lo, self._hi
        if self._cols.dense:
            return range(base + lo, base + hi)
        return [base + d for d in self._cols.deltas[lo:hi]]

    @property
    def offsets(self) -> Sequence[int]:
        """Each record's offset (a ``range`` when they are consecutive, as produced)."""
        return self._span(self.header.base_offset)

    @property
    def ids(self) -> Sequence[int]:
        """Each record's message id (``base_message_id`` + its offset delta)."""
        return self._span(self.header.base_message_id)

    @property
    def timestamps(self) -> array:
        """Each record's timestamp (ms since the epoch, the producer's clock), an ``array('q')``."""
        ts = self._cols.timestamps
        return ts if self._lo == 0 and self._hi == len(ts) else ts[self._lo:self._hi]

    @property
    def payloads(self) -> list[memoryview]:
        """Each record's payload: a read-only ``memoryview`` slice of the fetched bytes (inflated bytes for
        a compressed batch). ``bytes(p)`` copies one out."""
        cols = self._cols
        body = memoryview(cols.body).toreadonly()
        ends = list(accumulate(cols.vlens[:self._hi], initial=cols.values_at))
        with _gc_paused():  # memoryviews are tracked by the cyclic GC: not a scan per 700 of them
            return [body[a:b] for a, b in pairwise(ends[self._lo:])]

    @property
    def keys(self) -> list[bytes | None]:
        """Each record's key (None: no key)."""
        cols = self._cols
        if cols.no_keys:
            return [None] * len(self)
        return self._window(_split(self._bytes(), cols.keys_at, cols.klens))

    @property
    def attributes(self) -> list[str | None]:
        """Each record's attribute (None: no attribute)."""
        cols = self._cols
        if cols.no_attrs:
            return [None] * len(self)
        return self._window([a.decode() if a is not None else None
                             for a in _split(self._bytes(), cols.attrs_at, cols.alens)])

    @property
    def headers(self) -> list[list[tuple[str, bytes]] | None]:
        """Each record's headers, ``(name, value)`` pairs in order (None: no headers)."""
        cols = self._cols
        if cols.no_headers:
            return [None] * len(self)
        return self._window(_decode_headers(self._bytes(), cols.headers_at, cols.hcounts))

    def _window(self, column: _Column) -> _Column:
        return column if self._lo == 0 and self._hi == len(column) else column[self._lo:self._hi]

    def _bytes(self) -> bytes:
        raw = self._raw
        if raw is None:
            body = self._cols.body
            raw = self._raw = body if isinstance(body, bytes) else bytes(body)  # one copy; fields slice it
        return raw

    def __iter__(self) -> Iterator[Message]:
        """Messages one at a time, each built when the iteration reaches it (:func:`build_messages`, compiled when
        the module is there)."""
        if self._hi <= self._lo:
            return iter(())
        cols, header = self._cols, self.header
        vlens = cols.vlens
        start = cols.values_at + (sum(vlens[:self._lo]) if self._lo else 0)
        return _build(self.topic, self._bytes(), start, self._window(vlens), self._window(cols.deltas),
                      self._window(cols.timestamps), None if cols.no_attrs else self.attributes,
                      None if cols.no_keys else self.keys, None if cols.no_headers else self.headers,
                      header.base_offset, header.base_message_id, self.partition, header.append_time_ms,
                      self.broker_id)

    def messages(self) -> list[Message]:
        """Every record as a Message (the cyclic GC paused meanwhile: Messages cannot form cycles)."""
        with _gc_paused():
            return list(self)

    def head(self, count: int) -> MessageBatch:
        """The first ``count`` records (all of them if there are fewer)."""
        if count >= len(self):
            return self
        return MessageBatch(self.header, self._cols, self.topic, self.partition, self.broker_id, self._lo,
                            self._lo + max(count, 0))


def build_messages(topic: str, raw: bytes, start: int, lengths: Sequence[int], deltas: Sequence[int],
                   timestamps: Sequence[int], attributes: Iterable[str | None] | None,
                   keys: Iterable[bytes | None] | None, headers: Iterable[list[tuple[str, bytes]] | None] | None,
                   base_offset: int, base_message_id: int, partition: int, append_time_ms: int,
                   broker_id: int) -> Iterator[Message]:
    """The Messages of a batch's records, from its columns. Record ``i``: payload the next ``lengths[i]`` bytes of
    ``raw`` (the first from ``start`` on), copied into bytes of its own; offset ``base_offset + deltas[i]``, id
    ``base_message_id + deltas[i]``, ``timestamps[i]``; ``attributes``, ``keys`` and ``headers`` None when the whole
    column is. As ``zip``, the first column to run out ends the batch.

    Each Message is ``Message.__new__(Message)`` with every field set, without ``__init__``. The reference of the
    compiled metaq._speedups.MessageBuilder, which builds them the same way, and what runs without it."""
    position = start
    for length, delta, timestamp_ms, attribute, key, hdrs in zip(
            lengths, deltas, timestamps, repeat(None) if attributes is None else attributes,
            repeat(None) if keys is None else keys, repeat(None) if headers is None else headers, strict=False):
        m = Message.__new__(Message)
        m.topic = topic
        m.data = raw[position:position + length]
        m.attribute = attribute
        m.key = key
        m.headers = hdrs
        m.timestamp_ms = timestamp_ms
        m.partition = partition
        m.offset = base_offset + delta
        m.id = base_message_id + delta
        m.append_time_ms = append_time_ms
        m.broker_id = broker_id
        m.deliver_at = None
        m.delay_ms = None
        position += length
        yield m


_build: Any = build_messages
"""What :meth:`MessageBatch.__iter__` builds Messages with: :func:`build_messages`, or the compiled builder's
``messages`` (bound to :class:`~metaq.types.Message`: a field added to Message without it stops the import)."""
if _compiled.speedups is not None:
    _build = _compiled.speedups.MessageBuilder(Message, [f.name for f in fields(Message)]).messages


class _gc_paused:
    """Pause the cyclic GC for a block and restore whatever state it was in.

    Decoded Messages hold bytes, str, ints and tuples only: building them cannot create reference
    cycles, yet every 700 allocations the collector would scan them all (about a third of decoding
    time when thousands are built at once)."""

    __slots__ = ("_was",)

    def __enter__(self) -> None:
        self._was = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self._was:
            gc.enable()


def message_batch(batch: bytes | memoryview, topic: str = "", partition: int = -1,
                  header: BatchHeader | None = None, verify: bool = True,
                  max_uncompressed_bytes: int = 1 << 30, broker_id: int = -1) -> MessageBatch:
    """One whole batch as a :class:`MessageBatch`, with the same checks (and errors) as :func:`decode_batch`."""
    header, cols = _checked_columns(batch, header, verify, max_uncompressed_bytes)
    return MessageBatch(header, cols, topic, partition, broker_id)


def decode_batch(batch: bytes | memoryview, topic: str = "", partition: int = -1,
                 header: BatchHeader | None = None, verify: bool = True,
                 max_uncompressed_bytes: int = 1 << 30, broker_id: int = -1) -> list[Message]:
    """Every message of one whole batch, with offset, id and append time filled in (and ``topic``,
    ``partition`` and ``broker_id``: the partition the caller read it from).

    ``verify`` checks the CRC first (consumers should; the broker already did on append). The columns
    are always checked, so a damaged batch raises CorruptRecordError rather than yielding garbage.
    """
    return message_batch(batch, topic, partition, header, verify, max_uncompressed_bytes, broker_id).messages()


def batch_columns(batch: bytes | memoryview, header: BatchHeader | None = None, *, verify: bool = True,
                  max_uncompressed_bytes: int = 1 << 30) -> tuple[BatchHeader, Any]:
    """(header, columns) of one whole batch without building Message objects (for Arrow readers).

    The columns object has ``n``, ``deltas``, ``timestamps``, ``klens``, ``vlens``, ``alens``, ``hcounts``
    (arrays), ``body`` and the section starts ``keys_at``, ``values_at``, ``attrs_at``, ``headers_at``.
    :class:`MessageBatch` is the public view over the same columns.
    """
    return _checked_columns(batch, header, verify, max_uncompressed_bytes)


def fetched_batches(buf: bytes | memoryview, from_offset: int = 0) -> Iterator[tuple[int, BatchHeader]]:
    """(position, header) of the whole batches of a fetch reply that reach past ``from_offset``.

    Headers are checked (header CRC) and so is offset continuity from one batch to the next, so no
    offset is taken from damaged bytes. At the first damaged header it raises CorruptRecordError with
    ``offset`` set to where the damage starts (the batches before it have been yielded). A cut-off tail
    ends the walk silently. Bodies are the caller's to check (decode_batch / batch_columns).
    """
    view = memoryview(buf)
    expected = -1
    try:
        for pos, header in iter_batches(view):
            if expected >= 0 and header.base_offset != expected:
                raise CorruptRecordError(f"batch with base offset {header.base_offset} follows one that ends before "
                                         f"{expected}: offsets are not contiguous")
            expected = header.next_offset
            if header.next_offset <= from_offset:
                continue
            yield pos, header
    except CorruptRecordError as exc:
        at = max(expected, from_offset)
        raise CorruptRecordError(f"damaged record batch at offset {at}: {exc}", offset=at) from None


def damaged_batch_error(exc: CorruptRecordError, header: BatchHeader, from_offset: int,
                        where: str = "") -> CorruptRecordError:
    """The error for a batch whose header is intact but whose body is not: its offsets are known."""
    at = max(header.base_offset, from_offset)
    prefix = f"{where}: " if where else ""
    return CorruptRecordError(f"{prefix}record batch at offset {header.base_offset} is damaged: {exc}",
                              offset=at, resume_offset=header.next_offset)


def decode_fetched_batches(buf: bytes | memoryview, topic: str, partition: int, from_offset: int = 0,
                           verify: bool = True, broker_id: int = -1) -> tuple[list[MessageBatch], int]:
    """The checked batches of a fetch body as :class:`MessageBatch` views of the records at or after
    ``from_offset``, and the offset to fetch next; the same rules and errors as :func:`decode_fetched`.

    Batches with no record left (all below ``from_offset``, or a server-side filter emptied them) are
    not returned, but ``next_offset`` moves past them.
    """
    view = memoryview(buf)
    if len(view) >= HEADER_BYTES:
        one = _one_fetched_batch(view, topic, partition, from_offset, verify, broker_id)
        if one is not None:
            return one
    out: list[MessageBatch] = []
    next_offset = from_offset
    try:
        for pos, header in fetched_batches(view, from_offset):
            try:
                hdr, cols = _checked_columns(view[pos:pos + header.total_bytes], header, verify, 1 << 30)
            except CorruptRecordError as exc:
                where = f"{topic}:{broker_id}-{partition}" if broker_id >= 0 else f"{topic}-{partition}"
                raise damaged_batch_error(exc, header, from_offset, where) from None
            lo = 0
            if header.base_offset < from_offset:
                lo = bisect_left(cols.deltas, from_offset - header.base_offset)
            if lo < cols.n:
                out.append(MessageBatch(hdr, cols, topic, partition, broker_id, lo))
            next_offset = header.next_offset
    except CorruptRecordError:
        if next_offset > from_offset:
            return out, next_offset  # deliver what is intact; the next fetch starts at the damage
        raise
    return out, next_offset


def _one_fetched_batch(view: memoryview, topic: str, partition: int, from_offset: int, verify: bool,
                       broker_id: int) -> tuple[list[MessageBatch], int] | None:
    """:func:`decode_fetched_batches` of a reply that is exactly one whole, intact batch reaching past
    ``from_offset`` (what a caught-up consumer's long poll gets, a MultiFetch reply once per partition),
    without the general walk's two generators. None for anything else, damage included: the general
    walk then answers it, errors and all (this path has no effect of its own to undo)."""
    checked = _plain_batch(view)  # what a caught-up reader gets: one compiled check
    if checked is None:
        try:
            header = read_header(view)
            if header.total_bytes != len(view) or header.next_offset <= from_offset:
                return None
            checked = _checked_columns(view, header, verify, 1 << 30)
        except CorruptRecordError:
            return None
    header, cols = checked
    if header.next_offset <= from_offset:
        return None
    lo = 0
    if header.base_offset < from_offset:
        lo = bisect_left(cols.deltas, from_offset - header.base_offset)
    return ([MessageBatch(header, cols, topic, partition, broker_id, lo)] if lo < cols.n else []), header.next_offset


def decode_fetched(buf: bytes | memoryview, topic: str, partition: int, from_offset: int = 0,
                   verify: bool = True, broker_id: int = -1) -> tuple[list[Message], int]:
    """Messages at or after ``from_offset`` from a fetch body, and the offset to fetch next.

    Skips messages below ``from_offset`` (a fetch starts at the batch holding it) and drops a cut-off
    tail. Returns ``next_offset = from_offset`` if no whole batch was present. A damaged batch ends the
    reply: the messages of the intact batches before it are returned, and only when there are none
    does it raise CorruptRecordError, whose ``offset`` (and, when known, ``resume_offset``) say where.
    """
    batches, next_offset = decode_fetched_batches(buf, topic, partition, from_offset, verify, broker_id)
    if len(batches) == 1:
        return batches[0].messages(), next_offset
    out: list[Message] = []
    with _gc_paused():  # once for the whole reply, not per batch (see _gc_paused)
        for batch in batches:
            out.extend(batch)
    return out, next_offset


def is_protocol_error(exc: BaseException) -> bool:
    return isinstance(exc, ProtocolError)
