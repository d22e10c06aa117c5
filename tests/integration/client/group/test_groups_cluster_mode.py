"""Consumer groups in cluster mode (MetaQ's way): members, owners and offsets in ZooKeeper.

Real ZooKeeper, real broker processes; the consumers run in this process, each on its own session
(its own ZooKeeper session). What every consumer was handed is recorded, and the owners znodes are
compared with what each consumer runs.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import uvloop

from metaq import testing
from metaq.client import Message, MessageSessionFactory
from metaq.client.group import ConsumerConfig, GroupConsumer, ZooKeeperOffsetStorage, create_consumer
from metaq.client.group.membership import ZooKeeperMembership
from metaq.cluster.zookeeper import ZooKeeperRegistry
from metaq.testing import BrokerProcess, until
from metaq.testing.zookeeper import expire_session
from metaq.types import PartitionId

TOPICS = "[topic=orders]\nnumPartitions=2\n"
ZK_SESSION_MS = 3000
FAST = {"commit_offset_period_ms": 200, "max_delay_fetch_ms": 300, "fetch_runner_count": 4}


class Member:
    """A consumer on its own session, recording (partition, offset, value) per delivery."""

    def __init__(self, session: MessageSessionFactory, consumer: GroupConsumer) -> None:
        self.session = session
        self.consumer = consumer
        self.got: list[tuple[str, int, int]] = []

    @property
    def id(self) -> str:
        return self.consumer.consumer_id

    @property
    def membership(self) -> ZooKeeperMembership:
        assert isinstance(self.consumer.membership, ZooKeeperMembership)
        return self.consumer.membership

    def owned(self, topic: str = "orders") -> set[PartitionId]:
        return {tp.partition for tp in self.consumer.assignment() if tp.topic == topic}

    async def close(self) -> None:
        await self.consumer.close()
        await self.session.close()


async def member(zk: Any, root: str, group: str, tmp: Path, **kw: Any) -> Member:
    session = await MessageSessionFactory.connect(zk_connect=zk.connect_string, zk_root=root,
                                                  zk_session_timeout_ms=ZK_SESSION_MS)
    cfg = ConsumerConfig(group=group, recover_dir=tmp / "recover", **{**FAST, **kw})
    consumer = create_consumer(session, cfg)
    out = Member(session, consumer)

    def listener(msg: Message) -> None:
        out.got.append((str(msg.partition_id), msg.offset, int(bytes(msg.data))))

    consumer.subscribe("orders", 64 * 1024, listener)
    await consumer.complete_subscribe()
    return out


def settled(reader: ZooKeeperRegistry, group: str, members: list[Member], expected: set[PartitionId]) -> bool:
    """The owners znodes name exactly ``expected``, each by a live member that runs it, disjointly."""
    owners = reader.owners(group, "orders")
    if set(owners) != expected:
        return False
    for m in members:
        mine = {p for p, o in owners.items() if o == m.id}
        if m.owned() != mine or m.membership.settled_at is None:
            return False
    runs = [p for m in members for p in m.owned()]
    return len(runs) == len(set(runs)) and set(runs) == expected


async def produce(session: MessageSessionFactory, values: range) -> None:
    """One message a value, each placed by the producer's selector (round robin)."""
    await testing.produce(session, "orders", [b"%d" % v for v in values], batch_messages=1)


def check_history(members: list[Member], produced: set[int]) -> Counter[int]:
    """Everything produced was consumed; per member and partition, in offset order. Returns duplicates."""
    seen = Counter(v for m in members for _, _, v in m.got)
    missing = produced - set(seen)
    assert not missing, f"{len(missing)} produced messages never consumed, e.g. {sorted(missing)[:5]}"
    for m in members:
        by_part: dict[str, list[int]] = {}
        for part, offset, _ in m.got:
            by_part.setdefault(part, []).append(offset)
        for part, offsets in by_part.items():
            assert offsets == sorted(offsets), f"{m.id} got {part} out of order"
    return Counter({v: n - 1 for v, n in seen.items() if n > 1})


