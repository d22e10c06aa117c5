"""Produce: one record batch, checked and appended with one write, acknowledged per the flush policy.
MultiProduce: a batch for each of many partitions, each handled as a Produce of it, one reply for all.

A compressed batch is inflated to be checked (up to 4 x maxBatchSize), which takes tens to hundreds of
milliseconds for a compression bomb: such a request is checked in a worker thread (a small pool of its
own), and its connection handles nothing else meanwhile (``Session.hold``), so its batches are appended
in the order they came while every other connection is served."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from time import perf_counter
from typing import TYPE_CHECKING, Any

import zstandard

from metaq.broker.appending import ack_when_durable, await_ack, check_sequence
from metaq.broker.core import check_topic_name
from metaq.broker.delay.handler import produce_delayed
from metaq.broker.error_mapping import wire_error
from metaq.broker.handlers.fetch import SENDFILE_MIN_BYTES
from metaq.broker.handlers.transactions import put_into_transaction
from metaq.broker.session import DeferredReply, Session
from metaq.errors import (
    CorruptMessageError,
    InvalidArgument,
    InvalidRequestError,
    MessageTooLargeError,
    PartitionClosedError,
    ProtocolError,
    UnknownPartitionError,
    UnknownTopicError,
)
from metaq.protocol import messages as m
from metaq.protocol.records import (
    ATTR_DELAYED,
    HEADER_BYTES,
    PRODUCER_BLOCK_BYTES,
    PRODUCER_STAMPED,
    STAMPED_BYTES,
    BatchHeader,
    Compression,
    ProducerStamp,
    producer_stamp,
    validate_batch,
)
from metaq.storage.log import PartitionLog
from metaq.storage.producers import StoredBatch

if TYPE_CHECKING:
    from metaq.broker.core import Broker, Handler


Checked = tuple[BatchHeader, ProducerStamp | None] | Exception
"""A batch checked in advance (off the event loop): its header and producer stamp, or why it is refused."""
_CHECK_THREADS = 2
_checks: ThreadPoolExecutor | None = None


def handle_produce(broker: Broker, req: m.ProduceRequest, session: Session | None) -> Any:
    """The response, or (when the batch must be durable first) a DeferredReply or a coroutine of it.

    Per-batch work only: the batch header and columns are checked without a loop per message, the
    broker stamps the header, and the bytes are written as they came.
    """
    if _compressed(req.records):
        return _checked_off_loop(broker, session, [req.records], lambda checked: produce_batch(
            broker, req.topic, req.partition, req.records, req.transaction_id, checked[0])[1])
    return produce_batch(broker, req.topic, req.partition, req.records, req.transaction_id)[1]


_ATTRIBUTES_LOW_BYTE = STAMPED_BYTES + 1
"""The low byte of the batch's i16 attributes (bytes 45-46, records.py's layout): bits 0-2 its compression."""
INLINE_COMPRESSED_BYTES = 16 * 1024
"""A compressed batch up to this size is checked on the event loop: lz4 inflates it to at most ~4 MiB (its
ratio is at most ~255), a few milliseconds; a zstd frame only when it declares an inflated size up to
INLINE_INFLATED_BYTES (zstd stops at the size a frame declares; an undeclared one can inflate 64 MiB from a
few kilobytes). Anything larger costs a hand-off to a worker thread (~0.1-0.3 ms of CPU with the GIL)."""
INLINE_INFLATED_BYTES = 4 << 20


def _compressed(records: bytes | memoryview) -> bool:
    """Whether a batch is compressed and may take long to inflate (checked off the loop). A plain batch costs one
    byte read: this is on every produce's path. A batch too short to say is refused by the check on the loop."""
    if len(records) < HEADER_BYTES or not records[_ATTRIBUTES_LOW_BYTE] & 0x7:
        return False
    if len(records) > INLINE_COMPRESSED_BYTES:
        return True
    if records[_ATTRIBUTES_LOW_BYTE] & 0x7 != Compression.ZSTD:
        return False
    start = HEADER_BYTES + (PRODUCER_BLOCK_BYTES if records[_ATTRIBUTES_LOW_BYTE] & PRODUCER_STAMPED else 0)
    try:
        declared = zstandard.frame_content_size(bytes(records[start:]))
    except zstandard.ZstdError:
        return False  # not a zstd frame: refused by the check at once
    return not 0 <= declared <= INLINE_INFLATED_BYTES


