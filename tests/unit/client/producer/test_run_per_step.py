"""A topic sent to once per event-loop step (an application sending from callbacks or request handlers) is not
deferred: a run of one placed at its step's end turns the deferral off for the topic until its partitions are looked
up again, and sends in bursts are deferred again from then on (docs/producer.md). Either way each message lands
where the round robin puts it, in send order."""

from __future__ import annotations

import asyncio
from typing import Any

from metaq.client.config import ClientConfig, ProducerConfig
from metaq.client.core import ClientCore
from metaq.client.producer import Producer
from metaq.protocol.messages import MetadataResponse, PartitionInfo, TopicInfo
from metaq.types import Message

PARTITIONS = 3


def test_one_send_a_step_is_placed_as_it_comes_and_bursts_are_deferred_again() -> None:
    async def main() -> None:
        core = ClientCore(ClientConfig(), [("127.0.0.1", 9)])
        core.metadata.cache.update(MetadataResponse(topics=[TopicInfo("t", 0, [
            PartitionInfo(p, 0, 0, True, True) for p in range(PARTITIONS)])]), ["t"])
        producer = Producer(core, ProducerConfig(linger_ms=60_000))
        placement = producer._placement
        sealed: list[Any] = []
        producer._sender.dispatch = sealed.append  # type: ignore[method-assign]
        try:
            producer.send_async(Message("t", b"0"))  # looks the topic up: placed at once, the topic deferrable
            assert "t" in placement.deferrable
            producer.send_async(Message("t", b"1"))
            assert len(placement.run) == 1  # deferred to the end of this step
            await asyncio.sleep(0)  # the step ends with a run of one
            assert len(placement.run) == 0 and "t" not in placement.deferrable
            for i in range(2, 5):  # one a step: each placed as it is sent, no run, no step-end call
                producer.send_async(Message("t", b"%d" % i))
                assert len(placement.run) == 0
                await asyncio.sleep(0)
            placement.end_hot()  # what HOT_KEEP_S (or a metadata change) does: the next send looks the topic up
            producer.send_async(Message("t", b"5"))
            assert "t" in placement.deferrable
            for i in range(6, 9):  # a burst: deferred again
                producer.send_async(Message("t", b"%d" % i))
            assert len(placement.run) == 3
            await asyncio.sleep(0)
            assert "t" in placement.deferrable  # a run of three keeps the deferral on
            placement.seal_all()
            per_partition: dict[int, list[bytes]] = {}
            for batch in sealed:
                per_partition.setdefault(batch.partition, []).extend(batch.values)
            assert per_partition == {p: [b"%d" % i for i in range(9) if i % PARTITIONS == p] for p in range(PARTITIONS)}
        finally:
            placement.acc.batches.clear()
            placement.end_hot()
            await core.close()

    asyncio.run(main())
