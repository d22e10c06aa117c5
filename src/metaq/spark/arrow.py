"""Reading an offset range on an executor: fetched record batches -> Arrow record batches.

Yielding ``pyarrow.RecordBatch`` from ``read()`` is roughly twice as fast in Spark as yielding tuples,
provided the Arrow schema is exactly Spark's own conversion of the source schema (``to_arrow_schema(
schema, timezone="UTC")``): int32 broker_id and partition, int64 offset, timestamp[us, UTC], and headers as
``list<element: struct<key: string, value: binary>>``. :data:`ARROW_SCHEMA` is written out by hand
(pyarrow only, no pyspark import) and a unit test checks it against Spark's conversion.

The read path never builds a :class:`~metaq.types.Message`: :func:`fetch_to_arrow` takes the whole
batches of a fetch reply apart with the client's :func:`~metaq.client.fetched_columns` (CRC checked,
columns validated, decompressed) and gathers the columns of all the batches of the reply: the length arrays are
appended with ``array.extend`` (a copy in C), the key, value and attribute sections are joined into one
buffer each. One Arrow batch per fetch reply (``maxBytesPerFetch``, 4 MiB by default: tens of thousands
of small messages) is then made from those buffers with ``pyarrow.compute``: the offsets of the binary
columns are a cumulative sum of the lengths, nulls come from ``-1`` lengths, ``offset`` is an arange
plus the first offset (or base offset + delta per batch when a server-side filter left gaps), and
``message_id`` is formatted to hex with integer arithmetic on uint64 arrays (:func:`_hex8`). Only
headers (rare) are decoded per message. :func:`to_record_batch` is the Message-based equivalent, kept as
the reference the unit tests compare against.
"""

from __future__ import annotations

import logging
import struct
import sys
import time
from array import array
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from metaq.client import BlockingClient, ColumnSpan, PendingFetch, fetched_columns, next_fetch_offset
from metaq.errors import BrokerError, CorruptRecordError, MetaqError, OffsetOutOfRangeError
from metaq.spark.errors import DataLossError as DataLossError  # re-exported: the read path raises it
from metaq.types import Message, PartitionId, PartitionKey

HEADER_TYPE = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
HEADERS_TYPE = pa.list_(pa.field("element", HEADER_TYPE))
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")

