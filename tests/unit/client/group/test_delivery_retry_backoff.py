"""Listener retries back off (MetaQ's delayed fetch of a failed message): delivery stops at the failed
message and asks its worker to wait (retry number) times a tenth of max_delay_fetch_ms, capped, before
fetching it again; after max_fetch_retries redeliveries the rejection policy takes it. No clock runs here:
the delays are what delivery asks for, and nothing waits for them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

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
from metaq.errors import ConfigError
from metaq.types import Message, PartitionId, TopicPartition

TP = TopicPartition("t", PartitionId(0, 1))


class SkipStore:
    """The recover store's part delivery uses, refusing (so the skip path logs and moves on)."""

    async def put(self, msg: Message) -> bool:
        return False


def _delivery(config: ConsumerConfig) -> Delivery:
    return Delivery(config, ConsumerStats(), MessageIdLRU(100), lambda: True, lambda: False,
                    SkipStore(), None, None)  # type: ignore[arg-type]


def _worker(listener: Any, position: int = 0) -> Worker:
    sub = Subscription("t", 1 << 16, listener, None, True, False)
    return Worker(TP, None, sub, position, position, position, PartitionContext("t", TP.partition))  # type: ignore[arg-type]


def _fetch(start: int, stop: int) -> FetchResult:
    messages = [Message("t", b"m%d" % o, partition=1, offset=o, id=100 + o, broker_id=0) for o in range(start, stop)]
    return FetchResult(messages, stop, 0, stop)


def test_the_metaq_default_is_a_tenth_of_max_delay_fetch_more_each_retry_up_to_it() -> None:
    config = ConsumerConfig(group="g")
    assert [config.retry_delay_ms(r) for r in range(1, 13)] == [500 * r for r in range(1, 11)] + [5000, 5000]
    custom = ConsumerConfig(group="g", retry_backoff_ms=200, retry_backoff_max_ms=500)
    assert [custom.retry_delay_ms(r) for r in (1, 2, 3, 4)] == [200, 400, 500, 500]
    assert ConsumerConfig(group="g", retry_backoff_ms=0).retry_delay_ms(3) == 0
    with pytest.raises(ConfigError, match="retry_backoff_ms"):
        ConsumerConfig(group="g", retry_backoff_ms=-2)


def test_each_redelivery_waits_longer_and_the_last_failure_is_rejected() -> None:
    calls: list[int] = []

    async def always_fails(msg: Message) -> None:
        calls.append(msg.offset)
        raise RuntimeError("the database is down")

    async def main() -> None:
        delivery = _delivery(ConsumerConfig(group="g", rejection_policy="skip"))
        w = _worker(always_fails, position=3)
        waits = []
        while w.position == 3:  # what the worker does: deliver, back off if asked, fetch again from w.position
            await delivery.deliver(w, _fetch(w.position, 4))
            if w.retry_delay_s:
                waits.append(w.retry_delay_s)
                w.retry_delay_s = 0.0
        assert waits == [0.5, 1.0, 1.5, 2.0, 2.5]
        assert calls == [3] * 6 and delivery.stats.rejected == 1 and w.position == 4

    asyncio.run(main())


def test_a_message_that_fails_once_is_delivered_after_one_wait_and_the_rest_follow_in_order() -> None:
    calls: list[int] = []

    async def flaky(msg: Message) -> None:
        calls.append(msg.offset)
        if msg.offset == 1 and calls.count(1) == 1:
            raise RuntimeError("transient")

    async def main() -> None:
        delivery = _delivery(ConsumerConfig(group="g", max_delay_fetch_ms=1000))
        w = _worker(flaky)
        await delivery.deliver(w, _fetch(0, 4))
        assert (calls, w.position, w.acked, w.retry_delay_s) == ([0, 1], 1, 1, 0.1)  # stopped at the failure
        await delivery.deliver(w, _fetch(w.position, 4))
        assert (calls, w.position, w.acked) == ([0, 1, 1, 2, 3], 4, 4)

    asyncio.run(main())
