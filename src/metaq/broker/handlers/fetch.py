"""Fetch and ListOffsets: reading a partition, long polling at its end, and finding offsets in it.

A fetch reply's records are the stored bytes, unchanged: a :class:`~metaq.broker.session.FileReply`
that the TCP transport sends with sendfile, or (small replies, group filters) bytes read here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from metaq.broker.error_mapping import wire_error
from metaq.broker.filters import filter_fetched, group_filter
from metaq.broker.groups import validate_group
from metaq.broker.session import FileReply, Session
from metaq.errors import InvalidRequestError, OffsetOutOfRangeError, PartitionClosedError, UnknownTopicError
from metaq.protocol import messages as m
from metaq.protocol.records import peek_length
from metaq.storage import OffsetOutOfRange, PartitionLog
from metaq.storage.errors import DamagedData

if TYPE_CHECKING:
    from metaq.broker.core import Broker, Handler

SENDFILE_MIN_BYTES = 16 * 1024
"""Smaller fetch replies are read into memory and written in one go: cheaper than a sendfile round."""
LONG_POLL_MAX_MS = 600_000
"""A fetch's max_wait_ms is cut to this."""


def handle_fetch(broker: Broker, req: m.FetchRequest, session: Session | None) -> Any:
    state, plog = broker.partition_log(req.topic, req.partition)
    if req.group:
        validate_group(req.group)
    if not state.settings.accept_subscribe:
        raise PartitionClosedError(f"topic {req.topic!r} does not accept subscribing (acceptSubscribe=false)")
    if req.max_bytes <= 0:
        raise InvalidRequestError(f"max_bytes must be > 0; got {req.max_bytes}")
    bound = _Bound(plog)
    ha = broker.ha
    if ha is not None:
        if req.replica_id >= 0:  # a slave of this master (HA mode): epochs, divergence, its progress
            # before the range check: a slave ahead of a new master learns where to cut, not "out of range"
            bound.extra, bound.stop_before = ha.replica_fetch(req, plog)
            if bound.extra.get("diverging_end_offset", -1) >= 0:
                return _with(m.FetchResponse(log_start_offset=plog.log_start_offset,
                                             log_end_offset=plog.log_end_offset), bound.extra)
        else:
            bound.visible = ha.visible_end
    try:
        if req.offset < 0:
            raise OffsetOutOfRangeError(f"offset must be >= 0; got {req.offset}")
        offset, reset = _resolve_offset(broker, plog, req.offset)
    except OffsetOutOfRangeError as exc:
        return _error_with_range(plog, exc)
    if offset >= bound.end() and req.max_wait_ms > 0:
        return _long_poll(broker, req, plog, offset, reset, session, bound)
    return _fetch_now(broker, req, plog, offset, reset, bound)


class _Bound:
    """Where a fetch reply stops: the log end, or for consumers of a sync-replicated partition the high
    watermark, and for a slave the end of the epoch its offset is in."""

    __slots__ = ("extra", "plog", "stop_before", "visible")

    def __init__(self, plog: PartitionLog) -> None:
        self.plog = plog
        self.visible: Callable[[PartitionLog], int] | None = None
        self.stop_before = -1
        self.extra: dict[str, int] = {}

    def end(self) -> int:
        end = self.plog.log_end_offset if self.visible is None else self.visible(self.plog)
        return end if self.stop_before < 0 else min(end, self.stop_before)


def _error_with_range(plog: PartitionLog, exc: Exception, damaged_offset: int = -1,
                      resume_offset: int = -1) -> m.FetchResponse:
    """A fetch error carrying the partition's valid range (and where damage is), so that a consumer can
    reposition without asking again."""
    code, message = wire_error(exc, "Fetch")
    return m.FetchResponse(error_code=code, error_message=message, log_start_offset=plog.log_start_offset,
                           log_end_offset=plog.log_end_offset, damaged_offset=damaged_offset,
                           resume_offset=resume_offset)


def _resolve_offset(broker: Broker, plog: PartitionLog, offset: int) -> tuple[int, int]:
    """(offset to read, reset_offset) applying updateConsumerOffsets to an out-of-range offset."""
    start, end = plog.log_start_offset, plog.log_end_offset
    if start <= offset <= end:
        return offset, -1
    if not broker.config.update_consumer_offsets:
        raise OffsetOutOfRangeError(
            f"offset {offset} is out of range for {plog.topic}-{plog.partition}: valid offsets are "
            f"{start}..{end} (earliest..latest)")
    nearest = start if offset < start else end
    return nearest, nearest


