"""Produce: one record batch, checked and appended with one write, acknowledged per the flush policy."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from metaq.broker.core import check_topic_name
from metaq.broker.session import Session
from metaq.errors import (
    CorruptMessageError,
    InvalidArgument,
    MessageTooLargeError,
    PartitionClosedError,
    ProtocolError,
    StorageFailureError,
    UnknownPartitionError,
    UnknownTopicError,
)
from metaq.protocol import messages as m
from metaq.protocol.records import validate_batch

if TYPE_CHECKING:
    from metaq.broker.core import Broker, Handler


def handle_produce(broker: Broker, req: m.ProduceRequest, session: Session | None) -> Any:
    """The response, or (when the batch must be durable first) a coroutine of it.

    Per-batch work only: the batch header and columns are checked without a loop per message, the
    broker stamps the header, and the bytes are written as they came.
    """
    topic, partition = req.topic, req.partition
    broker.refuse_writes_on_slave("produce requests")
    check_topic_name(topic)
    state = broker.topics.get(topic)
    if partition < m.ANY_PARTITION:  # refused before a dynamic topic is created for it
        valid = f"partitions 0..{state.num_partitions - 1} or" if state is not None else "a partition >= 0 or"
        raise UnknownPartitionError(f"topic {topic!r} takes {valid} -1 (any open partition); got {partition}")
    if state is None:
        if not broker.config.auto_create_topics:
            raise UnknownTopicError(f"topic {topic!r} does not exist and autoCreateTopics=false")
        state = broker.ensure_topic(topic, None)
    if not state.settings.accept_publish:
        raise PartitionClosedError(f"topic {topic!r} does not accept publishing (acceptPublish=false)")
    if partition == m.ANY_PARTITION:
        open_parts = [p for p in range(state.num_partitions) if p not in state.closed]
        if not open_parts:
            raise PartitionClosedError(f"every partition of topic {topic!r} is closed")
        partition = random.choice(open_parts)
    elif partition in state.closed:
        raise PartitionClosedError(f"partition {topic}-{partition} is closed for publishing")
    _state, plog = broker.partition_log(topic, partition)
    counters = broker.stats.partition(topic, partition)
    try:
        header = validate_batch(req.records, broker.config.max_message_bytes, broker.config.max_batch_bytes)
    except InvalidArgument as exc:
        counters.put_failures += 1
        raise MessageTooLargeError(str(exc)) from None
    except ProtocolError as exc:
        counters.put_failures += 1
        raise CorruptMessageError(str(exc)) from None
    ha = broker.ha
    if ha is not None:
        ha.before_append(plog)
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
    if durable is not None or replicated is not None:
        return _await_ack(durable, replicated, response)
    return response


async def _await_ack(durable: Future[Any] | None, replicated: Awaitable[None] | None,
                     response: m.ProduceResponse) -> m.ProduceResponse:
    """Durable on the master (its flush policy), then held by the in-sync slaves (sync replication)."""
    if durable is not None:
        try:
            await asyncio.wrap_future(durable)
        except Exception as exc:
            raise StorageFailureError(f"the batch was written but not made durable: {exc}") from exc
    if replicated is not None:
        await replicated
    return response


HANDLERS: dict[type, Handler] = {m.ProduceRequest: handle_produce}