@pytest.fixture
def reader(zookeeper: Any, zk_root: str) -> Any:
    reg = ZooKeeperRegistry(zookeeper.connect_string, zk_root, watch_cluster=False, read_only=True).start()
    yield reg
    reg.close()


@pytest.mark.slow
def test_three_members_over_three_brokers_follow_brokers_leaving_and_coming_back(
        cluster_factory: Callable[..., BrokerProcess], zookeeper: Any, zk_root: str, reader: ZooKeeperRegistry,
        tmp_path: Path) -> None:
    brokers = {b: cluster_factory(b, topics=TOPICS) for b in (1, 2, 3)}
    every = {PartitionId(b, p) for b in (1, 2, 3) for p in (0, 1)}

    async def main() -> None:
        members = [await member(zookeeper, zk_root, "g", tmp_path / f"m{i}") for i in range(3)]
        produced: set[int] = set()
        try:
            await until(lambda: settled(reader, "g", members, every), message="6 partitions shared by 3 members")
            assert sorted(len(m.owned()) for m in members) == [2, 2, 2]
            assert all(m.consumer.offsets.__class__ is ZooKeeperOffsetStorage for m in members)

            async def consumed_all() -> None:
                await until(lambda: produced <= {v for m in members for _, _, v in m.got},
                            message="everything consumed")

            async def produce_checked(values: range) -> None:
                """In a settled group, each member receives exactly the new messages of what it owns."""
                owned = {m.id: m.owned() for m in members}
                marks = [len(m.got) for m in members]
                await produce(members[0].session, values)
                produced.update(values)
                await consumed_all()
                for m, mark in zip(members, marks, strict=True):
                    got = {PartitionId.parse(part) for part, _, v in m.got[mark:] if v in values}
                    assert got <= owned[m.id], f"{m.id} received {got - owned[m.id]}, owned by others"
                assert len([v for m in members for _, _, v in m.got if v in values]) == len(values)

            await produce_checked(range(0, 300))
            for how in ("stop", "kill"):
                b3 = brokers[3]
                await asyncio.to_thread(b3.stop if how == "stop" else b3.kill)
                rest = {p for p in every if p.broker_id != 3}
                await until(lambda r=rest: settled(reader, "g", members, r), message=f"broker 3 {how}: 4 partitions")
                await produce_checked(range(len(produced), len(produced) + 200))
                await asyncio.to_thread(b3.restart)
                await until(lambda: settled(reader, "g", members, every), message=f"broker 3 back after {how}")
                await produce_checked(range(len(produced), len(produced) + 300))
            await asyncio.gather(*(m.consumer.commit() for m in members))
            committed = reader.offsets("g", "orders")
            assert set(committed) == every
            dups = check_history(members, produced)
            assert not dups, f"clean rebalances deliver nothing twice, got {dups.most_common(3)}"
        finally:
            for m in members:
                await m.close()
        assert reader.members("g") == {} and reader.owners("g", "orders") == {}

    uvloop.run(main())