ARROW_SCHEMA = pa.schema([
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("attribute", pa.string()),
    pa.field("topic", pa.string()),
    pa.field("broker_id", pa.int32()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", TIMESTAMP_TYPE),
    pa.field("message_id", pa.string()),
    pa.field("headers", HEADERS_TYPE),
])

MAX_FETCH_BYTES = 64 * 1024 * 1024
"""The largest fetch a reader grows to when one stored batch is bigger than maxBytesPerFetch."""
CHUNK_BYTES = 1 << 30
"""At most this many key + value + attribute bytes go into one Arrow batch (its offsets are int32)..."""
CHUNK_ROWS = 1 << 22
"""... and at most this many rows (``message_id`` takes 32 bytes a row), unless one batch has more."""
_U64 = (1 << 64) - 1
_LITTLE = sys.byteorder == "little"


log = logging.getLogger(__name__)


# -- the columnar path --------------------------------------------------------------------------------

_INT32 = pa.int32()
_INT64 = pa.int64()
_UINT64 = pa.uint64()
_ZERO32 = pa.scalar(0, _INT32)
_MINUS1_32 = pa.scalar(-1, _INT32)
_EMPTY_BINARY = pa.scalar(b"", pa.binary())
_arange_cache: pa.Array = pa.array([], _INT64)


def _arange(n: int) -> pa.Array:
    """0, 1, ..., n-1 as int64 (a slice of a cached array, grown by doubling)."""
    global _arange_cache
    if len(_arange_cache) < n:
        size = max(n, 2 * len(_arange_cache), 1 << 16)
        one = pa.scalar(1, _INT64)
        _arange_cache = pc.subtract(pc.cumulative_sum(pa.repeat(one, size)), one)
    return _arange_cache.slice(0, n)


def _u64(value: int) -> pa.Scalar:
    return pa.scalar(value, _UINT64)


_M16, _M8, _M4 = _u64(0x0000FFFF0000FFFF), _u64(0x00FF00FF00FF00FF), _u64(0x0F0F0F0F0F0F0F0F)
_ADD6, _ONES, _ASCII0, _TO_A = _u64(0x0606060606060606), _u64(0x0101010101010101), _u64(0x3030303030303030), _u64(39)
_S4, _S8, _S16, _S32 = _u64(4), _u64(8), _u64(16), _u64(32)


def _hex8(u: pa.Array) -> pa.Array:
    """uint64 values below 2**32 -> uint64 values whose 8 bytes, in memory (little-endian) order, are the
    value's 8 lowercase hex digits, most significant first.

    Each nibble is moved into a byte of its own, most significant nibble into the lowest byte, in
    three shift-and-mask steps (16-bit halves, bytes, nibbles); then ``'0' + n``, plus 39 more for
    n >= 10 (``n + 6`` carries into bit 4 exactly then), lands on ``0-9a-f``.
    """
    sl, sr, band, bor = pc.shift_left, pc.shift_right, pc.bit_wise_and, pc.bit_wise_or
    x = band(bor(sr(u, _S16), sl(u, _S32)), _M16)
    x = band(bor(sr(x, _S8), sl(x, _S16)), _M8)
    x = band(bor(sr(x, _S4), sl(x, _S8)), _M4)
    letters = band(sr(pc.add(x, _ADD6), _S4), _ONES)
    return pc.add(pc.add(x, _ASCII0), pc.multiply(letters, _TO_A))


def _ids_with_prefix(offsets: pa.Array, shift: int, prefix: str) -> pa.Array:
    """``prefix`` (24 hex digits) + the 8 hex digits of ``offset + shift`` (each in [0, 2**32)) per row."""
    n = len(offsets)
    low = pc.add(offsets, pa.scalar(shift, _INT64)).cast(_UINT64)
    digits = pa.Array.from_buffers(pa.binary(), n, [None, pc.multiply(_arange(n + 1), 8).cast(_INT32).buffers()[1],
                                                    _hex8(low).buffers()[1]])
    joined = pc.binary_join_element_wise(pa.scalar(prefix.encode(), pa.binary()), digits, _EMPTY_BINARY)
    return pa.Array.from_buffers(pa.string(), n, joined.buffers()[:3])


def _skipped(lengths: array) -> int:
    """Bytes taken by records with these lengths (-1: absent, no bytes)."""
    return sum(lengths) + lengths.count(-1)


def _header_rows(cols: Any, lo: int, hi: int) -> list[list[tuple[str, bytes]] | None]:
    """Headers of records lo..hi-1 of a batch (None for a record without headers)."""
    raw = bytes(memoryview(cols.body)[cols.headers_at:])
    name_len, value_len = struct.Struct("<H").unpack_from, struct.Struct("<i").unpack_from
    out: list[list[tuple[str, bytes]] | None] = []
    p = 0
    for i, count in enumerate(cols.hcounts[:hi]):
        items: list[tuple[str, bytes]] | None = [] if count and i >= lo else None
        for _ in range(count):
            (nlen,) = name_len(raw, p)
            (vlen,) = value_len(raw, p + 2 + nlen)
            if items is not None:
                items.append((raw[p + 2:p + 2 + nlen].decode(), raw[p + 6 + nlen:p + 6 + nlen + vlen]))
            p += 6 + nlen + vlen
        if i >= lo:
            out.append(items)
    return out


class _Span:
    """Records lo..hi-1 of one batch, as gathered into a :class:`_Rows`."""

    __slots__ = ("append_time_ms", "base_id", "base_offset", "deltas")

    def __init__(self, span: ColumnSpan, deltas: array) -> None:
        header = span.header
        self.base_offset = header.base_offset
        self.base_id = header.base_message_id
        self.append_time_ms = header.append_time_ms
        self.deltas = deltas


class _Rows:
    """The selected records of consecutive batches of one partition, column by column, before Arrow."""

    def __init__(self) -> None:
        self.n = 0
        self.spans: list[_Span] = []
        self.timestamps = array("q")
        # the length arrays start with a 0: their cumulative sum is then directly the Arrow offsets
        self.klens, self.vlens, self.alens = array("i", [0]), array("i", [0]), array("h", [0])
        self.key_parts: list[memoryview] = []
        self.value_parts: list[memoryview] = []
        self.attr_parts: list[memoryview] = []
        self.any_keys = self.any_attrs = False
        self.headers: list[list[tuple[str, bytes]] | None] | None = None
        self.blob_bytes = 0

    def add(self, span: ColumnSpan) -> bool:
        """Gather the records of a span; False (nothing added) if that would make the Arrow batch too
        large: build this one and add to a fresh one."""
        cols, lo, hi = span.columns, span.lo, span.hi
        n = cols.n
        if lo == 0 and hi == n:
            deltas, tss, klens, vlens, alens = cols.deltas, cols.timestamps, cols.klens, cols.vlens, cols.alens
            k0, k1, v0, v1 = cols.keys_at, cols.values_at, cols.values_at, cols.attrs_at
            a0, a1 = cols.attrs_at, cols.headers_at
        else:
            deltas, tss = cols.deltas[lo:hi], cols.timestamps[lo:hi]
            klens, vlens, alens = cols.klens[lo:hi], cols.vlens[lo:hi], cols.alens[lo:hi]
            k0 = cols.keys_at + (0 if cols.no_keys else _skipped(cols.klens[:lo]))
            k1 = k0 + (0 if cols.no_keys else _skipped(klens))
            v0 = cols.values_at + sum(cols.vlens[:lo])
            v1 = v0 + sum(vlens)
            a0 = cols.attrs_at + (0 if cols.no_attrs else _skipped(cols.alens[:lo]))
            a1 = a0 + (0 if cols.no_attrs else _skipped(alens))
        size = (k1 - k0) + (v1 - v0) + (a1 - a0)
        if self.n and (self.blob_bytes + size > CHUNK_BYTES or self.n + hi - lo > CHUNK_ROWS):
            return False
        body = memoryview(cols.body)
        self.blob_bytes += size
        self.spans.append(_Span(span, deltas))
        self.timestamps.extend(tss)
        self.klens.extend(klens)
        self.vlens.extend(vlens)
        self.alens.extend(alens)
        if k1 > k0:
            self.key_parts.append(body[k0:k1])
        self.any_keys = self.any_keys or not cols.no_keys
        self.value_parts.append(body[v0:v1])
        if a1 > a0:
            self.attr_parts.append(body[a0:a1])
        self.any_attrs = self.any_attrs or not cols.no_attrs
        if not cols.no_headers:
            if self.headers is None:
                self.headers = [None] * self.n
            self.headers.extend(_header_rows(cols, lo, hi))
        elif self.headers is not None:
            self.headers.extend([None] * (hi - lo))
        self.n += hi - lo
        return True

    def build(self, topic: str, partition: PartitionId) -> pa.RecordBatch:
        n = self.n
        offsets = self._offsets()
        columns = [
            _var_width(pa.binary(), n, self.klens, self.key_parts) if self.any_keys else pa.nulls(n, pa.binary()),
            _var_width(pa.binary(), n, self.vlens, self.value_parts),
            _var_width(pa.string(), n, self.alens, self.attr_parts) if self.any_attrs else pa.nulls(n, pa.string()),
            pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.repeat(pa.scalar(partition.broker_id, _INT32), n),
            pa.repeat(pa.scalar(partition.partition, _INT32), n),
            offsets,
            self._timestamps(),
            self._message_ids(offsets),
            pa.nulls(n, HEADERS_TYPE) if self.headers is None else pa.array(self.headers, HEADERS_TYPE),
        ]
        return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)

    def _offsets(self) -> pa.Array:
        """base_offset + delta of each record: an arange when the records are consecutive offsets."""
        pieces: list[tuple[int, int, pa.Array | None]] = []  # (first offset, count, None if consecutive)
        for span in self.spans:
            d, m = span.deltas, len(span.deltas)
            first = span.base_offset + d[0]
            if d[-1] - d[0] == m - 1:  # strictly increasing deltas: m consecutive offsets
                if pieces and pieces[-1][2] is None and pieces[-1][0] + pieces[-1][1] == first:
                    pieces[-1] = (pieces[-1][0], pieces[-1][1] + m, None)
                else:
                    pieces.append((first, m, None))
            else:  # a server-side filter left gaps
                as_arrow = pa.Array.from_buffers(_INT32, m, [None, pa.py_buffer(d)]).cast(_INT64)
                pieces.append((first, m, pc.add(as_arrow, pa.scalar(span.base_offset, _INT64))))
        arrays = [pc.add(_arange(m), pa.scalar(first, _INT64)) if arr is None else arr for first, m, arr in pieces]
        return arrays[0] if len(arrays) == 1 else pa.concat_arrays(arrays)

    def _timestamps(self) -> pa.Array:
        """The producer's timestamps, or the broker's append time for a record without one (< 0)."""
        ms = pa.Array.from_buffers(_INT64, self.n, [None, pa.py_buffer(self.timestamps)])
        if pc.min(ms).as_py() < 0:
            fixed = array("q")
            i = 0
            for span in self.spans:
                m = len(span.deltas)
                fixed.extend([t if t >= 0 else span.append_time_ms for t in self.timestamps[i:i + m]])
                i += m
            ms = pa.Array.from_buffers(_INT64, self.n, [None, pa.py_buffer(fixed)])
        return pc.multiply_checked(ms, pa.scalar(1000, _INT64)).view(TIMESTAMP_TYPE)

    def _message_ids(self, offsets: pa.Array) -> pa.Array:
        """32 hex digits of base_message_id + delta per record.

        A broker's ids are (broker, partition tag, offset): within a run of records the first 24 digits
        are the same and the last 8 are the low 32 bits of the offset (plus a constant), formatted by
        :func:`_hex8`. A batch whose ids cross a 2**32 boundary is formatted in Python.
        """
        parts: list[pa.Array] = []
        run: list[Any] = []  # [row, count, prefix, shift] of the current vectorised run
        row = 0
        for span in self.spans:
            d, m = span.deltas, len(span.deltas)
            first_id, last_id = span.base_id + d[0], span.base_id + d[-1]
            if _LITTLE and first_id >> 32 == last_id >> 32:
                prefix = f"{first_id >> 32:024x}"
                shift = (first_id & 0xFFFFFFFF) - (span.base_offset + d[0])
                if run and run[2] == prefix and run[3] == shift:
                    run[1] += m
                else:
                    if run:
                        parts.append(_ids_with_prefix(offsets.slice(run[0], run[1]), run[3], run[2]))
                    run = [row, m, prefix, shift]
            else:
                if run:
                    parts.append(_ids_with_prefix(offsets.slice(run[0], run[1]), run[3], run[2]))
                    run = []
                parts.append(pa.array([f"{span.base_id + x:032x}" for x in d], pa.string()))
            row += m
        if run:
            parts.append(_ids_with_prefix(offsets.slice(run[0], run[1]), run[3], run[2]))
        return parts[0] if len(parts) == 1 else pa.concat_arrays(parts)


