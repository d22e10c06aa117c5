"""Producer round trips against a real broker process: what is sent is what a consumer reads.

Every test reads back with a PullConsumer and checks payloads byte for byte, the order within each
partition, and that message ids are unique and equal to the batch's base id + i.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Coroutine
from typing import Any

import pytest
import uvloop

from metaq.client import KeyHashSelector, Message, MessageSessionFactory, SendResult
from metaq.client.consumer import PullConsumer
from metaq.errors import MessageTooLargeError
from metaq.testing.broker import BrokerProcess


def run(coro: Coroutine[Any, Any, None], loop: str = "uvloop") -> None:
    if loop == "uvloop":
        uvloop.run(coro)
    else:
        asyncio.run(coro)


async def read_all(consumer: PullConsumer, topic: str, partitions: int) -> dict[int, list[Message]]:
    out: dict[int, list[Message]] = {}
    for p in range(partitions):
        out[p] = [m async for m in consumer.iterate(topic, p, "earliest", stop_at_end=True, max_bytes=64 * 1024)]
    return out


def check_results_match_log(results: list[tuple[bytes, SendResult]], log: dict[int, list[Message]]) -> None:
    """Each acknowledged (payload, result) is in the log at its partition and offset, with its id."""
    by_pos = {(p, m.offset): m for p, msgs in log.items() for m in msgs}
    sent_order: dict[int, list[int]] = defaultdict(list)
    for payload, r in results:
        assert r.success, r
        m = by_pos[(r.partition, r.offset)]
        assert bytes(m.data) == payload
        assert m.id == r.message_id
        sent_order[r.partition].append(r.offset)
    for p, offsets in sent_order.items():
        assert offsets == sorted(offsets), f"partition {p}: sends stored out of order"


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_send_send_async_oneway_and_batch_round_trip(broker: BrokerProcess, loop: str) -> None:
    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            admin = session.admin()
            assert await admin.create_topic("rt", 4) == 4
            producer = session.create_producer()

            sync_sent = []
            for i in range(40):
                payload = b"sync-%d-" % i + bytes(range(256))
                sync_sent.append((payload, await producer.send(Message("rt", payload))))

            async_payloads = [b"async-%05d" % i for i in range(3000)]
            futures = [producer.send_async(Message("rt", p)) for p in async_payloads]
            async_sent = list(zip(async_payloads, await asyncio.gather(*futures), strict=True))

            called: list[SendResult] = []
            # The callback was registered before this await, so it has run by the time the await returns.
            await producer.send_async(Message("rt", b"with-callback"), callback=called.append)
            assert len(called) == 1 and called[0].success

            oneway_payloads = {b"oneway-%d" % i for i in range(500)}
            for p in sorted(oneway_payloads):
                r = producer.send_oneway(Message("rt", p))
                assert (r.success, r.partition, r.offset, r.message_id) == (True, -1, -1, -1)

            batch_payloads = [b"batch-%06d" % i for i in range(20_000)]
            batch = await producer.send_batch("rt", batch_payloads)
            assert batch.success and len(batch) == len(batch_payloads)
            assert len(batch.chunks) > 1  # 20,000 x 40 bytes is more than one 64 KiB batch
            await producer.flush()

            log = await read_all(session.create_pull_consumer(), "rt", 4)
            everything = [m for msgs in log.values() for m in msgs]
            assert len({m.id for m in everything}) == len(everything), "message ids are not unique"

            check_results_match_log(sync_sent, log)
            check_results_match_log(async_sent, log)
            check_results_match_log(list(zip(batch_payloads, batch, strict=True)), log)
            for chunk in batch.chunks:  # one chunk = one frame = contiguous offsets and ids
                end = chunk.base_offset + chunk.count
                msgs = [m for m in log[chunk.partition] if chunk.base_offset <= m.offset < end]
                assert [m.id for m in msgs] == list(range(chunk.base_message_id, chunk.base_message_id + chunk.count))
            assert {bytes(m.data) for m in everything if m.data.startswith(b"oneway-")} == oneway_payloads
            assert len(everything) == 40 + 3000 + 1 + 500 + 20_000
            # Round robin over 4 partitions spreads single sends evenly.
            per_partition = {p: sum(1 for _, r in async_sent if r.partition == p) for p in range(4)}
            assert per_partition == {p: 750 for p in range(4)}

    run(main(), loop)


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_with_linger_0_a_lone_message_is_on_the_socket_after_one_loop_step(broker: BrokerProcess, loop: str) -> None:
    """linger_ms=0: a message sent alone is sealed at the end of its loop step and its frame is handed to
    the socket in that same step, by no timer and no later step (what `metaq bench e2e` latency needs)."""

    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            producer = session.create_producer(linger_ms=0)
            first = await producer.send(Message("lone", b"warm up: metadata and the connection"))
            assert first.success, first
            conn = session._core.cached_connection(first.broker_id, "produce")
            assert conn is not None and conn.in_flight == 0
            for i in range(3):
                fut = producer.send_async(Message("lone", b"alone %d" % i))
                assert producer.unsent_batches == 1
                await asyncio.sleep(0)  # one loop step: the producer's end-of-step callback runs before this resumes
                assert producer.unsent_batches == 0
                assert conn.in_flight == 1, "the batch was not sent in the step it was sealed in"
                assert conn.unflushed_bytes == 0, "the frame waits for another loop step to reach the socket"
                result = await fut
                assert result.success, result
            consumer = session.create_pull_consumer()
            got = [bytes(m.data) for p in range(4)
                   async for m in consumer.iterate("lone", p, "earliest", stop_at_end=True)]
            assert sorted(got)[:3] == [b"alone 0", b"alone 1", b"alone 2"]

    run(main(), loop)


def test_batches_sealed_while_the_connection_has_no_room_leave_merged_in_send_order(broker: BrokerProcess) -> None:
    """max_in_flight=1 and linger_ms=0: while a request is owed, each loop step seals a batch; instead of
    queueing one frame per step behind the slow reply, they join the last queued batch of their partition."""

    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers, max_in_flight=1) as session:
            await session.admin().create_topic("room", 1)
            producer = session.create_producer(linger_ms=0)
            assert (await producer.send(Message("room", b"warm up"))).success
            futures = []
            for i in range(300):
                futures.append(producer.send_async(Message("room", b"m%d" % i)))
                await asyncio.sleep(0)  # one batch sealed per loop step
            results = [await f for f in futures]
            assert all(r.success for r in results), [r for r in results if not r.success][:3]
            assert [r.offset for r in results] == list(range(1, 301))
            consumer = session.create_pull_consumer()
            got = [bytes(m.data) async for m in consumer.iterate("room", 0, 1, stop_at_end=True)]
            assert got == [b"m%d" % i for i in range(300)]
            stats = (await session.admin().stats(None))["topics"]["room"]["partitions"]
            requests = sum(p["put_requests"] for p in stats.values())
            assert requests < 150, f"{requests} produce requests for 301 messages: queued batches were not merged"
            assert producer.buffered_bytes == 0

    run(main())


def test_keys_attributes_headers_and_compression_survive(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            await session.admin().create_topic("rich", 3)
            consumer = session.create_pull_consumer()
            for compression in ("none", "lz4", "zstd"):
                producer = session.create_producer(KeyHashSelector(), compression=compression)
                sent = [Message("rich", (b"%s-%d " % (compression.encode(), i)) * 50, attribute=f"tag-{i % 3}",
                                key=b"user-%d" % (i % 5), headers=[("trace", b"%d" % i)],
                                timestamp_ms=1_700_000_000_000 + i)
                        for i in range(300)]
                results = await asyncio.gather(*[producer.send_async(m) for m in sent])
                assert all(r.success for r in results)
                by_key: dict[bytes, set[int]] = defaultdict(set)
                for m, r in zip(sent, results, strict=True):
                    by_key[m.key].add(r.partition)  # type: ignore[index]
                assert all(len(ps) == 1 for ps in by_key.values()), "one key, one partition"
                for m, r in zip(sent, results, strict=True):
                    # max_bytes=1 still returns the whole batch holding the offset.
                    fetched = await consumer.get("rich", r.partition, r.offset, max_bytes=1)
                    got = fetched[0]
                    assert got.offset == r.offset
                    assert (bytes(got.data), got.key, got.attribute, got.headers, got.timestamp_ms) == \
                           (m.data, m.key, m.attribute, m.headers, m.timestamp_ms)
                    assert got.id == r.message_id and got.append_time_ms > 0
                await producer.close()

    run(main())


def test_messages_of_one_key_are_read_in_send_order(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            await session.admin().create_topic("ordered", 4)
            producer = session.create_producer(KeyHashSelector(), linger_ms=1)
            keys = [b"order-%d" % k for k in range(7)]
            futures = [producer.send_async(Message("ordered", b"%s:%d" % (keys[i % 7], i), key=keys[i % 7]))
                       for i in range(5000)]
            assert all(r.success for r in await asyncio.gather(*futures))
            log = await read_all(session.create_pull_consumer(), "ordered", 4)
            for key in keys:
                seen = [int(bytes(m.data).split(b":")[1]) for msgs in log.values() for m in msgs if m.key == key]
                assert seen == sorted(seen) and len(seen) == len(range(keys.index(key), 5000, 7))

    run(main())


def test_first_send_to_a_new_topic_lets_the_broker_create_it(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            assert await session.partitions("fresh") == []
            producer = session.create_producer()
            first = await producer.send(Message("fresh", b"first"))
            assert first.success and 0 <= first.partition < 4
            # The producer then learns the partitions and round robins over them.
            results = [await producer.send(Message("fresh", b"m%d" % i)) for i in range(40)]
            assert all(r.success for r in results)
            assert {r.partition for r in results} == {0, 1, 2, 3}
            assert [p.partition for p in await session.partitions("fresh")] == [0, 1, 2, 3]

    run(main())


def test_a_message_the_broker_finds_too_large_fails_with_message_too_large(broker_factory: Any) -> None:
    proc = broker_factory({"maxMessageSize": 1024, "maxTransferSize": 4096})

    async def main() -> None:
        async with await MessageSessionFactory.connect(proc.servers) as session:
            await session.admin().create_topic("small", 1)
            producer = session.create_producer()  # its own limit (1 MiB) is larger than the broker's
            r = await producer.send(Message("small", b"x" * 2000))
            assert not r.success and isinstance(r.error, MessageTooLargeError)
            assert (await producer.send(Message("small", b"ok"))).success

    run(main())


def test_futures_the_caller_cancelled_leave_the_rest_of_their_batch_resolved(broker: BrokerProcess) -> None:
    """A batch's futures are resolved in one pass; a cancelled one is skipped, the others get their own
    offsets and ids (cancelling does not take the message back: it is stored all the same)."""

    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            await session.admin().create_topic("cancelled", 1)
            producer = session.create_producer(linger_ms=50)
            assert (await producer.send(Message("cancelled", b"warm up"))).success
            futures = [producer.send_async(Message("cancelled", b"c%d" % i)) for i in range(100)]
            cancelled = {0, 1, 50, 99}
            for i in cancelled:
                futures[i].cancel()
            await producer.flush()
            for i, f in enumerate(futures):
                if i in cancelled:
                    assert f.cancelled()
                    continue
                r = f.result()
                assert r.success and r.offset == i + 1, (i, r)
            consumer = session.create_pull_consumer()
            got = [m async for m in consumer.iterate("cancelled", 0, 1, stop_at_end=True)]
            assert [bytes(m.data) for m in got] == [b"c%d" % i for i in range(100)]
            ids = {i: futures[i].result().message_id for i in range(100) if i not in cancelled}
            assert all(got[i].id == mid for i, mid in ids.items())

    run(main())


def test_send_async_fast_path_still_refuses_misuse(broker: BrokerProcess) -> None:
    """The checks hold for a topic already sent to in this loop step (the common-case path): an oversized
    message and non-bytes data raise InvalidArgument, a closed producer raises ClientClosedError."""
    from metaq.client.exceptions import ClientClosedError
    from metaq.errors import InvalidArgument

    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            await session.admin().create_topic("misuse", 1)
            producer = session.create_producer(max_message_bytes=1000, batch_bytes=1000)
            assert (await producer.send(Message("misuse", b"warm up"))).success
            ok = producer.send_async(Message("misuse", b"fits"))
            with pytest.raises(InvalidArgument, match="max_message_bytes"):
                producer.send_async(Message("misuse", bytes(2000)))
            with pytest.raises(InvalidArgument, match="bytes"):
                producer.send_async(Message("misuse", "text"))  # type: ignore[arg-type]
            assert (await ok).success
            await producer.close()
            with pytest.raises(ClientClosedError):
                producer.send_async(Message("misuse", b"late"))

    run(main())


def test_flush_waits_for_every_batch_in_flight_however_many_flushes_wait_or_are_cancelled(
        broker: BrokerProcess) -> None:
    """flush() returns once each batch in flight at its call is acknowledged, not before: with the broker
    paused no flush returns; a cancelled flush leaves the others waiting; once the broker runs again every
    flush returns and every message sent before it has its result."""
    import signal

    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            await session.admin().create_topic("flushed", 16)
            # one Produce per batch: the batches are acknowledged one reply at a time
            producer = session.create_producer(linger_ms=0, multi_produce=False)
            assert (await producer.send(Message("flushed", b"warm up"))).success
            await producer.flush()  # nothing in flight: returns at once
            broker.signal(signal.SIGSTOP)
            try:
                futures = [producer.send_async(Message("flushed", b"m%d" % i)) for i in range(400)]
                first, cancelled, second = (asyncio.ensure_future(producer.flush()) for _ in range(3))
                done, _ = await asyncio.wait([first, cancelled, second], timeout=0.5)
                assert not done, "a flush returned while its batches could not be acknowledged"
                cancelled.cancel()
                late = producer.send_async(Message("flushed", b"late"))
                third = asyncio.ensure_future(producer.flush())
                await asyncio.wait([first, second, third], timeout=0.2)
                assert not (first.done() or second.done() or third.done())
            finally:
                broker.signal(signal.SIGCONT)
            async with asyncio.timeout(30):
                await first  # checked the moment it returns, before another reply is read
                assert all(f.done() for f in futures)
                await asyncio.gather(second, third)
            assert cancelled.cancelled()
            assert all(f.done() and f.result().success for f in [*futures, late])
            consumer = session.create_pull_consumer()
            stored = await read_all(consumer, "flushed", 16)
            assert sorted(bytes(m.data) for msgs in stored.values() for m in msgs) == sorted(
                [b"warm up", b"late", *(b"m%d" % i for i in range(400))])

    run(main())
