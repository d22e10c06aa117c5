"""``Producer.send_async_many``: one future for many messages, each message placed as ``send_async`` would.

Against a real broker: every message's SendResult (built when read) names the partition, offset and id the
log holds it at; order per partition is send order, also when ``send_async`` calls interleave; a failure is
the result of the messages it hit and no others; misuse raises before anything is queued.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

import pytest
import uvloop

from metaq.client import KeyHashSelector, Message, MessageSessionFactory, SendResult
from metaq.client.consumer import PullConsumer
from metaq.client.exceptions import BufferFullError, ClientClosedError
from metaq.client.producer import ManySendResult
from metaq.client.transaction import TransactionError
from metaq.errors import InvalidArgument, MessageTooLargeError
from metaq.testing.broker import BrokerProcess


async def read_log(consumer: PullConsumer, topic: str, partitions: int) -> dict[tuple[int, int], Message]:
    out: dict[tuple[int, int], Message] = {}
    for p in range(partitions):
        async for m in consumer.iterate(topic, p, "earliest", stop_at_end=True, max_bytes=64 * 1024):
            out[(p, m.offset)] = m
    return out


def check_against_log(sent: list[tuple[bytes, SendResult]], log: dict[tuple[int, int], Message]) -> None:
    order: dict[int, list[int]] = defaultdict(list)
    for payload, r in sent:
        assert r.success, r
        m = log[(r.partition, r.offset)]
        assert bytes(m.data) == payload and m.id == r.message_id
        order[r.partition].append(r.offset)
    for p, offsets in order.items():
        assert offsets == sorted(offsets), f"partition {p}: stored out of send order"


def test_each_message_gets_its_own_partition_offset_and_id(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            await session.admin().create_topic("many", 4)
            producer = session.create_producer(batch_bytes=4096)  # many batches per partition
            payloads = [b"many-%05d" % i for i in range(3000)]
            called: list[ManySendResult] = []
            fut = producer.send_async_many([Message("many", p) for p in payloads], callback=called.append)
            result = await fut
            await asyncio.sleep(0)  # the callback runs on the loop once the future is done
            assert called == [result]
            assert result.success and result.failures == 0 and result.errors == [] and len(result) == 3000
            assert {r.partition for r in result} == {0, 1, 2, 3}  # round robin, as send_async
            assert result[-1] == list(result)[2999] and result[10:12] == [result[10], result[11]]
            log = await read_log(session.create_pull_consumer(), "many", 4)
            assert len(log) == 3000
            check_against_log(list(zip(payloads, result, strict=True)), log)

    uvloop.run(main())


def test_interleaved_with_send_async_both_resolve_and_keep_send_order(broker: BrokerProcess) -> None:
    """Messages of both calls share partition batches: the futures and the many's results are resolved
    from the same batches, and the log holds everything in call order per partition."""

    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            await session.admin().create_topic("mixed", 4)
            producer = session.create_producer(linger_ms=20)
            sent: list[tuple[bytes, Any]] = []
            manys = []
            for round_ in range(5):
                for i in range(37):
                    payload = b"a-%d-%d" % (round_, i)
                    sent.append((payload, producer.send_async(Message("mixed", payload))))
                payloads = [b"m-%d-%d" % (round_, i) for i in range(101)]
                many = producer.send_async_many([Message("mixed", p) for p in payloads])
                manys.append(many)
                sent.extend((p, (many, i)) for i, p in enumerate(payloads))
            await producer.flush()
            assert all(m.done() for m in manys)
            results = [(p, w.result() if isinstance(w, asyncio.Future) else w[0].result()[w[1]]) for p, w in sent]
            log = await read_log(session.create_pull_consumer(), "mixed", 4)
            assert len(log) == len(sent)
            check_against_log(results, log)

    uvloop.run(main())


def test_keys_attributes_delays_and_a_topic_not_known_yet(broker: BrokerProcess) -> None:
    """The slow paths of send_async hold for its messages too: a keyed batch, a delayed batch, and a
    topic whose metadata is fetched first (partition -1: the broker creates it)."""

    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            await session.admin().create_topic("keyed", 4)
            producer = session.create_producer(KeyHashSelector())
            msgs = [Message("keyed", b"k%d" % i, key=b"key-%d" % (i % 3), attribute="attr") for i in range(30)]
            msgs.append(Message("keyed", b"later", key=b"key-0", delay_ms=1))
            msgs.append(Message("brand-new", b"first", key=b"x"))
            result = await producer.send_async_many(msgs)
            assert result.success, result.errors
            by_key: dict[bytes, set[int]] = defaultdict(set)
            for m, r in zip(msgs[:30], result[:30], strict=True):
                assert m.key is not None
                by_key[m.key].add(r.partition)
            assert all(len(parts) == 1 for parts in by_key.values())  # a key stays on one partition
            assert result[30].offset == -1 and result[30].message_id == -1  # delayed: assigned at delivery
            assert result[31].topic == "brand-new" and result[31].partition >= 0
            log = await read_log(session.create_pull_consumer(), "keyed", 4)
            check_against_log([(m.data, r) for m, r in zip(msgs[:30], result[:30], strict=True)], log)
            assert {m.attribute for m in log.values() if m.data.startswith(b"k")} == {"attr"}

    uvloop.run(main())


def test_a_failure_is_the_result_of_the_messages_it_hit_only(broker_factory: Any) -> None:
    proc = broker_factory({"maxMessageSize": 1024, "maxTransferSize": 4096, "numPartitions": 1})

    async def main() -> None:
        async with await MessageSessionFactory.connect(proc.servers) as session:
            await session.admin().create_topic("fine", 1)
            await session.admin().create_topic("big", 1)
            producer = session.create_producer()  # its own limit (1 MiB) is larger than the broker's
            result = await producer.send_async_many(
                [Message("fine", b"one"), Message("big", bytes(2000)), Message("fine", b"two")])
            assert not result.success and result.failures == 1
            assert [r.success for r in result] == [True, False, True]
            assert isinstance(result[1].error, MessageTooLargeError) and result.errors == [result[1].error]
            assert result[1].topic == "big" and result[1].offset == -1
            assert (result[0].offset, result[2].offset) == (0, 1)

    uvloop.run(main())


def test_buffer_full_fails_every_message_at_once(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            await session.admin().create_topic("full", 1)
            producer = session.create_producer(max_buffered_bytes=10_000, batch_bytes=8192, linger_ms=50)
            assert (await producer.send(Message("full", b"warm up"))).success
            first = producer.send_async_many([Message("full", bytes(100)) for _ in range(60)])  # ~7.7 KB: fits
            second = producer.send_async_many([Message("full", bytes(100)) for _ in range(60)])
            assert second.done()  # no waiting: failed at once
            refused = second.result()
            assert refused.failures == 60 and all(isinstance(r.error, BufferFullError) for r in refused)
            assert (await first).success

    uvloop.run(main())


def test_misuse_raises_before_anything_is_queued(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            await session.admin().create_topic("misuse", 1)
            producer = session.create_producer(max_message_bytes=1000)
            assert (await producer.send(Message("misuse", b"warm up"))).success
            for bad in ([Message("misuse", b"ok"), Message("misuse", "text")],  # type: ignore[arg-type]
                        [Message("misuse", b"ok"), Message("misuse", bytes(2000))],
                        [Message("misuse", b"ok"), Message("../etc", b"x")],
                        [Message("misuse", b"ok"), b"not a message"]):
                with pytest.raises(InvalidArgument):
                    producer.send_async_many(bad)  # type: ignore[arg-type]
                assert producer.buffered_bytes == 0 and producer.unsent_batches == 0
            empty = await producer.send_async_many([])
            assert len(empty) == 0 and empty.success
            async with producer.transaction():
                with pytest.raises(TransactionError):
                    producer.send_async_many([Message("misuse", b"x")])
            await producer.close()
            with pytest.raises(ClientClosedError):
                producer.send_async_many([Message("misuse", b"late")])

    uvloop.run(main())


def test_cancelling_the_future_does_not_withdraw_the_messages(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            await session.admin().create_topic("cancel", 1)
            producer = session.create_producer(linger_ms=50)
            assert (await producer.send(Message("cancel", b"warm up"))).success
            many = producer.send_async_many([Message("cancel", b"c%d" % i) for i in range(10)])
            after = producer.send_async(Message("cancel", b"after"))
            many.cancel()
            assert (await after).offset == 11  # behind the 10 cancelled ones, which were stored all the same
            got = [bytes(m.data) async for m in session.create_pull_consumer().iterate(
                "cancel", 0, 1, stop_at_end=True)]
            assert got == [b"c%d" % i for i in range(10)] + [b"after"]

    uvloop.run(main())


def test_one_way_producer_results_are_accepted_with_no_offsets(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            await session.admin().create_topic("oneway", 1)
            producer = session.create_producer(acks=0)
            result = await producer.send_async_many([Message("oneway", b"o%d" % i) for i in range(50)])
            assert result.success and len(result) == 50
            assert {(r.success, r.partition, r.offset, r.message_id) for r in result} == {(True, -1, -1, -1)}
            single = producer.send_oneway(Message("oneway", b"single"))
            assert (single.success, single.offset, single.topic) == (True, -1, "oneway")
            await producer.flush()
            got = [bytes(m.data) async for m in session.create_pull_consumer().iterate(
                "oneway", 0, 0, stop_at_end=True)]
            assert got == [b"o%d" % i for i in range(50)] + [b"single"]

    uvloop.run(main())


def test_a_message_the_selector_refuses_fails_alone(broker: BrokerProcess) -> None:
    """KeyHashSelector refuses a message without a key: send_async raises, send_async_many makes it that
    message's failed result and sends the others."""

    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            await session.admin().create_topic("hash", 4)
            producer = session.create_producer(KeyHashSelector())
            result = await producer.send_async_many(
                [Message("hash", b"a", key=b"k"), Message("hash", b"no key"), Message("hash", b"b", key=b"k")])
            assert [r.success for r in result] == [True, False, True]
            assert isinstance(result[1].error, InvalidArgument) and result.failures == 1
            assert result[2].offset == result[0].offset + 1

    uvloop.run(main())


