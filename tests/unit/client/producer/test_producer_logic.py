"""Producer checks that happen before any I/O: misuse raises, limits are clear, results add up."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from metaq.client.config import ClientConfig, ProducerConfig, build_config
from metaq.client.core import ClientCore
from metaq.client.exceptions import ClientClosedError
from metaq.client.producer import BatchChunk, BatchSendResult, Producer
from metaq.errors import ConfigError, InvalidArgument, UnknownTopicError
from metaq.protocol.records import RECORD_OVERHEAD_BYTES
from metaq.types import Message


def with_producer(test: Callable[[Producer], Coroutine[Any, Any, None]], **options: Any) -> None:
    """Run ``test`` with a producer whose session never connected: anything that reached the network
    would fail, so passing tests prove the checks happen first."""

    async def main() -> None:
        core = ClientCore(ClientConfig(), [("127.0.0.1", 9)])
        producer = Producer(core, build_config(ProducerConfig, options))
        try:
            await test(producer)
        finally:
            await core.close()

    asyncio.run(main())


OV = RECORD_OVERHEAD_BYTES
TOO_BIG = rf"{OV + 1000} bytes encoded \(payload 1000 bytes\); max_message_bytes is 1000"


def test_a_message_over_max_message_bytes_raises_invalid_argument() -> None:
    async def check(p: Producer) -> None:
        big = Message("t", b"x" * 1000)
        for call in (lambda: p.send_async(big), lambda: p.send_oneway(big)):
            with pytest.raises(InvalidArgument, match=TOO_BIG):
                call()
        with pytest.raises(InvalidArgument, match="max_message_bytes"):
            await p.send(big)
        with pytest.raises(InvalidArgument, match=f"item 1 is {OV + 1000} bytes"):
            await p.send_batch("t", [b"ok", b"x" * 1000])
        assert p.buffered_bytes == 0

    with_producer(check, max_message_bytes=1000)


def test_bad_topics_and_non_messages_raise() -> None:
    async def check(p: Producer) -> None:
        with pytest.raises(InvalidArgument, match="contains '/'"):
            p.send_async(Message("../etc", b"x"))
        with pytest.raises(InvalidArgument, match="Message"):
            p.send_async(b"raw bytes")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match="all bytes or all Message"):
            await p.send_batch("t", [b"a", Message("t", b"b")])
        with pytest.raises(InvalidArgument, match="got a message for topic 'u'"):
            await p.send_batch("t", [Message("t", b"a"), Message("u", b"b")])
        with pytest.raises(InvalidArgument, match="item 0 is str"):
            await p.send_batch("t", ["text"])  # type: ignore[list-item]
        for later in (Message("t", b"c", delay_ms=1000), Message("t", b"c", deliver_at=2_000_000_000_000)):
            with pytest.raises(InvalidArgument, match="does not take delayed messages"):
                await p.send_batch("t", [Message("t", b"a"), Message("t", b"b"), later])
        with pytest.raises(InvalidArgument, match="all bytes or all Message"):
            await p.send_batch("t", [b"a", Message("t", b"b", delay_ms=1000)])
        assert p.buffered_bytes == 0

    with_producer(check)


def test_a_closed_producer_refuses_sends() -> None:
    async def check(p: Producer) -> None:
        await p.close()
        with pytest.raises(ClientClosedError):
            p.send_async(Message("t", b"x"))
        with pytest.raises(ClientClosedError):
            await p.send_batch("t", [b"x"])

    with_producer(check)


def test_chunks_are_cut_at_batch_bytes() -> None:
    async def check(p: Producer) -> None:
        values = [b"x" * (100 - OV)] * 100  # 100 bytes each in a batch
        chunks = p._chunk("t", values)
        assert [len(c) for c, _ in chunks] == [10] * 10
        assert all(size == 1000 for _, size in chunks)

    with_producer(check, batch_bytes=1000, max_buffered_bytes=10_000)


def test_chunks_keep_every_item_once_in_order() -> None:
    async def check(p: Producer) -> None:
        values = [b"a" * 10, bytearray(b"b" * 900), memoryview(b"c" * 5000), b"d" * 400, b"e" * 400, b"f"]
        chunks = p._chunk("t", values)
        assert [list(c) for c, _ in chunks] == [values[0:2], values[2:3], values[3:6]]
        assert [size for _, size in chunks] == [OV + 10 + OV + 900, OV + 5000, 3 * OV + 801]  # a big one alone
        msgs = [Message("t", b"x" * 100, key=b"k"), Message("t", b"y", attribute="a", headers=[("h", b"v")])]
        chunks = p._chunk("t", msgs)
        assert [list(c) for c, _ in chunks] == [msgs] and chunks[0][1] == (OV + 100 + 1) + (OV + 1 + 1 + 8)

    with_producer(check, batch_bytes=1000, max_buffered_bytes=10_000)


def test_batch_send_result_expands_to_one_result_per_message() -> None:
    err = UnknownTopicError("gone")
    r = BatchSendResult("t", [BatchChunk(0, 10, 1000, 3), BatchChunk(1, -1, -1, 2, err), BatchChunk(2, 5, 500, 1)])
    assert len(r) == 6
    assert not r.success and r.errors == [err]
    assert [(x.success, x.partition, x.offset, x.message_id) for x in r] == [
        (True, 0, 10, 1000), (True, 0, 11, 1001), (True, 0, 12, 1002),
        (False, 1, -1, -1), (False, 1, -1, -1), (True, 2, 5, 500)]
    assert r[4].error is err and r[-1].offset == 5 and r[2].message_id == 1002
    assert [x.offset for x in r[1:3]] == [11, 12]
    assert r.message_ids() == [1000, 1001, 1002, -1, -1, 500]
    with pytest.raises(IndexError):
        r[6]


def test_one_way_batch_results_are_minus_one() -> None:
    r = BatchSendResult("t", [BatchChunk(3, -1, -1, 2)])
    assert [(x.success, x.partition, x.offset, x.message_id) for x in r] == [(True, 3, -1, -1)] * 2


def test_config_names_unknown_options_and_bad_values() -> None:
    with pytest.raises(ConfigError, match=r"unknown ProducerConfig option.*linger"):
        build_config(ProducerConfig, {"linger": 5})
    with pytest.raises(ConfigError, match="acks"):
        ProducerConfig(acks=2)
    with pytest.raises(ConfigError, match="compression"):
        build_config(ProducerConfig, {"compression": "snappy"})
    with pytest.raises(ConfigError, match="max_buffered_bytes"):
        ProducerConfig(batch_bytes=1 << 20, max_buffered_bytes=1 << 10)
    with pytest.raises(ConfigError, match="reconnect_attempts"):
        ClientConfig(reconnect_attempts=0)
    assert build_config(ProducerConfig, {"compression": "zstd"}).compression.name == "ZSTD"
    assert ProducerConfig().effective_retries == 0  # MetaQ never retries a send by itself
    assert ProducerConfig(enable_idempotence=True).effective_retries > 0  # where a retry cannot duplicate
    assert ProducerConfig(enable_idempotence=True, retries=0).effective_retries == 0
    with pytest.raises(ConfigError, match="acks=1"):
        ProducerConfig(enable_idempotence=True, acks=0)


def test_send_async_many_tokens_find_their_call_while_calls_come_and_go() -> None:
    """Each send_async_many call owns a range of waiter numbers; a number finds its call until the call is
    resolved, whichever order calls are resolved in, and never another call's."""
    from metaq.client.producer.results import Many as _Many
    from metaq.client.producer.results import ManyTable as _ManyTable

    async def main() -> None:
        loop = asyncio.get_running_loop()
        table = _ManyTable()
        calls = [_Many(table, n, loop.create_future()) for n in (3, 0, 5, 1)]
        for many in calls:
            table.add(many)
        a, empty, b, c = calls
        assert [table.find(a.base + i) for i in range(3)] == [a, a, a]
        assert [table.find(b.base + i) for i in range(5)] == [b] * 5
        assert table.find(c.base) is c and table.find(c.base + 1) is None
        assert table.find(empty.base) is None  # an empty call owns no number
        for i in range(5):  # b resolved first (its batch came back first)
            b.set_result(i, SendResultFactory.ok(i))
        assert b.future.done() and len(b.future.result()) == 5 and b.future.result().success
        assert table.find(b.base) is None and table.find(a.base + 2) is a and table.find(c.base) is c
        c.set_result(0, SendResultFactory.failed())
        assert c.future.result().failures == 1 and not c.future.result().success
        assert len(table) == 2  # a and the empty one: an empty call is resolved by send_async_many itself

    asyncio.run(main())


class SendResultFactory:
    @staticmethod
    def ok(i: int) -> Any:
        from metaq.types import SendResult
        return SendResult(True, i, 0, i, None, "t", 0)

    @staticmethod
    def failed() -> Any:
        from metaq.types import SendResult
        return SendResult(False, error=InvalidArgument("x"), topic="t")
