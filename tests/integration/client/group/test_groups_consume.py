"""Listener consumers in a group against a real broker: coverage, rebalances, offsets, failures."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import uvloop

from metaq import testing
from metaq.client import Message, MessageSessionFactory
from metaq.client.group import (
    AttributeFilter,
    ConsumerConfig,
    GroupConsumer,
    LocalFileOffsetStorage,
    PartitionContext,
    RecoverStore,
    TopicBrowser,
    create_consumer,
)
from metaq.testing import BrokerProcess, until

FAST = {"session_timeout_ms": 1500, "rebalance_timeout_ms": 6000, "commit_offset_period_ms": 200,
        "max_delay_fetch_ms": 500, "fetch_runner_count": 4}


def run(coro: Coroutine[Any, Any, None]) -> None:
    uvloop.run(coro)


def config(group: str, tmp: Path, **kw: Any) -> ConsumerConfig:
    return ConsumerConfig(group=group, recover_dir=tmp / "recover", **{**FAST, **kw})


async def produce(session: MessageSessionFactory, topic: str, n: int, start: int = 0) -> None:
    """Messages ``start`` .. ``start + n - 1`` spread evenly over the topic's partitions."""
    await testing.produce(session, topic, [b"%d" % v for v in range(start, start + n)], spread=True)


def stable(consumers: list[GroupConsumer], n_partitions: int) -> bool:
    owned = [tp for c in consumers for tp in c.assignment()]
    return (all(c.assigned.is_set() for c in consumers) and len(owned) == n_partitions
            and len(set(owned)) == n_partitions and len({c.generation for c in consumers}) == 1)


