"""A user's first run: messages go in and come back out, exactly, in order, with usable ids."""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable

from metaq.client import Message, connect
from metaq.testing import BrokerProcess


def test_100k_messages_round_trip_in_partition_order_with_unique_resolvable_ids(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 4, "unflushThreshold": 0})
    n = 100_000
    payloads = [os.urandom(8) + i.to_bytes(4, "big") + b"x" * (i % 50) for i in range(n)]
    with connect(broker.servers) as session:
        producer = session.create_producer()
        sent: dict[int, list[tuple[int, bytes, int]]] = defaultdict(list)
        for start in range(0, n, 5000):
            chunk = payloads[start:start + 5000]
            result = producer.send_batch("orders", chunk)
            assert result.success, result.errors
            for r, data in zip(result, chunk, strict=True):
                sent[r.partition].append((r.offset, data, r.message_id))
        ids = [mid for rows in sent.values() for _, _, mid in rows]
        assert len(set(ids)) == n

        consumer = session.create_pull_consumer()
        received = 0
        for partition, rows in sent.items():
            rows.sort()
            offset = 0
            got: list[Message] = []
            while offset < rows[-1][0] + 1:
                batch = consumer.get("orders", partition, offset)
                assert batch, f"partition {partition} stopped at {offset}"
                got.extend(batch)
                offset = batch[-1].offset + 1
            assert [m.offset for m in got] == [o for o, _, _ in rows]
            assert [bytes(m.data) for m in got] == [d for _, d, _ in rows]
            assert [m.id for m in got] == [mid for _, _, mid in rows]
            received += len(got)
        assert received == n

        admin = session.admin()
        for partition, rows in list(sent.items())[:2]:
            for offset, _data, mid in rows[:: len(rows) // 5]:
                loc = admin.lookup_message(mid)
                assert (loc.topic, loc.partition, loc.offset) == ("orders", partition, offset)


def test_single_sends_with_key_attribute_and_headers_come_back_whole(broker: BrokerProcess) -> None:
    with connect(broker.servers) as session:
        producer = session.create_producer()
        msg = Message("events", b"\x00payload\xff", attribute="tag-a", key=b"user-7",
                      headers=[("trace", b"abc"), ("hop", b"")])
        result = producer.send(msg)
        assert result.success and result.offset == 0 and result.message_id >= 0
        [got] = session.create_pull_consumer().get("events", result.partition, result.offset)
        assert (bytes(got.data), got.attribute, got.key, got.headers) == (
            b"\x00payload\xff", "tag-a", b"user-7", [("trace", b"abc"), ("hop", b"")])
        assert got.id == result.message_id
        assert got.append_time_ms > 0
        assert abs(got.timestamp_ms - got.append_time_ms) < 60_000  # stamped by the producer when sent