def _var_width(typ: pa.DataType, n: int, lengths: array, parts: list[memoryview]) -> pa.Array:
    """A binary/string array from 0 + the n lengths (-1: null) and the concatenated bytes."""
    lens = pa.Array.from_buffers(_INT32 if lengths.typecode == "i" else pa.int16(), n + 1,
                                 [None, pa.py_buffer(lengths)])
    if lens.type != _INT32:
        lens = lens.cast(_INT32)
    nulls = lengths.count(-1)
    validity = None
    if nulls:
        validity = pc.not_equal(lens.slice(1), _MINUS1_32)
        if validity.offset:
            validity = pa.concat_arrays([validity])
        lens = pc.max_element_wise(lens, _ZERO32)
    # one immutable section (e.g. a reply holding one large batch) is used in place, without a copy
    data = pa.py_buffer(parts[0] if len(parts) == 1 and parts[0].readonly else b"".join(parts))
    return pa.Array.from_buffers(typ, n, [None if validity is None else validity.buffers()[1],
                                          pc.cumulative_sum(lens).buffers()[1], data], null_count=nulls)


def fetch_to_arrow(records: bytes | memoryview, topic: str, partition: PartitionId, start: int,
                   end: int) -> tuple[list[pa.RecordBatch], int, int]:
    """The records with start <= offset < end among the whole batches of a fetch reply, as Arrow batches
    in :data:`ARROW_SCHEMA` (one, unless the reply exceeds :data:`CHUNK_BYTES` or :data:`CHUNK_ROWS`);
    the offset to fetch next (``start`` if the reply held no whole batch at or after ``start``); and the
    base offset of the first batch that reaches past ``start`` (-1 if none): if it is above ``start``,
    the offsets in between are missing.

    Every batch is CRC-checked (:func:`~metaq.client.fetched_columns`, whose rules for damage apply).
    Batches a server-side filter thinned out (fewer records than offsets, possibly none) take their
    offsets from the deltas and still advance the next offset past them.
    """
    fetched = fetched_columns(records, start, end, f"{topic}:{partition}")
    return _arrow_batches(fetched.spans, topic, partition), fetched.next_offset, fetched.first_base_offset