def test_members_join_and_leave_offsets_carry_over(
        cluster_factory: Callable[..., BrokerProcess], zookeeper: Any, zk_root: str, reader: ZooKeeperRegistry,
        tmp_path: Path) -> None:
    for b in (1, 2):
        cluster_factory(b, topics=TOPICS)
    every = {PartitionId(b, p) for b in (1, 2) for p in (0, 1)}

    async def main() -> None:
        a = await member(zookeeper, zk_root, "g", tmp_path / "a")
        produced = set(range(100))
        await produce(a.session, range(100))
        await until(lambda: settled(reader, "g", [a], every), message="a alone owns all")
        await until(lambda: produced <= {v for _, _, v in a.got}, message="a consumed everything")
        b = await member(zookeeper, zk_root, "g", tmp_path / "b")
        await until(lambda: settled(reader, "g", [a, b], every), message="a and b share")
        assert len(a.owned()) == len(b.owned()) == 2
        await produce(a.session, range(100, 200))
        produced.update(range(100, 200))
        await until(lambda: produced <= {v for m in (a, b) for _, _, v in m.got}, message="a and b consumed all")
        await a.close()
        await until(lambda: settled(reader, "g", [b], every), message="b takes a's partitions over")
        await produce(b.session, range(200, 300))
        produced.update(range(200, 300))
        await until(lambda: produced <= {v for m in (a, b) for _, _, v in m.got}, message="b consumed all")
        dups = check_history([a, b], produced)
        assert not dups, "a clean leave commits first: nothing is delivered twice"
        await b.close()
        # a new member of the group starts where the group stopped (ZooKeeper offsets)
        c = await member(zookeeper, zk_root, "g", tmp_path / "c")
        await until(lambda: settled(reader, "g", [c], every), message="c owns all")
        await produce(c.session, range(300, 310))
        await until(lambda: set(range(300, 310)) <= {v for _, _, v in c.got}, message="c consumed the new ones")
        assert {v for _, _, v in c.got} == set(range(300, 310))
        await c.close()

    uvloop.run(main())


def test_expired_session_stops_fetching_and_rejoins(
        cluster_factory: Callable[..., BrokerProcess], zookeeper: Any, zk_root: str, reader: ZooKeeperRegistry,
        tmp_path: Path) -> None:
    for b in (1, 2):
        cluster_factory(b, topics=TOPICS)
    every = {PartitionId(b, p) for b in (1, 2) for p in (0, 1)}

    async def main() -> None:
        a = await member(zookeeper, zk_root, "g", tmp_path / "a")
        b = await member(zookeeper, zk_root, "g", tmp_path / "b")
        try:
            await until(lambda: settled(reader, "g", [a, b], every), message="a and b share")
            produced = set(range(200))
            await produce(a.session, range(200))
            await until(lambda: produced <= {v for m in (a, b) for _, _, v in m.got}, message="consumed")
            registry = a.session._core.registry
            assert registry is not None
            before = a.membership.rebalances
            await asyncio.to_thread(expire_session, registry.raw_client(), zookeeper)
            # The expiry reaches the member's loop: it fetches nothing until it has rebalanced.
            await until(lambda: not a.membership.may_fetch() or a.membership.rebalances > before, 5,
                        message="a to stop fetching")
            await until(lambda: a.membership.rebalances > before and settled(reader, "g", [a, b], every),
                        message="a re-joined with a new session")
            await produce(b.session, range(200, 400))
            produced.update(range(200, 400))
            await until(lambda: produced <= {v for m in (a, b) for _, _, v in m.got}, message="consumed after")
            check_history([a, b], produced)
        finally:
            await a.close()
            await b.close()

    uvloop.run(main())


