"""Fetch and ListOffsets: reading a partition, long polling at its end, and finding offsets in it.

A fetch reply's records are the stored bytes, unchanged: a :class:`~metaq.broker.session.FileReply`
that the TCP transport sends with sendfile, or (small replies, group filters) bytes read here.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from metaq.broker.error_mapping import wire_error
from metaq.broker.filters import filter_fetched, group_filter
from metaq.broker.groups import validate_group
from metaq.broker.session import FileReply, Session
from metaq.errors import InvalidRequestError, OffsetOutOfRangeError, PartitionClosedError, UnknownTopicError
from metaq.protocol import messages as m
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
    try:
        if req.offset < 0:
            raise OffsetOutOfRangeError(f"offset must be >= 0; got {req.offset}")
        offset, reset = _resolve_offset(broker, plog, req.offset)
    except OffsetOutOfRangeError as exc:
        return _error_with_range(plog, exc)
    if offset >= plog.log_end_offset and req.max_wait_ms > 0:
        return _long_poll(broker, req, plog, offset, reset, session)
    return _fetch_now(broker, req, plog, offset, reset)


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
                     session: Session | None) -> Any:
    deadline = time.monotonic() + min(req.max_wait_ms, LONG_POLL_MAX_MS) / 1000
    while offset >= plog.log_end_offset and not broker.stopping:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        await broker.waiters.wait(req.topic, req.partition, remaining, session)
        if broker.logs.get(req.topic, req.partition) is not plog:
            raise UnknownTopicError(f"topic {req.topic!r} was deleted while the fetch waited")
    return _fetch_now(broker, req, plog, offset, reset)


def _fetch_now(broker: Broker, req: m.FetchRequest, plog: PartitionLog, offset: int, reset: int) -> Any:
    max_bytes = min(req.max_bytes, broker.config.max_transfer_bytes)
    counters = broker.stats.partition(req.topic, req.partition)
    counters.get_requests += 1
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
    response = m.FetchResponse(log_start_offset=plog.log_start_offset, log_end_offset=plog.log_end_offset,
                               reset_offset=reset)
    if fslice.size == 0:
        fslice.release()
        counters.get_misses += 1
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
