"""PullConsumer.iterate_columns against a real broker: the same records as iterate, as column views."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

import uvloop

from metaq.client import Message, MessageBatch, MessageSessionFactory, connect
from metaq.testing import produce
from metaq.testing.broker import BrokerProcess


def run(coro: Coroutine[Any, Any, None]) -> None:
    uvloop.run(coro)


def sample(topic: str, i: int) -> Message:
    """Every kind of record: some with a key, an attribute, headers, each a payload of its own."""
    return Message(topic, b"payload-%d" % i, attribute=f"attr-{i}" if i % 3 == 0 else None,
                   key=b"k%d" % i if i % 2 else None, headers=[("n", b"%d" % i)] if i % 5 == 0 else None,
                   timestamp_ms=1_000 + i)


def fields(m: Message) -> tuple[object, ...]:
    return (bytes(m.data), m.attribute, m.key, m.headers, m.timestamp_ms, m.offset, m.id, m.partition, m.broker_id)


def by_columns(batch: MessageBatch) -> list[tuple[object, ...]]:
    return [(bytes(p), a, k, h, ts, o, i, batch.partition, batch.broker_id)
            for p, a, k, h, ts, o, i in zip(batch.payloads, batch.attributes, batch.keys, batch.headers,
                                             batch.timestamps, batch.offsets, batch.ids, strict=True)]


async def fill(session: MessageSessionFactory, topic: str, count: int) -> None:
    await produce(session, topic, {0: [sample(topic, i) for i in range(count)]}, batch_messages=40,
                  create_partitions=1, batch_bytes=2048)  # many stored batches


def test_iterate_columns_gives_the_records_iterate_gives_in_offset_order(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            await fill(session, "cols", 300)
            consumer = session.create_pull_consumer()
            messages = [fields(m) async for m in consumer.iterate("cols", 0, "earliest", stop_at_end=True,
                                                                  max_bytes=4096)]
            lists = [fields(m) async for ms in consumer.iterate_batches("cols", 0, "earliest", stop_at_end=True,
                                                                        max_bytes=4096) for m in ms]
            views = [b async for b in consumer.iterate_columns("cols", 0, "earliest", stop_at_end=True,
                                                               max_bytes=4096)]
            assert len(views) > 5 and all(isinstance(b, MessageBatch) and len(b) for b in views)
            assert [r for b in views for r in by_columns(b)] == messages == lists
            assert [fields(m) for b in views for m in b] == messages
            assert [r[5] for r in messages] == list(range(300))
            assert [bytes(r[0]) for r in messages] == [b"payload-%d" % i for i in range(300)]

            # from an offset inside a stored batch, and at most max_messages records
            tail = [b async for b in consumer.iterate_columns("cols", 0, 57, max_messages=101, stop_at_end=True)]
            assert [o for b in tail for o in b.offsets] == list(range(57, 158))
            assert [fields(m) for b in tail for m in b] == messages[57:158]

    run(main())


def test_the_sync_facade_iterates_columns_and_messages(broker: BrokerProcess) -> None:
    async def setup() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            await fill(session, "cols-sync", 120)

    run(setup())
    with connect(broker.servers) as session:
        consumer = session.create_pull_consumer()
        views = list(consumer.iterate_columns("cols-sync", 0, 0, stop_at_end=True))
        messages = [fields(m) for m in consumer.iterate("cols-sync", 0, 0, stop_at_end=True)]
        assert [r for b in views for r in by_columns(b)] == messages
        assert [r[5] for r in messages] == list(range(120))
        assert [fields(m) for m in consumer.iterate("cols-sync", 0, 10, max_messages=5)] == messages[10:15]