def test_group_commands_read_and_reset_zookeeper_offsets(
        cluster_factory: Callable[..., BrokerProcess], zookeeper: Any, zk_root: str, reader: ZooKeeperRegistry,
        tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    for b in (1, 2):
        cluster_factory(b, topics=TOPICS)
    every = {PartitionId(b, p) for b in (1, 2) for p in (0, 1)}
    env = {**os.environ, "METAQ_SERVERS": "", "METAQ_ZK_CONNECT": zookeeper.connect_string, "METAQ_ZK_ROOT": zk_root}

    def metaq(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "metaq.cli.main", *args], capture_output=True, text=True,
                              timeout=60, env=env)

    async def consume_some() -> Member:
        a = await member(zookeeper, zk_root, "billing", tmp_path / "a")
        await produce(a.session, range(40))
        await until(lambda: settled(reader, "billing", [a], every), message="a owns all")
        await until(lambda: len(a.got) == 40, message="a consumed 40")
        await a.consumer.commit()
        return a

    async def main() -> None:
        a = await consume_some()
        try:
            listed = metaq("group", "list")
            assert listed.returncode == 0, listed.stderr
            assert listed.stdout.split() == ["billing"]
            described = metaq("group", "describe", "billing", "--json")
            assert described.returncode == 0, described.stderr
            doc = json.loads(described.stdout)
            assert doc["state"] == "Stable" and [mb["member_id"] for mb in doc["members"]] == [a.id]
            assert {p["partition"]: (p["owner"], p["lag"]) for p in doc["partitions"]} == {
                str(p): (a.id, 0) for p in every}
            assert sum(p["committed"] for p in doc["partitions"]) == 40
            refused = metaq("group", "reset", "billing", "orders", "--to", "earliest")
            assert refused.returncode == 1 and "stop its consumers" in refused.stderr, refused.stderr
        finally:
            await a.close()
        reset = metaq("group", "reset", "billing", "orders", "--to", "earliest", "-p", "1-0")
        assert reset.returncode == 0, reset.stderr
        old = reader.offsets("billing", "orders")
        assert old[PartitionId(1, 0)] == 0 and all(v > 0 for p, v in old.items() if p != PartitionId(1, 0))
        text = metaq("group", "describe", "billing")
        assert text.returncode == 0 and "Empty" in text.stdout, text.stdout
        # the next member starts 1-0 over from the reset offset
        b = await member(zookeeper, zk_root, "billing", tmp_path / "b")
        try:
            await until(lambda: settled(reader, "billing", [b], every), message="b owns all")
            await until(lambda: len(b.got) == old_count(a, "1-0"), message="b re-reads 1-0")
            assert {part for part, _, _ in b.got} == {"1-0"}
        finally:
            await b.close()

    def old_count(m: Member, part: str) -> int:
        return sum(1 for p, _, _ in m.got if p == part)

    uvloop.run(main())


def test_two_members_of_a_group_sharing_one_session(
        cluster_factory: Callable[..., BrokerProcess], zookeeper: Any, zk_root: str, reader: ZooKeeperRegistry,
        tmp_path: Path) -> None:
    """Consumers of one group on one session (one ZooKeeper session) are still distinct members: distinct
    ids, claims checked by owner, and every one of them hears of the group's changes."""
    for b in (1, 2):
        cluster_factory(b, topics=TOPICS)
    every = {PartitionId(b, p) for b in (1, 2) for p in (0, 1)}

    async def on_session(session: MessageSessionFactory, name: str) -> Member:
        cfg = ConsumerConfig(group="g", recover_dir=tmp_path / name, consumer_id=f"m-{name}", **FAST)
        consumer = create_consumer(session, cfg)
        out = Member(session, consumer)
        consumer.subscribe("orders", 64 * 1024,
                           lambda msg: out.got.append((str(msg.partition_id), msg.offset, int(bytes(msg.data)))))
        await consumer.complete_subscribe()
        return out

    async def main() -> None:
        shared = await MessageSessionFactory.connect(zk_connect=zookeeper.connect_string, zk_root=zk_root,
                                                     zk_session_timeout_ms=ZK_SESSION_MS)
        a = await on_session(shared, "a")
        b = await on_session(shared, "b")
        assert a.id != b.id
        await until(lambda: settled(reader, "g", [a, b], every), message="a and b share one session and the partitions")
        # "m-0" sorts first: with range, c takes a's partitions, so a must hear of c through the shared watch
        c = await member(zookeeper, zk_root, "g", tmp_path / "c", consumer_id="m-0")
        await until(lambda: settled(reader, "g", [a, b, c], every), message="both hear of c")
        assert {str(p) for p in c.owned()} == {"1-0", "1-1"}
        await c.close()
        await until(lambda: settled(reader, "g", [a, b], every), message="both hear c leave")
        await produce(shared, range(100))
        await until(lambda: set(range(100)) <= {v for m in (a, b) for _, _, v in m.got}, message="consumed")
        assert not check_history([a, b], set(range(100)))
        await a.consumer.close()
        await b.consumer.close()
        await shared.close()

    uvloop.run(main())
