"""The pull consumer's iterators send the next fetch before handing out a reply (when the reply says more
is stored): order, offsets and limits are as without it, payload views of earlier replies stay intact,
and a caught-up iterator holds no fetch ahead."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvloop

from metaq.client import Message, MessageSessionFactory
from metaq.client.consumer import PullConsumer
from metaq.testing import produce
from metaq.testing.broker import BrokerProcess

SIZE = 100_000
COUNT = 30

Body = Callable[[Any, PullConsumer], Awaitable[None]]


def payload(i: int) -> bytes:
    return bytes([i % 251]) * SIZE


async def fill(session: Any, topic: str, count: int = COUNT) -> None:
    # one stored batch each, so each fetch of ~1.5 batches holds one whole
    await produce(session, topic, [payload(i) for i in range(count)], batch_messages=1, create_partitions=1)


@pytest.fixture
def filled(broker: BrokerProcess) -> Callable[..., None]:
    """``filled(topic, body, count=COUNT)``: under uvloop, a session to the broker, ``topic`` created with
    ``count`` messages of SIZE bytes (one stored batch each), then ``await body(session, pull_consumer)``."""
    def run(topic: str, body: Body, count: int = COUNT) -> None:
        async def main() -> None:
            async with await MessageSessionFactory.connect(broker.servers) as session:
                await fill(session, topic, count)
                await body(session, session.create_pull_consumer())

        uvloop.run(main())

    return run


def test_iterate_sends_the_next_fetch_before_handing_out_a_reply(filled: Callable[..., None]) -> None:
    async def body(session: Any, consumer: PullConsumer) -> None:
        it = consumer.iterate("ahead", 0, 0, max_bytes=SIZE * 3 // 2, stop_at_end=True)
        first = await anext(it)
        assert (first.offset, first.data) == (0, payload(0))
        (conn,) = consumer._iterators
        assert conn.in_flight == 1  # offset 1's fetch is already on its way
        rest = [m async for m in it]
        assert [m.offset for m in rest] == list(range(1, COUNT))
        assert [m.data for m in rest] == [payload(i) for i in range(1, COUNT)]

    filled("ahead", body)


def test_payload_views_of_earlier_replies_stay_intact(filled: Callable[..., None]) -> None:
    """iterate_columns hands out payloads as views of the received replies: none may be overwritten."""
    async def body(session: Any, consumer: PullConsumer) -> None:
        kept: list[tuple[int, memoryview]] = []
        async for batch in consumer.iterate_columns("views", 0, 0, max_bytes=SIZE * 3 // 2, stop_at_end=True):
            kept += zip(batch.offsets, batch.payloads, strict=True)
        assert [o for o, _ in kept] == list(range(COUNT))
        assert all(view == payload(o) for o, view in kept)

    filled("views", body)


def test_limits_and_restarts_keep_their_offsets(filled: Callable[..., None]) -> None:
    async def body(session: Any, consumer: PullConsumer) -> None:
        got = [m.offset async for m in consumer.iterate("limits", 0, 0, max_bytes=SIZE * 3 // 2, max_messages=7)]
        assert got == list(range(7))
        # closed with a fetch ahead in flight: the next iterator goes on from where the caller stopped
        it = consumer.iterate_batches("limits", 0, 5, max_bytes=SIZE * 3 // 2)
        batch = await anext(it)
        assert [m.offset for m in batch] == [5]
        await it.aclose()
        assert not consumer._iterators
        again = [m.offset for batch in [b async for b in consumer.iterate_batches(
            "limits", 0, 6, max_bytes=SIZE * 3 // 2, stop_at_end=True)] for m in batch]
        assert again == list(range(6, COUNT))

    filled("limits", body)


def test_a_caught_up_iterator_holds_no_fetch_ahead(filled: Callable[..., None]) -> None:
    async def body(session: Any, consumer: PullConsumer) -> None:
        it = consumer.iterate("caught", 0, 0, max_bytes=SIZE * 3 // 2, max_wait_ms=30_000)
        offsets = [(await anext(it)).offset for _ in range(3)]
        assert offsets == [0, 1, 2]
        (conn,) = consumer._iterators
        assert conn.in_flight == 0  # the last reply reached the end: nothing sent ahead to wait there
        waiting = asyncio.ensure_future(anext(it))
        sent = await session.create_producer().send(Message("caught", b"late"))
        got = await asyncio.wait_for(waiting, 10)
        assert (got.offset, got.data) == (sent.offset, b"late")
        await it.aclose()

    filled("caught", body, count=3)
