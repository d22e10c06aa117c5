"""Interop between Kafka clients and Spark's format("metaq") through one broker with the Kafka listener
(docs/kafka.md): what a confluent-kafka producer sends, Spark reads with its key, headers, timestamp and
attribute; what Spark writes, a Kafka consumer reads."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from metaq.client.blocking import BlockingClient
from metaq.protocol.messages import CreateTopicRequest
from metaq.testing.broker import BrokerProcess

pytestmark = [pytest.mark.spark]
ck = pytest.importorskip("confluent_kafka")


@pytest.fixture(scope="module")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(Path(tmp_path_factory.mktemp("spark-kafka")) / "broker",
                         {"kafkaPort": 0, "numPartitions": 3, "unflushThreshold": 0})
    proc.start()
    try:
        yield proc
    finally:
        proc.stop_or_kill(15)


def test_kafka_producer_to_spark_reader(spark: Any, kafka_broker: BrokerProcess) -> None:
    producer = ck.Producer({"bootstrap.servers": f"127.0.0.1:{kafka_broker.kafka_port}", "enable.idempotence": True})
    sent = {}
    for i in range(90):
        headers = [("n", str(i).encode())] + ([("metaq.attribute", b"odd")] if i % 2 else [])
        producer.produce("from-kafka", key=f"k{i % 9}".encode(), value=f"v{i}".encode(), headers=headers,
                         timestamp=1_700_000_000_000 + i)
        sent[f"v{i}"] = (f"k{i % 9}".encode(), [("n", str(i).encode())], "odd" if i % 2 else None,
                         1_700_000_000_000 + i)
    assert producer.flush(30) == 0
    rows = spark.read.format("metaq").option("servers", kafka_broker.servers).option("topic", "from-kafka") \
        .load().collect()
    got = {bytes(r.value).decode(): (r.key, [(h.key, bytes(h.value)) for h in r.headers or []], r.attribute,
                                     int(r.timestamp.timestamp() * 1000)) for r in rows}
    assert got == sent


def test_spark_writer_to_kafka_consumer(spark: Any, kafka_broker: BrokerProcess) -> None:
    with BlockingClient(kafka_broker.servers) as client:
        client.request(CreateTopicRequest("from-spark", 3))
    rows = [(f"s{i}", f"key{i % 4}", "tagged" if i % 3 == 0 else None) for i in range(60)]
    df = spark.createDataFrame(rows, "value string, key string, attribute string")
    df.write.format("metaq").option("servers", kafka_broker.servers).option("topic", "from-spark") \
        .mode("append").save()
    consumer = ck.Consumer({"bootstrap.servers": f"127.0.0.1:{kafka_broker.kafka_port}", "group.id": "from-spark",
                            "auto.offset.reset": "earliest"})
    consumer.subscribe(["from-spark"])
    got = {}
    deadline = time.monotonic() + 60
    while len(got) < len(rows) and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            attribute = dict(msg.headers() or []).get("metaq.attribute")
            got[msg.value().decode()] = (msg.key().decode(), attribute.decode() if attribute else None)
    consumer.close()
    assert got == {v: (k, a) for v, k, a in rows}
