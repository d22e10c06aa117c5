"""Record batches: the unit a producer sends, the broker stores with one write, and a fetch returns.

All integers are big-endian. A batch::

    offset size  field                 who writes it
    ------ ----  --------------------  ---------------------------------------------------
     0     8     base_offset   i64     broker (stamped at append; the producer sends 0)
     8     4     batch_length  i32     producer: bytes after this field (total = 12 + batch_length)
    12     1     magic         i8      producer: format version, 1
    13    16     base_msg_id   u128    broker (stamped; id of message i = base_msg_id + offset_delta)
    29     8     append_time   i64     broker (stamped; ms since the epoch)
    37     4     crc           u32     producer: CRC32C of bytes [41, end) -- NOT of the stamped fields
    ------------ CRC covers everything below ------------------------------------------------
    41     2     attributes    i16     bits 0-2: compression of the records (0 none, 1 lz4, 2 zstd)
    43     4     last_offset_delta i32 record_count - 1
    47     8     first_timestamp i64   ms, the smallest record timestamp
    55     8     max_timestamp i64     ms, the largest record timestamp
    63     4     record_count  i32     >= 1
    67     ...   records                (compressed as a whole when attributes say so)

A record (inside the possibly compressed region)::

     0  4  length          i32   bytes after this field
     4  4  offset_delta    i32   0, 1, 2, ... within the batch
     8  8  timestamp       i64   ms since the epoch (the producer's clock)
    16  4  key_length      i32   -1 = no key
    20  4  value_length    i32
    24  2  attribute_length i16  -1 = no attribute (UTF-8)
    26  2  header_count    i16
    28  .  key | value | attribute | headers: (u16 name_len, name UTF-8, i32 value_len, value)*

Because the CRC excludes bytes [0, 41), the broker stamps offset, id and append time without
recomputing it, and a consumer still verifies every byte the producer wrote. The payload (value) is
never altered.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple

import crc32c as _crc32c
import lz4.frame as _lz4
import zstandard as _zstd

from metaq.errors import CorruptRecordError, InvalidArgument, ProtocolError
from metaq.types import Message

MAGIC = 1
HEADER_BYTES = 67
STAMPED_BYTES = 41
"""Bytes [0, 41) hold the fields outside the CRC: base offset, length, magic, base id, append time."""
LENGTH_PREFIX_BYTES = 12
"""base_offset + batch_length: enough to know where the next batch starts."""
RECORD_PREFIX_BYTES = 28
RECORD_OVERHEAD_BYTES = RECORD_PREFIX_BYTES

_HEADER = struct.Struct(">qibQQqIhiqqi")
_STAMP = struct.Struct(">qibQQq")  # bytes [0, 37): the part the broker rewrites (crc stays)
_LEN_PREFIX = struct.Struct(">qi")
_CRC_REGION_HEAD = struct.Struct(">hiqqi")
_RECORD = struct.Struct(">iiqiihh")
_HDR_NAME = struct.Struct(">H")
_HDR_VALUE = struct.Struct(">i")
_U64 = (1 << 64) - 1

assert _HEADER.size == HEADER_BYTES
assert _STAMP.size == 37
assert _RECORD.size == RECORD_PREFIX_BYTES


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


_COMPRESSION_MASK = 0x7


class BatchHeader(NamedTuple):
    base_offset: int
    batch_length: int
    magic: int
    base_message_id: int
    append_time_ms: int
    crc: int
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
        return self.attributes & _COMPRESSION_MASK


def read_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Parse the fixed header at ``pos``; ProtocolError if it is short or not a metaq batch."""
    if len(buf) - pos < HEADER_BYTES:
        raise CorruptRecordError(f"record batch header needs {HEADER_BYTES} bytes, {len(buf) - pos} left")
    (base_offset, batch_length, magic, id_hi, id_lo, append_time, crc, attributes, last_delta,
     first_ts, max_ts, count) = _HEADER.unpack_from(buf, pos)
    if magic != MAGIC:
        raise CorruptRecordError(f"record batch magic is {magic}, expected {MAGIC}")
    if batch_length < HEADER_BYTES - LENGTH_PREFIX_BYTES:
        raise CorruptRecordError(f"record batch length {batch_length} is shorter than its header")
    return BatchHeader(base_offset, batch_length, magic, (id_hi << 64) | id_lo, append_time, crc,
                       attributes, last_delta, first_ts, max_ts, count)


