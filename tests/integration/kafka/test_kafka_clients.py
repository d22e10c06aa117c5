"""The Kafka listener (docs/kafka.md) against real Kafka clients nobody here wrote: Debian's kcat,
confluent-kafka (librdkafka), kafka-python and aiokafka, each talking to a real broker process.

What a user relies on: metadata shows metaq's topics; messages produced with keys, headers and every
compression come back byte for byte, in order per partition, to Kafka consumers and to metaq's own client
(and the other way round); a consumer group's committed offsets are the ones a metaq group of the same
name sees; an API the listener does not serve is answered, not dropped; a corrupt batch is refused
with CORRUPT_MESSAGE and nothing of it stored.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from metaq.client import connect
from metaq.protocol.kafka import records as kr
from metaq.testing import BrokerProcess
from metaq.types import Message

ck = pytest.importorskip("confluent_kafka")
KCAT = "kcat"


@pytest.fixture(scope="module")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(Path(tmp_path_factory.mktemp("kafka")) / "broker",
                         {"kafkaPort": 0, "numPartitions": 3, "unflushThreshold": 0})
    proc.start()
    try:
        yield proc
    finally:
        proc.stop_or_kill(15)


def bootstrap(proc: BrokerProcess) -> str:
    assert proc.kafka_port is not None, "the broker printed no Kafka ready line"
    return f"127.0.0.1:{proc.kafka_port}"


def topic_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def kcat(*args: str, input_text: str | None = None, timeout_s: float = 60) -> str:
    done = subprocess.run([KCAT, *args], capture_output=True, text=True, input=input_text, timeout=timeout_s)
    assert done.returncode == 0, f"kcat {args} failed: {done.stderr}"
    return done.stdout


# -- kcat ----------------------------------------------------------------------------------------------


def test_kcat_lists_produces_from_a_file_and_consumes_with_keys_and_headers(kafka_broker: BrokerProcess,
                                                                            tmp_path: Path) -> None:
    bs = bootstrap(kafka_broker)
    topic = topic_name("kcat")
    lines = [f"key{i}:value {i}" for i in range(50)]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    kcat("-b", bs, "-P", "-t", topic, "-p", "1", "-K:", "-H", "app=kcat", "-H", "n=1", "-l", str(tmp_path / "in.txt"))
    listing = kcat("-b", bs, "-L", "-t", topic)
    assert f'topic "{topic}" with 3 partitions' in listing
    assert "broker 0 at 127.0.0.1" in listing
    out = kcat("-b", bs, "-C", "-t", topic, "-o", "beginning", "-e", "-f", "%p|%o|%k|%s|%h\n")
    got = [line.split("|") for line in out.splitlines()]
    assert got == [["1", str(i), f"key{i}", f"value {i}", "app=kcat,n=1"] for i in range(50)]


def test_confluent_lists_every_topic(kafka_broker: BrokerProcess) -> None:
    """An all-topics Metadata request as librdkafka sends it (it failed to decode in version 9)."""
    from confluent_kafka.admin import AdminClient

    topic = topic_name("listed")
    kcat("-b", bootstrap(kafka_broker), "-P", "-t", topic, input_text="x\n")
    listing = AdminClient({"bootstrap.servers": bootstrap(kafka_broker)}).list_topics(timeout=20)
    assert topic in listing.topics and len(listing.topics[topic].partitions) == 3
    assert [b.id for b in listing.brokers.values()] == [0]


def test_acks_zero_produces_get_no_reply_and_are_stored(kafka_broker: BrokerProcess) -> None:
    """acks=0: the broker answers nothing (a reply would be read as the answer to a later request)."""
    bs = bootstrap(kafka_broker)
    topic = topic_name("acks0")
    text = "".join(f"line {i}\n" for i in range(3000))
    kcat("-b", bs, "-P", "-t", topic, "-p", "0", "-X", "acks=0", "-X", "linger.ms=1", input_text=text)
    kcat("-b", bs, "-L", "-t", topic)  # the same connection kind goes on answering in order
    out = kcat("-b", bs, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e", "-f", "%s\n")
    assert out.splitlines() == [f"line {i}" for i in range(3000)]


# -- confluent-kafka (librdkafka) ---------------------------------------------------------------------


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_confluent_idempotent_compressed_producer_and_consumer(kafka_broker: BrokerProcess, compression: str) -> None:
    bs = bootstrap(kafka_broker)
    topic = topic_name(f"ck-{compression}")
    producer = ck.Producer({"bootstrap.servers": bs, "enable.idempotence": True, "compression.type": compression,
                            "linger.ms": 5})
    acked: dict[int, list[tuple[int, bytes]]] = {}
    errors: list[str] = []

    def delivered(err: object, msg: ck.Message) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            acked.setdefault(msg.partition(), []).append((msg.offset(), msg.value()))

    for i in range(3000):
        producer.produce(topic, key=f"k{i % 97}".encode(), value=f"message {i}".encode() * 3,
                         headers=[("i", str(i).encode())], on_delivery=delivered)
    assert producer.flush(60) == 0
    assert not errors
    assert sum(len(v) for v in acked.values()) == 3000
    consumer = ck.Consumer({"bootstrap.servers": bs, "group.id": topic, "auto.offset.reset": "earliest",
                            "enable.auto.commit": False})
    consumer.subscribe([topic])
    got: dict[int, list[tuple[int, bytes]]] = {}
    deadline = time.monotonic() + 60
    while sum(len(v) for v in got.values()) < 3000 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        assert msg.error() is None, msg.error()
        got.setdefault(msg.partition(), []).append((msg.offset(), msg.value()))
    consumer.commit(asynchronous=False)
    consumer.close()
    # every acked message, once, at its acked offset, in order per partition
    assert {p: sorted(v) for p, v in acked.items()} == got


def test_a_batch_bigger_than_the_fetch_size_is_served_whole(kafka_broker: BrokerProcess) -> None:
    """Kafka's rule: a fetch returns at least one whole batch, however small its size limit, or a consumer
    would never get past it. (The core's read already returns a first batch whole; the listener's second,
    larger read is for a reply that would hold only a cut batch, which this test does not reach.)"""
    bs = bootstrap(kafka_broker)
    topic = topic_name("big")
    producer = ck.Producer({"bootstrap.servers": bs, "linger.ms": 50})
    values = [bytes([i]) * 60_000 for i in range(5)]  # one batch of 300 KB
    for v in values:
        producer.produce(topic, v, partition=0)
    assert producer.flush(30) == 0
    consumer = ck.Consumer({"bootstrap.servers": bs, "group.id": topic, "auto.offset.reset": "earliest",
                            "max.partition.fetch.bytes": 10_000, "fetch.max.bytes": 20_000,
                            "message.max.bytes": 20_000})
    consumer.assign([ck.TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < len(values) and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got.append(msg.value())
    consumer.close()
    assert got == values


def test_committed_offsets_are_the_metaq_groups_and_survive_a_restart(kafka_broker: BrokerProcess) -> None:
    bs = bootstrap(kafka_broker)
    topic = topic_name("offsets")
    producer = ck.Producer({"bootstrap.servers": bs})
    for i in range(30):
        producer.produce(topic, value=b"%d" % i, partition=i % 3)
    assert producer.flush(30) == 0
    consumer = ck.Consumer({"bootstrap.servers": bs, "group.id": topic, "auto.offset.reset": "earliest",
                            "enable.auto.commit": False})
    consumer.subscribe([topic])
    seen = 0
    deadline = time.monotonic() + 60
    while seen < 30 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            seen += 1
    consumer.commit(asynchronous=False)
    consumer.close()
    # the same offsets through metaq's own group admin view (OffsetFetch of the group)
    from metaq.client.blocking import BlockingClient
    from metaq.protocol import messages as m

    with BlockingClient(kafka_broker.servers) as client:
        reply = client.request(m.OffsetFetchRequest(topic, None))
    assert sorted((e.partition, e.offset) for e in reply.offsets) == [(0, 10), (1, 10), (2, 10)]
    kafka_broker.restart()
    bs = bootstrap(kafka_broker)
    again = ck.Consumer({"bootstrap.servers": bs, "group.id": topic})
    parts = [ck.TopicPartition(topic, p) for p in range(3)]
    assert [tp.offset for tp in again.committed(parts, timeout=30)] == [10, 10, 10]
    again.close()


# -- kafka-python and aiokafka ----------------------------------------------------------------------------


def test_kafka_python_admin_producer_and_group_consumer(kafka_broker: BrokerProcess) -> None:
    kafka = pytest.importorskip("kafka")
    from kafka.admin import NewTopic

    bs = bootstrap(kafka_broker)
    topic = topic_name("kp")
    admin = kafka.KafkaAdminClient(bootstrap_servers=bs)
    admin.create_topics([NewTopic(topic, 4, 1)])
    assert topic in admin.list_topics()
    admin.close()
    producer = kafka.KafkaProducer(bootstrap_servers=bs, compression_type="gzip", acks="all")
    futures = [producer.send(topic, key=b"k%d" % i, value=b"v%d" % i, headers=[("h", b"%d" % i)])
               for i in range(400)]
    producer.flush()
    sent = {(f.get(10).partition, f.get(10).offset) for f in futures}
    producer.close()
    assert len(sent) == 400
    consumer = kafka.KafkaConsumer(topic, bootstrap_servers=bs, group_id=topic, auto_offset_reset="earliest",
                                   enable_auto_commit=False, consumer_timeout_ms=5000)
    got = {(r.partition, r.offset): (r.key, r.value, r.headers) for r in consumer}
    consumer.commit()
    consumer.close()
    assert set(got) == sent
    assert all(v == (b"k" + v[1][1:], v[1], [("h", v[1][1:])]) for v in got.values())


def test_aiokafka_idempotent_producer_and_consumer(kafka_broker: BrokerProcess) -> None:
    aiokafka = pytest.importorskip("aiokafka")
    bs = bootstrap(kafka_broker)
    topic = topic_name("ak")

    async def run() -> tuple[list[tuple[int, int]], list[tuple[int, int, bytes]]]:
        producer = aiokafka.AIOKafkaProducer(bootstrap_servers=bs, enable_idempotence=True, compression_type="lz4")
        await producer.start()
        try:
            sent = []
            for i in range(300):
                md = await producer.send_and_wait(topic, value=b"a%d" % i, key=b"%d" % (i % 5))
                sent.append((md.partition, md.offset))
        finally:
            await producer.stop()
        consumer = aiokafka.AIOKafkaConsumer(topic, bootstrap_servers=bs, group_id=topic,
                                             auto_offset_reset="earliest", enable_auto_commit=False)
        await consumer.start()
        got: list[tuple[int, int, bytes]] = []
        try:
            deadline = time.monotonic() + 60
            while len(got) < 300 and time.monotonic() < deadline:
                for _tp, msgs in (await consumer.getmany(timeout_ms=500)).items():
                    got += [(r.partition, r.offset, r.value) for r in msgs]
            await consumer.commit()
        finally:
            await consumer.stop()
        return sent, got

    sent, got = asyncio.run(run())
    assert sorted(sent) == sorted((p, o) for p, o, _ in got)
    assert len(set(sent)) == 300


# -- interop with metaq's own client -------------------------------------------------------------------


def test_kafka_produced_messages_read_by_metaq_and_back(kafka_broker: BrokerProcess) -> None:
    bs = bootstrap(kafka_broker)
    topic = topic_name("interop")
    producer = ck.Producer({"bootstrap.servers": bs})
    producer.produce(topic, key=b"\x00key", value=b"from kafka", partition=2, timestamp=1_700_000_000_123,
                     headers=[("h1", b"\x01"), ("h1", b"again"), ("metaq.attribute", b"tagA")])
    assert producer.flush(30) == 0
    with connect(kafka_broker.servers) as session:
        with session.create_pull_consumer() as pull:
            [msg] = pull.get(topic, 2, 0)
        assert (bytes(msg.data), msg.key, msg.attribute, msg.timestamp_ms) == (
            b"from kafka", b"\x00key", "tagA", 1_700_000_000_123)
        assert msg.headers == [("h1", b"\x01"), ("h1", b"again")]
        with session.create_producer() as mp:
            sent = mp.send(Message(topic, b"from metaq", key=b"mk", attribute="tagB", headers=[("x", b"y")],
                                   timestamp_ms=1_700_000_000_999))
    assert sent.success, sent.error
    consumer = ck.Consumer({"bootstrap.servers": bs, "group.id": topic, "auto.offset.reset": "earliest"})
    consumer.assign([ck.TopicPartition(topic, sent.partition, sent.offset)])
    got = []
    deadline = time.monotonic() + 30
    while not got and time.monotonic() < deadline:
        m = consumer.poll(0.5)
        if m is not None and m.error() is None:
            got.append((m.offset(), m.key(), m.value(), m.headers(), m.timestamp()[1]))
    consumer.close()
    assert got == [(sent.offset, b"mk", b"from metaq", [("metaq.attribute", b"tagB"), ("x", b"y")], 1_700_000_000_999)]


# -- what the listener does not serve, and bad input -------------------------------------------------


def _frame(api_key: int, version: int, correlation: int, body: bytes = b"", client: bytes = b"raw") -> bytes:
    head = struct.pack(">hhih", api_key, version, correlation, len(client)) + client
    return struct.pack(">i", len(head) + len(body)) + head + body


def _read_frame(sock: socket.socket) -> bytes:
    def exact(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            assert chunk, "the broker closed the connection"
            buf += chunk
        return buf
    (size,) = struct.unpack(">i", exact(4))
    return exact(size)


def test_unserved_apis_and_versions_are_answered_and_the_connection_kept(kafka_broker: BrokerProcess) -> None:
    with socket.create_connection(("127.0.0.1", kafka_broker.kafka_port or 0), timeout=10) as sock:
        sock.sendall(_frame(18, 99, 1))  # ApiVersions v99: answered in v0 with UNSUPPORTED_VERSION and the list
        reply = _read_frame(sock)
        correlation, code, count = struct.unpack_from(">ihi", reply)
        assert (correlation, code) == (1, 35) and count > 10
        sock.sendall(_frame(26, 3, 2, b"\x00" * 20))  # EndTxn: not served, answered with UNSUPPORTED_VERSION
        assert struct.unpack_from(">i", _read_frame(sock))[0] == 2
        sock.sendall(_frame(9999 % 32768, 0, 3))  # an API key nobody knows
        assert struct.unpack(">ih", _read_frame(sock)) == (3, 35)
        sock.sendall(_frame(18, 0, 4))  # still served
        assert struct.unpack_from(">ih", _read_frame(sock)) == (4, 0)


def test_a_corrupt_batch_is_refused_with_corrupt_message_and_nothing_stored(kafka_broker: BrokerProcess) -> None:
    from kio.schema.produce.v8.request import PartitionProduceData, ProduceRequest, TopicProduceData

    from metaq.protocol.kafka import codec

    topic = topic_name("corrupt")
    batch = bytearray(kr.build_batch(0, [kr.encode_record(0, 0, b"payload")], 0, 1000, 1000))
    batch[-3] ^= 0xFF  # a flipped byte in the record: the CRC no longer matches
    kcat("-b", bootstrap(kafka_broker), "-P", "-t", topic, input_text="first\n")  # the topic exists
    req = build_produce(ProduceRequest, TopicProduceData, PartitionProduceData, topic, bytes(batch))
    with socket.create_connection(("127.0.0.1", kafka_broker.kafka_port or 0), timeout=10) as sock:
        sock.sendall(_frame(0, 8, 7, req))
        reply = _read_frame(sock)
    response_cls = codec.response_class(0, 8)
    from kio.serial import entity_reader

    body, _ = entity_reader(response_cls)(reply, 4)
    part = body.responses[0].partition_responses[0]
    assert part.error_code.value == 2 and "CRC" in (part.error_message or "")
    out = kcat("-b", bootstrap(kafka_broker), "-C", "-t", topic, "-o", "beginning", "-e", "-f", "%s\n")
    assert out.splitlines() == ["first"]


def build_produce(request_cls: type, topic_cls: type, partition_cls: type, topic: str, records: bytes) -> bytes:
    import datetime
    import io

    from kio.serial import entity_writer

    req = request_cls(transactional_id=None, acks=1, timeout=datetime.timedelta(seconds=10),
                      topic_data=(topic_cls(name=topic, partition_data=(partition_cls(index=0, records=records),)),))
    buf = io.BytesIO()
    entity_writer(request_cls)(buf, req)
    return buf.getvalue()


# -- a ZooKeeper cluster of three brokers --------------------------------------------------------------


def test_kcat_against_a_three_broker_zookeeper_cluster(cluster_factory: Callable[..., BrokerProcess]) -> None:
    topics = "[topic=spread]\nnumPartitions=2\n"
    brokers = [cluster_factory(i, topics=topics, kafkaPort=0) for i in (1, 2, 3)]
    bs = ",".join(bootstrap(b) for b in brokers)
    listing = ""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # each broker learns the others' topics from ZooKeeper
        listing = kcat("-b", bootstrap(brokers[0]), "-L", "-t", "spread")
        if 'topic "spread" with 6 partitions' in listing:
            break
        time.sleep(0.2)
    assert 'topic "spread" with 6 partitions' in listing, listing
    leaders = [line.split("leader ")[1].split(",")[0] for line in listing.splitlines() if "partition " in line]
    assert leaders == ["1", "1", "2", "2", "3", "3"]
    for b in brokers:
        assert f"broker {brokers.index(b) + 1} at 127.0.0.1:{b.kafka_port}" in listing
    text = "".join(f"k{i}:v{i}\n" for i in range(120))
    kcat("-b", bs, "-P", "-t", "spread", "-K:", "-H", "src=kcat", input_text=text)
    out = kcat("-b", bootstrap(brokers[2]), "-C", "-t", "spread", "-o", "beginning", "-e", "-f", "%p|%k|%s|%h\n")
    got = [line.split("|") for line in out.splitlines()]
    assert sorted((k, v) for _p, k, v, _h in got) == sorted((f"k{i}", f"v{i}") for i in range(120))
    assert {h for *_, h in got} == {"src=kcat"}
    assert len({p for p, *_ in got}) == 6  # keys spread over every broker's partitions
    # a key's messages stay in one partition (librdkafka's key hash over the 6 Kafka partitions)
    by_key: dict[str, set[str]] = {}
    for p, k, _v, _h in got:
        by_key.setdefault(k, set()).add(p)
    assert all(len(ps) == 1 for ps in by_key.values())


def test_a_consumer_group_across_a_three_broker_cluster(cluster_factory: Callable[..., BrokerProcess]) -> None:
    """One coordinator for the group whichever broker a member asks; every broker's partitions assigned and
    committed."""
    topics = "[topic=spread]\nnumPartitions=2\n"
    brokers = [cluster_factory(i, topics=topics, kafkaPort=0) for i in (1, 2, 3)]
    deadline = time.monotonic() + 30
    while 'with 6 partitions' not in kcat("-b", bootstrap(brokers[2]), "-L", "-t", "spread"):
        assert time.monotonic() < deadline, "the brokers never saw each other's partitions"
        time.sleep(0.2)
    members = [ck.Consumer({"bootstrap.servers": bootstrap(b), "group.id": "spread-readers",
                            "auto.offset.reset": "earliest", "enable.auto.commit": False}) for b in brokers[1:]]
    for c in members:
        c.subscribe(["spread"])
    deadline = time.monotonic() + 60
    while not all(c.assignment() for c in members):  # both in one generation before anything is produced
        assert time.monotonic() < deadline, "the group never formed with both members"
        for c in members:
            c.poll(0.1)
    producer = ck.Producer({"bootstrap.servers": bootstrap(brokers[1])})
    for i in range(300):
        producer.produce("spread", value=b"%d" % i, partition=i % 6)
    assert producer.flush(30) == 0
    got: dict[int, list[int]] = {}
    deadline = time.monotonic() + 90
    while sum(len(v) for v in got.values()) < 300 and time.monotonic() < deadline:
        for c in members:
            msg = c.poll(0.2)
            if msg is not None and msg.error() is None:
                got.setdefault(msg.partition(), []).append(int(msg.value()))
    for c in members:
        c.commit(asynchronous=False)
    assignments = [sorted(tp.partition for tp in c.assignment()) for c in members]
    for c in members:
        c.close()
    assert sorted(p for a in assignments for p in a) == list(range(6))  # both members, every partition once
    assert {p: sorted(v) for p, v in got.items()} == {p: list(range(p, 300, 6)) for p in range(6)}
    check = ck.Consumer({"bootstrap.servers": bootstrap(brokers[0]), "group.id": "spread-readers"})
    committed = check.committed([ck.TopicPartition("spread", p) for p in range(6)], timeout=30)
    check.close()
    assert [tp.offset for tp in committed] == [50] * 6
