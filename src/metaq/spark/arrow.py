"""Reading an offset range on an executor: fetched record batches -> Arrow record batches.

Yielding ``pyarrow.RecordBatch`` from ``read()`` is roughly twice as fast in Spark as yielding tuples,
provided the Arrow schema is exactly Spark's own conversion of the source schema (``to_arrow_schema(
schema, timezone="UTC")``): int32 partition, int64 offset, timestamp[us, UTC], and headers as
``list<element: struct<key: string, value: binary>>``. :data:`ARROW_SCHEMA` is written out by hand
(pyarrow only, no pyspark import) and a unit test checks it against Spark's conversion.

One Arrow batch is built per fetch reply (``maxBytesPerFetch``, 4 MiB by default: tens of thousands of
small messages), column by column from the decoded messages.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from metaq.client.blocking import BlockingClient
from metaq.errors import MetaqError, OffsetOutOfRangeError
from metaq.protocol.records import decode_batch, iter_batches, peek_length
from metaq.types import Message

HEADER_TYPE = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
HEADERS_TYPE = pa.list_(pa.field("element", HEADER_TYPE))
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")

ARROW_SCHEMA = pa.schema([
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("attribute", pa.string()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", TIMESTAMP_TYPE),
    pa.field("message_id", pa.string()),
    pa.field("headers", HEADERS_TYPE),
])

MAX_FETCH_BYTES = 64 * 1024 * 1024
"""The largest fetch a reader grows to when one stored batch is bigger than maxBytesPerFetch."""
_U64 = (1 << 64) - 1


class DataLossError(MetaqError):
    """Messages the query should read are gone (retention, a truncated or recreated topic)."""


def _all_none(values: list[Any]) -> bool:
    return values.count(None) == len(values)


def _message_ids(messages: Sequence[Message]) -> list[str]:
    """32-hex-digit ids; a batch's ids are consecutive, which makes the common case cheap."""
    out: list[str] = []
    i, n = 0, len(messages)
    while i < n:
        first = messages[i].id
        # the run of consecutive ids starting at i
        j = i + 1
        while j < n and messages[j].id == first + (j - i):
            j += 1
        low = first & _U64
        if low + (j - i) - 1 <= _U64:
            out.extend(map((f"{first >> 64:016x}" + "%016x").__mod__, range(low, low + j - i)))
        else:  # the low 64 bits wrap inside the run: format each id whole
            out.extend(f"{first + k:032x}" for k in range(j - i))
        i = j
    return out


