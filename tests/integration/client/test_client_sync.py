"""The synchronous facade, for scripts, against a real broker."""

from __future__ import annotations

import concurrent.futures
import threading

import pytest

from metaq.client import Message, SendResult, connect
from metaq.client.exceptions import ClientClosedError
from metaq.errors import ConnectionClosedError, UnknownTopicError
from metaq.testing.broker import BrokerProcess


def test_sync_round_trip(broker: BrokerProcess) -> None:
    with connect(broker.servers) as session:
        admin = session.admin()
        assert admin.create_topic("sync", 2) == 2
        producer = session.create_producer()
        r = producer.send(Message("sync", b"one"))
        assert r.success and r.message_id >= 0

        seen: list[SendResult] = []
        done = threading.Event()

        def callback(result: SendResult) -> None:
            seen.append(result)
            done.set()

        fut = producer.send_async(Message("sync", b"two"), callback)
        assert isinstance(fut, concurrent.futures.Future)
        assert fut.result(10).success
        assert done.wait(10) and seen[0].success

        assert producer.send_oneway(Message("sync", b"three")).offset == -1
        batch = producer.send_batch("sync", [b"b%d" % i for i in range(1000)], partition=1)
        assert batch.success and len(batch) == 1000
        producer.flush()

        consumer = session.create_pull_consumer()
        got = [bytes(m.data) for p in (0, 1) for m in consumer.iterate("sync", p, "earliest", stop_at_end=True)]
        assert sorted(got) == sorted([b"one", b"two", b"three"] + [b"b%d" % i for i in range(1000)])
        first = consumer.get("sync", 1, 0)
        assert first and consumer.offsets("sync", 1)[1] >= 1000
        assert [m.offset for m in consumer.iterate("sync", 1, 0, max_messages=3)] == [0, 1, 2]
        assert [p.partition for p in session.partitions("sync")] == [0, 1]
        assert admin.describe_topic("sync").partitions[1].latest == consumer.offsets("sync", 1)[1]
        with pytest.raises(UnknownTopicError):
            consumer.get("missing", 0, 0)

    with pytest.raises(ClientClosedError):
        session.create_producer()


def test_sync_connect_to_nothing_fails_clearly() -> None:
    with pytest.raises(ConnectionClosedError, match="cannot connect"):
        connect("127.0.0.1:9", reconnect_attempts=1, connect_timeout_s=2)
