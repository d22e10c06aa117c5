"""The group consumer delivers from a fetch's column views (Messages built one at a time) exactly as from
a list of Messages: same messages, same retries, same positions, a filtered-out tail skipped."""

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
from metaq.protocol.records import (
    decode_fetched,
    decode_fetched_batches,
    encode_messages,
    read_header,
    rebuild_batch,
    stamp,
)
from metaq.types import Message, PartitionId, TopicPartition

TP = TopicPartition("t", PartitionId(0, 1))


def _consumer() -> Any:
    config = ConsumerConfig(group="g", retry_backoff_ms=0)  # a failed message is delivered again at once
    return Delivery(config, ConsumerStats(), MessageIdLRU(100), lambda: True, lambda: False,
                    None, None, None)  # type: ignore[arg-type]


def _worker(position: int) -> Worker:
    sub = Subscription("t", 1 << 16, lambda msg: None, None, False, False)
    return Worker(TP, None, sub, position, position, position, PartitionContext("t", TP.partition))  # type: ignore[arg-type]


def _reply() -> bytes:
    """Offsets 10..17 in two stored batches; a server-side filter kept 13 and 15 of the second (14 and the
    tail 16, 17 are gone), so a reader must still move past 17."""
    first = bytearray(encode_messages([Message("t", b"m%d" % i, key=b"k%d" % i) for i in range(10, 13)]))
    stamp(first, 10, 1000, 5)
    second = bytearray(encode_messages([Message("t", b"m%d" % i, attribute="a") for i in range(13, 18)]))
    stamp(second, 13, 1003, 5)
    whole = decode_fetched(bytes(second), "t", 1, 13)[0]
    thinned = rebuild_batch(bytes(second), read_header(bytes(second)), [whole[0], whole[2]])
    return bytes(first) + thinned


def _deliver(result: FetchResult, w: Worker, fail_once: int) -> list[tuple[int, bytes]]:
    """Run the steps as the drivers do; the listener fails once on ``fail_once`` (delivered again)."""
    consumer = _consumer()
    delivered = []
    failed = False
    steps = consumer.steps(w, result)
    try:
        action, msg = next(steps)
        while True:
            assert action == "call"
            delivered.append((msg.offset, bytes(msg.data)))
            error = None
            if msg.offset == fail_once and not failed:
                failed, error = True, RuntimeError("once")
            action, msg = steps.send(error)
    except StopIteration:
        pass
    return delivered


def test_views_and_message_lists_deliver_the_same() -> None:
    reply = _reply()
    messages, next_offset = decode_fetched(reply, "t", 1, 11, broker_id=0)
    batches, views_next = decode_fetched_batches(reply, "t", 1, 11, broker_id=0)
    assert next_offset == views_next == 18
    by_list, by_views = _worker(11), _worker(11)
    got_list = _deliver(FetchResult(messages, next_offset, 10, 18), by_list, fail_once=13)
    got_views = _deliver(FetchResult([], views_next, 10, 18, batches=batches), by_views, fail_once=13)
    assert got_views == got_list == [(11, b"m11"), (12, b"m12"), (13, b"m13"), (13, b"m13"), (15, b"m15")]
    assert (by_views.position, by_views.acked) == (by_list.position, by_list.acked) == (18, 18)
