"""The stream reader's driver-side logic against a real broker (no SparkSession needed)."""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from metaq.client.blocking import BlockingClient
from metaq.errors import ConfigError
from metaq.protocol.messages import CreateTopicRequest, DeleteTopicRequest
from metaq.protocol.records import encode_values
from metaq.spark.arrow import DataLossError
from metaq.spark.options import ReadOptions
from metaq.spark.source import MetaqInputPartition, MetaqStreamReader
from metaq.testing.broker import BrokerProcess


@pytest.fixture
def broker(broker_factory: Callable[..., BrokerProcess]) -> BrokerProcess:
    """A broker with topic t of 3 partitions."""
    broker = broker_factory({"autoCreateTopics": False})
    _create(broker.servers, 3)
    return broker


def _create(servers: str, partitions: int) -> None:
    with BlockingClient(servers) as client:
        client.request(CreateTopicRequest("t", partitions))


def _produce(broker: BrokerProcess, partition: int, n: int) -> None:
    with BlockingClient(broker.servers) as client:
        client.produce("t", partition, encode_values([b"m"] * n, 1))


def _reader(broker: BrokerProcess, **options: str) -> MetaqStreamReader:
    return MetaqStreamReader(ReadOptions.parse({"servers": broker.servers, "topic": "t", **options}, streaming=True))


def test_idle_stream_returns_the_same_text(broker: BrokerProcess) -> None:
    _produce(broker, 1, 5)
    reader = _reader(broker)
    start = reader.initialOffset()
    assert json.dumps(start) == '{"t": {"0-0": 0, "0-1": 0, "0-2": 0}}'
    end = reader.latestOffset(start, ReadAllAvailable())
    assert json.dumps(end) == '{"t": {"0-0": 0, "0-1": 5, "0-2": 0}}'
    # what Spark passes back is json.loads of the stored text; nothing new -> the identical text
    again = reader.latestOffset(json.loads(json.dumps(end)), ReadAllAvailable())
    assert json.dumps(again) == json.dumps(end)


def test_max_rows_limit_and_partitions(broker: BrokerProcess) -> None:
    _produce(broker, 0, 30)
    _produce(broker, 2, 10)
    reader = _reader(broker, maxOffsetsPerTrigger="8", minPartitions="4")
    assert reader.getDefaultReadLimit() == ReadMaxRows(8)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(8))
    assert end == {"t": {"0-0": 6, "0-1": 0, "0-2": 2}}
    # the engine may override the default limit (e.g. a final availableNow batch): respected
    assert reader.latestOffset(start, ReadAllAvailable()) == {"t": {"0-0": 30, "0-1": 0, "0-2": 10}}
    parts = reader.partitions(start, end)
    assert all(isinstance(p, MetaqInputPartition) for p in parts)
    assert sorted((str(p.partition), p.start, p.end) for p in parts) == [("0-0", 0, 2), ("0-0", 2, 4), ("0-0", 4, 6),
                                                                        ("0-2", 0, 2)]
    assert reader.partitions(end, end) == []


def test_available_now_stops_at_the_target(broker: BrokerProcess) -> None:
    _produce(broker, 0, 10)
    reader = _reader(broker)
    start = reader.initialOffset()
    reader.prepareForTriggerAvailableNow()
    _produce(broker, 0, 10)
    assert reader.latestOffset(start, ReadAllAvailable()) == {"t": {"0-0": 10, "0-1": 0, "0-2": 0}}


def test_latest_is_resolved_once_and_kept(broker: BrokerProcess, tmp_path: Path) -> None:
    _produce(broker, 0, 4)
    reader = _reader(broker, startingOffsets="latest", checkpointLocation=str(tmp_path))
    first = reader.initialOffset()
    assert first == {"t": {"0-0": 4, "0-1": 0, "0-2": 0}}
    _produce(broker, 0, 3)
    # a second call (or a restarted driver before batch 0 committed) gets the same start
    assert reader.initialOffset() == first
    assert _reader(broker, startingOffsets="latest", checkpointLocation=str(tmp_path)).initialOffset() == first
    # another checkpoint is another query
    other = _reader(broker, startingOffsets="latest", checkpointLocation=str(tmp_path / "other"))
    assert other.initialOffset() == {"t": {"0-0": 7, "0-1": 0, "0-2": 0}}


def test_a_recreated_shorter_topic_is_data_loss_unless_told_otherwise(broker: BrokerProcess) -> None:
    # the log went backwards: the query is at offset 30, the topic was deleted and recreated with 4
    _produce(broker, 0, 30)
    checkpointed = {"t": {"0-0": 30, "0-1": 0, "0-2": 0}}
    with BlockingClient(broker.servers) as client:
        client.request(DeleteTopicRequest("t"))
    _create(broker.servers, 3)
    _produce(broker, 0, 4)
    with pytest.raises(DataLossError, match="beyond the partition's end"):
        _reader(broker).latestOffset(checkpointed, ReadAllAvailable())
    lenient = _reader(broker, failOnDataLoss="false")
    at_end = {"t": {"0-0": 4, "0-1": 0, "0-2": 0}}
    assert lenient.latestOffset(checkpointed, ReadAllAvailable()) == at_end  # continues from its end
    assert lenient.partitions(checkpointed, at_end) == []


def test_new_partition_is_read_from_its_start(broker: BrokerProcess) -> None:
    reader = _reader(broker)
    end = reader.latestOffset({"t": {"0-0": 0, "0-1": 0}}, ReadAllAvailable())
    assert end == {"t": {"0-0": 0, "0-1": 0, "0-2": 0}}
    _produce(broker, 2, 4)
    parts = reader.partitions({"t": {"0-0": 0, "0-1": 0}}, {"t": {"0-0": 0, "0-1": 0, "0-2": 4}})
    assert [(str(p.partition), p.start, p.end, p.new_partition) for p in parts] == [("0-2", 0, 4, True)]


def test_checkpoint_of_another_topic_is_refused(broker: BrokerProcess) -> None:
    with pytest.raises(ConfigError, match="option 'topic'"):
        _reader(broker).latestOffset({"other": {"0-0": 1}}, ReadAllAvailable())


def test_reader_pickles_without_its_connection(broker: BrokerProcess) -> None:
    _produce(broker, 0, 3)
    reader = _reader(broker)
    reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    copy = pickle.loads(pickle.dumps(reader))
    assert copy._client is None and copy.opts == reader.opts
    rows = [b for b in copy.read(MetaqInputPartition("t", 0, 0, 3))]
    assert sum(b.num_rows for b in rows) == 3
    reader.stop()


def test_driver_tolerates_an_unreachable_broker_for_timeout_ms(broker: BrokerProcess) -> None:
    reader = _reader(broker, timeoutMs="400")
    start = reader.initialOffset()
    broker.stop()
    assert reader.latestOffset(start, ReadAllAvailable()) == start  # "no new data" for now
    with pytest.raises(Exception, match="option 'servers'"):
        for _ in range(10):
            reader.latestOffset(start, ReadAllAvailable())