def _check(records: bytes | memoryview, max_message_bytes: int, max_batch_bytes: int) -> Checked:
    try:
        header = validate_batch(records, max_message_bytes, max_batch_bytes)
        return header, producer_stamp(records, header) if header.attributes & PRODUCER_STAMPED else None
    except (InvalidArgument, ProtocolError) as exc:
        return exc


def _checked_off_loop(broker: Broker, session: Session | None, batches: Sequence[bytes | memoryview],
                      then: Callable[[list[Checked]], Any]) -> Coroutine[Any, Any, Any]:
    """Check ``batches`` in a worker thread, then call ``then`` with the results on the loop; the connection
    handles no other request until ``then`` has run (its appends keep their order)."""
    global _checks
    if _checks is None:
        _checks = ThreadPoolExecutor(_CHECK_THREADS, thread_name_prefix="metaq-batch-check")
    hold: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    if session is not None:
        session.hold = hold
    config = broker.config
    executor = _checks

    async def run() -> Any:
        try:
            checked = await asyncio.get_running_loop().run_in_executor(
                executor, lambda: [_check(b, config.max_message_bytes, config.max_batch_bytes) for b in batches])
            result = then(checked)
        finally:
            if not hold.done():
                hold.set_result(None)
        if isinstance(result, DeferredReply):
            return await result.wait()
        if isinstance(result, Coroutine):
            return await result
        return result

    return run()


