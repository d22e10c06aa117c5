"""`metaq group list|describe|reset` functions, and the SQL offset storages with a real PostgreSQL."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvloop

from metaq.client import Message, MessageSessionFactory
from metaq.client.group import ConsumerConfig, PostgresOffsetStorage, SqliteOffsetStorage, create_consumer
from metaq.client.group.admin import describe_group, list_groups, reset_offsets
from metaq.errors import IllegalGenerationError, StorageError, UnknownGroupError
from metaq.testing import BrokerProcess, until
from metaq.testing.postgres import PostgresServer, PostgresUnavailable
from metaq.types import PartitionId, TopicPartition

FAST = {"session_timeout_ms": 1500, "rebalance_timeout_ms": 6000, "commit_offset_period_ms": 200,
        "max_delay_fetch_ms": 500}


def run(coro: Coroutine[Any, Any, None]) -> None:
    uvloop.run(coro)


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    try:
        server = PostgresServer().start()
    except PostgresUnavailable as exc:
        if os.environ.get("CI"):
            raise  # CI installs PostgreSQL (scripts/system-deps.sh): a missing server is a failure there
        pytest.skip(str(exc))
    yield server
    server.stop()


def test_describe_shows_members_offsets_and_lag_and_reset_rewinds(
        broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    broker = broker_factory({"numPartitions": 4})

    async def main() -> None:
        session = await MessageSessionFactory.connect(broker.servers)
        await session.admin().create_topic("audit", 4)
        producer = session.create_producer()
        t0 = int(time.time() * 1000)
        await producer.send_batch("audit", [b"%d" % i for i in range(40)])
        await producer.flush()
        got: list[bytes] = []
        c = create_consumer(session, ConsumerConfig(group="auditors", recover_dir=tmp_path, **FAST)).subscribe(
            "audit", 4096, lambda msg: got.append(bytes(msg.data)))
        await c.complete_subscribe()
        await until(lambda: len(got) == 40 and all(v[2] == v[0] for v in c.positions().values()))
        assert await list_groups(session) == ["auditors"]
        d = await describe_group(session, "auditors")
        assert d.state == "Stable" and len(d.members) == 1
        assert {p.owner for p in d.partitions} == {c.member_id}
        assert d.total_lag == 0 and sum(p.committed for p in d.partitions) == 40
        with pytest.raises(IllegalGenerationError, match="active"):
            await reset_offsets(session, "auditors", "audit", "earliest")
        await c.close()
        await producer.send_batch("audit", [b"x"] * 8)
        await producer.flush()
        d = await describe_group(session, "auditors")
        assert d.state == "Empty" and d.total_lag == 8 and d.as_dict()["total_lag"] == 8
        changed = await reset_offsets(session, "auditors", "audit", "earliest")
        assert all(new == 0 for _old, new in changed.values())
        assert (await describe_group(session, "auditors")).total_lag == 48
        moved = await reset_offsets(session, "auditors", "audit", timestamp_ms=t0 + 3_600_000)
        assert all(new == p.log_end for (_o, new), p in zip(moved.values(), d.partitions, strict=True))
        assert (await reset_offsets(session, "auditors", "audit", 3, partitions=[1]))[PartitionId(0, 1)][1] == 3
        assert (await reset_offsets(session, "auditors", "audit", 2, partitions=["0-1"]))[PartitionId(0, 1)] == (3, 2)
        with pytest.raises(UnknownGroupError):
            await describe_group(session, "nobody")
        await session.close()

    run(main())


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_sql_offset_storage_carries_a_group_across_consumers(
        kind: str, broker_factory: Callable[..., BrokerProcess], tmp_path: Path,
        request: pytest.FixtureRequest) -> None:
    broker = broker_factory({"numPartitions": 2})
    if kind == "postgres":
        pg: PostgresServer = request.getfixturevalue("postgres")
        make = lambda: PostgresOffsetStorage(pg.conninfo)  # noqa: E731
    else:
        make = lambda: SqliteOffsetStorage(tmp_path / "offsets.db")  # noqa: E731

    async def main() -> None:
        session = await MessageSessionFactory.connect(broker.servers)
        await session.admin().create_topic("ledger", 2)
        producer = session.create_producer()
        await producer.send_batch("ledger", [b"%d" % i for i in range(20)])
        await producer.flush()
        first: list[bytes] = []
        storage = make()
        c = create_consumer(session, ConsumerConfig(group=f"sql-{kind}", recover_dir=tmp_path, **FAST), storage)
        c.subscribe("ledger", 4096, lambda msg: first.append(bytes(msg.data)))
        await c.complete_subscribe()
        await until(lambda: len(first) == 20)
        await c.close()
        await storage.close()
        check = make()
        stored = await check.load(f"sql-{kind}", [TopicPartition("ledger", PartitionId(0, p)) for p in (0, 1)])
        assert sum(stored.values()) == 20
        await check.close()
        await producer.send(Message("ledger", b"late", ))
        second: list[bytes] = []
        storage2 = make()
        d = create_consumer(session, ConsumerConfig(group=f"sql-{kind}", recover_dir=tmp_path, **FAST), storage2)
        d.subscribe("ledger", 4096, lambda msg: second.append(bytes(msg.data)))
        await d.complete_subscribe()
        await until(lambda: second)
        assert second == [b"late"]
        await d.close()
        await storage2.close()
        await session.close()

    run(main())


def test_postgres_storage_refuses_a_table_of_the_earlier_layout(postgres: PostgresServer) -> None:
    import psycopg

    with psycopg.connect(postgres.conninfo) as db:
        db.execute("DROP TABLE IF EXISTS metaq_offsets")
        db.execute("CREATE TABLE metaq_offsets (group_id VARCHAR(255) NOT NULL, topic VARCHAR(255) NOT NULL, "
                   "partition_id INTEGER NOT NULL, next_offset BIGINT NOT NULL, updated_ms BIGINT NOT NULL, "
                   "PRIMARY KEY (group_id, topic, partition_id))")

    async def main() -> None:
        store = PostgresOffsetStorage(postgres.conninfo)
        with pytest.raises(StorageError, match=r"layout of an earlier metaq .*RENAME TO metaq_offsets_old"):
            await store.load("g", [TopicPartition("t", PartitionId(1, 0))])
        await store.close()

    try:
        run(main())
    finally:
        with psycopg.connect(postgres.conninfo) as db:
            db.execute("DROP TABLE metaq_offsets")
