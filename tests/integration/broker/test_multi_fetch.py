"""MultiFetch against a real broker: many partitions per request, one long poll on all of them, replies
that overtake the others on a connection, clean errors for hostile requests, and a group member that
consumes 1,000 partitions over one connection per broker."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvloop

from metaq.client import MessageSessionFactory
from metaq.client.group import ConsumerConfig, create_consumer
from metaq.errors import InvalidRequestError, OffsetOutOfRangeError
from metaq.protocol import messages as m
from metaq.protocol.codec import NEED_DATA, ClientConnection
from metaq.protocol.records import decode_fetched, encode_values
from metaq.testing import BrokerProcess, wait_until
from metaq.testing.raw import RawClient


def _stats(c: RawClient) -> dict[str, Any]:
    return json.loads(c.call(m.StatsRequest(None)).stats_json)  # type: ignore[no-any-return]


def _produce(c: RawClient, topic: str, partition: int, values: list[bytes]) -> None:
    assert c.call(m.ProduceRequest(topic, partition, 1, 5000, encode_values(values, 1))).error_code == 0


def _values(topic: str, fetched: m.FetchedPartition, offset: int = 0) -> list[bytes]:
    messages, _ = decode_fetched(fetched.records, topic, fetched.partition, offset)
    return [bytes(x.data) for x in messages]


def test_one_request_returns_what_each_partition_has(broker_factory: Callable[..., BrokerProcess]) -> None:
    c = RawClient.to(broker_factory({"numPartitions": 8}))
    for p in (0, 3, 5):
        _produce(c, "mf", p, [b"p%d-%d" % (p, i) for i in range(3)])
    _produce(c, "other", 1, [b"x"])
    reply = c.call(m.MultiFetchRequest(0, 1, 1 << 20, "", [
        *(m.FetchPartition("mf", p, 0, 1 << 16) for p in range(8)),
        m.FetchPartition("other", 1, 0, 1 << 16),
        m.FetchPartition("mf", 99, 0, 1 << 16),           # no such partition: its own error
        m.FetchPartition("no-such-topic", 0, 0, 1 << 16),  # no such topic (dynamic topics are not created by reads)
    ]))
    assert reply.error_code == 0
    got = {(p.topic, p.partition): p for p in reply.partitions}
    assert [(p.topic, p.partition) for p in reply.partitions][:9] == [("mf", p) for p in range(8)] + [("other", 1)]
    for p in range(8):
        expected = [b"p%d-%d" % (p, i) for i in range(3)] if p in (0, 3, 5) else []
        assert _values("mf", got[("mf", p)]) == expected
        assert got[("mf", p)].error_code == 0 and got[("mf", p)].log_end_offset == len(expected)
    assert _values("other", got[("other", 1)]) == [b"x"]
    assert got[("mf", 99)].error_code == 4  # UNKNOWN_PARTITION
    assert got[("no-such-topic", 0)].error_code == 3  # UNKNOWN_TOPIC
    # each partition reads what a single Fetch with its partition_max_bytes reads
    for limit in (1, 200, 1 << 16):
        multi = c.call(m.MultiFetchRequest(0, 1, 1 << 20, "", [m.FetchPartition("mf", 3, 1, limit)]))
        single = c.call(m.FetchRequest("mf", 3, 1, limit, 0))
        assert bytes(multi.partitions[0].records) == bytes(single.records)
    # the whole reply's max_bytes: partitions after it is spent come back without records
    capped = c.call(m.MultiFetchRequest(0, 1, 1, "", [m.FetchPartition("mf", p, 0, 1 << 16) for p in (0, 3, 5)]))
    assert [bool(p.records) for p in capped.partitions] == [True, False, False]


def test_long_poll_wakes_on_data_in_any_partition(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 8})
    producer, consumer = RawClient.to(broker), RawClient.to(broker)
    for p in range(8):
        _produce(producer, "lp", p, [b"old"])
    result: dict[str, Any] = {}

    def poll() -> None:
        result["reply"] = consumer.call(m.MultiFetchRequest(60_000, 1, 1 << 20, "", [
            m.FetchPartition("lp", p, 1, 1 << 16) for p in range(8)]))

    t = threading.Thread(target=poll)
    t.start()
    wait_until(lambda: _stats(producer).get("waiting_fetches", 0) == 1,
               message="one waiting fetch for the eight partitions")
    _produce(producer, "lp", 6, [b"new"])
    t.join(30)
    assert not t.is_alive(), "the long poll was not woken by the append"
    reply = result["reply"]
    assert reply.error_code == 0
    assert {p.partition: _values("lp", p, 1) for p in reply.partitions} == {
        p: ([b"new"] if p == 6 else []) for p in range(8)}
    wait_until(lambda: _stats(producer).get("waiting_fetches", 0) == 0, message="the waiter gone")


def test_a_waiting_multi_fetch_does_not_hold_up_later_requests_on_its_connection(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 2})
    other = RawClient.to(broker)
    _produce(other, "wait", 0, [b"a"])
    sock = socket.create_connection((broker.host, broker.port), timeout=30)
    codec = ClientConnection("one-connection")
    long_poll, frame = codec.send(m.MultiFetchRequest(60_000, 1, 1 << 20, "", [
        m.FetchPartition("wait", 0, 1, 1 << 16), m.FetchPartition("wait", 1, 0, 1 << 16)]))
    sock.sendall(frame)
    wait_until(lambda: _stats(other).get("waiting_fetches", 0) == 1, message="the MultiFetch waiting")
    produce_id, frame1 = codec.send(m.ProduceRequest("elsewhere", 0, 1, 5000, encode_values([b"p"], 1)))
    metadata_id, frame2 = codec.send(m.MetadataRequest(["wait"]))
    sock.sendall(frame1 + frame2)

    def next_reply() -> Any:
        while (event := codec.next_event()) is NEED_DATA:
            chunk = sock.recv(1 << 20)
            assert chunk, "the broker closed the connection"
            codec.receive_data(chunk)
        return event

    first, second = next_reply(), next_reply()
    assert [first.correlation_id, second.correlation_id] == [produce_id, metadata_id]  # in order, among themselves
    assert first.response.error_code == 0 and second.response.error_code == 0
    assert _stats(other).get("waiting_fetches", 0) == 1  # the long poll is still waiting behind them
    _produce(other, "wait", 1, [b"b"])
    last = next_reply()
    assert last.correlation_id == long_poll
    assert [_values("wait", p, 0 if p.partition else 1) for p in last.response.partitions] == [[], [b"b"]]
    sock.close()


def test_hostile_requests_get_clean_errors_and_the_connection_stays_usable(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    c = RawClient.to(broker_factory({"numPartitions": 2}))
    _produce(c, "h", 0, [b"a", b"b"])
    ok = m.FetchPartition("h", 0, 0, 1024)
    refused = [
        m.MultiFetchRequest(0, 1, 1 << 20, "", []),
        m.MultiFetchRequest(0, 1, 1 << 20, "", [m.FetchPartition("h", i % 2, i, 64)
                                               for i in range(m.MULTI_FETCH_PARTITIONS_MAX + 1)]),
        m.MultiFetchRequest(0, 1, 1 << 20, "", [ok, m.FetchPartition("h", 1, 0, 64), ok]),
        m.MultiFetchRequest(0, 1, 0, "", [ok]),
        m.MultiFetchRequest(0, 1, 1 << 20, "", [m.FetchPartition("h", 0, 0, -5)]),
    ]
    for req in refused:
        reply = c.call(req)
        assert reply.error_code == InvalidRequestError.code, reply
        assert reply.partitions == []
    _produce(c, "g", 0, [b"a", b"b"])
    ok = m.FetchPartition("g", 0, 0, 1024)
    reply = c.call(m.MultiFetchRequest(0, 1, 1 << 20, "", [m.FetchPartition("h", 0, -7, 1024), ok,
                                                          m.FetchPartition("h", 1, 1 << 40, 1024),
                                                          m.FetchPartition("../x", 0, 0, 1024)]))
    assert reply.error_code == 0, reply
    negative, good, far, bad_name = reply.partitions
    assert negative.error_code == OffsetOutOfRangeError.code and "-7" in (negative.error_message or "")
    assert (negative.log_start_offset, negative.log_end_offset) == (0, 2)
    assert _values("g", good) == [b"a", b"b"]
    assert far.error_code == OffsetOutOfRangeError.code
    assert bad_name.error_code == 17  # INVALID_TOPIC
    assert c.call(m.MetadataRequest(["h"])).error_code == 0


def test_a_group_member_consumes_1000_partitions_exactly_once_in_order_over_one_connection(
        broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    broker = broker_factory({"numPartitions": 1000, "unflushThreshold": 0})
    partitions, per_partition = 1000, 3

    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as producer_session:
            await producer_session.admin().create_topic("wide", partitions)
            producer = producer_session.create_producer()
            sends = [producer.send_batch("wide", [b"%d:%d" % (p, i) for i in range(per_partition)], partition=p)
                     for p in range(partitions)]
            assert all(r.success for r in await asyncio.gather(*sends))
        session = await MessageSessionFactory.connect(broker.servers)
        seen: dict[int, list[int]] = defaultdict(list)
        consumer = create_consumer(session, ConsumerConfig(
            group="wide-group", recover_dir=tmp_path / "recover", max_delay_fetch_ms=2000,
            commit_offset_period_ms=200, fetch_runner_count=4))
        consumer.subscribe("wide", 64 * 1024, lambda msg: seen[msg.partition].append(msg.offset))
        await consumer.complete_subscribe()
        deadline = time.monotonic() + 60
        while sum(len(v) for v in seen.values()) < partitions * per_partition:
            assert time.monotonic() < deadline, f"consumed {sum(len(v) for v in seen.values())} messages"
            await asyncio.sleep(0.02)
        # every message once, in offset order per partition
        assert {p: seen[p] for p in range(partitions)} == {p: list(range(per_partition)) for p in range(partitions)}
        raw = RawClient.to(broker)
        try:
            broker_stats = _stats(raw)
        finally:
            raw.close()
        # the consumer's session: its default connection (metadata, offsets) and the group's one, which
        # carries the heartbeats and every MultiFetch; plus the RawClient asking
        assert broker_stats["connections"] <= 3, broker_stats["connections"]
        fetcher = consumer.broker_fetchers[consumer.assignment()[0].partition.broker_id]
        assert fetcher.requests > 0
        await consumer.close()
        await session.close()

    uvloop.run(main())


def test_a_burst_of_produces_in_one_write_reaches_a_waiting_multi_fetch_in_one_reply(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    # a producer's burst (one batch per partition, one write) woke the MultiFetch at its first append and
    # the other partitions waited a consumer round trip; now the reply leaves once the burst is handled
    broker = broker_factory({"numPartitions": 4})
    stats, consumer = RawClient.to(broker), RawClient.to(broker)
    result: dict[str, Any] = {}
    _produce(stats, "burst", 0, [b"x"])  # creates the topic; the poll waits after this message

    def poll_after_first() -> None:
        result["reply"] = consumer.call(m.MultiFetchRequest(60_000, 1, 1 << 20, "", [
            m.FetchPartition("burst", 0, 1, 1 << 16), *(m.FetchPartition("burst", p, 0, 1 << 16) for p in (1, 2, 3))]))

    t = threading.Thread(target=poll_after_first)
    t.start()
    wait_until(lambda: _stats(stats).get("waiting_fetches", 0) == 1, message="the MultiFetch waiting")
    sock = socket.create_connection((broker.host, broker.port), timeout=30)
    codec = ClientConnection("producer")
    frames = b"".join(codec.send(m.ProduceRequest("burst", p, 1, 5000, encode_values([b"p%d" % p], 1)))[1]
                      for p in range(4))
    sock.sendall(frames)  # one write, read by the broker in one go
    t.join(30)
    assert not t.is_alive(), "the long poll was not woken by the burst"
    reply = result["reply"]
    assert reply.error_code == 0
    assert {p.partition: _values("burst", p, 1 if p.partition == 0 else 0) for p in reply.partitions} == {
        p: [b"p%d" % p] for p in range(4)}
    acks = 0
    while acks < 4:  # and the burst's acks came too
        while (event := codec.next_event()) is not NEED_DATA:
            assert event.response.error_code == 0
            acks += 1
        if acks < 4:
            chunk = sock.recv(1 << 16)
            assert chunk, "the broker closed the connection"
            codec.receive_data(chunk)
    sock.close()
