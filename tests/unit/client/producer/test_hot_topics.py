"""A producer keeps a topic's partitions between sends, across event-loop iterations (Placement.hot), so that a
message sent one per iteration (from a request handler, say) skips the lookup too, and still sees every change of
what it may send to: a metadata change and a partition left out at the next send, the end of a partition's time
out at the next iteration, and the metadata's age at least every HOT_KEEP_S."""

from __future__ import annotations

import asyncio
import gc
import time
import weakref
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from offline_producer import next_iteration, run_offline

from metaq.client.config import ClientConfig, ProducerConfig
from metaq.client.core import ClientCore
from metaq.client.producer import Producer
from metaq.client.producer import placement as placement_module
from metaq.protocol.messages import MetadataResponse, PartitionInfo, TopicInfo
from metaq.types import Message, PartitionId

OPEN = [(0, 0, True), (0, 1, True), (1, 0, True)]


def metadata(topic: str, partitions: list[tuple[int, int, bool]]) -> MetadataResponse:
    return MetadataResponse(topics=[TopicInfo(topic, 0, [PartitionInfo(p, b, 0, publish, True)
                                                         for b, p, publish in partitions])])


def run(test: Callable[[ClientCore, Producer, list[tuple[int, int]]], Coroutine[Any, Any, None]],
        clock: Callable[[], float] | None = None, linger_ms: float = 0) -> None:
    """A producer of a never-connected session that knows topic "t" (OPEN); every batch it would send is recorded as
    (broker id, partition) instead, so nothing reaches the network, and its partition stays in flight."""
    sent: list[tuple[int, int]] = []
    busy: set[Any] = set()

    def on_batch(batch: Any) -> None:
        sent.extend([(batch.broker_id, batch.partition)] * batch.count)
        busy.add(batch.key)  # in flight for good: no ack comes

    def prepare(core: ClientCore, producer: Producer) -> None:
        if clock is not None:
            core.unavailable._clock = clock
        producer._sender.busy = busy.__contains__  # type: ignore[method-assign]

    run_offline(metadata("t", OPEN), ["t"], ProducerConfig(linger_ms=linger_ms), None, on_batch,
                lambda core, producer: test(core, producer, sent), prepare)


def send(producer: Producer, n: int = 1) -> None:
    for _ in range(n):
        producer.send_async(Message("t", b"x"))


def test_a_message_sent_one_per_iteration_finds_its_topic_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    async def test(core: ClientCore, producer: Producer, sent: list[tuple[int, int]]) -> None:
        send(producer, 3)  # the topic's first send looks its partitions up; each partition's first batch leaves
        await next_iteration()
        send(producer, 3)  # the next ones linger (their partitions are busy): a batch open at each partition
        await next_iteration()
        assert len(producer._placement.acc.batches) == 3 and "t" in producer._placement.hot
        looked_up: list[str] = []
        cached = core.metadata.cached
        monkeypatch.setattr(core.metadata, "cached", lambda topic: (looked_up.append(topic), cached(topic))[1])
        for _ in range(6):  # one message an iteration, as a request handler sends
            await next_iteration()
            send(producer)
        await next_iteration()
        assert looked_up == []  # within HOT_KEEP_S nothing changed: no lookup
        assert sorted(b.count for b in producer._placement.acc.batches.values()) == [3, 3, 3] and len(sent) == 3

    run(test, linger_ms=60_000)


def test_a_metadata_change_is_seen_by_the_next_send() -> None:
    async def test(core: ClientCore, producer: Producer, sent: list[tuple[int, int]]) -> None:
        send(producer, 6)
        await next_iteration()
        assert set(sent) == {(0, 0), (0, 1), (1, 0)}
        sent.clear()
        # partition 0-1 closed for publishing: the very next sends leave it out, without waiting for the loop
        core.metadata.cache.update(metadata("t", [(0, 0, True), (0, 1, False), (1, 0, True)]), ["t"])
        assert producer._placement.hot == {}
        send(producer, 6)
        await next_iteration()
        assert sorted(set(sent)) == [(0, 0), (1, 0)] and len(sent) == 6
        sent.clear()
        # a partition added (a refresh after the topic grew)
        core.metadata.cache.update(metadata("t", [*OPEN, (1, 1, True)]), ["t"])
        send(producer, 8)
        await next_iteration()
        assert set(sent) == {(0, 0), (0, 1), (1, 0), (1, 1)}
        # an admin call that drops the topic's entry: the next send looks it up again (here: not known any more)
        core.metadata.cache.invalidate("t")
        assert producer._placement.hot == {}

    run(test)


def test_a_partition_left_out_is_skipped_at_once_and_taken_back_when_its_time_is_up() -> None:
    now = [1000.0]

    async def test(core: ClientCore, producer: Producer, sent: list[tuple[int, int]]) -> None:
        send(producer, 3)
        await next_iteration()
        assert "t" in producer._placement.hot
        sent.clear()
        core.unavailable.avoid_partition("t", PartitionId(0, 1))  # what a failed batch to it does
        send(producer, 6)
        await next_iteration()
        assert sorted(set(sent)) == [(0, 0), (1, 0)]
        sent.clear()
        # nobody is told when the time out ends: while a partition is left out the topic is hot for one
        # iteration only, so the first send after the end sees it again
        now[0] += core.unavailable.avoid_s + 1
        send(producer, 6)
        await next_iteration()
        assert set(sent) == {(0, 0), (0, 1), (1, 0)}
        sent.clear()
        core.unavailable.avoid_broker(1)  # a broker left out, then back (it registered again)
        send(producer, 4)
        await next_iteration()
        assert set(sent) == {(0, 0), (0, 1)}
        sent.clear()
        core.unavailable.forget_broker(1)
        send(producer, 6)
        await next_iteration()
        assert (1, 0) in sent

    run(test, clock=lambda: now[0])


def test_the_metadata_age_is_looked_at_again_after_hot_keep_s(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placement_module, "HOT_KEEP_S", 0.01)

    async def test(core: ClientCore, producer: Producer, sent: list[tuple[int, int]]) -> None:
        send(producer)
        assert "t" in producer._placement.hot
        deadline = time.monotonic() + 5
        while "t" in producer._placement.hot and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        assert "t" not in producer._placement.hot  # the next send goes through Metadata.cached (a refresh when stale)

    run(test)


def test_a_producer_is_told_only_while_open_and_is_not_kept_alive_by_it() -> None:
    async def main() -> None:
        core = ClientCore(ClientConfig(), [("127.0.0.1", 9)])
        listeners = (core.metadata.cache.listeners, core.unavailable.listeners)
        closed = Producer(core, ProducerConfig())
        dropped = Producer(core, ProducerConfig())
        assert [len(x) for x in listeners] == [2, 2]
        await closed.close()
        assert [len(x) for x in listeners] == [1, 1]
        gone = weakref.ref(dropped)
        del dropped
        gc.collect()
        assert gone() is None and [len(x) for x in listeners] == [0, 0]
        core.metadata.cache.update(metadata("t", OPEN), ["t"])  # a dead listener is skipped, not called
        core.unavailable.avoid_broker(0)
        await core.close()

    asyncio.run(main())
