"""The group consumer's delivery steps and its duplicate filter: a message this consumer acknowledged
and is handed again (its partition came back to it from an older commit) is dropped, not delivered twice;
everything it never acknowledged is delivered."""

from __future__ import annotations

from typing import Any

from metaq.client.fetcher import FetchResult
from metaq.client.group.config import ConsumerConfig
from metaq.client.group.delivery import (
    ConsumerStats,
    Delivery,
    MessageIdLRU,
    PartitionContext,
    Subscription,
    Worker,
)
from metaq.types import Message, PartitionId, TopicPartition

TP = TopicPartition("t", PartitionId(0, 1))


def _consumer(dedup_window: int = 100) -> Any:
    """A GroupConsumer's delivery state only (no session): what ``_steps`` reads and writes."""
    config = ConsumerConfig(group="g", retry_backoff_ms=0)  # a failed message is delivered again at once
    return Delivery(config, ConsumerStats(), MessageIdLRU(dedup_window), lambda: True, lambda: False,
                    None, None, None)  # type: ignore[arg-type]


def _worker(position: int) -> Worker:
    sub = Subscription("t", 1 << 16, lambda msg: None, None, False, False)
    return Worker(TP, None, sub, position, position, position, PartitionContext("t", TP.partition))  # type: ignore[arg-type]


def _deliver(consumer: Any, w: Worker, offsets: range) -> list[int]:
    """Run the steps of one fetched batch as the drivers do, with a listener that succeeds."""
    messages = [Message("t", b"v", partition=1, offset=o, id=1000 + o, broker_id=0) for o in offsets]
    delivered = []
    steps = consumer.steps(w, FetchResult(messages, offsets.stop, 0, offsets.stop))
    try:
        action, msg = next(steps)
        while True:
            assert action == "call"
            delivered.append(msg.offset)
            action, msg = steps.send(None)
    except StopIteration:
        pass
    return delivered


def test_acknowledged_messages_handed_again_are_dropped_and_new_ones_delivered() -> None:
    consumer = _consumer()
    first = _worker(0)
    assert _deliver(consumer, first, range(0, 5)) == [0, 1, 2, 3, 4]
    assert (first.acked, consumer.stats.acked) == (5, 5)
    assert all(consumer.dedup.seen(1000 + o) for o in range(5))
    # the partition comes back from a commit at 2: 2..4 were acknowledged here, 5..7 are new
    again = _worker(2)
    assert _deliver(consumer, again, range(2, 8)) == [5, 6, 7]
    assert (again.acked, consumer.stats.duplicates_dropped) == (8, 3)


def test_without_a_dedup_window_everything_is_delivered_again() -> None:
    consumer = _consumer(dedup_window=0)
    assert _deliver(consumer, _worker(0), range(0, 3)) == [0, 1, 2]
    assert _deliver(consumer, _worker(0), range(0, 3)) == [0, 1, 2]


def test_the_lru_keeps_the_last_ids_added_in_batches() -> None:
    lru = MessageIdLRU(3)
    lru.add_many([1, 2, 3])
    lru.add_many([1, 4])  # 1 again: the newest now; 2 is the oldest and goes
    assert [lru.seen(i) for i in (1, 2, 3, 4)] == [True, False, True, True]
