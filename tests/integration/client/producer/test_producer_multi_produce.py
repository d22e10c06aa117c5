"""The producer puts batches for several partitions that leave together into one MultiProduce (API 24).

A burst spread round robin over a topic's partitions is one request and one reply; every message's result
is still its own stored position, and a batch the broker refuses fails alone.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import uvloop
from test_client_produce import check_results_match_log, read_all

from metaq.client import Message, MessageSessionFactory, SendResult
from metaq.errors import MessageTooLargeError
from metaq.testing.broker import BrokerProcess


@pytest.mark.parametrize("multi", [True, False])
def test_a_burst_over_four_partitions_is_one_request_and_every_result_is_where_the_message_is_stored(
        broker: BrokerProcess, multi: bool) -> None:
    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            await session.admin().create_topic("burst", 4)
            producer = session.create_producer(linger_ms=0, multi_produce=multi)
            assert (await producer.send(Message("burst", b"warm up"))).success
            sent: list[tuple[bytes, SendResult]] = []
            bursts = 25
            for b in range(bursts):
                payloads = [b"burst-%02d-%d" % (b, i) for i in range(8)]  # two per partition, round robin
                results = await asyncio.gather(*(producer.send_async(Message("burst", p)) for p in payloads))
                assert {r.partition for r in results} == {0, 1, 2, 3}
                sent.extend(zip(payloads, results, strict=True))
            if multi:  # each burst: the four partitions' batches in one request
                assert producer.multi_produce_requests == bursts
                assert producer.multi_produced_batches == 4 * bursts
            else:
                assert producer.multi_produce_requests == producer.multi_produced_batches == 0
            log = await read_all(session.create_pull_consumer(), "burst", 4)
            check_results_match_log(sent, log)
            stored = sorted(bytes(m.data) for msgs in log.values() for m in msgs)
            assert stored == sorted([b"warm up"] + [p for p, _ in sent])  # nothing stored twice or lost

    uvloop.run(main())


def test_a_batch_the_broker_refuses_fails_alone_and_the_others_of_its_request_are_stored(
        broker_factory: Any) -> None:
    proc = broker_factory({"numPartitions": 4, "maxMessageSize": 1024})

    async def main() -> None:
        async with await MessageSessionFactory.connect(proc.servers) as session:
            await session.admin().create_topic("mixed", 4)
            producer = session.create_producer(linger_ms=0)  # its own limit (1 MiB) is the larger one
            assert (await producer.send(Message("mixed", b"warm up"))).success
            payloads = [b"small-0", b"x" * 2000, b"small-2", b"small-3"]  # one message per partition
            results = await asyncio.gather(*(producer.send_async(Message("mixed", p)) for p in payloads))
            assert producer.multi_produce_requests >= 1
            big = results[1]
            assert not big.success and isinstance(big.error, MessageTooLargeError), big
            ok = [(p, r) for p, r in zip(payloads, results, strict=True) if p != payloads[1]]
            assert all(r.success for _, r in ok), results
            log = await read_all(session.create_pull_consumer(), "mixed", 4)
            check_results_match_log(ok, log)
            stored = {bytes(m.data) for msgs in log.values() for m in msgs}
            assert stored == {b"warm up", b"small-0", b"small-2", b"small-3"}

    uvloop.run(main())


@pytest.mark.parametrize("multi", [True, False])
def test_more_partitions_due_at_once_than_requests_allowed_in_flight_are_all_sent_in_order(
        broker_factory: Any, multi: bool) -> None:
    """16 partitions' batches due in one loop step over a connection that takes 4 requests in flight: with one
    Produce per batch the ones past the limit wait in the broker's queue for room (none fails), and with
    MultiProduce they go in one request."""
    proc = broker_factory({"numPartitions": 16, "unflushThreshold": 0})

    async def main() -> None:
        async with await MessageSessionFactory.connect(proc.servers, max_in_flight=4) as session:
            await session.admin().create_topic("wide", 16)
            producer = session.create_producer(linger_ms=0, multi_produce=multi)
            assert (await producer.send(Message("wide", b"warm up"))).success
            sent: list[tuple[bytes, SendResult]] = []
            for b in range(10):
                payloads = [b"wide-%d-%02d" % (b, i) for i in range(64)]  # four per partition, round robin
                results = await asyncio.gather(*(producer.send_async(Message("wide", p)) for p in payloads))
                assert all(r.success for r in results), [r.error for r in results if not r.success][:3]
                sent.extend(zip(payloads, results, strict=True))
            assert (producer.multi_produce_requests > 0) is multi
            log = await read_all(session.create_pull_consumer(), "wide", 16)
            check_results_match_log(sent, log)
            assert sum(len(msgs) for msgs in log.values()) == len(sent) + 1

    uvloop.run(main())
