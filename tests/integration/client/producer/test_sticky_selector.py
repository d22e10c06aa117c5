"""StickyRoundRobinSelector through a real producer and broker: every partition gets messages over time,
consecutive messages share a partition (whole batches per request), order per partition holds, and keyed
messages under KeyHashSelector(fallback=StickyRoundRobinSelector()) stay on their key's partition."""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict

import uvloop

from metaq.client import KeyHashSelector, Message, MessageSessionFactory, StickyRoundRobinSelector
from metaq.client.selectors import key_hash
from metaq.testing.broker import BrokerProcess

PARTITIONS = 5


async def read_all(session: object, topic: str) -> dict[int, list[bytes]]:
    consumer = session.create_pull_consumer()  # type: ignore[attr-defined]
    return {p: [bytes(m.data) async for m in consumer.iterate(topic, p, "earliest", stop_at_end=True)]
            for p in range(PARTITIONS)}


def test_sticky_selector_fills_batches_and_spreads_over_every_partition(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            await session.admin().create_topic("sticky", PARTITIONS)
            producer = session.create_producer(StickyRoundRobinSelector(), batch_bytes=4096, linger_ms=0)
            sent = [b"m%05d" % i + b"." * 94 for i in range(4000)]
            futures = [producer.send_async(Message("sticky", v)) for v in sent]  # one loop step
            results = await asyncio.gather(*futures)
            assert all(r.success for r in results), [r for r in results if not r.success][:3]
            log = await read_all(session, "sticky")
            assert all(log[p] for p in range(PARTITIONS)), {p: len(v) for p, v in log.items()}
            for p, values in log.items():  # order per partition: the send order
                assert values == sorted(values), f"partition {p} out of send order"
            assert sorted(v for vs in log.values() for v in vs) == sent
            # Sticky: the partition changes once per batch (about 36 messages of 4096 bytes), not per message.
            changes = sum(1 for a, b in itertools.pairwise(results) if a.partition != b.partition)
            assert changes < len(sent) // 10, changes
            for r, v in zip(results, sent, strict=True):
                assert log[r.partition][r.offset] == v
            stats = (await session.admin().stats(None))["topics"]["sticky"]["partitions"]
            assert sum(s["put_requests"] for s in stats.values()) < len(sent) // 10

    uvloop.run(main())


def test_sticky_selector_moves_on_after_each_sent_batch_when_messages_trickle(broker: BrokerProcess) -> None:
    """One message per loop step with linger_ms=0: each leaves alone, so the next goes to the next partition."""

    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            await session.admin().create_topic("trickle", PARTITIONS)
            producer = session.create_producer(StickyRoundRobinSelector(), linger_ms=0)
            results = []
            for i in range(3 * PARTITIONS):
                results.append(await producer.send(Message("trickle", b"t%d" % i)))
            assert all(r.success for r in results)
            assert [r.partition for r in results] == list(range(PARTITIONS)) * 3
            log = await read_all(session, "trickle")
            assert log == {p: [b"t%d" % i for i in range(p, 3 * PARTITIONS, PARTITIONS)] for p in range(PARTITIONS)}

    uvloop.run(main())


def test_keyed_messages_keep_their_partition_under_a_sticky_fallback(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            await session.admin().create_topic("mixed", PARTITIONS)
            producer = session.create_producer(KeyHashSelector(fallback=StickyRoundRobinSelector()),
                                               batch_bytes=2048, linger_ms=0)
            keys = [b"k%d" % k for k in range(7)]
            messages = [Message("mixed", b"%d" % i, key=keys[i % 7] if i % 2 else None) for i in range(3000)]
            results = await asyncio.gather(*[producer.send_async(m) for m in messages])
            assert all(r.success for r in results)
            where: dict[bytes, set[int]] = defaultdict(set)
            for m, r in zip(messages, results, strict=True):
                if m.key is not None:
                    where[m.key].add(r.partition)
            assert where == {k: {key_hash(k) % PARTITIONS} for k in keys}
            keyless = {r.partition for m, r in zip(messages, results, strict=True) if m.key is None}
            assert keyless == set(range(PARTITIONS))
            log = await read_all(session, "mixed")
            for p, values in log.items():
                numbers = [int(v) for v in values]
                assert numbers == sorted(numbers), f"partition {p} out of send order"

    uvloop.run(main())


def test_a_local_transaction_under_the_sticky_selector_commits_every_message_in_order(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            await session.admin().create_topic("sticky-tx", PARTITIONS)
            producer = session.create_producer(StickyRoundRobinSelector(), batch_bytes=1024)
            async with producer.transaction():
                for i in range(200):
                    assert (await producer.send(Message("sticky-tx", b"x%03d" % i))).success
            # and plain sends afterwards still spread by batch
            results = await asyncio.gather(*[producer.send_async(Message("sticky-tx", b"y%03d" % i))
                                             for i in range(200)])
            assert all(r.success for r in results)
            assert len({r.partition for r in results}) > 1
            log = await read_all(session, "sticky-tx")
            xs = [v for vs in log.values() for v in vs if v.startswith(b"x")]
            assert sorted(xs) == [b"x%03d" % i for i in range(200)]
            for values in log.values():
                assert values == sorted(values)

    uvloop.run(main())