def peek_length(buf: bytes | bytearray | memoryview, pos: int = 0) -> tuple[int, int] | None:
    """(base_offset, total_bytes) of the batch at ``pos``, or None if fewer than 12 bytes remain."""
    if len(buf) - pos < LENGTH_PREFIX_BYTES:
        return None
    base_offset, batch_length = _LEN_PREFIX.unpack_from(buf, pos)
    return base_offset, LENGTH_PREFIX_BYTES + batch_length


def compute_crc(batch: bytes | bytearray | memoryview) -> int:
    return _crc32c.crc32c(memoryview(batch)[STAMPED_BYTES:])


def crc_ok(batch: bytes | bytearray | memoryview, header: BatchHeader) -> bool:
    return compute_crc(batch) == header.crc


def stamp_prefix(header: BatchHeader, base_offset: int, base_message_id: int, append_time_ms: int) -> bytes:
    """The 41 stamped bytes that replace the producer's prefix (``os.writev`` it before ``batch[41:]``)."""
    return _STAMP.pack(base_offset, header.batch_length, MAGIC, (base_message_id >> 64) & _U64,
                       base_message_id & _U64, append_time_ms) + header.crc.to_bytes(4, "big")


def stamp(batch: bytearray | memoryview, base_offset: int, base_message_id: int, append_time_ms: int) -> None:
    """Rewrite the stamped fields of a batch in place (the CRC is unaffected)."""
    _, batch_length = _LEN_PREFIX.unpack_from(batch, 0)
    _STAMP.pack_into(batch, 0, base_offset, batch_length, MAGIC, (base_message_id >> 64) & _U64,
                     base_message_id & _U64, append_time_ms)


# ----------------------------------------------------------------------------------------------
# Building batches (producer side)


def _compress(codec: Compression, data: bytes) -> bytes:
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


def _decompress(codec: int, data: bytes | memoryview, max_bytes: int) -> bytes:
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


def encode_record(offset_delta: int, timestamp_ms: int, value: bytes, key: bytes | None = None,
                  attribute: str | None = None, headers: Sequence[tuple[str, bytes]] | None = None) -> bytes:
    if key is None and attribute is None and not headers:
        return _RECORD.pack(24 + len(value), offset_delta, timestamp_ms, -1, len(value), -1, 0) + value
    attr = attribute.encode() if attribute is not None else b""
    if len(attr) > 0x7FFF:
        raise InvalidArgument(f"attribute is {len(attr)} bytes encoded; at most 32767")
    parts = [b"", key or b"", value, attr]
    for name, hvalue in headers or ():
        raw = name.encode()
        parts.append(_HDR_NAME.pack(len(raw)) + raw + _HDR_VALUE.pack(len(hvalue)) + bytes(hvalue))
    body_len = 24 + sum(len(p) for p in parts)
    parts[0] = _RECORD.pack(body_len, offset_delta, timestamp_ms, -1 if key is None else len(key),
                            len(value), -1 if attribute is None else len(attr), len(headers or ()))
    return b"".join(parts)


def assemble_batch(records: bytes, record_count: int, first_ts: int, max_ts: int,
                   compression: Compression = Compression.NONE) -> bytes:
    """Wrap encoded records into a batch (base offset 0, id 0, append time -1: the broker stamps them)."""
    if record_count < 1:
        raise InvalidArgument("a record batch needs at least one record")
    codec = Compression.parse(compression)
    body = _compress(codec, records)
    region = _CRC_REGION_HEAD.pack(int(codec), record_count - 1, first_ts, max_ts, record_count) + body
    crc = _crc32c.crc32c(region)
    head = _STAMP.pack(0, len(region) + 29, MAGIC, 0, 0, -1) + crc.to_bytes(4, "big")
    return head + region


def encode_values(values: Sequence[bytes], timestamp_ms: int,
                  compression: Compression = Compression.NONE) -> bytes:
    """The fast path: a batch of plain payloads (no key, attribute or headers) sharing one timestamp."""
    pack = _RECORD.pack
    records = b"".join([pack(24 + len(v), i, timestamp_ms, -1, len(v), -1, 0) + v
                        for i, v in enumerate(values)])
    return assemble_batch(records, len(values), timestamp_ms, timestamp_ms, compression)


