"""Under the default round robin, plain sends of a kept topic are placed at the end of their event-loop step, a
partition's share at a time (docs/producer.md): each message lands where the round robin would have put it one by
one, in send order within its partition, with its own timestamp if it has one, its bytes counted from the send."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from offline_producer import run_offline

from metaq.client.config import ProducerConfig
from metaq.client.producer import Producer
from metaq.protocol.messages import MetadataResponse, PartitionInfo, TopicInfo
from metaq.protocol.records import RECORD_OVERHEAD_BYTES
from metaq.types import Message, PartitionId

PARTS = [(0, 0), (0, 1), (1, 0)]


Sent = dict[tuple[PartitionId, int], list[tuple[bytes, int]]]


def run(test: Callable[[Producer, Sent], Coroutine[Any, Any, None]]) -> None:
    """A never-connected producer that knows topic "t"; every batch sealed is recorded per partition and acks, as
    (payload, timestamp) in batch order, and stays in flight."""

    sent: Sent = {}

    def on_batch(batch: Any) -> None:
        sent.setdefault((PartitionId(batch.broker_id, batch.partition), batch.acks), []).extend(
            zip(batch.values, batch.timestamps, strict=True))

    run_offline(MetadataResponse(topics=[TopicInfo("t", 0, [PartitionInfo(p, b, 0, True, True) for b, p in PARTS])]),
                ["t"], ProducerConfig(linger_ms=60_000), None, on_batch, lambda core, producer: test(producer, sent))


def test_deferred_sends_land_where_the_round_robin_puts_them_in_send_order() -> None:
    async def test(producer: Producer, sent: Sent) -> None:
        producer.send_async(Message("t", b"first"))  # looks the topic up: placed at once, partition 0-0
        for i in range(10):
            producer.send_async(Message("t", b"m%d" % i, timestamp_ms=7 if i == 4 else -1))
        producer.send_async(Message("t", b"keyed", key=b"k"))  # not deferrable: what came before goes first
        for i in range(10, 13):
            producer.send_oneway(Message("t", b"m%d" % i))  # another run (acks 0)
        assert producer.buffered_bytes == sum(RECORD_OVERHEAD_BYTES + n for n in (5, *([2] * 10), 5 + 1, 3, 3, 3))
        producer._placement.seal_all()
        rotation = [PartitionId(*p) for p in PARTS]
        expected: Sent = {}
        for n, data in enumerate([b"first", *(b"m%d" % i for i in range(10)), b"keyed"]):
            expected.setdefault((rotation[n % 3], 1), []).append((data, 0))
        for n, data in enumerate(b"m%d" % i for i in range(10, 13)):
            expected.setdefault((rotation[(12 + n) % 3], 0), []).append((data, 0))
        assert {k: [d for d, _ in v] for k, v in sent.items()} == {k: [d for d, _ in v] for k, v in expected.items()}
        stamps = {d: ts for v in sent.values() for d, ts in v}
        assert stamps[b"m4"] == 7 and all(ts > 1_000_000 for d, ts in stamps.items() if d != b"m4")

    run(test)


def test_a_flush_places_the_deferred_sends_first() -> None:
    async def test(producer: Producer, sent: Sent) -> None:
        producer.send_async(Message("t", b"warm"))
        for i in range(6):
            producer.send_async(Message("t", b"d%d" % i))
        assert producer.unsent_batches >= 1
        producer._placement.seal_all()  # what flush() does first
        assert sorted(d for v in sent.values() for d, _ in v) == sorted([b"warm", *(b"d%d" % i for i in range(6))])

    run(test)
