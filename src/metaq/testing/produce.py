"""Putting messages into a topic for a test, and knowing where each was stored.

:func:`produce` sends with one producer of a session and waits until every message is acknowledged
(an AssertionError names the first that was not), so a test starts from data that is there; it returns
where each message went (:class:`Stored`), the history a fault test checks what it reads against.
:func:`produce_blocking` does the same on a session of its own, for a test without an event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from metaq.client import MessageSessionFactory
from metaq.types import Message, PartitionId, PartitionKey

__all__ = ["Stored", "produce", "produce_blocking"]

Values = Iterable[bytes | Message] | Mapping[PartitionKey, Iterable[bytes | Message]]


@dataclass(frozen=True, slots=True)
class Stored:
    """Where one message was stored."""

    partition: PartitionId
    offset: int
    message_id: int
    value: bytes


async def produce(session: MessageSessionFactory, topic: str, values: Values, *, spread: bool = False,
                  batch_messages: int = 100, create_partitions: int | None = None,
                  **producer_config: Any) -> list[Stored]:
    """Send ``values`` to ``topic``, ``batch_messages`` to a ``send_batch`` call; where each was stored, in
    send order.

    ``values``: a mapping of partition to its values, each sent to that partition; or a sequence, placed by
    the producer's selector batch by batch, or with ``spread`` value ``i`` to the ``i``-th of the topic's
    partitions (modulo their count: every partition gets its share, as a group test wants).
    ``create_partitions``: create the topic first, with that many partitions. ``producer_config``: the
    producer's options (``batch_bytes=2048`` for many small stored batches).
    """
    if create_partitions is not None:
        await session.admin().create_topic(topic, create_partitions)
    placed: dict[PartitionKey | None, Iterable[bytes | Message]]
    if isinstance(values, Mapping):
        placed = {p: items for p, items in values.items()}
    elif spread:
        parts = [p.id for p in await session.partitions(topic)]
        assert parts, f"topic {topic} has no partitions to spread over"
        listed = list(values)
        placed = {p: listed[i::len(parts)] for i, p in enumerate(parts)}
    else:
        placed = {None: values}
    producer = session.create_producer(**producer_config)
    stored: list[Stored] = []
    try:
        for partition, items in placed.items():
            batch: list[bytes | Message] = []
            for item in items:
                batch.append(item)
                if len(batch) >= batch_messages:
                    stored += await _send(producer, topic, batch, partition)
                    batch = []
            if batch:
                stored += await _send(producer, topic, batch, partition)
    finally:
        await producer.close()
    return stored


async def _send(producer: Any, topic: str, batch: Sequence[bytes | Message],
                partition: PartitionKey | None) -> list[Stored]:
    result = await producer.send_batch(topic, batch, partition=partition)
    assert result.success, f"sending to {topic} failed: {result.errors}"
    return [Stored(r.partition_id, r.offset, r.message_id, bytes(item.data if isinstance(item, Message) else item))
            for r, item in zip(result, batch, strict=True)]


def produce_blocking(servers: str, topic: str, values: Values, **options: Any) -> list[Stored]:
    """:func:`produce` on a session of its own to ``servers``."""
    async def main() -> list[Stored]:
        async with await MessageSessionFactory.connect(servers) as session:
            return await produce(session, topic, values, **options)

    return asyncio.run(main())
