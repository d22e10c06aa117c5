"""ZooKeeperMembership against an in-memory GroupRegistry: the order of claims, starts, stops and releases."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable, Mapping
from types import SimpleNamespace

import pytest

from metaq.client.group.config import ConsumerConfig
from metaq.client.group.membership import ZooKeeperMembership, metaq_consumer_id
from metaq.cluster.registry import GroupRegistry
from metaq.testing import until
from metaq.types import PartitionId, TopicPartition

P = [PartitionId(1, 0), PartitionId(1, 1), PartitionId(2, 0), PartitionId(2, 1)]


class MemoryRegistry(GroupRegistry):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ids: dict[str, list[str]] = {}
        self.owner: dict[tuple[str, PartitionId], str] = {}
        self.offsets: dict[tuple[str, PartitionId], int] = {}
        self.member_watchers: list[Callable[[], None]] = []
        self.log: list[tuple[str, ...]] = []

    def register_member(self, group: str, consumer_id: str, topics: Iterable[str]) -> None:
        with self.lock:
            self.ids[consumer_id] = sorted(topics)
        for w in list(self.member_watchers):
            w()

    def unregister_member(self, group: str, consumer_id: str) -> None:
        with self.lock:
            self.ids.pop(consumer_id, None)
        for w in list(self.member_watchers):
            w()

    def members(self, group: str) -> dict[str, list[str]]:
        with self.lock:
            return dict(self.ids)

    def watch_members(self, group: str, listener: Callable[[], None]) -> None:
        self.member_watchers.append(listener)

    def watch_topic_partitions(self, topic: str, listener: Callable[[], None]) -> None:
        pass

    def claim(self, group: str, topic: str, partition: PartitionId, owner: str) -> bool:
        with self.lock:
            held = self.owner.get((topic, partition))
            if held not in (None, owner):
                return False
            self.owner[(topic, partition)] = owner
            self.log.append(("claim", owner, str(partition)))
            return True

    def release(self, group: str, topic: str, partition: PartitionId, owner: str) -> None:
        with self.lock:
            if self.owner.get((topic, partition)) == owner:
                del self.owner[(topic, partition)]
                self.log.append(("release", owner, str(partition)))

    def release_all(self, group: str, owner: str) -> None:
        with self.lock:
            for key in [k for k, o in self.owner.items() if o == owner]:
                del self.owner[key]

    def owners(self, group: str, topic: str) -> dict[PartitionId, str]:
        with self.lock:
            return {p: o for (t, p), o in self.owner.items() if t == topic}

    def load_offset(self, group: str, topic: str, partition: PartitionId) -> int | None:
        return self.offsets.get((topic, partition))

    def commit_offsets(self, group: str, offsets: Mapping[tuple[str, PartitionId], int]) -> None:
        self.offsets.update(offsets)

    def alive(self, group: str, consumer_id: str) -> bool:
        return consumer_id in self.members(group)


class FakeConsumer:
    """What the membership drives: start and stop partitions (recorded with what the registry held then)."""

    def __init__(self, consumer_id: str, registry: MemoryRegistry) -> None:
        self.consumer_id = consumer_id
        self.config = ConsumerConfig(group="g")
        self.subscriptions = {"t": SimpleNamespace()}
        self.assigned = asyncio.Event()
        self.running: set[TopicPartition] = set()
        self.registry = registry

    async def start_partitions(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            assert self.registry.owners("g", "t").get(tp.partition) == self.consumer_id, "started before claimed"
        self.running.update(tps)

    async def stop_partitions(self, tps: list[TopicPartition], commit: bool) -> None:
        for tp in tps:
            assert self.registry.owners("g", "t").get(tp.partition) == self.consumer_id, "released before stopped"
        self.running.difference_update(tps)


def membership(consumer: FakeConsumer, registry: MemoryRegistry) -> ZooKeeperMembership:
    return ZooKeeperMembership(consumer, registry, lambda topic: list(P), session_timeout_s=3.0)  # type: ignore[arg-type]


def test_members_split_the_partitions_claiming_before_starting_and_stopping_before_releasing() -> None:
    async def main() -> None:
        reg = MemoryRegistry()
        a, b = FakeConsumer("a", reg), FakeConsumer("b", reg)
        ma, mb = membership(a, reg), membership(b, reg)
        ta = asyncio.ensure_future(ma.run())
        await until(lambda: a.running == {TopicPartition("t", p) for p in P} and ma.settled_at is not None)
        tb = asyncio.ensure_future(mb.run())
        await until(lambda: ma.settled_at is not None and mb.settled_at is not None
                    and len(a.running) == len(b.running) == 2)
        assert a.running.isdisjoint(b.running)
        assert {tp.partition for tp in a.running | b.running} == set(P)
        # range: a (first id) keeps 1-0 and 1-1; b had to wait for a to release 2-0 and 2-1
        assert {str(tp.partition) for tp in b.running} == {"2-0", "2-1"}
        assert reg.log.index(("release", "a", "2-0")) < reg.log.index(("claim", "b", "2-0"))
        tb.cancel()
        await asyncio.gather(tb, return_exceptions=True)
        await mb.leave()
        await until(lambda: len(a.running) == 4)
        ta.cancel()
        await asyncio.gather(ta, return_exceptions=True)
        await ma.leave()
        assert reg.owner == {} and reg.ids == {}

    asyncio.run(main())


def test_a_partition_held_by_someone_else_is_retried_until_released() -> None:
    async def main() -> None:
        reg = MemoryRegistry()
        reg.owner[("t", P[0])] = "ghost"  # a killed member whose session has not expired yet
        a = FakeConsumer("a", reg)
        ma = membership(a, reg)
        task = asyncio.ensure_future(ma.run())
        await until(lambda: len(a.running) == 3)
        assert ma.settled_at is None and not a.assigned.is_set()
        reg.release("g", "t", P[0], "ghost")
        await until(lambda: len(a.running) == 4 and ma.settled_at is not None)
        assert a.assigned.is_set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ma.leave()

    asyncio.run(main())


def test_an_expired_session_stops_everything_without_commit_and_rejoins() -> None:
    async def main() -> None:
        reg = MemoryRegistry()
        a = FakeConsumer("a", reg)
        stops: list[bool] = []
        original = a.stop_partitions

        async def stop(tps: list[TopicPartition], commit: bool) -> None:
            stops.append(commit)
            reg.release_all("g", "a")  # the expiry removed the owner nodes
            a.running.difference_update(tps)

        a.stop_partitions = stop  # type: ignore[method-assign]
        ma = membership(a, reg)
        task = asyncio.ensure_future(ma.run())
        await until(lambda: len(a.running) == 4 and ma.settled_at is not None)
        assert ma.may_fetch()
        before = ma.rebalances
        ma._on_session("lost")
        await until(lambda: not ma.may_fetch() or ma.rebalances > before)
        await until(lambda: ma.rebalances > before and len(a.running) == 4)
        assert stops == [False]
        a.stop_partitions = original  # type: ignore[method-assign]
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ma.leave()

    asyncio.run(main())


@pytest.mark.parametrize("rand", [0, 0xABCDEF])
def test_consumer_id_has_metaqs_shape(rand: int) -> None:
    cid = metaq_consumer_id("billing", "host-1", 1700000000123, rand)
    assert cid == f"billing_host-1-1700000000123-{rand:06x}"