def _arrow_batches(spans: list[ColumnSpan], topic: str, partition: PartitionId) -> list[pa.RecordBatch]:
    out: list[pa.RecordBatch] = []
    rows = _Rows()
    for span in spans:
        if not rows.add(span):
            out.append(rows.build(topic, partition))
            rows = _Rows()
            rows.add(span)
    if rows.n:
        out.append(rows.build(topic, partition))
    return out


# -- the Message-based reference ----------------------------------------------------------------------

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


def to_record_batch(messages: Sequence[Message], topic: str, partition: PartitionId) -> pa.RecordBatch:
    """Messages of one partition (ascending offsets) as an Arrow batch in :data:`ARROW_SCHEMA`.

    The reference for :func:`fetch_to_arrow`: the same rows from Message objects, several times slower."""
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
        pa.repeat(pa.scalar(partition.broker_id, pa.int32()), n),
        pa.repeat(pa.scalar(partition.partition, pa.int32()), n),
        offsets,
        pa.array([(m.timestamp_ms if m.timestamp_ms >= 0 else m.append_time_ms) * 1000 for m in messages],
                 TIMESTAMP_TYPE),
        pa.array(_message_ids(messages), pa.string()),
        pa.nulls(n, HEADERS_TYPE) if _all_none(headers) else pa.array(headers, HEADERS_TYPE),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