def produce_batch(broker: Broker, topic: str, partition: int, records: bytes | memoryview,
                  transaction_id: str, checked: Checked | None = None) -> tuple[int, Any]:
    """One produced batch (a Produce's, or one of a MultiProduce's): the partition it went to, and its
    ProduceResponse, or a DeferredReply or coroutine of it when its ack waits (flush policy, sync
    replication). Raises for a batch refused before anything was stored. ``checked``: the batch was checked
    in advance (off the loop)."""
    broker.refuse_writes_on_slave("produce requests")
    state = broker.topics.get(topic)
    if state is None:  # a topic that exists had its name checked when it was created
        check_topic_name(topic)
    if partition < m.ANY_PARTITION:  # refused before a dynamic topic is created for it
        valid = f"partitions 0..{state.num_partitions - 1} or" if state is not None else "a partition >= 0 or"
        raise UnknownPartitionError(f"topic {topic!r} takes {valid} -1 (any open partition); got {partition}")
    if state is None:
        if not broker.config.auto_create_topics:
            raise UnknownTopicError(f"topic {topic!r} does not exist and autoCreateTopics=false")
        state = broker.ensure_topic(topic, None)
    if not state.settings.accept_publish:
        raise PartitionClosedError(broker.publish_refused(topic))
    config = broker.config
    try:
        if checked is None:
            checked = _check(records, config.max_message_bytes, config.max_batch_bytes)
        if isinstance(checked, Exception):
            raise checked
        header, stamp = checked
    except InvalidArgument as exc:
        broker.stats.partition(topic, max(partition, 0)).put_failures += 1
        raise MessageTooLargeError(str(exc)) from None
    except ProtocolError as exc:
        broker.stats.partition(topic, max(partition, 0)).put_failures += 1
        raise CorruptMessageError(str(exc)) from None
    asked = partition
    if partition == m.ANY_PARTITION:
        open_parts = [p for p in range(state.num_partitions) if p not in state.closed]
        if not open_parts:
            raise PartitionClosedError(f"every partition of topic {topic!r} is closed")
        # an idempotent producer's retry must land where its first attempt did
        partition = open_parts[stamp.producer_id % len(open_parts)] if stamp else random.choice(open_parts)
    elif partition in state.closed:
        raise PartitionClosedError(f"partition {broker.config.broker_id}-{partition} of topic {topic!r} is closed for "
                                   "publishing")
    plog = broker.logs.get(topic, partition) if 0 <= partition < state.num_partitions else None
    if plog is None:  # not opened yet, or not a partition of the topic (the error comes from partition_log)
        _state, plog = broker.partition_log(topic, partition)
    counters = broker.stats.partition(topic, partition)
    if transaction_id:  # into the transaction log until commit (docs/transactions.md)
        if header.attributes & ATTR_DELAYED:
            raise InvalidArgument("delayed messages cannot be sent in a transaction")
        return partition, put_into_transaction(broker, transaction_id, topic, asked, records, header, stamp)
    if header.attributes & ATTR_DELAYED:  # kept in the delay store until due (docs/delayed.md)
        return partition, produce_delayed(broker, topic, partition, records, header)
    ha = broker.ha
    if ha is not None:
        ha.before_append(plog)
    if stamp is not None:
        duplicate = check_sequence(plog, stamp, header.record_count)
        if duplicate is not None:
            counters.duplicates_dropped += 1
            return partition, _answer_duplicate(broker, plog, partition, duplicate)
    # A small batch some fetch waits for stays readable from memory until its waiters have answered: they answer
    # with it without finding it and reading it back from the file (PartitionLog.append's keep_tail).
    waiters = broker.waiters
    total = header.total_bytes
    waited_on = waiters.waiting_on(topic, partition)
    keep_tail = waited_on and total < SENDFILE_MIN_BYTES
    started = perf_counter()
    result = plog.append(records, header, keep_tail=keep_tail)
    broker.stats.append_seconds.observe(perf_counter() - started)
    counters.put_requests += 1
    counters.put_messages += result.record_count
    counters.put_bytes += total
    # With no fetch waiting (or held) on the partition before the append, notify would find none: the append
    # registers no waiter, and no tail was kept to drop.
    if waited_on:
        waiters.notify(topic, partition, plog.drop_tail if keep_tail else None)
    response = m.ProduceResponse(partition=partition, base_offset=result.base_offset,
                                 base_message_id=result.base_message_id, append_time_ms=result.append_time_ms)
    durable = result.durable if result.wait_for_durable and not result.durable.done() else None
    replicated = ha.after_append(plog, result.last_offset + 1) if ha is not None else None
    if replicated is not None:
        return partition, await_ack(durable, replicated, response)
    if durable is not None:
        return partition, ack_when_durable(durable, response)
    return partition, response


def _answer_duplicate(broker: Broker, plog: PartitionLog, partition: int, original: StoredBatch) -> Any:
    """A retried batch that is already stored: the original's offsets, acknowledged under the same rule
    as an append (durable per the flush policy, and held by the in-sync slaves when replication is sync)."""
    response = m.ProduceResponse(partition=partition, base_offset=original.base_offset,
                                 base_message_id=plog.message_id(original.base_offset),
                                 append_time_ms=original.append_time_ms)
    future, wait = plog.durable_barrier()
    durable = future if wait and not future.done() else None
    ha = broker.ha
    replicated = ha.after_append(plog, original.last_offset + 1) if ha is not None else None
    if durable is not None or replicated is not None:
        return await_ack(durable, replicated, response)
    return response


# -- 24 MultiProduce ------------------------------------------------------------------------------

_MULTI = m.MultiProduceRequest.API_NAME


