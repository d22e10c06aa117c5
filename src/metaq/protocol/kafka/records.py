"""Kafka record batches (magic 2) to metaq record batches and back: what the Kafka listener stores and serves.

A Kafka batch (all integers big-endian; Kafka's "Record Batch" documentation)::

    offset size  field
     0     8     baseOffset            the broker stamps it; a producer sends 0
     8     4     batchLength           bytes after this field
    12     4     partitionLeaderEpoch
    16     1     magic                 2
    17     4     crc                   CRC32C of bytes [21, end)
    21     2     attributes            bits 0-2 compression (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd);
                                       bit 3 timestamp type (1: log append time); bit 4 transactional;
                                       bit 5 control batch
    23     4     lastOffsetDelta
    27     8     baseTimestamp
    35     8     maxTimestamp
    43     8     producerId            -1: not idempotent
    51     2     producerEpoch
    53     4     baseSequence
    57     4     recordsCount
    61     ...   records (compressed as a whole when the attributes say so)

and each record, every integer a zigzag varint::

    length, attributes (one byte), timestampDelta, offsetDelta, keyLength (-1: null), key,
    valueLength (-1: null), value, headerCount, then per header: keyLength, key (UTF-8), valueLength, value

metaq stores its own columnar batches (:mod:`metaq.protocol.records`), so a Kafka producer's batch is
converted once on produce (:func:`to_metaq`) and a stored batch once per fetch (:func:`to_kafka`):
keys, values, headers and timestamps carry over unchanged; a metaq message's ``attribute`` travels as
the header :data:`ATTRIBUTE_HEADER` (a Kafka producer sets a metaq attribute the same way); the
producer id, epoch and base sequence of an idempotent Kafka producer become the metaq batch's producer
block, so the broker's own duplicate check applies. docs/kafka.md says why this converts rather than
storing Kafka's bytes, with the figures.

Pure functions over bytes: no sockets, no files.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import crc32c as _crc32c
import lz4.frame as _lz4
import zstandard as _zstd

from metaq import _compiled
from metaq.errors import CorruptRecordError, InvalidArgument
from metaq.protocol import records as mrec

_records_to_region = _compiled.kafka_speedups.records_to_region if _compiled.kafka_speedups else None
_region_to_records = _compiled.kafka_speedups.region_to_records if _compiled.kafka_speedups else None
COMPILED = _records_to_region is not None
"""Whether the conversions run compiled (metaq._kafka_speedups); the Python code is the reference."""

KAFKA_MAGIC = 2
HEADER_BYTES = 61
_HEAD = struct.Struct(">qiibIhiqqqhii")
assert _HEAD.size == HEADER_BYTES
_CRC_FROM = 21
_LEN_PREFIX = struct.Struct(">qi")

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
CODECS = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
_TRANSACTIONAL = 0x10
_CONTROL = 0x20
ATTRIBUTE_HEADER = "metaq.attribute"
"""The Kafka record header that carries a metaq message's attribute (the string consumers filter on)."""
_XERIAL_MAGIC = b"\x82SNAPPY\x00"


class KafkaBatch(NamedTuple):
    """One Kafka batch's header fields and its (decompressed) records region."""

    base_offset: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    records: bytes | memoryview
    """The records region: a view into the request when the batch is not compressed."""

    @property
    def compression(self) -> int:
        return self.attributes & 0x7


# -- varints ------------------------------------------------------------------------------------------

def _zigzag(value: int) -> bytes:
    v = (value << 1) ^ (value >> 63)
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


_SMALL = [_zigzag(i) for i in range(1 << 14)]
"""Zigzag varints of 0..16383 (1 or 2 bytes): lengths, deltas and counts of ordinary records."""
_MINUS_ONE = _zigzag(-1)


