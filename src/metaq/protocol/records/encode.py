"""Building record batches (the producer's side): records region, header and CRCs; the stamped fields left for
the broker (base offset 0, id 0, append time -1). The layout is drawn in :mod:`metaq.protocol.records.format`."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import crc32c as _crc32c

from metaq import _compiled
from metaq.errors import InvalidArgument
from metaq.protocol.records.compression import Compression, compress
from metaq.protocol.records.format import (
    CRC_REGION_HEAD,
    HEADER_BYTES,
    HEADER_NAME,
    HEADER_VALUE,
    LENGTH_PREFIX_BYTES,
    RECORD_OVERHEAD_BYTES,
    STAMPED_BYTES,
    BatchHeader,
    column,
    prefix,
    stamp,
)
from metaq.types import Message

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
        """The batch's size so far, before compression (header included)."""
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
        """The batch of the records appended (at least one), compressed as asked; the builder is unchanged."""
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
