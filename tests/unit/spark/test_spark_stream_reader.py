"""The stream reader's driver on data deleted under it, on the in-memory broker (no SparkSession needed).

Everything a real broker can show is tested against one: tests/integration/spark/test_spark_stream_driver.py.
The in-memory broker stays for a partition whose head is dropped now (retention, without its schedule).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable
from spark_fake_broker import FakeBroker

from metaq.client.blocking import BlockingClient
from metaq.protocol.records import encode_values
from metaq.spark.arrow import DataLossError
from metaq.spark.options import ReadOptions
from metaq.spark.source import MetaqStreamReader


@pytest.fixture
def fake() -> Iterator[FakeBroker]:
    broker = FakeBroker({"t": 3})
    yield broker
    broker.stop()


def _produce(fake: FakeBroker, partition: int, n: int) -> None:
    with BlockingClient(fake.servers) as client:
        client.produce("t", partition, encode_values([b"m"] * n, 1))


def _reader(fake: FakeBroker, **options: str) -> MetaqStreamReader:
    return MetaqStreamReader(ReadOptions.parse({"servers": fake.servers, "topic": "t", **options}, streaming=True))


def test_deleted_head_is_data_loss_on_the_driver(fake: FakeBroker) -> None:
    for _ in range(3):
        _produce(fake, 0, 10)
    fake.drop_head("t", 0, 20)
    reader = _reader(fake)
    with pytest.raises(DataLossError, match="failOnDataLoss=false"):
        reader.latestOffset({"t": {"0-0": 5, "0-1": 0, "0-2": 0}}, ReadAllAvailable())
    lenient = _reader(fake, failOnDataLoss="false")
    at_end = {"t": {"0-0": 30, "0-1": 0, "0-2": 0}}
    assert lenient.latestOffset({"t": {"0-0": 5, "0-1": 0, "0-2": 0}}, ReadAllAvailable()) == at_end
