"""Record batches whole, for code that reads and writes them without Message objects: a fetch reply taken apart
into checked columns, and payloads cut into batches to produce. The Spark source builds its Arrow batches from
:func:`fetched_columns` and its sink produces :func:`value_batches` through a
:class:`~metaq.client.blocking.BlockingClient` (docs/client.md, "Blocking client").

A fetch reply (``FetchResponse.records``) holds whole stored batches from the one holding the offset asked for,
and may end inside one (``max_bytes``). :func:`fetched_columns` takes the whole batches that hold offsets in
``[start, end)`` apart with the consumer's checks: each header and the offsets' continuity, each batch's CRC32C
and every column; compressed batches are inflated. What it gives per batch is the batch's raw columns
(:class:`ColumnSpan`): length arrays and the sections of keys, values, attributes and headers, from which a
reader builds arrays for a whole reply at once. :class:`~metaq.client.MessageBatch` is the per-record view over
the same columns.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from metaq.errors import CorruptRecordError
from metaq.protocol.records import (
    HEADER_BYTES,
    RECORD_OVERHEAD_BYTES,
    BatchHeader,
    Compression,
    batch_columns,
    damaged_batch_error,
    encode_values,
    fetched_batches,
    peek_length,
)

__all__ = ["ColumnSpan", "FetchedColumns", "fetched_columns", "next_fetch_offset", "value_batches"]


@dataclass(frozen=True, slots=True)
class ColumnSpan:
    """Records ``lo`` to ``hi - 1`` (``lo < hi``) of one stored batch: those in the range a reader asked for.

    ``columns`` are the batch's checked columns, one entry per record of the whole batch: ``n`` (records),
    ``deltas`` (offset deltas, ``array('i')``: offset = ``header.base_offset + delta``, message id =
    ``header.base_message_id + delta``; ``dense`` when they are 0..n-1), ``timestamps`` (``array('q')``, ms; < 0:
    none, the append time stands in), ``klens``, ``vlens`` (``array('i')``), ``alens``, ``hcounts``
    (``array('h')``): the lengths of keys, values and attributes (-1: none) and the header counts; ``body`` (the
    batch's bytes, or the inflated bytes of a compressed one) with the starts of its sections ``keys_at``,
    ``values_at``, ``attrs_at``, ``headers_at``, each section the records' fields back to back; ``no_keys``,
    ``no_attrs``, ``no_headers`` when no record has one."""

    header: BatchHeader
    """The stored batch's header: ``base_offset``, ``base_message_id``, ``append_time_ms``, ``next_offset``."""
    columns: Any
    lo: int
    hi: int


@dataclass(frozen=True, slots=True)
class FetchedColumns:
    """What :func:`fetched_columns` found in a fetch reply."""

    spans: list[ColumnSpan]
    """The records in the range, batch by batch, in offset order (batches with none there are left out)."""
    next_offset: int
    """Where the next fetch starts: past the last whole batch taken (at most ``end``); ``start`` if the reply held
    no whole batch from ``start`` on."""
    first_base_offset: int
    """The base offset of the first batch reaching past ``start`` (-1: none). Above ``start``, the offsets in
    between are not stored any more (a batch a server-side filter thinned out still starts at its base offset)."""
    first_batch: tuple[int, int] | None = None
    """When the reply held no whole batch from ``start`` on: (base offset, size in bytes) of the batch it starts
    with, unchecked (a size above the fetch's ``max_bytes``: that batch is larger than the fetch asked for)."""


def _batches_in_range(view: memoryview, start: int, end: int) -> Iterator[tuple[int, BatchHeader]]:
    """(position, header) of the whole batches of a fetch reply holding offsets in [start, end), headers and offset
    continuity checked (CorruptRecordError naming the offset otherwise)."""
    for pos, header in fetched_batches(view, start):
        if header.base_offset >= end:
            return
        yield pos, header
        if header.next_offset >= end:
            return


def fetched_columns(records: bytes | memoryview, start: int, end: int, where: str = "") -> FetchedColumns:
    """The records with ``start <= offset < end`` among the whole batches of a fetch reply, as the checked columns
    of their batches (see the module docstring); ``where`` (e.g. ``"topic:1-0"``) prefixes the damage errors.

    A damaged batch ends the reply: the intact batches before it are returned (``next_offset`` then points at the
    damage, where the next fetch fails again); only when there are none does it raise CorruptRecordError, whose
    ``offset`` says where the damage is and ``resume_offset``, when the header is intact, where it ends.
    """
    spans: list[ColumnSpan] = []
    next_offset = start
    first_base = -1
    view = memoryview(records)
    try:
        for pos, header in _batches_in_range(view, start, end):
            if first_base < 0:
                first_base = header.base_offset
            try:
                _, cols = batch_columns(view[pos:pos + header.total_bytes], header, verify=True)
            except CorruptRecordError as exc:
                raise damaged_batch_error(exc, header, start, where) from None
            lo, hi = 0, cols.n
            if header.base_offset < start or header.next_offset > end:
                lo = bisect_left(cols.deltas, start - header.base_offset)
                hi = bisect_left(cols.deltas, end - header.base_offset)
            if lo < hi:
                spans.append(ColumnSpan(header, cols, lo, hi))
            next_offset = min(header.next_offset, end)
    except CorruptRecordError:
        if next_offset == start:
            raise
    first_batch = peek_length(view) if next_offset == start else None
    return FetchedColumns(spans, next_offset, first_base, first_batch)


def next_fetch_offset(records: bytes | memoryview, start: int, end: int) -> int:
    """Where the fetch after this reply starts if every whole batch in it is intact: the end of its last whole batch
    below ``end`` (``start`` if there is none, or a header is damaged). Headers only, no CRC: a guess made before the
    reply is taken apart, so that the next fetch can be on its way meanwhile."""
    nxt = start
    try:
        for _pos, header in _batches_in_range(memoryview(records), start, end):
            nxt = min(header.next_offset, end)
    except CorruptRecordError:
        return start
    return nxt


def value_batches(values: Sequence[bytes], timestamp_ms: int, batch_bytes: int,
                  compression: Compression = Compression.NONE) -> Iterator[tuple[bytes, int]]:
    """Payloads (no key, attribute or headers) sharing one timestamp, cut into record batches of at most
    ``batch_bytes`` each before compression (a payload larger than that goes alone): (batch, record count) per batch,
    in order, each built when the iteration reaches it."""
    limit = batch_bytes - HEADER_BYTES
    start, size = 0, 0
    for i, v in enumerate(values):
        record = RECORD_OVERHEAD_BYTES + len(v)
        if size + record > limit and i > start:
            yield encode_values(values[start:i], timestamp_ms, compression), i - start
            start, size = i, 0
        size += record
    if start < len(values):
        yield encode_values(values[start:], timestamp_ms, compression), len(values) - start
