"""Failures a producer reports in its SendResult (never as an exception), against a real broker.

Unknown topics and closed partitions get the broker's error class; a broker that dies or stops
answering fails what is in flight with ConnectionClosedError / RequestTimeoutError (may have been stored),
a send to a broker that cannot be reached waits for it until its delivery deadline (then
DeliveryTimeoutError, certainly not stored), and a later send reconnects by itself.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import uvloop

from metaq.client import Message, MessageSessionFactory, Partition, Producer
from metaq.errors import (
    ConnectionClosedError,
    DeliveryTimeoutError,
    PartitionClosedError,
    RequestTimeoutError,
    UnknownTopicError,
)
from metaq.testing.broker import BrokerProcess
from metaq.types import SendResult


def run(coro: Coroutine[Any, Any, None]) -> None:
    uvloop.run(coro)


def pin(partition: int) -> Callable[[str, Sequence[Partition], Message], Partition]:
    def select(topic: str, partitions: Sequence[Partition], message: Message) -> Partition:
        return next(p for p in partitions if p.partition == partition)

    return select


def test_unknown_topic_without_auto_create_is_an_unknown_topic_result(broker_factory: Any) -> None:
    proc = broker_factory({"autoCreateTopics": False, "numPartitions": 2})

    async def main() -> None:
        async with await MessageSessionFactory.connect(proc.servers) as session:
            producer = session.create_producer()
            r = await producer.send(Message("ghost", b"x"))
            assert not r.success and isinstance(r.error, UnknownTopicError)
            assert r.topic == "ghost" and "ghost" in str(r.error)
            futures = [producer.send_async(Message("ghost", b"%d" % i)) for i in range(10)]
            assert all(isinstance(x.error, UnknownTopicError) for x in await asyncio.gather(*futures))
            batch = await producer.send_batch("ghost", [b"a", b"b"])
            assert not batch.success and all(isinstance(x.error, UnknownTopicError) for x in batch)
            pinned = await producer.send_batch("ghost", [b"a", b"b"], partition=0)
            assert [(x.success, x.partition, type(x.error)) for x in pinned] == [(False, 0, UnknownTopicError)] * 2
            # Once the topic exists, the same producer sends to it.
            await session.admin().create_topic("ghost", 2)
            assert (await producer.send(Message("ghost", b"now"))).success

    run(main())


def test_closed_partitions_give_partition_closed_results(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            admin = session.admin()
            await admin.create_topic("gate", 3)
            pinned = session.create_producer(pin(1))
            assert (await pinned.send(Message("gate", b"before"))).success

            await admin.close_partition("gate", 1)
            r = await pinned.send(Message("gate", b"closed"))
            assert not r.success and isinstance(r.error, PartitionClosedError) and r.partition == 1

            # Round robin learns partition 1 is closed and skips it.
            rr = session.create_producer()
            results = [await rr.send(Message("gate", b"rr%d" % i)) for i in range(12)]
            assert all(x.success for x in results)
            assert {x.partition for x in results} == {0, 2}

            await admin.close_partition("gate")  # every partition
            r = await rr.send(Message("gate", b"all closed"))
            assert not r.success and isinstance(r.error, PartitionClosedError)

            await admin.open_partition("gate")
            assert (await rr.send(Message("gate", b"open again"))).success
            assert (await pinned.send(Message("gate", b"open again"))).success
            # Reads never stopped: the closed partition still serves its messages.
            assert [bytes(m.data) for m in await session.create_pull_consumer().get("gate", 1, 0)] == \
                   [b"before", b"open again"]

    run(main())


def test_a_lost_connection_fails_in_flight_sends_and_a_later_send_reconnects(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers, reconnect_attempts=5,
                                                       reconnect_backoff_s=0.2) as session:
            await session.admin().create_topic("crash", 2)
            producer = session.create_producer()
            assert (await producer.send(Message("crash", b"before"))).success

            # A stopped broker still lets the kernel take our bytes: these sends are in flight for sure.
            broker.signal(signal.SIGSTOP)
            futures = [producer.send_async(Message("crash", b"lost-%d" % i)) for i in range(100)]
            await producer_has_written(producer)
            broker.kill()  # SIGKILL a stopped process: the connection is reset
            results: list[SendResult] = list(await asyncio.gather(*futures))
            assert all(not r.success for r in results)
            assert all(isinstance(r.error, ConnectionClosedError) for r in results)
            assert "may or may not have been applied" in str(results[0].error)

            await asyncio.to_thread(broker.restart)
            r = await producer.send(Message("crash", b"after restart"))
            assert r.success, r
            consumer = session.create_pull_consumer()
            assert b"after restart" in [bytes(m.data) for m in await consumer.get("crash", r.partition, 0)]

    run(main())


async def producer_has_written(producer: Producer) -> None:
    """Wait (bounded) until every batch has been handed to the connection."""
    async with asyncio.timeout(10):
        while producer.unsent_batches:
            await asyncio.sleep(0.001)


def test_a_broker_that_stops_answering_times_out_and_the_producer_recovers(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers, request_timeout_s=0.5) as session:
            await session.admin().create_topic("hang", 1)
            producer = session.create_producer()
            assert (await producer.send(Message("hang", b"before"))).success
            broker.signal(signal.SIGSTOP)
            try:
                r = await producer.send(Message("hang", b"stuck"))
            finally:
                broker.signal(signal.SIGCONT)
            assert not r.success and isinstance(r.error, RequestTimeoutError)
            # The late reply never confuses the next request: that connection was closed.
            r2 = await producer.send(Message("hang", b"after"))
            assert r2.success, r2
            # "stuck" may or may not be stored (that is what a timeout means); "after" follows it.
            got = [bytes(m.data) for m in await session.create_pull_consumer().get("hang", 0, 0)]
            assert got[0] == b"before" and got[-1] == b"after" and set(got) <= {b"before", b"stuck", b"after"}

    run(main())


def test_a_broker_that_is_down_fails_sends_at_their_delivery_deadline_as_certainly_not_stored(
        broker: BrokerProcess) -> None:
    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers, reconnect_attempts=2,
                                                       reconnect_backoff_s=0.01) as session:
            await session.admin().create_topic("down", 1)
            producer = session.create_producer(delivery_timeout_ms=1500)
            assert (await producer.send(Message("down", b"up"))).success
            await asyncio.to_thread(broker.stop)
            started = asyncio.get_running_loop().time()
            r = await producer.send(Message("down", b"nobody"))
            waited = asyncio.get_running_loop().time() - started
            assert not r.success and isinstance(r.error, DeliveryTimeoutError), r.error
            assert r.error.maybe_stored is False and isinstance(r.error.cause, ConnectionClosedError)
            assert "gave up after 2 attempts" in str(r.error)
            assert waited >= 1.4, f"failed after {waited:.2f} s, before its deadline"

    run(main())


def test_a_send_to_a_broker_that_is_down_waits_for_it_to_come_back(broker: BrokerProcess) -> None:
    """Within the delivery deadline a send rides out a broker restart instead of failing with "cannot connect"."""
    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers, reconnect_attempts=2,
                                                       reconnect_backoff_s=0.01) as session:
            await session.admin().create_topic("back", 1)
            producer = session.create_producer()
            assert (await producer.send(Message("back", b"up"))).success
            await asyncio.to_thread(broker.stop)
            futures = [producer.send_async(Message("back", b"while-down-%d" % i)) for i in range(20)]
            await asyncio.sleep(0.5)  # the sender has tried and failed to connect meanwhile
            assert not any(f.done() for f in futures)
            await asyncio.to_thread(broker.start)
            results = await asyncio.gather(*futures)
            assert all(r.success for r in results), [r.error for r in results if not r.success][:3]
            offsets = [r.offset for r in results]
            assert offsets == sorted(offsets), "stored out of send order"

    run(main())


def test_with_retries_sends_in_flight_during_a_crash_are_stored_at_least_once(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers, reconnect_attempts=12,
                                                       reconnect_backoff_s=0.05) as session:
            await session.admin().create_topic("again", 2)
            producer = session.create_producer(retries=3, retry_backoff_ms=50)
            assert (await producer.send(Message("again", b"before"))).success
            broker.signal(signal.SIGSTOP)
            payloads = [b"retry-%d" % i for i in range(200)]
            futures = [producer.send_async(Message("again", p)) for p in payloads]
            await producer_has_written(producer)
            broker.kill()
            restart = asyncio.ensure_future(asyncio.to_thread(broker.start))
            results = await asyncio.gather(*futures)
            await restart
            assert all(r.success for r in results), [r.error for r in results if not r.success][:3]
            consumer = session.create_pull_consumer()
            stored = [bytes(m.data) for p in (0, 1) async for m in _all(consumer, "again", p)]
            # At least once: every payload is there; a batch the broker appended (its reply lost in the
            # crash) may be there twice -- the documented cost of retries.
            assert set(payloads) <= set(stored)

    run(main())


async def _all(consumer: Any, topic: str, partition: int) -> Any:
    async for m in consumer.iterate(topic, partition, "earliest", stop_at_end=True):
        yield m