async def _long_poll(broker: Broker, req: m.FetchRequest, plog: PartitionLog, offset: int, reset: int,
                     session: Session | None, bound: _Bound) -> Any:
    deadline = time.monotonic() + min(req.max_wait_ms, LONG_POLL_MAX_MS) / 1000
    while offset >= bound.end() and not broker.stopping:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        await broker.waiters.wait(req.topic, req.partition, remaining, session)
        if broker.logs.get(req.topic, req.partition) is not plog:
            raise UnknownTopicError(f"topic {req.topic!r} was deleted while the fetch waited")
    return _fetch_now(broker, req, plog, offset, reset, bound)


def _fetch_now(broker: Broker, req: m.FetchRequest, plog: PartitionLog, offset: int, reset: int,
               bound: _Bound | None = None) -> Any:
    max_bytes = min(req.max_bytes, broker.config.max_transfer_bytes)
    counters = broker.stats.partition(req.topic, req.partition)
    counters.get_requests += 1
    end = bound.end() if bound is not None else plog.log_end_offset
    extra = bound.extra if bound is not None else {}
    if offset >= end and offset < plog.log_end_offset:  # held back (the high watermark): nothing yet
        counters.get_misses += 1
        return _with(m.FetchResponse(log_start_offset=plog.log_start_offset, log_end_offset=plog.log_end_offset,
                                     reset_offset=reset), extra)
    started = time.perf_counter()
    try:
        try:
            fslice = plog.read(offset, max_bytes)
        except OffsetOutOfRange:
            offset, reset = _resolve_offset(broker, plog, offset)
            fslice = plog.read(offset, max_bytes)
    except DamagedData as exc:
        counters.corrupt_reads += 1
        return _error_with_range(plog, exc, damaged_offset=exc.offset, resume_offset=exc.resume_offset)
    broker.stats.fetch_seconds.observe(time.perf_counter() - started)
    response = _with(m.FetchResponse(log_start_offset=plog.log_start_offset, log_end_offset=plog.log_end_offset,
                                     reset_offset=reset), extra)
    if fslice.size == 0:
        fslice.release()
        counters.get_misses += 1
        return response
    if fslice.next_offset > end:  # the reply must stop at a batch boundary before the whole slice
        try:
            data = fslice.read_bytes()
        finally:
            fslice.release()
        response.records = cut_before(data, end)
        counters.get_bytes += len(response.records)
        counters.get_messages += end - offset
        return response
    counters.get_bytes += fslice.size
    counters.get_messages += fslice.next_offset - offset
    accept = group_filter(broker.topics[req.topic].settings, req.group) if req.group else None
    if accept is not None:
        # a server-side filter for this group ([topic=...] group.NAME=module:callable): the
        # stored bytes are decoded and re-encoded without the rejected messages, so no sendfile
        try:
            data = fslice.read_bytes()
        finally:
            fslice.release()
        response.records = filter_fetched(data, accept, req.topic, req.partition)
        return response
    if fslice.size < SENDFILE_MIN_BYTES:
        try:
            response.records = fslice.read_bytes()
        finally:
            fslice.release()
        return response
    return FileReply(response, fslice)


def _with(response: m.FetchResponse, extra: dict[str, int]) -> m.FetchResponse:
    for name, value in extra.items():
        setattr(response, name, value)
    return response


def cut_before(data: bytes, offset: int) -> bytes:
    """The whole batches of ``data`` that start before ``offset`` (a batch boundary)."""
    position = 0
    while True:
        peeked = peek_length(data, position)
        if peeked is None or peeked[0] >= offset or position + peeked[1] > len(data):
            return data[:position]
        position += peeked[1]


def handle_list_offsets(broker: Broker, req: m.ListOffsetsRequest, session: Session | None) -> m.ListOffsetsResponse:
    _state, plog = broker.partition_log(req.topic, req.partition)
    if req.timestamp_ms == m.EARLIEST_TIMESTAMP:
        offset = plog.log_start_offset
    elif req.timestamp_ms == m.LATEST_TIMESTAMP:
        offset = plog.log_end_offset
    elif req.timestamp_ms < 0:
        raise InvalidRequestError(f"timestamp must be -2 (earliest), -1 (latest) or >= 0; got {req.timestamp_ms}")
    else:
        offset = plog.offset_for_timestamp(req.timestamp_ms)
    return m.ListOffsetsResponse(offset=offset, log_start_offset=plog.log_start_offset,
                                 log_end_offset=plog.log_end_offset)


HANDLERS: dict[type, Handler] = {m.FetchRequest: handle_fetch, m.ListOffsetsRequest: handle_list_offsets}
