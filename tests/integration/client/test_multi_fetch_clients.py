"""The client side of MultiFetch: PullConsumer.get_many, and the fallback to one Fetch per partition
against a broker that does not serve MultiFetch (found from its ApiVersions answer)."""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import uvloop

from metaq.client import MessageSessionFactory
from metaq.client.fetcher import FetchResult
from metaq.client.group import ConsumerConfig, create_consumer
from metaq.errors import CorruptRecordError, OffsetOutOfRangeError
from metaq.protocol import messages as m
from metaq.testing import BrokerProcess, produce
from metaq.testing.inprocess import InProcessBroker
from metaq.testing.raw import RawClient
from metaq.types import PartitionId


async def _fill(session: MessageSessionFactory, topic: str, partitions: int, per_partition: int) -> None:
    """``topic`` created with ``partitions`` partitions, each holding ``b"<partition>:<i>"``."""
    await produce(session, topic, {p: [b"%d:%d" % (p, i) for i in range(per_partition)] for p in range(partitions)},
                  create_partitions=partitions)


def test_get_many_returns_each_partitions_messages_and_errors_and_long_polls(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 4})

    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            await _fill(session, "many", 4, 2)
            consumer = session.create_pull_consumer()
            got = await consumer.get_many({("many", 0): 0, ("many", 1): 1, ("many", 2): 2, ("many", 3): 50})
            ok = {k: v for k, v in got.items() if isinstance(v, FetchResult)}
            assert {k[1].partition: [bytes(x.data) for x in v.messages] for k, v in ok.items()} == {
                0: [b"0:0", b"0:1"], 1: [b"1:1"], 2: []}
            assert isinstance(got[("many", PartitionId(0, 3))], OffsetOutOfRangeError)
            # long polling: every partition caught up, an append to one of them answers the call
            waiting = asyncio.ensure_future(consumer.get_many({("many", p): 2 for p in range(4)}, max_wait_ms=60_000))
            raw = RawClient.to(broker)
            deadline = time.monotonic() + 20
            while json.loads(raw.call(m.StatsRequest(None)).stats_json).get("waiting_fetches", 0) < 1:
                assert time.monotonic() < deadline, "the MultiFetch never waited"
                await asyncio.sleep(0.01)
            raw.close()
            assert (await session.create_producer().send_batch("many", [b"late"], partition=2)).success
            woke = await asyncio.wait_for(waiting, 20)
            assert [bytes(x.data) for x in woke[("many", PartitionId(0, 2))].messages] == [b"late"]
            assert all(not woke[("many", PartitionId(0, p))].messages for p in (0, 1, 3))

    uvloop.run(main())


def test_a_broker_without_multi_fetch_is_read_partition_by_partition(tmp_path: Path) -> None:
    with InProcessBroker(tmp_path / "old", {"numPartitions": 6, "unflushThreshold": 0}) as broker:
        broker.call(lambda: broker.broker.handlers.pop(m.MultiFetchRequest))  # an older broker

        async def main() -> None:
            async with await MessageSessionFactory.connect(broker.servers) as session:
                await _fill(session, "old", 6, 5)
                pull = session.create_pull_consumer()
                got = await pull.get_many({("old", p): 3 for p in range(6)})
                assert all(isinstance(v, FetchResult) and [x.offset for x in v.messages] == [3, 4]
                           for v in got.values())
            session = await MessageSessionFactory.connect(broker.servers)
            seen: dict[int, list[int]] = defaultdict(list)
            consumer = create_consumer(session, ConsumerConfig(
                group="old-group", recover_dir=tmp_path / "recover", max_delay_fetch_ms=300,
                commit_offset_period_ms=200, fetch_runner_count=2))
            consumer.subscribe("old", 64 * 1024, lambda msg: seen[msg.partition].append(msg.offset))
            await consumer.complete_subscribe()
            deadline = time.monotonic() + 30
            while sum(map(len, seen.values())) < 30:
                assert time.monotonic() < deadline, dict(seen)
                await asyncio.sleep(0.02)
            assert dict(seen) == {p: [0, 1, 2, 3, 4] for p in range(6)}
            assert consumer.broker_fetchers == {}  # no MultiFetch was tried
            await consumer.close()
            await session.close()

        uvloop.run(main())


def test_a_damaged_batch_fails_only_its_own_partition(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 2})

    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            await session.admin().create_topic("dmg", 2)
            producer = session.create_producer()
            for p in range(2):
                assert (await producer.send_batch("dmg", [b"payload-%d" % p] * 3, partition=p)).success
            segment = sorted((broker.data_dir / "dmg-0").glob("*.log"))[0]
            data = bytearray(segment.read_bytes())
            at = data.index(b"payload-0")  # a value byte: the batch's body CRC, checked by the client, fails
            data[at] ^= 0xFF
            segment.write_bytes(bytes(data))
            got = await session.create_pull_consumer().get_many({("dmg", 0): 0, ("dmg", 1): 0})
            assert isinstance(got[("dmg", PartitionId(0, 0))], CorruptRecordError)
            healthy = got[("dmg", PartitionId(0, 1))]
            assert isinstance(healthy, FetchResult) and [bytes(x.data) for x in healthy.messages] == [b"payload-1"] * 3

    uvloop.run(main())