def varint(value: int) -> bytes:
    """A zigzag varint (Kafka's signed varint/varlong)."""
    return _SMALL[value] if 0 <= value < 16384 else _zigzag(value)


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    b = buf[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    result, shift = b & 0x7F, 7
    while True:
        pos += 1
        b = buf[pos]
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return (result >> 1) ^ -(result & 1), pos + 1
        shift += 7
        if shift > 63:
            raise CorruptRecordError("a varint of a Kafka record is longer than 10 bytes")


# -- compression --------------------------------------------------------------------------------------

def _snappy_decompress(data: bytes, max_bytes: int) -> bytes:
    import cramjam  # only Kafka's snappy needs it

    if data.startswith(_XERIAL_MAGIC):  # the Java client's framing: 16-byte header, then (length, block)*
        out, pos = [], 16
        total = 0
        while pos < len(data):
            (size,) = struct.unpack_from(">i", data, pos)
            block = bytes(cramjam.snappy.decompress_raw(data[pos + 4:pos + 4 + size]))
            total += len(block)
            if total > max_bytes:
                raise CorruptRecordError(f"snappy records decompress to more than {max_bytes} bytes")
            out.append(block)
            pos += 4 + size
        return b"".join(out)
    return bytes(cramjam.snappy.decompress_raw(data))


def decompress(codec: int, data: bytes, max_bytes: int) -> bytes:
    """The records region of a compressed Kafka batch; CorruptRecordError when it cannot be read or would
    be larger than ``max_bytes``."""
    try:
        if codec == GZIP:
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            out = d.decompress(data, max_bytes + 1)
        elif codec == SNAPPY:
            out = _snappy_decompress(data, max_bytes)
        elif codec == LZ4:
            out = _lz4.decompress(data)
        elif codec == ZSTD:
            declared = _zstd.frame_content_size(data)
            if declared > max_bytes:
                raise CorruptRecordError(f"zstd records declare {declared} bytes, more than {max_bytes}")
            out = _zstd.ZstdDecompressor().decompress(data, max_output_size=max_bytes)
        else:
            raise CorruptRecordError(f"unknown compression codec {codec} in a Kafka record batch")
    except CorruptRecordError:
        raise
    except Exception as exc:
        raise CorruptRecordError(f"cannot decompress a Kafka record batch ({CODECS.get(codec, codec)}): "
                                 f"{exc}") from None
    if len(out) > max_bytes:
        raise CorruptRecordError(f"a Kafka record batch decompresses to more than {max_bytes} bytes")
    return bytes(out)


def compress(codec: int, data: bytes) -> bytes:
    """For tests and tools: a records region compressed as Kafka producers do."""
    if codec == NONE:
        return data
    if codec == GZIP:
        return gzip.compress(data)
    if codec == SNAPPY:
        import cramjam

        return bytes(cramjam.snappy.compress_raw(data))
    if codec == LZ4:
        return bytes(_lz4.compress(data))
    if codec == ZSTD:
        return bytes(_zstd.ZstdCompressor().compress(data))
    raise InvalidArgument(f"unknown Kafka compression codec {codec}")


# -- reading Kafka batches ------------------------------------------------------------------------------

def iter_kafka_batches(data: bytes | memoryview, max_bytes: int) -> Iterator[KafkaBatch]:
    """The checked batches of a Produce request's records field, decompressed.

    CorruptRecordError for anything not a whole magic-2 batch with a matching CRC (Kafka's CORRUPT_MESSAGE);
    InvalidArgument for what metaq does not store (transactional and control batches)."""
    view = memoryview(data)
    pos, end = 0, len(view)
    if end == 0:
        raise CorruptRecordError("the Produce request has no record batch")
    while pos < end:
        if end - pos < HEADER_BYTES:
            raise CorruptRecordError(f"a Kafka record batch header needs {HEADER_BYTES} bytes, {end - pos} left")
        (base_offset, length, _leader_epoch, magic, crc, attributes, last_delta, base_ts, max_ts, pid, epoch, seq,
         count) = _HEAD.unpack_from(view, pos)
        if magic != KAFKA_MAGIC:
            raise CorruptRecordError(f"Kafka record batch magic {magic}: only magic 2 (Kafka 0.11+) is accepted")
        total = 12 + length
        if length < HEADER_BYTES - 12 or pos + total > end:
            raise CorruptRecordError(f"Kafka record batch length {length} does not fit the request")
        if _crc32c.crc32c(view[pos + _CRC_FROM:pos + total]) != crc:
            raise CorruptRecordError("Kafka record batch fails its CRC32C check")
        if attributes & (_TRANSACTIONAL | _CONTROL):
            raise InvalidArgument("transactional and control record batches are not supported by this listener")
        if count < 1 or last_delta != count - 1:
            raise CorruptRecordError(f"Kafka record batch has {count} records and lastOffsetDelta {last_delta}")
        body: bytes | memoryview = view[pos + HEADER_BYTES:pos + total]  # no copy: the compiled code reads views
        codec = attributes & 0x7
        if codec:
            body = decompress(codec, bytes(body), max_bytes)
        yield KafkaBatch(base_offset, attributes, last_delta, base_ts, max_ts, pid, epoch, seq, count, body)
        pos += total


class Columns(NamedTuple):
    values: list[bytes]
    timestamps: list[int]
    keys: list[bytes | None] | None
    attributes: list[str | None] | None
    headers: list[list[tuple[str, bytes]] | None] | None


def parse_records(batch: KafkaBatch) -> Columns:
    """The records of a batch as columns; CorruptRecordError for malformed records."""
    buf, n, base_ts = bytes(batch.records), batch.record_count, batch.base_timestamp
    values: list[bytes] = []
    timestamps: list[int] = []
    keys: list[bytes | None] = []
    attrs: list[str | None] = []
    headers: list[list[tuple[str, bytes]] | None] = []
    any_key = any_attr = any_header = False
    pos = 0
    try:
        for i in range(n):
            length, pos = _read_varint(buf, pos)
            end = pos + length
            pos += 1  # record attributes: unused
            ts_delta, pos = _read_varint(buf, pos)
            offset_delta, pos = _read_varint(buf, pos)
            if offset_delta != i:
                raise CorruptRecordError(f"record {i} of a Kafka batch has offset delta {offset_delta}")
            klen, pos = _read_varint(buf, pos)
            if klen >= 0:
                keys.append(buf[pos:pos + klen])
                pos += klen
                any_key = True
            else:
                keys.append(None)
            vlen, pos = _read_varint(buf, pos)
            if vlen >= 0:
                values.append(buf[pos:pos + vlen])
                pos += vlen
            else:
                values.append(b"")  # a Kafka tombstone: metaq has no null payload
            hcount, pos = _read_varint(buf, pos)
            attr = None
            if hcount:
                hs: list[tuple[str, bytes]] = []
                for _ in range(hcount):
                    hklen, pos = _read_varint(buf, pos)
                    name = buf[pos:pos + hklen].decode()
                    pos += hklen
                    hvlen, pos = _read_varint(buf, pos)
                    value = buf[pos:pos + hvlen] if hvlen >= 0 else b""
                    pos += max(hvlen, 0)
                    if name == ATTRIBUTE_HEADER:
                        attr = value.decode()
                        any_attr = True
                    else:
                        hs.append((name, value))
                headers.append(hs or None)
                any_header = any_header or bool(hs)
            else:
                headers.append(None)
            attrs.append(attr)
            timestamps.append(base_ts + ts_delta)
            if pos != end:
                raise CorruptRecordError(f"record {i} of a Kafka batch is {length} bytes long but its fields "
                                         f"take {length + pos - end}")
    except (IndexError, UnicodeDecodeError) as exc:
        raise CorruptRecordError(f"a Kafka record is cut off or malformed: {exc}") from None
    if pos != len(buf):
        raise CorruptRecordError(f"a Kafka batch has {len(buf) - pos} bytes after its {n} records")
    return Columns(values, timestamps, keys if any_key else None, attrs if any_attr else None,
                   headers if any_header else None)


_METAQ_CODEC = {LZ4: mrec.Compression.LZ4, ZSTD: mrec.Compression.ZSTD}
_REGION_HEAD = struct.Struct(">hiqqi")     # metaq batch bytes [45, 71): attributes .. record count
_STAMP_HEAD = struct.Struct(">qibQQq")     # metaq batch bytes [0, 37): base offset .. append time
_PRODUCER_BLOCK = struct.Struct(">qhih")
_U32 = struct.Struct(">I")


def to_metaq(batch: KafkaBatch) -> bytes:
    """The metaq batch holding the records of one Kafka batch (lz4 and zstd kept, gzip and snappy stored
    uncompressed: metaq has no such codecs), with the idempotent producer's block when it has one."""
    stamp = None
    if batch.producer_id >= 0:
        if batch.producer_id == 0:
            raise CorruptRecordError("producer id 0 is not one this broker handed out (InitProducerId)")
        stamp = mrec.ProducerStamp(batch.producer_id, batch.producer_epoch, batch.base_sequence)
    codec = _METAQ_CODEC.get(batch.compression, mrec.Compression.NONE)
    fast = _records_to_region(batch.records, batch.record_count, batch.base_timestamp) if _records_to_region else None
    if fast is not None:
        region, first_ts, max_ts = fast
        return metaq_batch(region, batch.record_count, first_ts, max_ts, codec, stamp)
    cols = parse_records(batch)
    out = mrec.encode_columns(cols.values, cols.timestamps, keys=cols.keys, attributes=cols.attributes,
                              headers=cols.headers, compression=codec)
    return mrec.with_producer_stamp(out, stamp) if stamp is not None else out


def metaq_batch(region: bytes, count: int, first_ts: int, max_ts: int, codec: mrec.Compression,
                stamp: mrec.ProducerStamp | None) -> bytes:
    """A producer's metaq batch (stamped fields left for the broker) around a records region, as
    :func:`metaq.protocol.records.encode_columns` and ``with_producer_stamp`` make it (the same bytes: tested),
    from a region built elsewhere. Layout: metaq.protocol.records' module docstring."""
    if codec == mrec.Compression.LZ4:
        body = bytes(_lz4.compress(region))
    elif codec == mrec.Compression.ZSTD:
        body = bytes(_zstd.ZstdCompressor(level=3).compress(region))
    else:
        body = region
    attributes = int(codec) | (mrec.PRODUCER_STAMPED if stamp is not None else 0)
    head = _REGION_HEAD.pack(attributes, count - 1, first_ts, max_ts, count)
    block = _PRODUCER_BLOCK.pack(stamp.producer_id, stamp.producer_epoch, stamp.base_sequence, 0) if stamp else b""
    crc = _crc32c.crc32c(body, _crc32c.crc32c(block, _crc32c.crc32c(head)))
    length = mrec.STAMPED_BYTES - mrec.LENGTH_PREFIX_BYTES + len(head) + len(block) + len(body)
    prefix = _STAMP_HEAD.pack(0, length, mrec.MAGIC, 0, 0, -1) + _U32.pack(crc)
    return b"".join((prefix, _U32.pack(_crc32c.crc32c(head, _crc32c.crc32c(prefix))), head, block, body))


# -- writing Kafka batches ---------------------------------------------------------------------------

def build_batch(base_offset: int, records: Sequence[bytes], last_offset_delta: int, base_timestamp: int,
                max_timestamp: int, *, producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
                leader_epoch: int = 0) -> bytes:
    """An uncompressed Kafka batch of encoded records (see :func:`encode_record`)."""
    return build_batch_of(base_offset, b"".join(records), len(records), last_offset_delta, base_timestamp,
                          max_timestamp, producer_id=producer_id, producer_epoch=producer_epoch,
                          base_sequence=base_sequence, leader_epoch=leader_epoch)


def build_batch_of(base_offset: int, records: bytes, count: int, last_offset_delta: int, base_timestamp: int,
                   max_timestamp: int, *, producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
                   leader_epoch: int = 0) -> bytes:
    """:func:`build_batch` from the records already joined."""
    return b"".join(batch_parts(base_offset, records, count, last_offset_delta, base_timestamp, max_timestamp,
                                producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=base_sequence,
                                leader_epoch=leader_epoch))


def batch_parts(base_offset: int, records: bytes, count: int, last_offset_delta: int, base_timestamp: int,
                max_timestamp: int, *, producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
                leader_epoch: int = 0) -> list[bytes]:
    """A Kafka batch as [the 21 bytes up to the CRC, the rest of the header, the records]."""
    tail = struct.pack(">hiqqqhii", 0, last_offset_delta, base_timestamp, max_timestamp, producer_id,
                       producer_epoch, base_sequence, count)
    crc = _crc32c.crc32c(records, _crc32c.crc32c(tail))
    return [struct.pack(">qiibI", base_offset, len(tail) + len(records) + 9, leader_epoch, KAFKA_MAGIC, crc), tail,
            records]


def encode_record(offset_delta: int, timestamp_delta: int, value: bytes | None, key: bytes | None = None,
                  headers: Sequence[tuple[str, bytes | None]] = ()) -> bytes:
    """One Kafka record (length prefix included)."""
    parts = [b"\x00", varint(timestamp_delta), varint(offset_delta)]
    parts += [_MINUS_ONE] if key is None else [varint(len(key)), key]
    parts += [_MINUS_ONE] if value is None else [varint(len(value)), value]
    parts.append(varint(len(headers)))
    for name, hvalue in headers:
        raw = name.encode()
        parts += [varint(len(raw)), raw]
        parts += [_MINUS_ONE] if hvalue is None else [varint(len(hvalue)), hvalue]
    body = b"".join(parts)
    return varint(len(body)) + body


_NO_HEADERS = b"\x00"


def to_kafka(fetched: bytes | memoryview, from_offset: int, leader_epoch: int = 0) -> tuple[bytes, int]:
    """The whole metaq batches of a fetch reply as Kafka batches, and, when there is none but a cut-off
    one, that batch's size (else 0): the caller fetches it again with room for it (Kafka's rule: a fetch
    returns at least one whole batch, however large).

    Batches that end before ``from_offset`` are skipped; records of the first batch below it are kept
    (Kafka consumers skip them, as they do for Kafka's own batches)."""
    view = memoryview(fetched)
    parts: list[bytes] = []
    for pos, header in mrec.fetched_batches(view, from_offset):
        parts += _batch_to_kafka(view[pos:pos + header.total_bytes], header, leader_epoch)
    if not parts:
        pos = 0
        while (peek := mrec.peek_length(view, pos)) is not None:
            if pos + peek[1] > len(view):
                return b"", peek[1]  # the cut-off batch after the whole ones
            pos += peek[1]
    return b"".join(parts), 0


def _batch_to_kafka(batch: memoryview, header: mrec.BatchHeader, leader_epoch: int) -> list[bytes]:
    """The parts of one Kafka batch (joined once for the whole reply: no copy per batch)."""
    _, cols = mrec.batch_columns(batch, header)
    if cols.n == 0:  # emptied by a filter: nothing to hand over, the next fetch starts after it
        return []
    base_ts = header.first_timestamp_ms
    records = _region_to_records(cols.body, cols.n, base_ts) if _region_to_records else None
    if records is None:
        body = cols.body if isinstance(cols.body, bytes) else bytes(cols.body)
        records = region_to_records_py(cols, body, base_ts)
    return batch_parts(header.base_offset, records, cols.n, header.last_offset_delta, base_ts,
                       header.max_timestamp_ms, leader_epoch=leader_epoch)


def region_to_records_py(cols: Any, body: bytes, base_ts: int) -> bytes:
    """The Kafka records of a checked metaq batch's columns (the reference of the compiled
    ``region_to_records``)."""
    n = cols.n
    deltas, stamps, vlens = cols.deltas, cols.timestamps, cols.vlens
    small = _SMALL
    records: list[bytes] = []
    if cols.no_keys and cols.no_attrs and cols.no_headers:
        v = cols.values_at
        for i in range(n):
            vlen = vlens[i]
            end = v + vlen
            head = b"".join((b"\x00", varint(stamps[i] - base_ts), varint(deltas[i]), _MINUS_ONE, varint(vlen)))
            size = len(head) + vlen + 1
            records.append(b"".join((small[size] if size < 16384 else _zigzag(size), head, body[v:end],
                                     _NO_HEADERS)))
            v = end
        return b"".join(records)
    klens, alens = cols.klens, cols.alens
    k, v, a = cols.keys_at, cols.values_at, cols.attrs_at
    blobs = cols.header_blobs() if not cols.no_headers else None
    for i in range(n):
        klen, vlen, alen = klens[i], vlens[i], alens[i]
        key = None
        if klen >= 0:
            key = body[k:k + klen]
            k += klen
        value = body[v:v + vlen]
        v += vlen
        hs: list[tuple[str, bytes | None]] = []
        if alen >= 0:
            hs.append((ATTRIBUTE_HEADER, body[a:a + alen]))
            a += alen
        if blobs is not None and cols.hcounts[i]:
            hs += _metaq_headers(blobs[i])
        records.append(encode_record(deltas[i], stamps[i] - base_ts, value, key, hs))
    return b"".join(records)


_HDR_NAME = struct.Struct("<H")
_HDR_VALUE = struct.Struct("<i")


def _metaq_headers(blob: bytes) -> list[tuple[str, bytes | None]]:
    out: list[tuple[str, bytes | None]] = []
    p = 0
    while p < len(blob):
        (nlen,) = _HDR_NAME.unpack_from(blob, p)
        name = blob[p + 2:p + 2 + nlen].decode()
        (vlen,) = _HDR_VALUE.unpack_from(blob, p + 2 + nlen)
        start = p + 6 + nlen
        out.append((name, blob[start:start + vlen]))
        p = start + vlen
    return out
