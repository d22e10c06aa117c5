"""A topic sent to once per event-loop step (an application sending from callbacks or request handlers) is not
deferred: a run of one placed at its step's end turns the deferral off for the topic until its partitions are looked
up again, and sends in bursts are deferred again from then on (docs/producer.md). Either way each message lands
where the round robin puts it, in send order."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from metaq.client.config import ClientConfig, ProducerConfig
from metaq.client.core import ClientCore
from metaq.client.producer import Producer
from metaq.protocol.messages import MetadataResponse, PartitionInfo, TopicInfo
from metaq.protocol.records import HEADER_BYTES, RECORD_OVERHEAD_BYTES
from metaq.types import Message

PARTITIONS = 3


@contextlib.asynccontextmanager
async def producer_of(partitions: int, *, busy: bool = False) -> AsyncIterator[tuple[Producer, list[Any]]]:
    """A producer whose topic "t" has ``partitions`` partitions known, its sealed batches kept in the list given back
    (``busy``: every partition has a request in flight, so a batch lingers instead of leaving at the step's end)."""
    core = ClientCore(ClientConfig(), [("127.0.0.1", 9)])
    core.metadata.cache.update(MetadataResponse(topics=[TopicInfo("t", 0, [
        PartitionInfo(p, 0, 0, True, True) for p in range(partitions)])]), ["t"])
    producer = Producer(core, ProducerConfig(linger_ms=60_000))
    sealed: list[Any] = []
    producer._sender.dispatch = sealed.append  # type: ignore[method-assign]
    if busy:
        producer._sender.busy = lambda key: True  # type: ignore[method-assign]
    try:
        yield producer, sealed
    finally:
        producer._placement.acc.batches.clear()
        producer._placement.end_hot()
        await core.close()


def test_one_send_a_step_is_placed_as_it_comes_and_bursts_are_deferred_again() -> None:
    async def main() -> None:
        async with producer_of(PARTITIONS) as (producer, sealed):
            placement = producer._placement
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

    asyncio.run(main())


def test_sends_one_a_step_join_their_batches_in_order_with_keys_lined_up() -> None:
    """The short path of a plain send (``Placement.place_one``, docs/producer.md "The compiled seam"): sends one a
    step go from the run's direct case straight into their partition's open batch (opening one when none is), in
    send order, the buffer counting each; a keyed message between them takes the general path, and the plain ones
    after it still line up with its key in the batch's columns."""
    async def main() -> None:
        async with producer_of(2, busy=True) as (producer, _):
            placement = producer._placement
            sent: list[Message] = []
            send(producer, sent, Message("t", b"a0"))  # looks the topic up
            send(producer, sent, Message("t", b"a1"))
            await asyncio.sleep(0)  # a run of one: the topic is no longer deferred
            assert "t" in placement.hot and "t" not in placement.deferrable
            futures = []
            for i, message in enumerate([Message("t", b"b0", timestamp_ms=7), Message("t", b"b1"),
                                         Message("t", b"k2", key=b"key"), Message("t", b"b3"),
                                         Message("t", b"b4", timestamp_ms=9), Message("t", b"b5")]):
                futures.append(send(producer, sent, message))
                assert len(placement.run) == 0, i  # placed as it came
                await asyncio.sleep(0)
            assert not any(f.done() for f in futures)
            assert producer._buffer.used == sum(map(size, sent))
            batches = {b.partition: b for b in placement.acc.batches.values()}
            assert sorted(batches) == [0, 1]
            for p, batch in batches.items():
                mine = sent[p::2]
                assert batch.values == [m.data for m in mine] and batch.count == len(mine)
                assert batch.timestamps == [m.timestamp_ms if m.timestamp_ms >= 0 else batch.created_ms for m in mine]
                assert batch.size_bytes == HEADER_BYTES + sum(map(size, mine))
            assert batches[0].keys == [None, None, b"key", None] and not batches[0].plain  # a0 b0 k2 b4: lined up
            assert batches[1].keys is None and batches[1].plain

    asyncio.run(main())


def send(producer: Producer, sent: list[Message], message: Message) -> asyncio.Future[Any]:
    sent.append(message)
    return producer.send_async(message)


def size(message: Message) -> int:
    return RECORD_OVERHEAD_BYTES + len(message.data) + len(message.key or b"")
