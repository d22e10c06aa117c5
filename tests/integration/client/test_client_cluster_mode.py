"""A session in cluster mode (``zk_connect``): brokers, topics and partitions come from ZooKeeper,
and what ZooKeeper reports (a broker joining or leaving) reaches the session's metadata at once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from metaq.client import Message, MessageSessionFactory, connect
from metaq.errors import ConfigError, ConnectionClosedError, DeliveryTimeoutError, PartitionClosedError
from metaq.testing import BrokerProcess, wait_until
from metaq.types import PartitionId as P


def test_session_reads_the_cluster_from_zookeeper_and_follows_it(
        cluster_factory: Callable[..., BrokerProcess], zookeeper: Any, zk_root: str) -> None:
    topics = "[topic=orders]\nnumPartitions=2\n"
    b1 = cluster_factory(1, topics=topics)
    b2 = cluster_factory(2, topics=topics)
    with connect(zk_connect=zookeeper.connect_string, zk_root=zk_root) as session:
        assert [str(p) for p in session.partitions("orders")] == ["1-0", "1-1", "2-0", "2-1"]
        producer = session.create_producer()
        results = [producer.send(Message("orders", b"m%d" % i)) for i in range(8)]
        assert sorted({r.partition_id for r in results}) == [P(1, 0), P(1, 1), P(2, 0), P(2, 1)]

        def brokers_used() -> set[int]:
            return {producer.send(Message("orders", b"x")).broker_id for _ in range(6)}

        # The cached metadata is 30 s fresh (metadata_max_age_s): only the watch brings these changes sooner.
        b3 = cluster_factory(3, topics=topics)
        wait_until(lambda: brokers_used() == {1, 2, 3}, 10, message="the joining broker's partitions are produced to")
        b2.stop()
        wait_until(lambda: brokers_used() == {1, 3}, 10, message="the stopped broker is left out")
        assert all(b.proc is not None and b.proc.poll() is None for b in (b1, b3))


def test_cluster_mode_refusals_are_clear(zookeeper: Any, zk_root: str) -> None:
    with pytest.raises(ConfigError, match="not both"):
        connect("127.0.0.1:1", zk_connect=zookeeper.connect_string)
    with pytest.raises(ConnectionClosedError, match="no metaq broker is registered"):
        connect(zk_connect=zookeeper.connect_string, zk_root=zk_root + "-empty", zk_connection_timeout_ms=5000)


def test_a_send_while_every_partition_is_closed_waits_for_one_to_open_in_cluster_mode(
        cluster_factory: Callable[..., BrokerProcess], zookeeper: Any, zk_root: str) -> None:
    """In cluster mode "every partition closed" is also how a master's handover looks for a moment (the old
    master's topic node gone, the new one's not yet there): a send then waits for the view to change, in order,
    up to the send's delivery deadline, instead of failing at once (and a caller's retry loop spinning)."""
    cluster_factory(1, topics="[topic=gate]\nnumPartitions=2\n")

    async def main() -> None:
        async with await MessageSessionFactory.connect(zk_connect=zookeeper.connect_string, zk_root=zk_root) as session:
            admin = session.admin()

            async def close_every_partition() -> None:
                await admin.close_partition("gate")
                # the broker's topic node leaves ZooKeeper, then the session's view follows
                while any(p.accept_publish for p in await session.partitions("gate")):
                    await session._core.cluster_changed(10.0)

            producer = session.create_producer()
            assert (await producer.send(Message("gate", b"before"))).success
            await close_every_partition()
            held = [producer.send_async(Message("gate", b"held-%d" % i)) for i in range(6)]
            many = producer.send_async_many([Message("gate", b"many-%d" % i) for i in range(4)])
            await asyncio.sleep(0)
            assert not any(f.done() for f in held), "a send failed at once although the topic may reopen"
            assert not many.done(), "send_async_many failed at once although the topic may reopen"
            await admin.open_partition("gate")
            results = await asyncio.wait_for(asyncio.gather(*held), 30)
            assert all(r.success for r in results), [r.error for r in results]
            many_result = await asyncio.wait_for(many, 30)
            assert many_result.success, many_result.errors
            consumer = session.create_pull_consumer()
            stored = {p: [bytes(m.data) for m in await consumer.get("gate", p, 0)] for p in (0, 1)}
            # every held message stored once, where its result says, in send order within its partition
            assert sorted(stored[0] + stored[1]) == sorted([b"before", *(b"held-%d" % i for i in range(6)),
                                                            *(b"many-%d" % i for i in range(4))])
            for i, r in enumerate(results):
                assert b"held-%d" % i in stored[r.partition]
            for msgs in stored.values():  # send order within each partition: the held ones, then send_async_many's
                held_here = [x for x in msgs if x.startswith((b"held-", b"many-"))]
                assert held_here == sorted(held_here, key=lambda x: (x.startswith(b"many-"), x)), stored

            # Still closed at the sends' delivery deadline: they fail, in order, certainly not stored, with the reason.
            short = session.create_producer(delivery_timeout_ms=1000)
            await close_every_partition()
            late = [short.send_async(Message("gate", b"late-%d" % i)) for i in range(3)]
            outcomes = await asyncio.wait_for(asyncio.gather(*late), 30)
            assert all(not r.success and isinstance(r.error, DeliveryTimeoutError) and not r.error.maybe_stored
                       and isinstance(r.error.cause, PartitionClosedError) for r in outcomes), outcomes
            assert "stayed closed" in str(outcomes[0].error)

    asyncio.run(main())
