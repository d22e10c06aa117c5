"""Produce: one record batch, checked and appended with one write, acknowledged per the flush policy."""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Any

from metaq.broker.core import check_topic_name
from metaq.broker.delay.handler import produce_delayed
from metaq.broker.handlers.appending import ack_when_durable, await_ack, check_sequence
from metaq.broker.handlers.transactions import put_into_transaction
from metaq.broker.session import Session
from metaq.errors import (
    CorruptMessageError,
    InvalidArgument,
    MessageTooLargeError,
    PartitionClosedError,
    ProtocolError,
    UnknownPartitionError,
    UnknownTopicError,
)
from metaq.protocol import messages as m
from metaq.protocol.records import ATTR_DELAYED, producer_stamp, validate_batch
from metaq.storage.log import PartitionLog
from metaq.storage.producers import StoredBatch

if TYPE_CHECKING:
    from metaq.broker.core import Broker, Handler


def handle_produce(broker: Broker, req: m.ProduceRequest, session: Session | None) -> Any:
    """The response, or (when the batch must be durable first) a coroutine of it.

    Per-batch work only: the batch header and columns are checked without a loop per message, the
    broker stamps the header, and the bytes are written as they came.
    """
    topic, partition = req.topic, req.partition
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
        raise PartitionClosedError(f"topic {topic!r} does not accept publishing (acceptPublish=false)")
    try:
        header = validate_batch(req.records, broker.config.max_message_bytes, broker.config.max_batch_bytes)
        stamp = producer_stamp(req.records, header)
    except InvalidArgument as exc:
        broker.stats.partition(topic, max(partition, 0)).put_failures += 1
        raise MessageTooLargeError(str(exc)) from None
    except ProtocolError as exc:
        broker.stats.partition(topic, max(partition, 0)).put_failures += 1
        raise CorruptMessageError(str(exc)) from None
    if partition == m.ANY_PARTITION:
        open_parts = [p for p in range(state.num_partitions) if p not in state.closed]
        if not open_parts:
            raise PartitionClosedError(f"every partition of topic {topic!r} is closed")
        # an idempotent producer's retry must land where its first attempt did
        partition = open_parts[stamp.producer_id % len(open_parts)] if stamp else random.choice(open_parts)
    elif partition in state.closed:
        raise PartitionClosedError(f"partition {topic}-{partition} is closed for publishing")
    plog = broker.logs.get(topic, partition) if 0 <= partition < state.num_partitions else None
    if plog is None:  # not opened yet, or not a partition of the topic (the error comes from partition_log)
        _state, plog = broker.partition_log(topic, partition)
    counters = broker.stats.partition(topic, partition)
    if req.transaction_id:  # into the transaction log until commit (docs/transactions.md)
        if header.attributes & ATTR_DELAYED:
            raise InvalidArgument("delayed messages cannot be sent in a transaction")
        return put_into_transaction(broker, req, header, stamp)
    if header.attributes & ATTR_DELAYED:  # kept in the delay store until due (docs/delayed.md)
        return produce_delayed(broker, topic, partition, req.records, header)
    ha = broker.ha
    if ha is not None:
        ha.before_append(plog)
    if stamp is not None:
        duplicate = check_sequence(plog, stamp, header.record_count)
        if duplicate is not None:
            counters.duplicates_dropped += 1
            return _answer_duplicate(broker, plog, partition, duplicate)
    started = time.perf_counter()
    result = plog.append(req.records, header)
    broker.stats.append_seconds.observe(time.perf_counter() - started)
    counters.put_requests += 1
    counters.put_messages += header.record_count
    counters.put_bytes += header.total_bytes
    broker.waiters.notify(topic, partition)
    response = m.ProduceResponse(partition=partition, base_offset=result.base_offset,
                                 base_message_id=result.base_message_id, append_time_ms=result.append_time_ms)
    durable = result.durable if result.wait_for_durable and not result.durable.done() else None
    replicated = ha.after_append(plog, result.last_offset + 1) if ha is not None else None
    if replicated is not None:
        return await_ack(durable, replicated, response)
    if durable is not None:
        return ack_when_durable(durable, response)
    return response


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


HANDLERS: dict[type, Handler] = {m.ProduceRequest: handle_produce}