@dataclass
class BatchBuilder:
    """Accumulates records for one partition until it is full, then builds one batch."""

    max_bytes: int
    compression: Compression = Compression.NONE

    def __post_init__(self) -> None:
        self._parts: list[bytes] = []
        self._size = HEADER_BYTES
        self._first_ts = 0
        self._max_ts = 0

    def __len__(self) -> int:
        return len(self._parts)

    @property
    def size_bytes(self) -> int:
        return self._size

    def try_append(self, timestamp_ms: int, value: bytes, key: bytes | None = None,
                   attribute: str | None = None, headers: Sequence[tuple[str, bytes]] | None = None) -> bool:
        """Append a record if it fits (the first record always fits); False means build and start anew."""
        rec = encode_record(len(self._parts), timestamp_ms, value, key, attribute, headers)
        if self._parts and self._size + len(rec) > self.max_bytes:
            return False
        if not self._parts:
            self._first_ts = self._max_ts = timestamp_ms
        else:
            self._first_ts = min(self._first_ts, timestamp_ms)
            self._max_ts = max(self._max_ts, timestamp_ms)
        self._parts.append(rec)
        self._size += len(rec)
        return True

    def build(self) -> bytes:
        return assemble_batch(b"".join(self._parts), len(self._parts), self._first_ts, self._max_ts,
                              self.compression)


def encode_messages(messages: Iterable[Message], compression: Compression = Compression.NONE,
                    now_ms: int = 0) -> bytes:
    """One batch from Message objects (timestamps of -1 become ``now_ms``)."""
    builder = BatchBuilder(max_bytes=1 << 62, compression=compression)
    for m in messages:
        ts = m.timestamp_ms if m.timestamp_ms >= 0 else now_ms
        builder.try_append(ts, bytes(m.data), m.key, m.attribute, m.headers)
    return builder.build()


# ----------------------------------------------------------------------------------------------
# Validating (broker side) and reading (consumer side)


def validate_batch(batch: bytes | bytearray | memoryview, max_message_bytes: int,
                   max_batch_bytes: int) -> BatchHeader:
    """Check everything the broker must know before storing a batch; CorruptRecordError otherwise.

    Checks the length, magic, CRC, count and offset deltas, and walks the record lengths so that a
    stored batch is always readable. Per-record work is a few integer reads; payloads are not copied.
    Raises InvalidArgument (not a protocol error) for a batch or message over the size limits.
    """
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
    if header.compression not in (0, 1, 2) or header.attributes & ~_COMPRESSION_MASK:
        raise CorruptRecordError(f"record batch attributes {header.attributes:#x} are not understood")
    if header.compression:
        body: bytes | bytearray | memoryview = _decompress(
            header.compression, memoryview(batch)[HEADER_BYTES:], max_batch_bytes * 4)
        pos = 0
    else:
        body, pos = batch, HEADER_BYTES
    end = len(body)
    unpack = _RECORD.unpack_from
    for i in range(header.record_count):
        if end - pos < RECORD_PREFIX_BYTES:
            raise CorruptRecordError(f"record {i} is cut off")
        length, delta, _ts, klen, vlen, alen, hcount = unpack(body, pos)
        if delta != i:
            raise CorruptRecordError(f"record {i} has offset delta {delta}")
        if (length < 24 or pos + 4 + length > end or 24 + max(klen, 0) + vlen + max(alen, 0) > length
                or vlen < 0 or klen < -1 or alen < -1 or hcount < 0):
            raise CorruptRecordError(f"record {i} has inconsistent lengths")
        if length + 4 > max_message_bytes:
            raise InvalidArgument(
                f"message {i} of the batch is {length + 4} bytes; the limit is {max_message_bytes}")
        rec_end = pos + 4 + length
        tail = pos + RECORD_PREFIX_BYTES + max(klen, 0) + vlen
        if alen > 0 or hcount:
            _check_record_tail(body, tail, rec_end, alen, hcount, i)
        elif tail != rec_end:
            raise CorruptRecordError(f"record {i} has {rec_end - tail} bytes after its fields")
        pos = rec_end
    if pos != end:
        raise CorruptRecordError(f"record batch has {end - pos} bytes after its last record")
    return header


