"""Reading record batches (the consumer's side, and the broker's readers): whole batches checked and split into
columns, Messages built from them one at a time, and a fetch reply walked batch by batch."""

from __future__ import annotations

import gc
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import fields
from itertools import accumulate, pairwise, repeat
from typing import Any, TypeVar

from metaq import _compiled
from metaq.errors import CorruptRecordError, ProtocolError
from metaq.protocol.records import validate
from metaq.protocol.records.format import (
    HEADER_BYTES,
    HEADER_NAME,
    HEADER_VALUE,
    BatchHeader,
    check_attributes,
    compute_crc,
    read_header,
)
from metaq.protocol.records.validate import Columns, batch_body
from metaq.types import Message, PartitionId


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
    if validate.validate_plain is None:
        return None
    header: BatchHeader | None = validate.validate_plain(batch, _NO_LIMIT, _NO_LIMIT, BatchHeader)
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
        """``brokerId-partition`` the batch was read from."""
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
