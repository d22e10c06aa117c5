"""The short path of a plain send under the round robin (``Placement.place_one``, docs/producer.md "The compiled
seam"): sends one per event-loop step go from the run's direct case straight into their partition's open batch
(opening one when none is), in send order, the buffer counting each; a keyed message between them takes the general
path, and the plain ones after it still line up with its key in the batch's columns."""

from __future__ import annotations

import asyncio
from typing import Any

from metaq.client.config import ClientConfig, ProducerConfig
from metaq.client.core import ClientCore
from metaq.client.producer import Producer
from metaq.protocol.messages import MetadataResponse, PartitionInfo, TopicInfo
from metaq.protocol.records import HEADER_BYTES, RECORD_OVERHEAD_BYTES
from metaq.types import Message

PARTITIONS = 2


def test_sends_one_a_step_join_their_batches_in_order_with_keys_lined_up() -> None:
    async def main() -> None:
        core = ClientCore(ClientConfig(), [("127.0.0.1", 9)])
        core.metadata.cache.update(MetadataResponse(topics=[TopicInfo("t", 0, [
            PartitionInfo(p, 0, 0, True, True) for p in range(PARTITIONS)])]), ["t"])
        producer = Producer(core, ProducerConfig(linger_ms=60_000))
        placement = producer._placement
        sealed: list[Any] = []
        producer._sender.dispatch = sealed.append  # type: ignore[method-assign]
        producer._sender.busy = lambda key: True  # type: ignore[method-assign]  # in flight: a batch lingers
        sent: list[Message] = []

        def send(message: Message) -> asyncio.Future[Any]:
            sent.append(message)
            return producer.send_async(message)

        try:
            send(Message("t", b"a0"))  # looks the topic up
            send(Message("t", b"a1"))
            await asyncio.sleep(0)  # a run of one: the topic is no longer deferred
            assert "t" in placement.hot and "t" not in placement.deferrable
            futures = []
            for i, message in enumerate([Message("t", b"b0", timestamp_ms=7), Message("t", b"b1"),
                                         Message("t", b"k2", key=b"key"), Message("t", b"b3"),
                                         Message("t", b"b4", timestamp_ms=9), Message("t", b"b5")]):
                futures.append(send(message))
                assert len(placement.run) == 0, i  # placed as it came
                await asyncio.sleep(0)
            assert not any(f.done() for f in futures)
            assert producer._buffer.used == sum(RECORD_OVERHEAD_BYTES + len(m.data) + len(m.key or b"") for m in sent)
            batches = {b.partition: b for b in placement.acc.batches.values()}
            assert sorted(batches) == [0, 1]
            for p, batch in batches.items():
                mine = sent[p::PARTITIONS]
                assert batch.values == [m.data for m in mine]
                assert batch.timestamps == [m.timestamp_ms if m.timestamp_ms >= 0 else batch.created_ms for m in mine]
                assert batch.count == len(mine)
                assert batch.size_bytes == HEADER_BYTES + sum(RECORD_OVERHEAD_BYTES + len(m.data) + len(m.key or b"")
                                                              for m in mine)
                if batch.keys is not None:
                    assert batch.keys == [m.key for m in mine] and not batch.plain
            assert batches[0].keys == [None, None, b"key", None]  # a0 b0 k2 b4: the plain ones around it line up
            placement.seal_all()
            assert not sealed[0].plain or not sealed[1].plain
        finally:
            placement.acc.batches.clear()
            placement.end_hot()
            await core.close()

    asyncio.run(main())
