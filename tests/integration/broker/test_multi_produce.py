"""MultiProduce (24) against a real broker process over TCP: one request stores a batch in each of many
partitions and one reply says where each went (or why one failed); what it stored reads back with Fetch; a
one-way request (acks=0) is stored without a reply; every batch's records count against the produce quota.

The per-batch rules (offsets, refused batches, idempotent duplicates, fsync acks) are held at the broker
core in tests/unit/broker/test_broker_multi_produce.py; ACLs in test_auth_acl.py, the slave's NOT_MASTER in
test_replication_slave.py."""

from __future__ import annotations

from collections.abc import Callable

from metaq.errors import InvalidRequestError, UnknownPartitionError
from metaq.net.blocking import BlockingConnection
from metaq.net.codec import ConnectionSettings
from metaq.protocol import messages as m
from metaq.protocol.records import decode_fetched, encode_values
from metaq.testing import BrokerProcess, wait_until

SETTINGS = ConnectionSettings("multi-produce-test", 10.0, 30.0, 16, 64 << 20)


def _open(broker: BrokerProcess) -> BlockingConnection:
    return BlockingConnection.open((broker.host, broker.port), SETTINGS)


def _request(*batches: tuple[str, int, list[bytes]], acks: int = 1) -> m.MultiProduceRequest:
    return m.MultiProduceRequest(acks, 5000, "", [m.ProducePartition(t, p, encode_values(v, 1)) for t, p, v in batches])


def _read(conn: BlockingConnection, topic: str, partition: int) -> list[bytes]:
    reply = conn.call(m.FetchRequest(topic, partition, 0, 1 << 20, 0))
    assert reply.error_code == 0, reply
    return [bytes(x.data) for x in decode_fetched(reply.records, topic, partition, 0)[0]]


def test_one_request_stores_a_batch_in_each_partition_and_a_consumer_reads_them(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 4})
    conn = _open(broker)
    try:
        reply = conn.call(_request(("mp", 0, [b"a0", b"a1"]), ("mp", 1, [b"b0"]), ("mp", 9, [b"lost"]),
                                   ("mp", 3, [b"d0"]), ("mp", 1, [b"b1", b"b2"]), ("mp", -1, [b"any"])))
        assert isinstance(reply, m.MultiProduceResponse) and reply.error_code == 0
        entries = [(p.topic, p.partition, p.error_code, p.base_offset) for p in reply.partitions]
        assert entries[:5] == [("mp", 0, 0, 0), ("mp", 1, 0, 0), ("mp", 9, UnknownPartitionError.code, -1),
                               ("mp", 3, 0, 0), ("mp", 1, 0, 1)]
        anywhere = reply.partitions[5]
        assert anywhere.error_code == 0 and 0 <= anywhere.partition < 4
        stored = {p: _read(conn, "mp", p) for p in range(4)}
        assert [v for v in stored[anywhere.partition] if v == b"any"] == [b"any"]
        stored[anywhere.partition].remove(b"any")
        assert stored == {0: [b"a0", b"a1"], 1: [b"b0", b"b1", b"b2"], 2: [], 3: [b"d0"]}
        # the message ids of the reply are those a consumer sees
        fetched = conn.call(m.FetchRequest("mp", 1, 0, 1 << 20, 0))
        ids = [x.id for x in decode_fetched(fetched.records, "mp", 1, 0)[0]]
        assert ids[0] == reply.partitions[1].base_message_id and ids[1] == reply.partitions[4].base_message_id
        # a request with no batch is refused whole, and the connection goes on
        empty = conn.call(m.MultiProduceRequest(1, 5000, "", []))
        assert empty.error_code == InvalidRequestError.code and empty.partitions == []
        after_any = 1 if anywhere.partition == 2 else 0  # the -1 batch went to a random partition, maybe 2
        assert conn.call(_request(("mp", 2, [b"c0"]))).partitions[0].base_offset == after_any
    finally:
        conn.close()


def test_a_one_way_request_is_stored_and_gets_no_reply(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 2})
    conn = _open(broker)
    try:
        conn.send(_request(("ow", 0, [b"x0"]), ("ow", 1, [b"y0", b"y1"]), acks=0), expect_response=False)
        conn.send(_request(("ow", 5, [b"refused"]), acks=0), expect_response=False)  # a failure is silent too
        # the next reply on the connection is the next request's: none was written for the one-way ones
        acked = conn.call(_request(("ow", 0, [b"x1"])))
        assert [(p.partition, p.error_code, p.base_offset) for p in acked.partitions] == [(0, 0, 1)]
        assert _read(conn, "ow", 0) == [b"x0", b"x1"]
        wait_until(lambda: _read(conn, "ow", 1) == [b"y0", b"y1"], 10, message="the one-way batch of partition 1")
    finally:
        conn.close()


def test_every_batch_counts_against_the_produce_quota_and_the_throttle_is_in_the_reply(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    rate = 10_000  # bytes/s; a principal may burst one second of it
    broker = broker_factory({"numPartitions": 4, "quotaProducerByteRate": rate})
    conn = _open(broker)
    try:
        request = _request(*[("q", p, [b"v" * 4900]) for p in range(4)])  # each batch alone is under the burst
        total = sum(len(p.records) for p in request.partitions)
        reply = conn.call(request)
        assert [p.error_code for p in reply.partitions] == [0, 0, 0, 0]
        expected_ms = (total / rate - 1.0) * 1000  # what four single Produces in a row would be throttled in all
        assert expected_ms > 500 and abs(reply.throttle_time_ms - expected_ms) < 100, (reply.throttle_time_ms,
                                                                                        expected_ms)
        assert all(_read(conn, "q", p) == [b"v" * 4900] for p in range(4))
    finally:
        conn.close()
