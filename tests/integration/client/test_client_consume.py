"""PullConsumer against a real broker: get, iterate with long polling, offsets, out-of-range."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any

import pytest
import uvloop

from metaq.client import Message, MessageSessionFactory
from metaq.errors import OffsetOutOfRangeError, UnknownPartitionError, UnknownTopicError
from metaq.testing.broker import BrokerProcess


def run(coro: Coroutine[Any, Any, None]) -> None:
    uvloop.run(coro)


def test_iterate_long_polls_and_returns_a_message_appended_while_it_waits(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            await session.admin().create_topic("lp", 1)
            producer = session.create_producer()
            assert (await producer.send(Message("lp", b"old"))).success
            consumer = session.create_pull_consumer()
            it = consumer.iterate("lp", 0, "latest", max_wait_ms=30_000)
            waiting = asyncio.ensure_future(anext(it))
            # Not a synchronisation sleep: the assertion is that the iterator has nothing to return
            # (its fetch is parked at the broker) until something is appended.
            done, _ = await asyncio.wait({waiting}, timeout=0.3)
            assert not done
            started = time.monotonic()
            sent = await producer.send(Message("lp", b"new"))
            got = await asyncio.wait_for(waiting, 10)
            # Woken by the append, long before its 30 s max wait.
            assert time.monotonic() - started < 10
            assert (bytes(got.data), got.offset, got.id) == (b"new", sent.offset, sent.message_id)
            await it.aclose()

    run(main())


def test_iterate_follows_a_partition_in_order_while_it_is_written(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            await session.admin().create_topic("follow", 1)
            producer = session.create_producer(batch_bytes=4096)
            consumer = session.create_pull_consumer()

            async def write() -> None:
                for i in range(50):
                    await producer.send_batch("follow", [b"%d" % (i * 100 + j) for j in range(100)])

            writer = asyncio.ensure_future(write())
            got = [int(m.data) async for m in consumer.iterate("follow", 0, 0, max_wait_ms=5000, max_messages=5000,
                                                                 max_bytes=1000)]
            await writer
            assert got == list(range(5000))

    run(main())


def test_get_does_not_wait_and_reads_from_any_offset(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            await session.admin().create_topic("get", 2)
            producer = session.create_producer()
            r = await producer.send_batch("get", [b"v%d" % i for i in range(10)], partition=1)
            assert r.success and {c.partition for c in r.chunks} == {1}
            consumer = session.create_pull_consumer()
            assert [bytes(m.data) for m in await consumer.get("get", 1, 3)] == [b"v%d" % i for i in range(3, 10)]
            started = time.monotonic()
            assert await consumer.get("get", 1, 10) == []  # the end: empty, at once
            assert await consumer.get("get", 0, 0) == []
            assert time.monotonic() - started < 5
            assert await consumer.offsets("get", 1) == (0, 10)

    run(main())


def test_out_of_range_offsets_say_the_valid_range(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            await session.admin().create_topic("range", 1)
            await session.create_producer().send_batch("range", [b"a", b"b", b"c"])
            consumer = session.create_pull_consumer()
            with pytest.raises(OffsetOutOfRangeError) as info:
                await consumer.get("range", 0, 99)
            assert (info.value.earliest, info.value.latest) == (0, 3)  # type: ignore[attr-defined]
            assert "0..3" in str(info.value)
            with pytest.raises(OffsetOutOfRangeError):
                [m async for m in consumer.iterate("range", 0, 99, stop_at_end=True)]
            got = [bytes(m.data) async for m in consumer.iterate("range", 0, 99, stop_at_end=True,
                                                                 on_out_of_range="earliest")]
            assert got == [b"a", b"b", b"c"]

    run(main())


def test_unknown_topics_and_partitions_raise_for_consumers(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            consumer = session.create_pull_consumer()
            with pytest.raises(UnknownTopicError):
                await consumer.get("nope", 0, 0)
            await session.admin().create_topic("two", 2)
            with pytest.raises(UnknownPartitionError, match="has no partition 5"):
                await consumer.get("two", 5, 0)

    run(main())


def test_offset_for_time(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            await session.admin().create_topic("times", 1)
            producer = session.create_producer()
            for i, ts in enumerate((1000, 2000, 3000)):
                r = await producer.send(Message("times", b"%d" % i, timestamp_ms=ts))
                assert r.success
            consumer = session.create_pull_consumer()
            assert await consumer.offset_for_time("times", 0, 1500) == 1
            assert await consumer.offset_for_time("times", 0, 0) == 0
            assert await consumer.offset_for_time("times", 0, 9999) == 3  # none: the latest offset

    run(main())


def test_iterate_survives_a_broker_restart(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers, reconnect_attempts=10,
                                                       reconnect_backoff_s=0.05) as session:
            await session.admin().create_topic("restart", 1)
            producer = session.create_producer()
            assert (await producer.send(Message("restart", b"one"))).success
            it = session.create_pull_consumer().iterate("restart", 0, 0, max_wait_ms=30_000)
            assert (await anext(it)).data == b"one"
            waiting = asyncio.ensure_future(anext(it))  # parked in a long poll on its own connection
            await asyncio.to_thread(broker.restart)
            sent = await producer.send(Message("restart", b"two"))  # reconnects by itself
            assert sent.success, sent
            got = await asyncio.wait_for(waiting, 20)
            assert (got.data, got.offset) == (b"two", 1)
            await it.aclose()

    run(main())
