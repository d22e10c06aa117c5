"""Fetch and ListOffsets: reading a partition, long polling at its end, and finding offsets in it.

A fetch reply's records are the stored bytes, unchanged: a :class:`~metaq.broker.session.FileReply`
that the TCP transport sends with sendfile, or (small replies, group filters) bytes read here. A Fetch
reply whose bytes are not in the page cache (old data: a consumer reading a backlog) is read in a worker
thread instead, so that the disk read does not stop the event loop (and every producer with it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from metaq.broker.error_mapping import error_response, wire_error
from metaq.broker.filters import filter_fetched, group_filter
from metaq.broker.groups import validate_group
from metaq.broker.session import DeferredReply, FileReply, Session
from metaq.errors import InvalidRequestError, OffsetOutOfRangeError, PartitionClosedError, UnknownTopicError
from metaq.protocol import messages as m
from metaq.protocol.records import peek_length
from metaq.storage import FileSlice, OffsetOutOfRange, PartitionLog, fileslice
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
                return _diverged(plog, bound.extra)
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
    return _fetch_now(broker, req, plog, offset, reset, bound, off_loop=True)


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


def _diverged(plog: PartitionLog, extra: dict[str, int]) -> m.FetchResponse:
    """A slave's fetch whose log is not a prefix of the master's: where to cut (``extra``), no records."""
    return _with(m.FetchResponse(log_start_offset=plog.log_start_offset, log_end_offset=plog.log_end_offset),
                 extra)


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


def _long_poll(broker: Broker, req: m.FetchRequest, plog: PartitionLog, offset: int, reset: int,
               session: Session | None, bound: _Bound) -> DeferredReply:
    """Wait at the end of the partition. The reply is answered by the waiter's wake-up callback inside
    the append's notify (the same loop step), as soon as there is something this fetch may return:
    past ``bound`` (the high watermark under HA), which is checked again at every wake-up."""
    deadline = time.monotonic() + min(req.max_wait_ms, LONG_POLL_MAX_MS) / 1000
    reply = DeferredReply()

    def woken(timed_out: bool) -> None:
        try:
            if broker.logs.get(req.topic, req.partition) is not plog:
                raise UnknownTopicError(f"topic {req.topic!r} was deleted while the fetch waited")
            if offset >= bound.end() and not (timed_out or broker.stopping or time.monotonic() >= deadline):
                broker.waiters.rearm(waiter)  # woken, but nothing it may see yet (the watermark)
                return
            answer: Any = None
            if req.replica_id >= 0 and broker.ha is not None:
                # a slave's: the records' epoch and the watermark as they are now, not when it came in
                bound.extra, bound.stop_before = broker.ha.replica_reply(req, plog)
                if bound.extra.get("diverging_end_offset", -1) >= 0:
                    answer = _diverged(plog, bound.extra)
            if answer is None:
                answer = _fetch_now(broker, req, plog, offset, reset, bound)
        except Exception as exc:
            answer = error_response(m.FetchRequest.API_KEY, exc)
        broker.waiters.finish(waiter)
        reply.resolve(answer)

    waiter = broker.waiters.park(((req.topic, req.partition),), deadline - time.monotonic(), session, woken)
    reply.on_cancel = lambda: broker.waiters.finish(waiter)
    return reply


def _fetch_now(broker: Broker, req: m.FetchRequest, plog: PartitionLog, offset: int, reset: int,
               bound: _Bound | None = None, *, off_loop: bool = False) -> Any:
    """The reply to a fetch at ``offset``: a FetchResponse, a FileReply, or (``off_loop``, for a slice not in
    the page cache) a coroutine of the FetchResponse with the bytes read in a worker thread."""
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
    try:
        accept = group_filter(broker.filters, broker.topics[req.topic].settings, req.group) if req.group else None
    except BaseException:
        fslice.release()
        raise
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
    if off_loop and not _cached(fslice):
        return _read_off_loop(response, fslice)
    return FileReply(response, fslice)


def _cached(fslice: FileSlice) -> bool:
    """Whether the first and the last byte of ``fslice`` are in the page cache (``fileslice.page_cached``:
    True when it cannot tell): if so the reply is sent from the loop as usual; the pages between them are
    read ahead (storage asks for readahead past every read), so the two ends stand for the whole."""
    fd = fslice.fileno()
    return all(fileslice.page_cached(fd, position) is not False
               for position in (fslice.position, fslice.position + fslice.size - 1))


async def _read_off_loop(response: m.FetchResponse, fslice: FileSlice) -> m.FetchResponse:
    """``response`` with the slice's bytes, read in the loop's default executor (a disk read off the loop)."""
    try:
        response.records = await asyncio.get_running_loop().run_in_executor(None, fslice.read_bytes)
    finally:
        fslice.release()
    return response


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


# -- MultiFetch: many partitions, one request, one long poll ----------------------------------------

def handle_multi_fetch(broker: Broker, req: m.MultiFetchRequest, session: Session | None) -> Any:
    """Every partition of ``req`` read as a single Fetch would read it, in one reply.

    The request as a whole is refused (INVALID_REQUEST) for limits a client sets: no partitions, more
    than MULTI_FETCH_PARTITIONS_MAX, a partition named twice, max_bytes or a partition_max_bytes <= 0.
    What depends on a partition's state (unknown, closed, an offset out of range, damaged data) is that
    partition's own error, as a single Fetch of it would answer. When none has anything to read and
    ``max_wait_ms`` > 0, one waiter stands on all of them until an append to any, or the time is up.
    """
    if req.group:
        validate_group(req.group)
    count = len(req.partitions)
    if not 0 < count <= m.MULTI_FETCH_PARTITIONS_MAX:
        raise InvalidRequestError(f"a MultiFetch names 1..{m.MULTI_FETCH_PARTITIONS_MAX} partitions; got {count}")
    if req.max_bytes <= 0:
        raise InvalidRequestError(f"max_bytes must be > 0; got {req.max_bytes}")
    seen: set[tuple[str, int]] = set()
    for p in req.partitions:
        key = (p.topic, p.partition)
        if key in seen:
            raise InvalidRequestError(f"partition {p.topic}-{p.partition} is named twice in one MultiFetch")
        seen.add(key)
        if p.partition_max_bytes <= 0:
            raise InvalidRequestError(
                f"partition_max_bytes must be > 0; got {p.partition_max_bytes} for {p.topic}-{p.partition}")
    plans = [_plan(broker, req.group, p) for p in req.partitions]
    if req.max_wait_ms > 0 and not any(plan.ready() for plan in plans):
        return _multi_long_poll(broker, req, plans, session)
    return _multi_answer(broker, req, plans)


class _Plan:
    """One partition of a MultiFetch: its log and where it reads, or the error that answers it."""

    __slots__ = ("bound", "error", "offset", "plog", "request", "reset")

    def __init__(self, request: m.FetchRequest) -> None:
        self.request = request
        self.plog: PartitionLog | None = None
        self.bound: _Bound | None = None
        self.offset = -1
        self.reset = -1
        self.error: m.FetchedPartition | None = None

    def ready(self) -> bool:
        """Something to answer now: an error, or data past the offset."""
        return self.error is not None or (self.bound is not None and self.offset < self.bound.end())


def _plan(broker: Broker, group: str, p: m.FetchPartition) -> _Plan:
    plan = _Plan(m.FetchRequest(p.topic, p.partition, p.offset, p.partition_max_bytes, 0, group))
    try:
        state, plog = broker.partition_log(p.topic, p.partition)
        if not state.settings.accept_subscribe:
            raise PartitionClosedError(f"topic {p.topic!r} does not accept subscribing (acceptSubscribe=false)")
    except Exception as exc:
        code, message = wire_error(exc, "MultiFetch")
        plan.error = m.FetchedPartition(p.topic, p.partition, code, message)
        return plan
    plan.plog = plog
    plan.bound = bound = _Bound(plog)
    if broker.ha is not None:
        bound.visible = broker.ha.visible_end
    try:
        if p.offset < 0:
            raise OffsetOutOfRangeError(f"offset must be >= 0; got {p.offset}")
        plan.offset, plan.reset = _resolve_offset(broker, plog, p.offset)
    except OffsetOutOfRangeError as exc:
        plan.error = _fetched(p.topic, p.partition, _error_with_range(plog, exc))
    return plan


def _multi_long_poll(broker: Broker, req: m.MultiFetchRequest, plans: list[_Plan],
                     session: Session | None) -> DeferredReply:
    """One waiter on every partition; answered inside the notify of the append that gives it enough."""
    deadline = time.monotonic() + min(req.max_wait_ms, LONG_POLL_MAX_MS) / 1000
    keys = [(plan.request.topic, plan.request.partition) for plan in plans]
    reply = DeferredReply()

    def woken(timed_out: bool) -> None:
        try:
            for plan in plans:
                if plan.plog is not None and \
                        broker.logs.get(plan.request.topic, plan.request.partition) is not plan.plog:
                    plan.plog = plan.bound = None
                    plan.error = m.FetchedPartition(
                        plan.request.topic, plan.request.partition, UnknownTopicError.code,
                        f"topic {plan.request.topic!r} was deleted while the fetch waited")
            enough = any(plan.ready() for plan in plans) and (req.min_bytes <= 1 or _available(plans) >= req.min_bytes)
            if not (enough or timed_out or broker.stopping or time.monotonic() >= deadline):
                broker.waiters.rearm(waiter)
                return
            answer = _multi_answer(broker, req, plans)
        except Exception as exc:
            answer = error_response(m.MultiFetchRequest.API_KEY, exc)
        broker.waiters.finish(waiter)
        reply.resolve(answer)

    waiter = broker.waiters.park(keys, deadline - time.monotonic(), session, woken)
    reply.on_cancel = lambda: broker.waiters.finish(waiter)
    return reply


def _available(plans: list[_Plan]) -> int:
    """Bytes readable now over the plans, roughly (whole segments' worth is not read to know it)."""
    total = 0
    for plan in plans:
        if plan.plog is not None and plan.bound is not None and plan.offset < plan.bound.end():
            try:
                fslice = plan.plog.read(plan.offset, plan.request.max_bytes)
            except (OffsetOutOfRange, DamagedData):
                return 1 << 62  # an error to report: answer now
            total += fslice.size
            fslice.release()
    return total


def _multi_answer(broker: Broker, req: m.MultiFetchRequest, plans: list[_Plan]) -> m.MultiFetchResponse:
    """Read every partition, in the request's order, until max_bytes is used up: the partitions after
    that answer with no records (the client asks them again). Each partition reads at most
    maxTransferSize, as a single Fetch; the whole reply at most half the frame limit."""
    budget = min(req.max_bytes, broker.config.max_frame_bytes // 2)
    out = []
    for plan in plans:
        topic, partition = plan.request.topic, plan.request.partition
        if plan.error is not None:
            out.append(plan.error)
            continue
        assert plan.plog is not None and plan.bound is not None
        plog = plan.plog
        if budget <= 0 or plan.offset >= plan.bound.end():
            out.append(m.FetchedPartition(topic, partition, log_start_offset=plog.log_start_offset,
                                          log_end_offset=plog.log_end_offset, reset_offset=plan.reset,
                                          high_watermark=_visible(plan)))
            continue
        plan.request.max_bytes = min(plan.request.max_bytes, budget)
        answer = _fetch_now(broker, plan.request, plog, plan.offset, plan.reset, plan.bound)
        if isinstance(answer, FileReply):  # several records fields in one reply: read, not sendfile
            try:
                answer.response.records = answer.file_slice.read_bytes()
            finally:
                answer.file_slice.release()
            answer = answer.response
        fetched = _fetched(topic, partition, answer)
        fetched.high_watermark = _visible(plan)
        budget -= len(fetched.records)
        out.append(fetched)
    return m.MultiFetchResponse(partitions=out)


def _visible(plan: _Plan) -> int:
    """What consumers may read up to when HA holds some of the log back (-1: all of it)."""
    return plan.bound.end() if plan.bound is not None and plan.bound.visible is not None else -1


def _fetched(topic: str, partition: int, resp: m.FetchResponse) -> m.FetchedPartition:
    return m.FetchedPartition(topic, partition, resp.error_code, resp.error_message, resp.log_start_offset,
                              resp.log_end_offset, resp.reset_offset, resp.damaged_offset, resp.resume_offset,
                              records=resp.records)


HANDLERS: dict[type, Handler] = {m.FetchRequest: handle_fetch, m.ListOffsetsRequest: handle_list_offsets,
                                 m.MultiFetchRequest: handle_multi_fetch}
