"""Offset storages behind one interface: load what was committed, across reopen, per group."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from metaq.client.group.config import ConsumerConfig
from metaq.client.group.consumer import empty_fetch_delay_ms
from metaq.client.group.delivery import MessageIdLRU, wants_ctx
from metaq.client.group.offsets import LocalFileOffsetStorage, OffsetStorage, SqliteOffsetStorage
from metaq.client.group.recover import RecoverStore
from metaq.errors import ConfigError, StorageError
from metaq.types import Message, PartitionId, TopicPartition

# partition 0 of two brokers: the stores must keep them apart
T0, T1, U0 = (TopicPartition("t", PartitionId(1, 0)), TopicPartition("t", PartitionId(2, 0)),
              TopicPartition("u", PartitionId(1, 0)))


async def exercise(make: Callable[[], OffsetStorage]) -> None:
    s = make()
    assert await s.load("g", [T0, T1]) == {}
    await s.commit("g", {T0: 5, T1: 7})
    await s.commit("g", {T0: 9})
    await s.commit("other", {T0: 1})
    assert await s.load("g", [T0, T1, U0]) == {T0: 9, T1: 7}
    await s.close()
    s2 = make()
    assert await s2.load("g", [T0, T1]) == {T0: 9, T1: 7}
    assert await s2.load("other", [T0]) == {T0: 1}
    await s2.close()


def test_local_file_storage(tmp_path: Path) -> None:
    asyncio.run(exercise(lambda: LocalFileOffsetStorage(tmp_path)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.json", "other.json"]  # no temp left behind
    assert json.loads((tmp_path / "g.json").read_text())["offsets"] == {"t": {"1-0": 9, "2-0": 7}}


def test_local_file_storage_refuses_a_file_of_bare_partition_numbers(tmp_path: Path) -> None:
    (tmp_path / "g.json").write_text(json.dumps({"group": "g", "offsets": {"t": {"0": 5}}}))

    async def main() -> None:
        store = LocalFileOffsetStorage(tmp_path)
        with pytest.raises(StorageError, match=r"g\.json keys partition '0' of topic 't', not brokerId-partition"):
            await store.load("g", [T0])
        await store.close()

    asyncio.run(main())


def test_sqlite_storage(tmp_path: Path) -> None:
    asyncio.run(exercise(lambda: SqliteOffsetStorage(tmp_path / "offsets.db")))
    with sqlite3.connect(tmp_path / "offsets.db") as db:
        rows = db.execute("SELECT group_id, topic, broker_partition, next_offset FROM metaq_offsets ORDER BY 1, 3")
        assert rows.fetchall() == [("g", "t", "1-0", 9), ("g", "t", "2-0", 7), ("other", "t", "1-0", 1)]


def test_sqlite_storage_refuses_a_table_of_the_earlier_layout(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "old.db") as db:
        db.execute("CREATE TABLE metaq_offsets (group_id VARCHAR(255) NOT NULL, topic VARCHAR(255) NOT NULL, "
                   "partition_id INTEGER NOT NULL, next_offset BIGINT NOT NULL, updated_ms BIGINT NOT NULL, "
                   "PRIMARY KEY (group_id, topic, partition_id))")

    async def main() -> None:
        store = SqliteOffsetStorage(tmp_path / "old.db")
        with pytest.raises(StorageError, match=r"earlier metaq .*RENAME TO metaq_offsets_old"):
            await store.load("g", [T0])
        await store.close()

    asyncio.run(main())


def test_recover_store_round_trip_and_survives_reopen(tmp_path: Path) -> None:
    async def main() -> None:
        store = RecoverStore(tmp_path, "g/../weird")
        msg = Message("t", b"payload", attribute="a", key=b"k", headers=[("h", b"v")], timestamp_ms=5,
                      partition=2, offset=41, id=(3 << 64) + 41, append_time_ms=99, broker_id=4)
        assert await store.put(msg)
        store.close()
        again = RecoverStore(tmp_path, "g/../weird")
        [(name, back)] = await again.messages()
        assert name == f"t-4-2-{41:020d}.msg"
        assert (back.topic, back.partition_id, back.offset, back.id, back.data) == ("t", PartitionId(4, 2), 41,
                                                                                    msg.id, b"payload")
        assert (back.attribute, back.key, back.headers) == ("a", b"k", [("h", b"v")])
        calls = []

        async def deliver(m: Message) -> bool:
            calls.append(m.offset)
            return len(calls) > 1

        assert await again.recover_once(deliver) == 0
        assert await again.recover_once(deliver) == 1
        assert await again.count() == 0 and calls == [41, 41]
        again.close()
        assert (tmp_path / "g_.._weird").is_dir()  # the group name cannot escape the directory

    asyncio.run(main())


def test_consumer_config_metaq_names_and_checks() -> None:
    cfg = ConsumerConfig.from_metaq(group="g", fetchRunnerCount=3, maxDelayFetchTimeInMills=100,
                                    commitOffsetPeriodInMills=1000, loadBalanceStrategyType="CONSIST")
    assert (cfg.fetch_runner_count, cfg.max_delay_fetch_ms, cfg.commit_offset_period_ms,
            cfg.load_balance_strategy) == (3, 100, 1000, "consistent_hash")
    assert ConsumerConfig(group="g").max_fetch_retries == 5
    assert ConsumerConfig(group="g").commit_offset_period_ms == 5000
    for bad in ({"group": ""}, {"group": "g", "fetch_runner_count": 0}, {"group": "g", "rejection_policy": "x"},
                {"group": "g", "session_timeout_ms": 10, "rebalance_timeout_ms": 5}):
        with pytest.raises(ConfigError):
            ConsumerConfig(**bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="unknown consumer option"):
        ConsumerConfig.from_metaq(group="g", fetchRunners=2)


def test_dedup_lru_and_listener_arity() -> None:
    lru = MessageIdLRU(2)
    for i in (1, 2, 3):
        lru.add(i)
    assert not lru.seen(1) and lru.seen(2) and lru.seen(3)
    assert wants_ctx(lambda m, ctx: None)
    assert not wants_ctx(lambda m: None)
    assert not wants_ctx(lambda m, box=(): None)

    class Obj:
        async def __call__(self, m: Message, ctx: object) -> None: ...

    assert wants_ctx(Obj())


def test_empty_fetch_back_off_is_metaqs() -> None:
    assert [empty_fetch_delay_ms(n, 5000) for n in (1, 2, 5, 10, 11, 50)] == [500, 1000, 2500, 5000, 5000, 5000]