def test_three_consumers_share_twelve_partitions_disjointly_and_completely(
        broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    broker = broker_factory({"numPartitions": 12})

    async def main() -> None:
        sessions = [await MessageSessionFactory.connect(broker.servers) for _ in range(4)]
        await sessions[0].admin().create_topic("orders", 12)
        got: Counter[bytes] = Counter()
        consumers = [create_consumer(s, config("billing", tmp_path)) for s in sessions[1:]]
        for c in consumers:
            c.subscribe("orders", 64 * 1024, lambda msg: got.update([bytes(msg.data)]))
        for c in consumers:
            await c.complete_subscribe()
        await until(lambda: stable(consumers, 12), message="a stable group of three")
        sets = [set(c.assignment()) for c in consumers]
        assert [len(s) for s in sets] == [4, 4, 4]
        assert not (sets[0] & sets[1]) and not (sets[1] & sets[2]) and not (sets[0] & sets[2])
        await produce(sessions[0], "orders", 1200)
        await until(lambda: len(got) == 1200, message="every message")
        assert max(got.values()) == 1, "clean rebalances deliver nothing twice"
        for c in consumers:
            await c.close()
        for s in sessions:
            await s.close()

    run(main())


def test_members_joining_and_leaving_move_partitions_without_loss(
        broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    broker = broker_factory({"numPartitions": 6})

    async def main() -> None:
        session = await MessageSessionFactory.connect(broker.servers)
        await session.admin().create_topic("flow", 6)
        got: Counter[bytes] = Counter()

        async def listener(msg: Message) -> None:
            got.update([bytes(msg.data)])

        def member() -> GroupConsumer:
            return create_consumer(session, config("movers", tmp_path)).subscribe("flow", 64 * 1024, listener)

        a = member()
        await a.complete_subscribe()
        await until(lambda: stable([a], 6))
        await produce(session, "flow", 300, 0)
        b = member()
        await b.complete_subscribe()
        await until(lambda: stable([a, b], 6), message="a and b stable")
        await produce(session, "flow", 300, 300)
        await a.close()  # leaves: b takes everything
        await until(lambda: stable([b], 6), message="b alone")
        await produce(session, "flow", 300, 600)
        await until(lambda: len(got) == 900, message="all 900")
        assert max(got.values()) == 1
        await b.close()
        await session.close()

    run(main())


def test_offsets_are_committed_and_a_restarted_group_resumes(
        broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    broker = broker_factory({"numPartitions": 4})

    async def main() -> None:
        session = await MessageSessionFactory.connect(broker.servers)
        await session.admin().create_topic("resume", 4)
        await produce(session, "resume", 100)
        first: list[bytes] = []
        c = create_consumer(session, config("resumers", tmp_path)).subscribe(
            "resume", 4096, lambda msg: first.append(bytes(msg.data)))
        await c.complete_subscribe()
        await until(lambda: len(first) == 100)
        await c.close()
        await session.close()

    run(main())
    broker.restart()  # offsets survive a broker restart

    async def again() -> None:
        session = await MessageSessionFactory.connect(broker.servers)
        await produce(session, "resume", 50, 100)
        second: list[bytes] = []
        c = create_consumer(session, config("resumers", tmp_path)).subscribe(
            "resume", 4096, lambda msg: second.append(bytes(msg.data)))
        await c.complete_subscribe()
        await until(lambda: len(second) >= 50)
        assert sorted(second) == sorted(b"%d" % i for i in range(100, 150))
        # a new group starts at the end with consumeFromMaxOffset
        late: list[bytes] = []
        d = create_consumer(session, config("latecomers", tmp_path, consume_from_max_offset=True)).subscribe(
            "resume", 4096, lambda msg: late.append(bytes(msg.data)))
        await d.complete_subscribe()
        await until(lambda: d.assigned.is_set() and len(d.assignment()) == 4)
        await produce(session, "resume", 10, 150)
        await until(lambda: len(late) == 10)
        assert sorted(late) == sorted(b"%d" % i for i in range(150, 160))
        await c.close()
        await d.close()
        await session.close()

    run(again())


def test_a_failing_message_is_retried_then_recovered_in_the_background(
        broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    broker = broker_factory({"numPartitions": 1})

    async def main() -> None:
        session = await MessageSessionFactory.connect(broker.servers)
        await session.admin().create_topic("fragile", 1)
        await produce(session, "fragile", 10)
        calls: Counter[bytes] = Counter()
        healed = asyncio.Event()

        def listener(msg: Message) -> None:
            calls.update([bytes(msg.data)])
            if msg.data == b"3" and not healed.is_set():
                raise RuntimeError("poison")

        cfg = config("fragile-g", tmp_path, max_fetch_retries=2, recover_message_interval_ms=3_600_000)
        c = create_consumer(session, cfg).subscribe("fragile", 4096, listener)
        await c.complete_subscribe()
        await until(lambda: all(calls[b"%d" % i] for i in range(10)) and c.stats.rejected == 1)
        assert calls[b"3"] == 3  # 1 + maxFetchRetries deliveries
        assert all(calls[b"%d" % i] == 1 for i in range(10) if i != 3)
        await until(lambda: c.positions()[next(iter(c.positions()))][2] == 10, message="offset 10 committed")
        assert await c.recover.count() == 1
        await c.close()

        # the recover store survives a restart of the consumer and retries in the background
        healed.set()
        store = RecoverStore(tmp_path / "recover", "fragile-g")
        assert await store.count() == 1
        c2 = create_consumer(session, config("fragile-g", tmp_path, recover_message_interval_ms=100)).subscribe(
            "fragile", 4096, listener)
        await c2.complete_subscribe()
        await until(lambda: c2.stats.recovered == 1, message="the background recover")
        assert calls[b"3"] == 4
        assert await store.count() == 0
        await c2.close()
        store.close()
        await session.close()

    run(main())


def test_a_transient_failure_is_outlasted_by_the_retry_back_off(
        broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    """The listener's database is down for 1 s (of a fake clock the partition's back-off advances): the
    partition waits 0.5 s, then 1 s (MetaQ's: a tenth of max_delay_fetch_ms more each retry) and the message
    is delivered once the database is back. With ``skip``, retries with no back-off (all six within a
    millisecond) would have dropped it."""
    broker = broker_factory({"numPartitions": 1})

    async def main() -> None:
        session = await MessageSessionFactory.connect(broker.servers)
        await session.admin().create_topic("transient", 1)
        await produce(session, "transient", 5)
        now_s = 0.0
        waits: list[float] = []
        calls: Counter[bytes] = Counter()

        async def fake_wait(delay_s: float) -> None:
            nonlocal now_s
            waits.append(delay_s)
            now_s += delay_s

        def listener(msg: Message) -> None:
            calls.update([bytes(msg.data)])
            if msg.data == b"2" and now_s < 1.0:
                raise ConnectionError("the database is down")

        c = create_consumer(session, config("transient-g", tmp_path, rejection_policy="skip",
                                            max_delay_fetch_ms=5000)).subscribe("transient", 4096, listener)
        c.retry_wait = fake_wait
        await c.complete_subscribe()
        await until(lambda: calls[b"4"] == 1, message="every message delivered")
        assert (waits, calls[b"2"], c.stats.rejected, c.stats.failures) == ([0.5, 1.0], 3, 0, 2)
        assert all(calls[b"%d" % i] == 1 for i in (0, 1, 3, 4))
        await c.close()
        await session.close()

    run(main())


def test_skip_policy_and_rollback_only(broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    broker = broker_factory({"numPartitions": 1})

    async def main() -> None:
        session = await MessageSessionFactory.connect(broker.servers)
        await session.admin().create_topic("skippy", 1)
        await produce(session, "skippy", 5)
        calls: Counter[bytes] = Counter()

        async def listener(msg: Message, ctx: PartitionContext) -> None:
            calls.update([bytes(msg.data)])
            if msg.data == b"1":
                ctx.set_rollback_only()

        c = create_consumer(session, config("skippers", tmp_path, rejection_policy="skip")).subscribe(
            "skippy", 4096, listener)
        await c.complete_subscribe()
        await until(lambda: calls[b"4"] == 1)
        assert calls[b"1"] == 6 and c.stats.rejected == 1
        assert await c.recover.count() == 0
        await c.close()
        await session.close()

    run(main())


def test_transactions_ack_and_rollback(broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    broker = broker_factory({"numPartitions": 1})

    async def main() -> None:
        session = await MessageSessionFactory.connect(broker.servers)
        await session.admin().create_topic("txn", 1)
        await produce(session, "txn", 9)
        seen: list[int] = []
        rolled = set()

        def listener(msg: Message, ctx: PartitionContext) -> None:
            ctx.set_auto_ack(False)
            seen.append(msg.offset)
            if msg.offset % 3 == 2:  # a transaction of three messages
                if msg.offset == 5 and 5 not in rolled:
                    rolled.add(5)
                    ctx.rollback()
                else:
                    ctx.ack()

        c = create_consumer(session, config("tx", tmp_path)).subscribe("txn", 4096, listener)
        await c.complete_subscribe()
        await until(lambda: 8 in seen)
        assert seen == [0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7, 8]
        await until(lambda: next(iter(c.positions().values()))[2] == 9, message="commit after the last ack")
        assert c.stats.rollbacks == 1
        await c.close()
        await session.close()

    run(main())


def test_unacked_transaction_is_redelivered_to_the_next_consumer(
        broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    broker = broker_factory({"numPartitions": 1})

    async def main() -> None:
        session = await MessageSessionFactory.connect(broker.servers)
        await session.admin().create_topic("open-txn", 1)
        await produce(session, "open-txn", 6)
        seen: list[int] = []

        def never_acks_past_2(msg: Message, ctx: PartitionContext) -> None:
            ctx.set_auto_ack(False)
            seen.append(msg.offset)
            if msg.offset == 2:
                ctx.ack()

        c = create_consumer(session, config("otx", tmp_path)).subscribe("open-txn", 4096, never_acks_past_2)
        await c.complete_subscribe()
        await until(lambda: 5 in seen)
        await c.close()  # commits 3: messages 3..5 were never acked
        again: list[int] = []
        d = create_consumer(session, config("otx", tmp_path)).subscribe(
            "open-txn", 4096, lambda msg: again.append(msg.offset))
        await d.complete_subscribe()
        await until(lambda: len(again) == 3)
        assert again == [3, 4, 5]
        await d.close()
        await session.close()

    run(main())


def test_client_filter_broadcast_and_browser(broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    broker = broker_factory({"numPartitions": 3})

    async def main() -> None:
        session = await MessageSessionFactory.connect(broker.servers)
        await session.admin().create_topic("news", 3)
        producer = session.create_producer()
        for i in range(30):
            await producer.send(Message("news", b"%d" % i, attribute="vip" if i % 3 == 0 else "plain"))
        await producer.flush()
        # broadcast: every member gets everything, offsets per member in local files
        boxes: list[list[bytes]] = [[], []]
        members = []
        for i, box in enumerate(boxes):
            cfg = config("fans", tmp_path, broadcast=True, consumer_id=f"fan{i}")
            c = create_consumer(session, cfg, LocalFileOffsetStorage(tmp_path / "offsets"))
            c.subscribe("news", 4096, lambda msg, box=box: box.append(bytes(msg.data)), AttributeFilter("vip"))
            await c.complete_subscribe()
            members.append(c)
        await until(lambda: all(len(b) == 10 for b in boxes), message="both broadcast members")
        assert sorted(boxes[0]) == sorted(boxes[1]) == sorted(b"%d" % i for i in range(0, 30, 3))
        for c in members:
            await until(lambda c=c: all(v[2] == v[0] for v in c.positions().values()), message="committed")
            await c.close()
        assert {p.name for p in (tmp_path / "offsets").iterdir()} == {"fans-fan0.json", "fans-fan1.json"}
        # the browser reads everything without consuming anything
        browser = TopicBrowser(session, "news")
        seen = [bytes(msg.data) async for msg in browser]
        assert sorted(seen) == sorted(b"%d" % i for i in range(30))
        await browser.close()
        await session.close()

    run(main())


def test_listener_calls_are_ordered_per_partition_and_parallel_across(
        broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    broker = broker_factory({"numPartitions": 8})

    async def main() -> None:
        import threading

        session = await MessageSessionFactory.connect(broker.servers)
        await session.admin().create_topic("par", 8)
        await produce(session, "par", 800)
        lock = threading.Lock()
        active = 0
        peak = 0
        order: dict[int, list[int]] = {}

        def slow(msg: Message) -> None:
            nonlocal active, peak
            with lock:
                active += 1
                peak = max(peak, active)
                order.setdefault(msg.partition, []).append(msg.offset)
            time.sleep(0.002)  # work, so that calls overlap
            with lock:
                active -= 1

        cfg = config("par-g", tmp_path, fetch_runner_count=3, long_poll=False, max_delay_fetch_ms=200)
        c = create_consumer(session, cfg).subscribe("par", 512, slow)
        await c.complete_subscribe()
        await until(lambda: sum(map(len, order.values())) == 800)
        assert all(offs == sorted(offs) and len(set(offs)) == len(offs) for offs in order.values())
        assert 1 < peak <= 3, peak  # fetchRunnerCount partitions at once, never more
        await c.close()
        await session.close()

    run(main())


def test_consumer_rides_through_a_broker_kill9_and_restart(
        broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    broker = broker_factory({"numPartitions": 2})

    async def main() -> None:
        session = await MessageSessionFactory.connect(broker.servers)
        await session.admin().create_topic("phoenix", 2)
        await produce(session, "phoenix", 20)
        got: Counter[bytes] = Counter()
        c = create_consumer(session, config("phoenix-g", tmp_path)).subscribe(
            "phoenix", 4096, lambda msg: got.update([bytes(msg.data)]))
        await c.complete_subscribe()
        await until(lambda: len(got) == 20 and all(v[2] == v[0] for v in c.positions().values()),
                    message="20 consumed and committed")
        await asyncio.get_running_loop().run_in_executor(None, broker.kill)
        await asyncio.get_running_loop().run_in_executor(None, broker.start)  # same port, same data
        await produce(session, "phoenix", 20, 20)
        await until(lambda: len(got) == 40, 30, message="the messages produced after the restart")
        assert max(got.values()) == 1  # the committed offsets survived kill -9
        await c.close()
        await session.close()

    run(main())
