"""The produce of a delayed batch (attribute bit 7): into the delay store, acknowledged like a produce."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from metaq.errors import StorageFailureError
from metaq.protocol import messages as m
from metaq.protocol.records import BatchHeader

if TYPE_CHECKING:
    from metaq.broker.core import Broker


def produce_delayed(broker: Broker, topic: str, partition: int, records: bytes | memoryview,
                    header: BatchHeader) -> Any:
    """The response (offset and message id -1: the messages get theirs when delivered), or a coroutine of it
    when the flush policy wants the delay-log append durable before the ack."""
    result = broker.delay.produce(topic, partition, records, header)
    response = m.ProduceResponse(partition=partition, base_offset=-1, base_message_id=-1,
                                 append_time_ms=result.append_time_ms)
    if result.wait_for_durable and not result.durable.done():
        return _await_durable(result.durable, response)
    return response


async def _await_durable(durable: Any, response: m.ProduceResponse) -> m.ProduceResponse:
    try:
        await asyncio.wrap_future(durable)
    except Exception as exc:
        raise StorageFailureError(f"the delayed batch was written but not made durable: {exc}") from exc
    return response
