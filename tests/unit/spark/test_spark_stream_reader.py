"""The stream reader's driver-side logic against an in-memory broker (no SparkSession needed)."""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from spark_fake_broker import FakeBroker

from metaq.client.blocking import BlockingClient
from metaq.errors import ConfigError
from metaq.protocol.records import encode_values
from metaq.spark.arrow import DataLossError
from metaq.spark.options import ReadOptions
from metaq.spark.source import MetaqInputPartition, MetaqStreamReader


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


def test_idle_stream_returns_the_same_text(fake: FakeBroker) -> None:
    _produce(fake, 1, 5)
    reader = _reader(fake)
    start = reader.initialOffset()
    assert json.dumps(start) == '{"t": {"0": 0, "1": 0, "2": 0}}'
    end = reader.latestOffset(start, ReadAllAvailable())
    assert json.dumps(end) == '{"t": {"0": 0, "1": 5, "2": 0}}'
    # what Spark passes back is json.loads of the stored text; nothing new -> the identical text
    again = reader.latestOffset(json.loads(json.dumps(end)), ReadAllAvailable())
    assert json.dumps(again) == json.dumps(end)


def test_max_rows_limit_and_partitions(fake: FakeBroker) -> None:
    _produce(fake, 0, 30)
    _produce(fake, 2, 10)
    reader = _reader(fake, maxOffsetsPerTrigger="8", minPartitions="4")
    assert reader.getDefaultReadLimit() == ReadMaxRows(8)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(8))
    assert end == {"t": {"0": 6, "1": 0, "2": 2}}
    # the engine may override the default limit (e.g. a final availableNow batch): respected
    assert reader.latestOffset(start, ReadAllAvailable()) == {"t": {"0": 30, "1": 0, "2": 10}}
    parts = reader.partitions(start, end)
    assert all(isinstance(p, MetaqInputPartition) for p in parts)
    assert sorted((p.partition, p.start, p.end) for p in parts) == [(0, 0, 2), (0, 2, 4), (0, 4, 6), (2, 0, 2)]
    assert reader.partitions(end, end) == []


def test_available_now_stops_at_the_target(fake: FakeBroker) -> None:
    _produce(fake, 0, 10)
    reader = _reader(fake)
    start = reader.initialOffset()
    reader.prepareForTriggerAvailableNow()
    _produce(fake, 0, 10)
    assert reader.latestOffset(start, ReadAllAvailable()) == {"t": {"0": 10, "1": 0, "2": 0}}


def test_latest_is_resolved_once_and_kept(fake: FakeBroker, tmp_path: Path) -> None:
    _produce(fake, 0, 4)
    reader = _reader(fake, startingOffsets="latest", checkpointLocation=str(tmp_path))
    first = reader.initialOffset()
    assert first == {"t": {"0": 4, "1": 0, "2": 0}}
    _produce(fake, 0, 3)
    # a second call (or a restarted driver before batch 0 committed) gets the same start
    assert reader.initialOffset() == first
    assert _reader(fake, startingOffsets="latest", checkpointLocation=str(tmp_path)).initialOffset() == first
    # another checkpoint is another query
    other = _reader(fake, startingOffsets="latest", checkpointLocation=str(tmp_path / "other"))
    assert other.initialOffset() == {"t": {"0": 7, "1": 0, "2": 0}}


def test_data_loss_on_the_driver(fake: FakeBroker) -> None:
    for _ in range(3):
        _produce(fake, 0, 10)
    fake.drop_head("t", 0, 20)
    reader = _reader(fake)
    with pytest.raises(DataLossError, match="failOnDataLoss=false"):
        reader.latestOffset({"t": {"0": 5, "1": 0, "2": 0}}, ReadAllAvailable())
    with pytest.raises(DataLossError, match="beyond the partition's end"):
        reader.latestOffset({"t": {"0": 99, "1": 0, "2": 0}}, ReadAllAvailable())
    lenient = _reader(fake, failOnDataLoss="false")
    at_end = {"t": {"0": 30, "1": 0, "2": 0}}
    assert lenient.latestOffset({"t": {"0": 5, "1": 0, "2": 0}}, ReadAllAvailable()) == at_end
    # the log went back (recreated topic): continue from its end
    assert lenient.latestOffset({"t": {"0": 99, "1": 0, "2": 0}}, ReadAllAvailable()) == at_end
    assert lenient.partitions({"t": {"0": 99, "1": 0, "2": 0}}, at_end) == []


def test_new_partition_is_read_from_its_start(fake: FakeBroker) -> None:
    reader = _reader(fake)
    end = reader.latestOffset({"t": {"0": 0, "1": 0}}, ReadAllAvailable())
    assert end == {"t": {"0": 0, "1": 0, "2": 0}}
    _produce(fake, 2, 4)
    parts = reader.partitions({"t": {"0": 0, "1": 0}}, {"t": {"0": 0, "1": 0, "2": 4}})
    assert [(p.partition, p.start, p.end, p.new_partition) for p in parts] == [(2, 0, 4, True)]


def test_checkpoint_of_another_topic_is_refused(fake: FakeBroker) -> None:
    with pytest.raises(ConfigError, match="option 'topic'"):
        _reader(fake).latestOffset({"other": {"0": 1}}, ReadAllAvailable())


def test_reader_pickles_without_its_connection(fake: FakeBroker) -> None:
    _produce(fake, 0, 3)
    reader = _reader(fake)
    reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    copy = pickle.loads(pickle.dumps(reader))
    assert copy._client is None and copy.opts == reader.opts
    rows = [b for b in copy.read(MetaqInputPartition("t", 0, 0, 3))]
    assert sum(b.num_rows for b in rows) == 3
    reader.stop()


def test_driver_tolerates_an_unreachable_broker_for_timeout_ms(fake: FakeBroker) -> None:
    reader = _reader(fake, timeoutMs="400")
    start = reader.initialOffset()
    fake.stop()
    assert reader.latestOffset(start, ReadAllAvailable()) == start  # "no new data" for now
    with pytest.raises(Exception, match="option 'servers'"):
        for _ in range(10):
            reader.latestOffset(start, ReadAllAvailable())
