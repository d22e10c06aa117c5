"""The delayed messages' bytes: reading a delay log back, the record each message is delivered as, and the
batches a delivery appends to a partition."""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator

from metaq.broker.delay.buckets import Row
from metaq.errors import CorruptRecordError
from metaq.protocol.delayed import DELAY_REF_HEADER, pack_ms
from metaq.protocol.records import (
    RECORD_OVERHEAD_BYTES,
    BatchHeader,
    assemble_batch,
    decode_batch,
    encode_record,
    fetched_batches,
)
from metaq.storage import PartitionLog
from metaq.types import Message

log = logging.getLogger("metaq.broker.delay")

SCAN_CHUNK_BYTES = 4 << 20
DELIVERY_BATCH_BYTES_MAX = 1 << 20
_DELTA = struct.Struct(">i")
_TS = struct.Struct(">q")


def scan_log(plog: PartitionLog, from_offset: int) -> Iterator[tuple[BatchHeader, list[Message]]]:
    """Every batch (header, messages) of a log from ``from_offset`` to its end; stops at damage (logged)."""
    offset = max(from_offset, plog.log_start_offset)
    chunk = SCAN_CHUNK_BYTES
    while offset < plog.log_end_offset:
        buf = plog.read_bytes(offset, chunk)
        view = memoryview(buf)
        advanced = False
        try:
            for pos, header in fetched_batches(view, offset):
                messages = decode_batch(view[pos:pos + header.total_bytes], plog.topic, plog.partition, header)
                advanced = True
                offset = header.next_offset
                yield header, messages
        except CorruptRecordError as exc:
            log.error("%s-%d: damaged data at offset %d while recovering delayed messages: %s", plog.topic,
                      plog.partition, offset, exc)
            return
        if not advanced:
            if not buf or chunk >= 1 << 31:
                return
            chunk *= 2


def delivery_record(message: Message, offset: int) -> bytes:
    """The record as it will be delivered: its own fields, its headers plus ``metaq.delay-ref``."""
    headers = [*(message.headers or ()), (DELAY_REF_HEADER, pack_ms(offset))]
    return encode_record(0, message.timestamp_ms, bytes(message.data), message.key, message.attribute, headers)


def assemble_delivery(rows: list[Row]) -> bytes:
    """One normal batch (bit 7 clear) of ``rows``' records, offset deltas 0..n-1, in row order."""
    buf = bytearray(b"".join(r.record for r in rows))
    pos = 0
    first_ts = max_ts = _TS.unpack_from(buf, 8)[0]
    for i, row in enumerate(rows):
        _DELTA.pack_into(buf, pos + 4, i)
        ts = _TS.unpack_from(buf, pos + 8)[0]
        first_ts = min(first_ts, ts)
        max_ts = max(max_ts, ts)
        pos += len(row.record)
    return assemble_batch(bytes(buf), len(rows), first_ts, max_ts)


def delivery_chunks(rows: list[Row]) -> Iterator[list[Row]]:
    """``rows`` in order, cut into batches of at most DELIVERY_BATCH_BYTES_MAX (a row bigger is alone)."""
    chunk: list[Row] = []
    size = 0
    for row in rows:
        n = len(row.record) + RECORD_OVERHEAD_BYTES
        if chunk and size + n > DELIVERY_BATCH_BYTES_MAX:
            yield chunk
            chunk, size = [], 0
        chunk.append(row)
        size += n
    if chunk:
        yield chunk