def to_record_batch(messages: Sequence[Message], topic: str, partition: int) -> pa.RecordBatch:
    """Messages of one partition (ascending offsets) as an Arrow batch in :data:`ARROW_SCHEMA`."""
    n = len(messages)
    keys = [m.key for m in messages]
    attrs = [m.attribute for m in messages]
    headers = [m.headers for m in messages]
    first = messages[0].offset if n else 0
    if n and messages[-1].offset - first == n - 1:
        offsets = pa.array(range(first, first + n), pa.int64())
    else:
        offsets = pa.array([m.offset for m in messages], pa.int64())
    columns = [
        pa.nulls(n, pa.binary()) if _all_none(keys) else pa.array(keys, pa.binary()),
        pa.array([m.data for m in messages], pa.binary()),
        pa.nulls(n, pa.string()) if _all_none(attrs) else pa.array(attrs, pa.string()),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        offsets,
        pa.array([(m.timestamp_ms if m.timestamp_ms >= 0 else m.append_time_ms) * 1000 for m in messages],
                 TIMESTAMP_TYPE),
        pa.array(_message_ids(messages), pa.string()),
        pa.nulls(n, HEADERS_TYPE) if _all_none(headers) else pa.array(headers, HEADERS_TYPE),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


def decode_range(records: bytes | memoryview, topic: str, partition: int, start: int,
                 end: int) -> tuple[list[Message], int]:
    """Messages with start <= offset < end among the whole batches of a fetch reply, and the offset
    to fetch next (``start`` if the reply held no whole batch at or after ``start``)."""
    out: list[Message] = []
    next_offset = start
    view = memoryview(records)
    for pos, header in iter_batches(view):
        if header.next_offset <= start:
            continue
        if header.base_offset >= end:
            break
        msgs = decode_batch(view[pos:pos + header.total_bytes], topic, partition, header)
        if header.base_offset < start or header.next_offset > end:
            msgs = [m for m in msgs if start <= m.offset < end]
        out.extend(msgs)
        next_offset = min(header.next_offset, end)
        if next_offset >= end:
            break
    return out, next_offset


def read_range(client: BlockingClient, topic: str, partition: int, start: int, end: int, *,
               max_bytes: int, fail_on_data_loss: bool = True, new_partition: bool = False,
               stall_timeout_s: float = 30.0) -> Iterator[pa.RecordBatch]:
    """Exactly the messages with offsets in [start, end) of one partition, in order.

    Deterministic for a range while the data is retained. When the range starts below the log start
    (retention deleted it), fails with :class:`DataLossError` if ``fail_on_data_loss``, else skips to
    the earliest message still stored. ``new_partition``: the partition appeared after the query
    started, so starting past 0 is not a loss.
    """
    offset = start
    fetch_bytes = max_bytes
    stalled_since: float | None = None
    where = f"{topic}-{partition}"
    while offset < end:
        try:
            resp = client.fetch(topic, partition, offset, fetch_bytes)
        except OffsetOutOfRangeError:
            bounds = client.list_offsets(topic, partition, -1)
            offset = _after_loss(where, offset, end, bounds.log_start_offset, bounds.log_end_offset,
                                 fail_on_data_loss, new_partition)
            continue
        if resp.reset_offset >= 0 and resp.reset_offset != offset:
            # a broker with updateConsumerOffsets=true served from its nearest valid offset instead
            offset = _after_loss(where, offset, end, resp.log_start_offset, resp.log_end_offset,
                                 fail_on_data_loss, new_partition)
            continue
        messages, next_offset = decode_range(resp.records, topic, partition, offset, end)
        if messages and messages[0].offset > offset:
            # the first message we got is past the one asked for: the ones between are gone
            _after_loss(where, offset, end, messages[0].offset, resp.log_end_offset, fail_on_data_loss,
                        new_partition)
        if next_offset > offset:
            stalled_since = None
            fetch_bytes = max_bytes
            if messages:
                yield to_record_batch(messages, topic, partition)
            offset = next_offset
            continue
        # no whole batch at `offset` in the reply
        head = peek_length(resp.records) if len(resp.records) else None
        if head is not None and head[1] > fetch_bytes:
            if head[1] > MAX_FETCH_BYTES:
                raise MetaqError(f"{where}: the stored batch at offset {head[0]} is {head[1]} bytes, more than "
                                 f"the reader's limit of {MAX_FETCH_BYTES}")
            fetch_bytes = head[1]
            continue
        if resp.log_end_offset >= 0 and resp.log_end_offset <= offset:
            if fail_on_data_loss:
                raise DataLossError(
                    f"{where}: the query expects offsets up to {end}, but the partition ends at "
                    f"{resp.log_end_offset} (truncated or recreated topic?); set failOnDataLoss=false "
                    "to skip what is missing")
            return
        now = time.monotonic()
        if stalled_since is None:
            stalled_since = now
        elif now - stalled_since > stall_timeout_s:
            raise MetaqError(f"{where}: no data returned at offset {offset} for {stall_timeout_s}s although "
                             f"the partition ends at {resp.log_end_offset}")
        time.sleep(0.01)


def _after_loss(where: str, offset: int, end: int, log_start: int, log_end: int, fail: bool,
                new_partition: bool) -> int:
    """The offset to continue from after finding ``offset`` is no longer stored (or raise)."""
    if offset < log_start:
        if fail and not new_partition:
            raise DataLossError(
                f"{where}: offsets {offset}..{min(end, log_start) - 1} were deleted before they were read "
                f"(the partition now starts at {log_start}; retention?); set failOnDataLoss=false to skip "
                "to the earliest message instead")
        return min(log_start, end)
    if offset > log_end:
        if fail:
            raise DataLossError(
                f"{where}: offset {offset} is beyond the end of the partition ({log_end}): the topic was "
                "truncated or recreated; set failOnDataLoss=false to skip")
        return end
    raise MetaqError(f"{where}: broker refused offset {offset} inside its range {log_start}..{log_end}")
