"""The two shortcuts a selector may allow the producer (selectors.py, PartitionSelector): ``reads_message = False``
(a plain message goes from the send call to its batch without the selector being given it) and ``stays = True``
(a sticky selector's topic keeps joining the batch the selector last chose, without asking it again, while that
batch is open and the topic's partitions are unchanged). Each must give exactly the placement that asking the
selector every time gives."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from offline_producer import next_iteration, run_offline

from metaq.client.config import ProducerConfig
from metaq.client.core import ClientCore
from metaq.client.metadata import Partition
from metaq.client.producer import Producer
from metaq.client.selectors import RandomSelector, RoundRobinSelector, StickyRoundRobinSelector
from metaq.protocol.messages import MetadataResponse, PartitionInfo, TopicInfo
from metaq.types import Message

OPEN = [(0, 0, True), (0, 1, True), (1, 0, True)]


def metadata(partitions: list[tuple[int, int, bool]]) -> MetadataResponse:
    return MetadataResponse(topics=[TopicInfo("t", 0, [PartitionInfo(p, b, 0, publish, True)
                                                       for b, p, publish in partitions])])


Sent = list[tuple[tuple[int, int], list[bytes]]]


def run(selector: Any, test: Callable[[ClientCore, Producer, Sent], Coroutine[Any, Any, None]]) -> None:
    """A producer of a never-connected session that knows topic "t" (OPEN). Every batch it would send is recorded as
    ((broker id, partition), its payloads) and resolved at once (its partition idle again), and the selector is
    told the batch is done, as the sender tells it."""
    sent: Sent = []
    batch_done = getattr(selector, "batch_done", None)

    def on_batch(batch: Any) -> None:
        if batch_done is not None:
            batch_done(batch.topic, batch.broker_id, batch.partition)
        sent.append(((batch.broker_id, batch.partition), list(batch.values)))

    run_offline(metadata(OPEN), ["t"], ProducerConfig(linger_ms=0), selector, on_batch,
                lambda core, producer: test(core, producer, sent))


def send(producer: Producer, *values: bytes) -> None:
    for v in values:
        producer.send_async(Message("t", v))


def test_a_sticky_topic_fills_one_batch_a_step_and_moves_on_to_the_next_partition() -> None:
    async def test(core: ClientCore, producer: Producer, sent: Sent) -> None:
        send(producer, b"w")  # the topic's first send looks it up (the general path)
        await next_iteration()
        sent.clear()
        for step in range(6):
            send(producer, *(b"%d.%d" % (step, i) for i in range(5)))
            await next_iteration()
        assert [values for _, values in sent] == [[b"%d.%d" % (step, i) for i in range(5)] for step in range(6)]
        where = [p for p, _ in sent]
        assert all(a != b for a, b in itertools.pairwise(where)), where  # a new partition every batch
        assert set(where) == {(0, 0), (0, 1), (1, 0)}

    run(StickyRoundRobinSelector(), test)


def test_a_sticky_topic_stops_joining_its_batch_when_its_partition_closes_mid_step() -> None:
    async def test(core: ClientCore, producer: Producer, sent: Sent) -> None:
        send(producer, b"w")
        await next_iteration()
        sent.clear()
        send(producer, b"a", b"b")  # the batch being filled is at some partition
        (key, filling), = producer._placement.acc.batches.items()
        closed = (key[2], key[1])
        core.metadata.cache.update(metadata([(b, p, (b, p) != closed) for b, p, _ in OPEN]), ["t"])
        send(producer, b"c", b"d")  # the next sends ask the selector again: the closed partition is not chosen
        assert filling.count == 2
        await next_iteration()
        assert sent[0] == (closed, [b"a", b"b"])
        assert [v for p, values in sent[1:] for v in values] == [b"c", b"d"]
        assert closed not in [p for p, _ in sent[1:]]

    run(StickyRoundRobinSelector(), test)


def test_the_sticky_shortcut_puts_every_message_where_asking_the_selector_each_time_would() -> None:
    """Against the same selector without ``stays``: the same partition for every message, burst after burst."""

    class AskedEveryTime(StickyRoundRobinSelector):
        stays = False

    def record(selector: Any) -> list[tuple[tuple[int, int], list[bytes]]]:
        out: Sent = []

        async def test(core: ClientCore, producer: Producer, sent: Sent) -> None:
            n = 0
            for burst in (1, 7, 2, 1, 30, 3):
                send(producer, *(b"%04d" % (n + i) for i in range(burst)))
                n += burst
                await next_iteration()
            out.extend(sent)

        run(selector, test)
        return out

    assert record(StickyRoundRobinSelector()) == record(AskedEveryTime())


def test_a_selector_that_reads_messages_is_given_each_plain_message_itself() -> None:
    seen: list[Message | None] = []

    def first(topic: str, partitions: Sequence[Partition], message: Message) -> Partition:
        seen.append(message)
        return partitions[0]

    async def test(core: ClientCore, producer: Producer, sent: Sent) -> None:
        messages = [Message("t", b"%d" % i) for i in range(4)]
        for m in messages[:2]:
            producer.send_async(m)
        await next_iteration()
        for m in messages[2:]:  # the topic is kept now: the short path, the message still given
            producer.send_async(m)
        await next_iteration()
        assert seen == messages

    run(first, test)


def test_the_built_in_spreading_selectors_do_not_read_the_message() -> None:
    for cls in (RoundRobinSelector, StickyRoundRobinSelector, RandomSelector):
        assert cls.reads_message is False
    assert StickyRoundRobinSelector.stays is True
    assert not getattr(RoundRobinSelector, "stays", False)


def test_a_subclass_of_a_built_in_selector_that_reads_messages_is_given_them() -> None:
    """The shortcuts are promises of the class that makes them: a subclass does not inherit them."""
    seen: list[Message | None] = []

    class ByKeyElseRoundRobin(RoundRobinSelector):
        def __call__(self, topic: str, partitions: Sequence[Partition], message: Message) -> Partition:
            seen.append(message)
            return super().__call__(topic, partitions, message)

    class StickyToo(StickyRoundRobinSelector):
        def __call__(self, topic: str, partitions: Sequence[Partition], message: Message) -> Partition:
            seen.append(message)
            return super().__call__(topic, partitions, message)

    for selector in (ByKeyElseRoundRobin(), StickyToo()):
        seen.clear()

        async def test(core: ClientCore, producer: Producer, sent: Sent) -> None:
            messages = [Message("t", b"%d" % i) for i in range(6)]
            for m in messages[:3]:
                producer.send_async(m)
            await next_iteration()
            for m in messages[3:]:
                producer.send_async(m)
                await next_iteration()
            assert seen == messages

        run(selector, test)