def handle_multi_produce(broker: Broker, req: m.MultiProduceRequest, session: Session | None) -> Any:
    """Each batch as :func:`produce_batch` handles a Produce of it, in the request's order, each with its own
    result (a refused batch does not stop the others). The reply is immediate when no batch waits for an
    ack; else a DeferredReply resolved by the last batch's answer (a coroutine, when a batch's ack is one:
    sync replication, a delayed or a duplicate batch waiting for its fsync)."""
    batches = req.partitions
    if not batches or len(batches) > m.MULTI_PRODUCE_PARTITIONS_MAX:
        raise InvalidRequestError(f"a MultiProduce carries 1..{m.MULTI_PRODUCE_PARTITIONS_MAX} batches; "
                                  f"got {len(batches)}")
    if any(_compressed(batch.records) for batch in batches):
        return _checked_off_loop(broker, session, [b.records for b in batches],
                                 lambda checked: _multi_produce(broker, req, checked))
    return _multi_produce(broker, req, None)


def _multi_produce(broker: Broker, req: m.MultiProduceRequest, checked: list[Checked] | None) -> Any:
    batches = req.partitions
    entries: list[m.ProducedPartition] = []
    waiting: list[tuple[m.ProducedPartition, Any]] = []
    txid = req.transaction_id
    for i, batch in enumerate(batches):
        entry = m.ProducedPartition(batch.topic, batch.partition)
        entries.append(entry)
        try:
            entry.partition, result = produce_batch(broker, batch.topic, batch.partition, batch.records, txid,
                                                    checked[i] if checked is not None else None)
        except Exception as exc:
            entry.error_code, entry.error_message = wire_error(exc, _MULTI)
            continue
        if isinstance(result, m.ProduceResponse):
            _fill(entry, result)
        else:
            waiting.append((entry, result))
    response = m.MultiProduceResponse(partitions=entries)
    if not waiting:
        return response
    if any(not isinstance(result, DeferredReply) for _entry, result in waiting):
        return _await_all(response, waiting)
    return _MultiAck(response, waiting).reply


def _fill(entry: m.ProducedPartition, result: Any) -> None:
    """A batch's ProducedPartition from its ProduceResponse (its error, or where it was stored)."""
    if result.error_code:
        entry.error_code, entry.error_message = result.error_code, result.error_message
    else:
        entry.base_offset, entry.base_message_id = result.base_offset, result.base_message_id
        entry.append_time_ms = result.append_time_ms


class _MultiAck:
    """The reply of a MultiProduce whose waiting batches are all DeferredReplies (the flush policy's acks,
    answered on the loop by :func:`ack_when_durable`): resolved by the last of them, without a task."""

    __slots__ = ("left", "reply", "response", "waiting")

    def __init__(self, response: m.MultiProduceResponse, waiting: list[tuple[m.ProducedPartition, Any]]) -> None:
        self.response = response
        self.waiting = waiting
        self.reply = DeferredReply()
        self.reply.on_cancel = self._cancel  # the connection closed: nobody is left to answer
        self.left = len(waiting)
        for entry, pending in waiting:
            pending.on_done(lambda result, entry=entry: self._answered(entry, result))

    def _cancel(self) -> None:
        for _entry, pending in self.waiting:
            pending.cancel()

    def _answered(self, entry: m.ProducedPartition, result: Any) -> None:
        _fill(entry, result)
        self.left -= 1
        if self.left == 0:
            self.reply.resolve(self.response)


async def _await_all(response: m.MultiProduceResponse, waiting: list[tuple[m.ProducedPartition, Any]]) -> Any:
    """Every waiting batch's answer (each already under way: awaiting them in turn costs no time), a failure
    as that batch's error entry."""
    try:
        for entry, pending in waiting:
            try:
                result = await (pending.wait() if isinstance(pending, DeferredReply) else pending)
            except Exception as exc:
                entry.error_code, entry.error_message = wire_error(exc, _MULTI)
                continue
            _fill(entry, result)
    finally:  # cancelled (the connection closed, the broker stops): the acks not awaited yet are dropped
        for _entry, pending in waiting:
            if isinstance(pending, Coroutine):
                pending.close()
            elif isinstance(pending, DeferredReply):
                pending.cancel()
    return response


HANDLERS: dict[type, Handler] = {m.ProduceRequest: handle_produce, m.MultiProduceRequest: handle_multi_produce}