def test_a_plain_list_lands_where_round_robin_puts_it_one_by_one(broker: BrokerProcess) -> None:
    """A list of plain messages of one topic under the default selector is placed a partition at a time:
    message j goes where the j-th send_async would have gone, across batch boundaries, behind a keyed
    batch already open for a partition, keeping given timestamps and giving the others their batch's."""

    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            await session.admin().create_topic("bulk", 4)
            producer = session.create_producer(batch_bytes=2048, linger_ms=20)
            assert (await producer.send(Message("bulk", b"warm up"))).success  # partition 0; next: 1
            keyed = producer.send_async(Message("bulk", b"keyed", key=b"k"))  # partition 1, a keyed batch
            payloads = [b"p%04d" % i + bytes(i % 50) for i in range(1001)]
            msgs = [Message("bulk", p, timestamp_ms=1_000_000 + i if i % 7 == 0 else -1)
                    for i, p in enumerate(payloads)]
            result = await producer.send_async_many(msgs)
            after = await producer.send_async(Message("bulk", b"after"))
            assert (await keyed).partition == 1 and result.success
            assert [r.partition for r in result] == [(2 + j) % 4 for j in range(1001)]
            assert after.partition == (2 + 1001) % 4  # the selector's counter moved past the whole list
            log = await read_log(session.create_pull_consumer(), "bulk", 4)
            check_against_log(list(zip(payloads, result, strict=True)), log)
            for i, r in enumerate(result):
                stamp = log[(r.partition, r.offset)].timestamp_ms
                assert stamp == 1_000_000 + i if i % 7 == 0 else stamp > 1_000_000_000_000
            assert log[(1, (await keyed).offset)].key == b"k"

    uvloop.run(main())


def test_an_idempotent_producer_stamps_its_batches_as_any_others(broker: BrokerProcess) -> None:
    """Batches filled by send_async_many are stamped at their first write like every batch: each message is
    stored once, in order, with the offsets its result names."""

    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            await session.admin().create_topic("idem", 2)
            producer = session.create_producer(enable_idempotence=True, batch_bytes=1024)
            assert (await producer.send(Message("idem", b"warm up"))).success
            payloads = [b"i%04d" % i for i in range(600)]
            first = producer.send_async_many([Message("idem", p) for p in payloads[:300]])
            second = producer.send_async_many([Message("idem", p) for p in payloads[300:]])
            results = [*(await first), *(await second)]
            log = await read_log(session.create_pull_consumer(), "idem", 2)
            assert len(log) == 601
            check_against_log(list(zip(payloads, results, strict=True)), log)

    uvloop.run(main())