# -- reading a range --------------------------------------------------------------------------------

def read_range(client: BlockingClient, topic: str, partition: PartitionKey, start: int, end: int, *,
               max_bytes: int, fail_on_data_loss: bool = True, new_partition: bool = False,
               stall_timeout_s: float = 30.0) -> Iterator[pa.RecordBatch]:
    """Exactly the messages with offsets in [start, end) of one partition, in order.

    Deterministic for a range while the data is retained. When the range starts below the log start
    (retention deleted it), fails with :class:`DataLossError` if ``fail_on_data_loss``, else skips to
    the earliest message still stored. ``new_partition``: the partition appeared after the query
    started, so starting past 0 is not a loss. Missing offsets are recognised from the batch headers
    (the first batch of a reply starting past the offset asked for), so a batch that a server-side filter
    thinned out is not mistaken for a loss.

    Pipelined: as soon as a reply arrives, the fetch after it (from the end of its last whole batch) is
    sent, so that the broker reads and sends it while this one becomes Arrow and Spark takes it. That
    fetch is used only if it asked for exactly the offset the reply led to (and the same size); otherwise
    (damaged data, a gap) its reply is read and dropped and the right offset fetched. At most one fetch is
    ahead; one still in flight when the caller stops early is given up with its connection.
    """
    offset = start
    fetch_bytes = max_bytes
    stalled_since: float | None = None
    partition = client.resolve(topic, partition)
    where = f"{topic}:{partition}"
    ahead: PendingFetch | None = None
    try:
        while offset < end:
            pending, ahead = ahead, None
            try:
                if pending is not None and (pending.offset, pending.max_bytes) != (offset, fetch_bytes):
                    _drop(pending)
                    pending = None
                resp = pending.result() if pending is not None else client.fetch(topic, partition, offset,
                                                                                  fetch_bytes)
                if resp.reset_offset < 0 or resp.reset_offset == offset:
                    after = next_fetch_offset(resp.records, offset, end)
                    if offset < after < end:
                        ahead = client.send_fetch(topic, partition, after, max_bytes)
                    fetched = fetched_columns(resp.records, offset, end, where)
            except OffsetOutOfRangeError:
                bounds = client.list_offsets(topic, partition, -1)
                offset = _after_loss(where, offset, end, bounds.log_start_offset, bounds.log_end_offset,
                                     fail_on_data_loss, new_partition)
                continue
            except CorruptRecordError as exc:
                offset = _after_damage(where, offset, end, exc, fail_on_data_loss)
                continue
            if resp.reset_offset >= 0 and resp.reset_offset != offset:
                # a broker with updateConsumerOffsets=true served from its nearest valid offset instead
                offset = _after_loss(where, offset, end, resp.log_start_offset, resp.log_end_offset,
                                     fail_on_data_loss, new_partition)
                continue
            if fetched.first_base_offset > offset:
                # the first batch we got starts past the offset asked for: the ones between are gone
                _after_loss(where, offset, end, fetched.first_base_offset, resp.log_end_offset, fail_on_data_loss,
                            new_partition)
            if fetched.next_offset > offset:
                stalled_since = None
                fetch_bytes = max_bytes
                yield from _arrow_batches(fetched.spans, topic, partition)
                offset = fetched.next_offset
                continue
            # no whole batch at `offset` in the reply
            head = fetched.first_batch
            if head is not None and head[1] > fetch_bytes:
                if head[1] > MAX_FETCH_BYTES:
                    raise MetaqError(f"{where}: the stored batch at offset {head[0]} is {head[1]} bytes, more "
                                     f"than the reader's limit of {MAX_FETCH_BYTES}")
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
    finally:
        if ahead is not None:
            ahead.cancel()


def _drop(pending: PendingFetch) -> None:
    """Read and drop the reply of a fetch sent ahead that turned out not to be wanted."""
    try:
        pending.result()
    except BrokerError:
        pass


def _after_damage(where: str, offset: int, end: int, exc: CorruptRecordError, fail: bool) -> int:
    """The offset to continue from after stored data at ``offset`` was found damaged (or raise)."""
    resume = exc.resume_offset
    if fail or resume <= offset:
        skip = (f"; set failOnDataLoss=false to skip the damaged range (offsets {offset}..{resume - 1})"
                if resume > offset else "")
        raise DataLossError(f"{where}: stored data at offset {offset} is damaged ({exc}){skip}; "
                            "`metaq admin verify` lists damaged ranges") from None
    log.warning("%s: skipping damaged offsets %d..%d (%d messages) as failOnDataLoss=false: %s", where, offset,
                resume - 1, resume - offset, exc)
    return min(resume, end)


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
