"""Consumers reading from slaves (``read_from``): a real master, a real slave, real ZooKeeper.

What a user relies on: a consumer reading from the slave gets every message the master acked, in
order, with the master's offsets and ids; with ``prefer-slave`` a slave killed -9 sends the reads to
the master and a slave restarted takes them back, with nothing lost and nothing delivered twice (the
group consumer's duplicate filter is off, so a repeat would show), for the pull consumer and the group
consumer alike.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import uvloop
from cli_process import metaq
from test_replication_ha import TOPIC as HA_TOPIC
from test_replication_ha import Replicas, group_state, wait_isr
from test_replication_slave import end_offsets

from metaq.client import Message, MessageSessionFactory
from metaq.client.group import ConsumerConfig, create_consumer
from metaq.net.blocking import BlockingConnection
from metaq.net.codec import ConnectionSettings, raise_for_error
from metaq.protocol import messages as m
from metaq.testing import BrokerProcess, until
from metaq.testing.history import ProduceLoad, check_history
from metaq.types import PartitionId

TOPIC = "orders"
TOPICS = f"[topic={TOPIC}]\nnumPartitions=2\n"
PARTS = [PartitionId(1, 0), PartitionId(1, 1)]
SETTINGS = ConnectionSettings("read-from-test", 5.0, 30.0, 16, 64 << 20)
WAIT_S = 60.0

Record = tuple[int, int, bytes]
"""(offset, message id, payload)."""


def get_requests(proc: BrokerProcess) -> int:
    """Fetches the broker answered on the topic (a slave answers only consumers' fetches), 0 if it is down."""
    try:
        conn = BlockingConnection.open((proc.host, proc.port), SETTINGS)
    except Exception:
        return 0
    try:
        doc = json.loads(raise_for_error(conn.call(m.StatsRequest(TOPIC))).stats_json)
    except Exception:
        return 0
    finally:
        conn.close()
    return sum(p["get_requests"] for p in doc["topics"].get(TOPIC, {}).get("partitions", {}).values())


class Produced:
    def __init__(self, session: MessageSessionFactory) -> None:
        self.producer = session.create_producer()
        self.acked: dict[PartitionId, list[Record]] = {p: [] for p in PARTS}
        self.n = 0

    async def send(self, count: int) -> None:
        for _ in range(count):
            result = await self.producer.send(Message(TOPIC, b"m%06d" % self.n))
            self.n += 1
            assert result.success, result
            self.acked[result.partition_id].append((result.offset, result.message_id, b"m%06d" % (self.n - 1)))

    def total(self) -> int:
        return sum(len(v) for v in self.acked.values())


def start(cluster_factory: Callable[..., BrokerProcess], **system: Any) -> tuple[BrokerProcess, BrokerProcess]:
    master = cluster_factory(1, topics=TOPICS, **system)
    slave = cluster_factory(1, topics=TOPICS, name="broker-1-slave-0", args=["--slave", "--slave-id", "0"], **system)
    return master, slave


async def connect(zookeeper: Any, zk_root: str, **config: Any) -> MessageSessionFactory:
    return await MessageSessionFactory.connect(zk_connect=zookeeper.connect_string, zk_root=zk_root, **config)


def test_a_pull_consumer_reading_from_the_slave_gets_every_message_in_order(
        cluster_factory: Callable[..., BrokerProcess], zookeeper: Any, zk_root: str) -> None:
    master, slave = start(cluster_factory)

    async def main() -> None:
        producing = await connect(zookeeper, zk_root)
        reading = await connect(zookeeper, zk_root, read_from="slave")
        produced = Produced(producing)
        got: dict[PartitionId, list[Record]] = {p: [] for p in PARTS}
        consumer = reading.create_pull_consumer()

        async def read(p: PartitionId) -> None:
            # offset 0 while the slave may not be registered yet: the fetches wait for it
            async for msg in consumer.iterate(TOPIC, p, 0, max_wait_ms=300):
                got[p].append((msg.offset, msg.id, bytes(msg.data)))

        tasks = [asyncio.create_task(read(p)) for p in PARTS]
        try:
            await produced.send(300)  # while the consumer reads the slave, which follows the master
            await until(lambda: all(len(got[p]) >= len(produced.acked[p]) for p in PARTS), WAIT_S,
                        message="every message")
            await produced.send(100)
            await until(lambda: all(len(got[p]) >= len(produced.acked[p]) for p in PARTS), WAIT_S,
                        message="the new messages")
            assert got == produced.acked  # same offsets, same ids, in order, nothing twice
            assert produced.total() == 400
            assert await consumer.offsets(TOPIC, PARTS[0]) == (0, len(produced.acked[PARTS[0]]))
            assert get_requests(slave) > 0  # read from the slave: it takes fetches from consumers only
            acked.update(produced.acked)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await reading.close()
            await producing.close()

    acked: dict[PartitionId, list[Record]] = {}
    uvloop.run(main())

    # the command line: metaq consume --read-from slave prints what the slave holds (all of it by now)
    result = metaq("consume", TOPIC, "--zk-connect", zookeeper.connect_string, "--zk-root", zk_root,
                   "--read-from", "slave", "--format", "json")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert {(r["partition"], r["offset"], r["value"]) for r in rows} == \
        {(str(p), o, v.decode()) for p, recs in acked.items() for o, _, v in recs}
    assert len(rows) == 400
    refused = metaq("consume", TOPIC, "-s", master.servers, "--read-from", "prefer-slave")
    assert refused.returncode == 2 and "--read-from prefer-slave needs --zk-connect" in refused.stderr


def test_prefer_slave_falls_back_to_the_master_when_the_slave_dies_and_returns_to_it(
        cluster_factory: Callable[..., BrokerProcess], zookeeper: Any, zk_root: str, tmp_path: Path) -> None:
    _master, slave = start(cluster_factory)

    async def main() -> None:
        producing = await connect(zookeeper, zk_root)
        reading = await connect(zookeeper, zk_root, read_from="prefer-slave", unreachable_avoid_s=1.0)
        produced = Produced(producing)
        pulled: dict[PartitionId, list[Record]] = {p: [] for p in PARTS}
        grouped: dict[PartitionId, list[Record]] = {p: [] for p in PARTS}
        puller = reading.create_pull_consumer()
        group = create_consumer(reading, ConsumerConfig(group="g", recover_dir=tmp_path / "recover", dedup_window=0,
                                                        commit_offset_period_ms=200, max_delay_fetch_ms=300))

        def listener(msg: Message) -> None:
            grouped[msg.partition_id].append((msg.offset, msg.id, bytes(msg.data)))

        group.subscribe(TOPIC, 64 * 1024, listener)
        await group.complete_subscribe()

        async def pull(p: PartitionId) -> None:
            async for msg in puller.iterate(TOPIC, p, 0, max_wait_ms=300):
                pulled[p].append((msg.offset, msg.id, bytes(msg.data)))

        def caught_up() -> bool:
            return all(len(seen[p]) >= len(produced.acked[p]) for seen in (pulled, grouped) for p in PARTS)

        tasks = [asyncio.create_task(pull(p)) for p in PARTS]
        try:
            await produced.send(200)
            await until(caught_up, WAIT_S, message="phase 1 consumed")
            await until(lambda: get_requests(slave) > 0, WAIT_S, message="reads served by the slave")

            sending = asyncio.create_task(produced.send(300))
            await asyncio.to_thread(slave.kill)  # -9 while messages flow: reads go to the master
            await sending
            await until(caught_up, WAIT_S, message="everything consumed with the slave dead")

            await asyncio.to_thread(slave.start)  # back (behind, catching up): reads return to it
            await until(lambda: get_requests(slave) > 0, WAIT_S, message="reads served by the restarted slave")
            await produced.send(200)
            await until(caught_up, WAIT_S, message="everything consumed after the slave's return")
            assert produced.total() == 700
            assert pulled == produced.acked, "the pull consumer lost, repeated or reordered messages"
            assert grouped == produced.acked, "the group consumer lost, repeated or reordered messages"
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await group.close()
            await reading.close()
            await producing.close()

    uvloop.run(main())


@pytest.mark.parametrize("update_consumer_offsets", [False, True])
def test_an_offset_past_the_slaves_log_end_is_waited_for_never_jumped_or_reset(
        cluster_factory: Callable[..., BrokerProcess], zookeeper: Any, zk_root: str,
        update_consumer_offsets: bool, caplog: pytest.LogCaptureFixture) -> None:
    """A consumer ahead of the slave (it read further on the master, or the slave is catching up) gets
    nothing until the slave has its offset, then exactly what is there; with updateConsumerOffsets=true
    the slave's own reset to its end (a redelivery) is not taken either."""
    start(cluster_factory, updateConsumerOffsets=update_consumer_offsets)
    p10 = PartitionId(1, 0)
    caplog.set_level(logging.DEBUG, logger="metaq.client.consumer")

    def told_behind(offset: int) -> bool:
        """The fetcher was told the slave ends before ``offset`` and waits for it (its debug record)."""
        return any(r.funcName == "_fetch_slave" and r.args and r.args[-1] == offset  # type: ignore[index]
                   for r in caplog.records)

    async def main() -> None:
        producing = await connect(zookeeper, zk_root)
        reading = await connect(zookeeper, zk_root, read_from="slave")
        try:
            producer = producing.create_producer(selector=lambda topic, partitions, message: partitions[0])
            results = [await producer.send(Message(TOPIC, b"a%d" % i)) for i in range(100)]
            assert all(r.success and r.partition_id == p10 for r in results)
            consumer = reading.create_pull_consumer()
            deadline = time.monotonic() + 30
            while await consumer.offsets(TOPIC, p10) != (0, 100):  # asked of the slave
                assert time.monotonic() < deadline, "the slave did not catch up"
                await asyncio.sleep(0.02)

            now = await consumer.fetcher.fetch(TOPIC, p10, 150, max_wait_ms=0)
            assert now.behind and now.messages == [] and now.next_offset == 150 and now.log_end_offset == 100
            assert await consumer.get(TOPIC, p10, 150) == []

            waiting = asyncio.create_task(consumer.fetcher.fetch(TOPIC, p10, 150, max_wait_ms=30_000))
            await until(lambda: waiting.done() or told_behind(150), message="the fetch to be answered or to wait")
            assert not waiting.done(), "the fetch waits for the slave instead of answering"
            more = [await producer.send(Message(TOPIC, b"b%d" % i)) for i in range(60)]
            assert [r.offset for r in more] == list(range(100, 160))
            got = await waiting
            assert not got.behind and got.reset_offset == -1
            assert got.messages and got.messages[0].offset == 150
            by_offset = {r.offset: (r.message_id, b"b%d" % i) for i, r in enumerate(more)}
            assert [(x.offset, x.id, bytes(x.data)) for x in got.messages] == \
                [(o, *by_offset[o]) for o in range(150, 150 + len(got.messages))]
        finally:
            await reading.close()
            await producing.close()

    uvloop.run(main())


def test_consumers_reading_slaves_ride_out_a_failover_and_see_every_acked_message_once(
        cluster_factory: Callable[..., BrokerProcess], zookeeper: Any, zk_root: str, zk_client: Any,
        tmp_path: Path) -> None:
    """HA mode (sync replication, automatic failover): prefer-slave consumers, pull and group, while the
    master is killed -9 under load and a slave takes over. Slaves serve only up to the high watermark,
    so nothing a consumer saw can vanish; every acked message is read once, in order (history check)."""
    replicas = Replicas(cluster_factory, 3, inSyncMaxLagMs=5000)
    wait_isr(zk_client, zk_root, {1, 2})
    session = {"zk_connect": zookeeper.connect_string, "zk_root": zk_root, "request_timeout_s": 10.0}
    load = ProduceLoad(session, HA_TOPIC, window=50, time_limit_s=120.0).start()
    pulled: dict[PartitionId, list[tuple[int, bytes]]] = {}
    grouped: dict[PartitionId, list[tuple[int, bytes]]] = {}

    async def main() -> None:
        reading = await connect(zookeeper, zk_root, read_from="prefer-slave", request_timeout_s=10.0)
        group = create_consumer(reading, ConsumerConfig(group="g", recover_dir=tmp_path / "recover", dedup_window=0,
                                                        commit_offset_period_ms=200, max_delay_fetch_ms=300))
        group.subscribe(HA_TOPIC, 64 * 1024,
                        lambda msg: grouped.setdefault(msg.partition_id, []).append((msg.offset, bytes(msg.data))))
        await group.complete_subscribe()
        puller = reading.create_pull_consumer()

        async def pull(p: Any) -> None:
            got = pulled.setdefault(p.id, [])
            async for msg in puller.iterate(HA_TOPIC, p, 0, max_wait_ms=300):
                got.append((msg.offset, bytes(msg.data)))

        tasks = [asyncio.create_task(pull(p)) for p in await reading.partitions(HA_TOPIC)]

        def read_all(seen: dict[PartitionId, list[tuple[int, bytes]]]) -> bool:
            return set(load.acked) <= {d for msgs in seen.values() for _, d in msgs}

        try:
            await until(lambda: len(load.acked) > 500, WAIT_S, message="acks before the kill")
            state = group_state(zk_client, zk_root)
            assert state is not None
            await asyncio.to_thread(replicas.procs[state["master"]].kill)
            acked = len(load.acked)
            await until(lambda: (s := group_state(zk_client, zk_root)) is not None and s["epoch"] > state["epoch"]
                        and len(load.acked) > acked + 300, WAIT_S, message="a slave to take over and acks to resume")
            await asyncio.to_thread(load.stop, 120)
            await until(lambda: read_all(pulled) and read_all(grouped), WAIT_S, message="every acked message consumed")
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await group.close()
            await reading.close()

    try:
        uvloop.run(main())
    finally:
        load.stop(120)
    for name, read in (("pull", pulled), ("group", grouped)):
        problems = check_history(read, load.acked, load.failed)
        assert not problems, f"{name} consumer: " + "\n".join(problems[:10])

    # metaq cluster shows the replica group's HA state: the new master replica, its epoch, the in-sync set
    state = group_state(zk_client, zk_root)
    assert state is not None
    result = metaq("cluster", "--zk-connect", zookeeper.connect_string, "--zk-root", zk_root, "--json")
    assert result.returncode == 0, result.stderr
    (shown,) = json.loads(result.stdout)["replication"]
    assert shown["ha"] == {"epoch": state["epoch"], "master_replica": state["master"], "in_sync": state["isr"]}
    text = metaq("cluster", "--zk-connect", zookeeper.connect_string, "--zk-root", zk_root).stdout
    assert f"(HA: replica {state['master']} is master, epoch {state['epoch']}, in sync: " in text
    print(f"failover under prefer-slave consumers: {len(load.acked)} acked, all read once in order by both")


def test_a_dead_masters_partitions_stay_readable_from_its_slave(
        cluster_factory: Callable[..., BrokerProcess], zookeeper: Any, zk_root: str, zk_client: Any,
        tmp_path: Path) -> None:
    """MetaQ's slave "serves consumers": with the master killed and its session expired (plain async
    replication: nobody takes over), the partitions of broker id 1 stay in every client's partition list
    (readable, not publishable) and are read from the slave: by `metaq consume -p 1-0 --read-from slave`, by a
    pull consumer and by a group consumer, both with the default read_from="master"."""
    master, slave = start(cluster_factory, zk_session_timeout_ms=2000)
    cluster_factory(2, topics=TOPICS, zk_session_timeout_ms=2000)  # the topic lives on elsewhere too
    dead = [PartitionId(1, 0), PartitionId(1, 1)]

    async def produce() -> dict[PartitionId, list[Record]]:
        session = await connect(zookeeper, zk_root)
        acked: dict[PartitionId, list[Record]] = {}
        try:
            for _ in range(500):  # both brokers announce the topic
                if len(await session.partitions(TOPIC)) == 4:
                    break
                await asyncio.sleep(0.02)
            producer = session.create_producer()
            for n in range(400):
                result = await producer.send(Message(TOPIC, b"d%06d" % n))
                assert result.success, result
                acked.setdefault(result.partition_id, []).append((result.offset, result.message_id, b"d%06d" % n))
        finally:
            await session.close()
        return acked

    acked = uvloop.run(produce())
    assert set(dead) <= set(acked)
    ends = [len(acked[p]) for p in dead]
    deadline = time.monotonic() + 30
    while end_offsets(slave, 2) != ends:
        assert time.monotonic() < deadline, "the slave did not catch up"
        time.sleep(0.02)
    master.kill()
    deadline = time.monotonic() + 30
    while zk_client.exists(f"{zk_root}/brokers/ids/1/master") is not None:
        assert time.monotonic() < deadline, "the dead master's session did not expire"
        time.sleep(0.05)

    result = metaq("consume", TOPIC, "-p", "1-0", "--zk-connect", zookeeper.connect_string, "--zk-root", zk_root,
                   "--read-from", "slave", "--format", "json")
    assert result.returncode == 0, result.stderr
    assert [(json.loads(line)["offset"], json.loads(line)["value"]) for line in result.stdout.splitlines()] == \
        [(o, v.decode()) for o, _, v in acked[dead[0]]]

    async def read() -> None:
        session = await connect(zookeeper, zk_root)
        grouped: dict[PartitionId, list[Record]] = {}
        group = create_consumer(session, ConsumerConfig(group="after-death", recover_dir=tmp_path / "recover",
                                                        dedup_window=0, commit_offset_period_ms=200,
                                                        max_delay_fetch_ms=300))
        try:
            listed = {str(p): p.accept_publish for p in await session.partitions(TOPIC)}
            assert listed == {"1-0": False, "1-1": False, "2-0": True, "2-1": True}, listed
            puller = session.create_pull_consumer()
            pulled = [(msg.offset, msg.id, bytes(msg.data))
                      async for msg in puller.iterate(TOPIC, "1-1", 0, stop_at_end=True, max_wait_ms=300)]
            assert pulled == acked[dead[1]]

            def listener(msg: Message) -> None:
                grouped.setdefault(msg.partition_id, []).append((msg.offset, msg.id, bytes(msg.data)))

            group.subscribe(TOPIC, 64 * 1024, listener)
            await group.complete_subscribe()
            await until(lambda: sum(len(v) for v in grouped.values()) >= 400, WAIT_S,
                        message="the group to read everything")
            assert grouped == acked, "the group consumer lost, repeated or reordered messages"
        finally:
            await group.close()
            await session.close()

    uvloop.run(read())
    assert get_requests(slave) > 0
