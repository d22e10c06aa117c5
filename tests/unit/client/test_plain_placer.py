"""The compiled placement of a plain message (metaq._speedups.PlainPlacer) does exactly what the producer's
Python code does: the same batches, in the same order, with the same payloads, timestamps and waiters, the same
buffer accounting and round robin, the same results; and for anything it does not cover it changes nothing."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metaq.client.accumulator import ProducerBatch
from metaq.client.config import ClientConfig, ProducerConfig, build_config
from metaq.client.core import ClientCore
from metaq.client.metadata import Partition
from metaq.client.producer import Producer
from metaq.client.selectors import KeyHashSelector, RandomSelector, RoundRobinSelector, StickyRoundRobinSelector
from metaq.errors import InvalidArgument
from metaq.protocol.records import HEADER_BYTES, RECORD_OVERHEAD_BYTES
from metaq.types import PLAIN_PLACER, Message

pytestmark = pytest.mark.skipif(PLAIN_PLACER is None, reason="metaq._speedups is not built (or METAQ_NO_SPEEDUPS)")

TOPICS = {
    "a": (Partition(0, 0), Partition(0, 1), Partition(1, 0)),
    # a closed partition: the round robin's candidates are a list without it
    "b": (Partition(0, 0), Partition(0, 1, accept_publish=False), Partition(0, 2)),
}
REFRESHED = {  # what a metadata refresh may bring: a partition closed, or opened again
    "a": (Partition(0, 0), Partition(0, 1, accept_publish=False), Partition(1, 0)),
    "b": (Partition(0, 0), Partition(0, 1), Partition(0, 2)),
}


def run_pair(test: Callable[[Producer, Producer], Coroutine[Any, Any, None]],
             selector: Callable[[], Any] = RoundRobinSelector, **options: Any) -> None:
    """Two producers of one never-connected session, one with the compiled placement and one without; every
    batch either sends is recorded instead (its ``_dispatch``), so nothing reaches the network."""

    async def main() -> None:
        core = ClientCore(ClientConfig(), [("127.0.0.1", 9)])
        config = build_config(ProducerConfig, options)
        fast, slow = Producer(core, config, selector()), Producer(core, config, selector())
        assert fast._fast_async is not None and fast._fast_oneway is not None
        slow._fast_async = slow._fast_oneway = None
        for p in (fast, slow):
            p.sent = []  # type: ignore[attr-defined]
            p._dispatch = p.sent.append  # type: ignore[attr-defined, method-assign]
            p._hot.update(TOPICS)
        try:
            await test(fast, slow)
        finally:
            for p in (fast, slow):
                p._acc.batches.clear()  # nothing is sent: no timer may find them
                p._hot.clear()
            await core.close()

    asyncio.run(main())


def shape(batch: ProducerBatch, token: dict[int, int]) -> tuple[Any, ...]:
    """What a batch carries, its waiters as the index of the send that made them (None for one-way) and a
    record's default timestamp as "created" (the two producers' batches are created at different times)."""
    return (batch.key, list(batch.values), ["created" if t == batch.created_ms else t for t in batch.timestamps],
            [None if w is None else token[id(w)] for w in batch.waiters], batch.count, batch.size_bytes,
            batch.keys, batch.headers)


def outcome(result: Any) -> Any:
    """A send's visible outcome: a one-way result, or a future's state (pending, or its result's success and
    error type)."""
    if isinstance(result, asyncio.Future):
        if not result.done():
            return "pending"
        r = result.result()
        return ("done", r.success, type(r.error).__name__)
    return ("oneway", result.success, type(result.error).__name__, result.topic)


def selector_state(selector: Any) -> Any:
    """The round robin's counters, or the sticky selector's current partitions and counters."""
    if isinstance(selector, StickyRoundRobinSelector):
        return {t: c[1] for t, c in selector.current.items()}, dict(selector._counters)
    return {t: r.next for t, r in selector.rotations.items()}


def state(p: Producer, token: dict[int, int]) -> tuple[Any, ...]:
    return ([shape(b, token) for b in p.sent],  # type: ignore[attr-defined]
            sorted((shape(b, token) for b in p._acc.batches.values()), key=repr),
            p.buffered_bytes, selector_state(p.selector))


send = st.fixed_dictionaries({
    "api": st.sampled_from(["async", "async", "async_cb", "oneway", "refresh"]),
    "topic": st.sampled_from(["a", "a", "b"]),
    "size": st.integers(0, 150),
    "timestamp": st.one_of(st.just(-1), st.just(-1), st.integers(0, 10_000)),
    "key": st.one_of(st.none(), st.none(), st.none(), st.just(b"k")),
    "headers": st.one_of(st.none(), st.none(), st.none(), st.none(), st.just([("h", b"v")])),
})


@pytest.mark.parametrize("selector", [RoundRobinSelector, StickyRoundRobinSelector])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sends=st.lists(send, max_size=120), batch_bytes=st.integers(120, 700),
       buffered_batches=st.integers(1, 12))
def test_compiled_and_python_placement_agree(selector: Callable[[], Any], sends: list[dict[str, Any]],
                                             batch_bytes: int, buffered_batches: int) -> None:
    async def check(fast: Producer, slow: Producer) -> None:
        tokens: tuple[dict[int, int], dict[int, int]] = ({}, {})
        called: list[tuple[str, int]] = []
        for i, s in enumerate(sends):
            if s["api"] == "refresh":  # metadata refreshed: a new tuple, maybe another partition closed
                partitions = (REFRESHED if s["size"] % 2 else TOPICS)[s["topic"]]
                for p in (fast, slow):
                    p._hot[s["topic"]] = tuple(list(partitions))
                assert state(fast, tokens[0]) == state(slow, tokens[1])
                continue
            outcomes = []
            for p, token in zip((fast, slow), tokens, strict=True):
                message = Message(s["topic"], bytes(s["size"]), key=s["key"], headers=s["headers"],
                                  timestamp_ms=s["timestamp"])
                if s["api"] == "oneway":
                    result: Any = p.send_oneway(message)
                elif s["api"] == "async_cb":
                    result = p.send_async(message, lambda r, p=p, i=i: called.append((repr(p), i)))
                else:
                    result = p.send_async(message)
                if isinstance(result, asyncio.Future):
                    token[id(result)] = i
                outcomes.append(outcome(result))
            assert outcomes[0] == outcomes[1], s
            assert state(fast, tokens[0]) == state(slow, tokens[1])
        await asyncio.sleep(0)  # the callbacks of futures already done (buffer full) run: both or neither
        assert sorted(i for who, i in called if who == repr(fast)) == sorted(
            i for who, i in called if who == repr(slow))

    run_pair(check, selector, batch_bytes=batch_bytes, max_buffered_bytes=batch_bytes * buffered_batches)


def test_the_compiled_placement_is_what_places_plain_messages_into_open_batches() -> None:
    """Not a vacuous agreement: with the compiled placement, a plain message joining an open batch is placed
    without the Python placement being called, and one opening a batch goes through it."""

    async def check(fast: Producer, slow: Producer) -> None:
        calls: list[str] = []
        original = fast._place_plain
        fast._place_plain = lambda *a: (calls.append("python"), original(*a))[1]  # type: ignore[method-assign]
        futures = [fast.send_async(Message("a", b"x")) for _ in range(6)]
        assert calls == ["python"] * 3  # the first message of each of the three partitions opens its batch
        assert [len(b.values) for b in fast._acc.batches.values()] == [2, 2, 2]
        assert all(isinstance(f, asyncio.Future) and not f.done() for f in futures)
        assert fast.send_oneway(Message("a", b"y")).success
        assert calls == ["python"] * 4  # one-way batches are other batches (acks 0): this one opens one
        assert fast.send_oneway(Message("a", b"y")).success
        assert calls == ["python"] * 5
        assert fast.send_oneway(Message("a", b"y")).success
        assert fast.send_oneway(Message("a", b"y")).success
        assert calls == ["python"] * 6

    run_pair(check)


def test_with_the_sticky_selector_the_compiled_placement_fills_its_partitions_batch() -> None:
    async def check(fast: Producer, slow: Producer) -> None:
        calls: list[str] = []
        original = fast._place_plain
        fast._place_plain = lambda *a: (calls.append("python"), original(*a))[1]  # type: ignore[method-assign]
        for _ in range(6):
            fast.send_async(Message("a", b"x"))
        assert calls == ["python"]  # the first message picks the partition and opens its batch
        assert [len(b.values) for b in fast._acc.batches.values()] == [6]

    run_pair(check, StickyRoundRobinSelector)


def test_a_batch_the_compiled_placement_fills_leaves_at_once() -> None:
    full = HEADER_BYTES + 3 * (RECORD_OVERHEAD_BYTES + 50)  # three records of 50 B fill a batch exactly

    async def check(fast: Producer, slow: Producer) -> None:
        calls: list[str] = []
        original = fast._place_plain
        fast._place_plain = lambda *a: (calls.append("python"), original(*a))[1]  # type: ignore[method-assign]
        for p in (fast, slow):
            for _ in range(3 * 6):
                p.send_async(Message("a", bytes(50)))
        sent: list[list[ProducerBatch]] = [fast.sent, slow.sent]  # type: ignore[attr-defined]
        assert [(b.key, b.values, b.size_bytes) for b in sent[0]] == [(b.key, b.values, b.size_bytes)
                                                                        for b in sent[1]]
        assert len(sent[0]) == 6 and all(b.size_bytes == full and b.count == 3 for b in sent[0])
        assert not fast._acc.batches and fast.buffered_bytes == slow.buffered_bytes == 6 * full - 6 * HEADER_BYTES
        assert len(calls) == 6  # each batch opened by the Python code, filled and sent by the compiled one

    run_pair(check, batch_bytes=full)


def test_misuse_still_raises_through_the_python_checks() -> None:
    async def check(fast: Producer, slow: Producer) -> None:
        too_big = Message("a", bytes(2000))
        with pytest.raises(InvalidArgument, match="max_message_bytes is 1000"):
            fast.send_async(too_big)
        with pytest.raises(InvalidArgument, match="max_message_bytes is 1000"):
            fast.send_oneway(too_big)
        with pytest.raises(InvalidArgument, match="Message"):
            fast.send_async(b"raw")  # type: ignore[arg-type]
        assert fast.buffered_bytes == 0 and not fast._acc.batches

    run_pair(check, max_message_bytes=1000, batch_bytes=1000)


@pytest.mark.parametrize("selector", [KeyHashSelector, RandomSelector])
def test_other_selectors_keep_the_python_placement(selector: Callable[[], Any]) -> None:
    async def check() -> None:
        core = ClientCore(ClientConfig(), [("127.0.0.1", 9)])
        try:
            p = Producer(core, build_config(ProducerConfig, {}), selector())
            assert p._fast_async is None and p._fast_oneway is None
        finally:
            await core.close()

    asyncio.run(check())


def test_a_producer_with_its_placers_is_collected() -> None:
    """The placers and the producer reference each other: the cycle is the collector's to free."""

    async def check() -> weakref.ref[Producer]:
        core = ClientCore(ClientConfig(), [("127.0.0.1", 9)])
        p = Producer(core, build_config(ProducerConfig, {}))
        assert p._fast_async is not None
        ref = weakref.ref(p)
        await core.close()
        return ref

    ref = asyncio.run(check())
    gc.collect()
    assert ref() is None
