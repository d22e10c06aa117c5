"""Range reads to Arrow and the sink's writes against a real broker (no Spark session needed)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pyarrow as pa
import pytest

from metaq.client.blocking import BlockingClient
from metaq.protocol.messages import CreateTopicRequest
from metaq.protocol.records import decode_fetched, encode_messages, encode_values
from metaq.spark.arrow import ARROW_SCHEMA, DataLossError, read_range
from metaq.spark.options import ReadOptions, WriteOptions
from metaq.spark.sink import write_arrow
from metaq.spark.source import MetaqInputPartition, _read
from metaq.testing.broker import BrokerProcess
from metaq.types import Message


@pytest.fixture
def servers(broker_factory: Callable[..., BrokerProcess]) -> str:
    """A broker with topics t (2 partitions) and u (3)."""
    broker = broker_factory({"autoCreateTopics": False})
    with BlockingClient(broker.servers) as client:
        client.request(CreateTopicRequest("t", 2))
        client.request(CreateTopicRequest("u", 3))
    return broker.servers


def _fill(client: BlockingClient, partition: int, batches: int, per_batch: int, size: int = 100) -> list[bytes]:
    values = []
    for b in range(batches):
        chunk = [f"p{partition}-{b}-{i}-".encode().ljust(size, b"x") for i in range(per_batch)]
        client.produce("t", partition, encode_values(chunk, 1_700_000_000_000 + b))
        values.extend(chunk)
    return values


def _rows(batches: list[pa.RecordBatch]) -> list[dict[str, object]]:
    return pa.Table.from_batches(batches, schema=ARROW_SCHEMA).to_pylist()


def test_read_range_is_exact(servers: str) -> None:
    with BlockingClient(servers) as client:
        values = _fill(client, 0, batches=20, per_batch=50)
        # small fetches: each reply holds a few whole batches; ranges start and end mid-batch
        got = _rows(list(read_range(client, "t", 0, 73, 911, max_bytes=3000)))
        assert [r["offset"] for r in got] == list(range(73, 911))
        assert [r["value"] for r in got] == values[73:911]
        assert {r["topic"] for r in got} == {"t"}
        assert list(read_range(client, "t", 0, 5, 5, max_bytes=3000)) == []


def test_read_range_of_batches_larger_than_max_bytes(servers: str) -> None:
    # the broker sends a first batch whole even when it alone is over the limit
    with BlockingClient(servers) as client:
        values = _fill(client, 1, batches=2, per_batch=100, size=1000)
        got = _rows(list(read_range(client, "t", 1, 0, 200, max_bytes=1024)))
        assert [r["value"] for r in got] == values


def test_read_range_past_the_end_is_data_loss(servers: str) -> None:
    with BlockingClient(servers) as client:
        _fill(client, 0, batches=1, per_batch=10)
        with pytest.raises(DataLossError, match="beyond the end"):
            list(read_range(client, "t", 0, 15, 20, max_bytes=1 << 20))
        assert list(read_range(client, "t", 0, 15, 20, max_bytes=1 << 20, fail_on_data_loss=False)) == []


def test_read_decodes_keys_attributes_headers(servers: str) -> None:
    with BlockingClient(servers) as client:
        msgs = [Message("t", b"a", "tag", b"k1", [("x", b"1")], 5), Message("t", b"b", timestamp_ms=6)]
        client.produce("t", 1, encode_messages(msgs))
        rows = _rows(list(read_range(client, "t", 1, 0, 2, max_bytes=1 << 20)))
        assert [(r["key"], r["value"], r["attribute"]) for r in rows] == [(b"k1", b"a", "tag"), (None, b"b", None)]
        assert rows[0]["headers"] == [{"key": "x", "value": b"1"}]


# -- the sink's side ------------------------------------------------------------------------------

def _fetch_all(client: BlockingClient, topic: str, partition: int) -> list[Message]:
    resp = client.fetch(topic, partition, 0, 1 << 24)
    return decode_fetched(resp.records, topic, partition)[0]


def test_write_plain_values_in_several_batches(servers: str) -> None:
    opts = WriteOptions.parse({"servers": servers, "topic": "t", "batchBytes": "4096"})
    values = [f"m{i}".encode().ljust(100, b".") for i in range(500)]
    rb = pa.RecordBatch.from_pydict({"value": pa.array(values, pa.binary())})
    stats = write_arrow([rb, rb.slice(0, 0)], opts)
    assert stats.rows == 500 and stats.batches > 10
    with BlockingClient(servers) as client:
        got = [m for p in (0, 1) for m in _fetch_all(client, "t", p)]
    assert sorted(bytes(m.data) for m in got) == sorted(values)
    assert sum(hi - lo + 1 for lo, hi in stats.ranges.values()) == 500


def test_write_columns_route_rows(servers: str) -> None:
    opts = WriteOptions.parse({"servers": servers, "topic": "t"})
    rb = pa.RecordBatch.from_pydict({
        "value": pa.array(["a", "b", "c", "d", "e"], pa.string()),
        "key": pa.array([None, "k", "k", None, None], pa.string()),
        "attribute": pa.array(["x", None, None, None, None], pa.string()),
        "topic": pa.array([None, None, None, "u", "u"], pa.string()),
        "partition": pa.array([1, None, None, 2, 2], pa.int32()),
        "headers": pa.array([None, None, [{"key": "h", "value": b"v"}], None, None],
                            pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
        "extra": pa.array([1, 2, 3, 4, 5]),
    })
    stats = write_arrow([rb], opts)
    assert stats.rows == 5
    with BlockingClient(servers) as client:
        t1 = _fetch_all(client, "t", 1)
        keyed = [m for p in (0, 1) for m in _fetch_all(client, "t", p) if m.key == b"k"]
        u2 = _fetch_all(client, "u", 2)
    assert [(bytes(m.data), m.attribute) for m in t1 if m.key is None] == [(b"a", "x")]
    assert [bytes(m.data) for m in keyed] == [b"b", b"c"]  # one key: one partition, in order
    assert keyed[1].headers == [("h", b"v")]
    assert [bytes(m.data) for m in u2] == [b"d", b"e"]


def test_write_headers_from_a_map_column(servers: str) -> None:
    opts = WriteOptions.parse({"servers": servers, "topic": "t"})
    rb = pa.RecordBatch.from_pydict({
        "value": pa.array([b"a"], pa.binary()),
        "partition": pa.array([0], pa.int64()),
        "headers": pa.array([[("x", b"1"), ("y", b"2")]], pa.map_(pa.string(), pa.binary())),
    })
    write_arrow([rb], opts)
    with BlockingClient(servers) as client:
        (m,) = _fetch_all(client, "t", 0)
    assert m.headers == [("x", b"1"), ("y", b"2")]


def test_a_task_read_resumes_exactly_after_a_broker_restart(broker_factory: Callable[..., BrokerProcess],
                                                            caplog: pytest.LogCaptureFixture) -> None:
    # a Spark task's read (source._read): fetches go out one ahead of the Arrow work; the broker restarts
    # while one is in flight, and the task resumes after the last row it yielded, nothing lost or repeated
    broker = broker_factory({"autoCreateTopics": False, "unflushThreshold": 0})
    with BlockingClient(broker.servers) as client:
        client.request(CreateTopicRequest("t", 1))
        values = _fill(client, 0, batches=30, per_batch=20)
        partition = client.resolve("t", 0)
    opts = ReadOptions.parse({"servers": broker.servers, "topic": "t", "maxBytesPerFetch": "8000",
                              "timeoutMs": "20000"})
    part = MetaqInputPartition("t", partition, 35, 587)
    reader = _read(opts, part)
    got = [next(reader)]
    broker.restart()
    with caplog.at_level(logging.WARNING, logger="metaq.spark"):
        got.extend(reader)
    assert any("resuming t:" in r.getMessage() for r in caplog.records)  # the restart was met mid-read
    rows = _rows(got)
    assert [r["offset"] for r in rows] == list(range(35, 587))
    assert [r["value"] for r in rows] == values[35:587]
