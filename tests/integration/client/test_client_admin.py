"""Admin calls against a real broker."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

import pytest
import uvloop

from metaq.client import Message, MessageSessionFactory, Partition
from metaq.errors import InvalidRequestError, MessageNotFoundError, TopicExistsError, UnknownTopicError
from metaq.testing.broker import BrokerProcess
from metaq.types import make_message_id


def run(coro: Coroutine[Any, Any, None]) -> None:
    uvloop.run(coro)


def test_topics_are_created_listed_described_and_deleted(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            admin = session.admin()
            assert await admin.create_topic("alpha", 3) == 3
            assert await admin.create_topic("beta") == 4  # the broker's numPartitions
            with pytest.raises(TopicExistsError):
                await admin.create_topic("alpha", 3)
            topics = await admin.list_topics()
            assert topics["alpha"] == [Partition(0, 0), Partition(0, 1), Partition(0, 2)]
            assert len(topics["beta"]) == 4

            await session.create_producer().send_batch("alpha", [b"x"] * 5, partition=2)
            desc = await admin.describe_topic("alpha")
            assert [(d.partition.partition, d.earliest, d.latest) for d in desc.partitions] == \
                   [(0, 0, 0), (1, 0, 0), (2, 0, 5)]
            assert await admin.list_offsets("alpha", 2, -2) == 0
            assert await admin.list_offsets("alpha", 2, -1) == 5

            await admin.delete_topic("alpha")
            assert "alpha" not in await admin.list_topics()
            with pytest.raises(UnknownTopicError):
                await admin.describe_topic("alpha")
            with pytest.raises(UnknownTopicError):
                await admin.delete_topic("alpha")

    run(main())


def test_stats_and_message_lookup(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            admin = session.admin()
            await admin.create_topic("looked", 2)
            r = await session.create_producer().send(Message("looked", b"find me"))
            assert r.success
            loc = await admin.lookup_message(r.message_id)
            assert (loc.topic, loc.partition, loc.offset) == ("looked", r.partition, r.offset)
            assert await admin.lookup_message(r.message_id_hex) == loc
            with pytest.raises(MessageNotFoundError):
                await admin.lookup_message(make_message_id(session.broker_id, 12345, 0))

            stats = await admin.stats()
            assert stats["topics"]["looked"]["put_messages"] == 1
            assert isinstance(stats["uptime_s"], float)
            assert set((await admin.stats("looked"))["topics"]) == {"looked"}

    run(main())


def test_reload_without_a_config_file_is_refused(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            with pytest.raises(InvalidRequestError, match="without -f"):
                await session.admin().reload()

    run(main())