def _check_record_tail(body: bytes | bytearray | memoryview, p: int, rec_end: int, alen: int, hcount: int,
                       i: int) -> None:
    """Attribute and headers must be exactly what decode_batch will read, so a stored batch stays readable.

    Touches only the attribute and header names (short strings), never the key or payload.
    """
    try:
        if alen > 0:
            bytes(body[p:p + alen]).decode()
            p += alen
        for _ in range(hcount):
            if p + 2 > rec_end:
                break
            (nlen,) = _HDR_NAME.unpack_from(body, p)
            if p + 6 + nlen > rec_end:
                break
            bytes(body[p + 2:p + 2 + nlen]).decode()
            (hlen,) = _HDR_VALUE.unpack_from(body, p + 2 + nlen)
            if hlen < 0:
                break
            p += 6 + nlen + hlen
        else:
            if p == rec_end:
                return
    except UnicodeDecodeError:
        raise CorruptRecordError(f"record {i} has an attribute or header name that is not UTF-8") from None
    raise CorruptRecordError(f"record {i}: its attribute and headers do not add up to its length")


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


def decode_batch(batch: bytes | memoryview, topic: str = "", partition: int = -1,
                 header: BatchHeader | None = None, verify: bool = True,
                 max_uncompressed_bytes: int = 1 << 30) -> list[Message]:
    """Every message of one whole batch, with offset, id and append time filled in.

    ``verify`` checks the CRC first (consumers should; the broker already did on append).
    """
    if header is None:
        header = read_header(batch)
    view = memoryview(batch)
    if len(view) < header.total_bytes:
        raise CorruptRecordError("record batch is cut off")
    if len(view) > header.total_bytes:
        view = view[: header.total_bytes]
    if verify and header.crc != compute_crc(view):
        raise CorruptRecordError(f"record batch at offset {header.base_offset} fails its CRC32C check")
    if header.compression:
        body: bytes | memoryview = _decompress(header.compression, view[HEADER_BYTES:], max_uncompressed_bytes)
        pos = 0
    else:
        body, pos = view, HEADER_BYTES
    raw = bytes(body) if isinstance(body, memoryview) else body
    out: list[Message] = []
    append = out.append
    unpack = _RECORD.unpack_from
    base_offset = header.base_offset
    base_id = header.base_message_id
    append_time = header.append_time_ms
    end = len(raw)
    try:
        for _ in range(header.record_count):
            length, delta, ts, klen, vlen, alen, hcount = unpack(raw, pos)
            rec_end = pos + 4 + length
            if rec_end > end or length < 24:
                raise CorruptRecordError("record runs past the end of its batch")
            p = pos + RECORD_PREFIX_BYTES
            key = None
            if klen >= 0:
                key = raw[p:p + klen]
                p += klen
            value = raw[p:p + vlen]
            p += vlen
            attribute = None
            if alen >= 0:
                attribute = raw[p:p + alen].decode()
                p += alen
            headers = None
            if hcount:
                headers = []
                for _h in range(hcount):
                    (nlen,) = _HDR_NAME.unpack_from(raw, p)
                    p += 2
                    name = raw[p:p + nlen].decode()
                    p += nlen
                    (hlen,) = _HDR_VALUE.unpack_from(raw, p)
                    p += 4
                    if hlen < 0 or p + hlen > rec_end:
                        raise CorruptRecordError("record header value runs past its record")
                    headers.append((name, raw[p:p + hlen]))
                    p += hlen
            if p != rec_end or len(value) != vlen:
                raise CorruptRecordError("record fields do not add up to its length")
            append(Message(topic, value, attribute, key, headers, ts, partition, base_offset + delta,
                           base_id + delta, append_time))
            pos = rec_end
    except (struct.error, UnicodeDecodeError) as exc:
        raise CorruptRecordError(f"malformed record: {exc}") from None
    if pos != end:
        raise CorruptRecordError("record batch has bytes after its last record")
    return out


def decode_fetched(buf: bytes | memoryview, topic: str, partition: int, from_offset: int = 0,
                   verify: bool = True) -> tuple[list[Message], int]:
    """Messages at or after ``from_offset`` from a fetch body, and the offset to fetch next.

    Skips messages below ``from_offset`` (a fetch starts at the batch holding it) and drops a cut-off
    tail. Returns ``next_offset = from_offset`` if no whole batch was present.
    """
    out: list[Message] = []
    next_offset = from_offset
    view = memoryview(buf)
    for pos, header in iter_batches(view):
        if header.next_offset <= from_offset:
            continue
        messages = decode_batch(view[pos:pos + header.total_bytes], topic, partition, header, verify)
        if header.base_offset < from_offset:
            messages = [m for m in messages if m.offset >= from_offset]
        out.extend(messages)
        next_offset = header.next_offset
    return out, next_offset


def is_protocol_error(exc: BaseException) -> bool:
    return isinstance(exc, ProtocolError)
