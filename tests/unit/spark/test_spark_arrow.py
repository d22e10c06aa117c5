"""Arrow conversion, range reads and the sink's encoder, against an in-memory broker (no Spark)."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema
from spark_fake_broker import FakeBroker

from metaq.client.blocking import BlockingClient
from metaq.errors import ConfigError
from metaq.protocol.records import decode_fetched, encode_messages, encode_values
from metaq.spark.arrow import ARROW_SCHEMA, DataLossError, read_range, to_record_batch
from metaq.spark.options import WriteOptions
from metaq.spark.sink import BatchEncoder, check_input_schema, write_arrow
from metaq.spark.source import SCHEMA
from metaq.types import Message, format_message_id


@pytest.fixture
def fake() -> Iterator[FakeBroker]:
    broker = FakeBroker({"t": 2, "u": 3})
    yield broker
    broker.stop()


def _fill(client: BlockingClient, partition: int, batches: int, per_batch: int, size: int = 100) -> list[bytes]:
    values = []
    for b in range(batches):
        chunk = [f"p{partition}-{b}-{i}-".encode().ljust(size, b"x") for i in range(per_batch)]
        client.produce("t", partition, encode_values(chunk, 1_700_000_000_000 + b))
        values.extend(chunk)
    return values


def _rows(batches: list[pa.RecordBatch]) -> list[dict[str, object]]:
    return pa.Table.from_batches(batches, schema=ARROW_SCHEMA).to_pylist()


def test_arrow_schema_is_sparks_own_conversion() -> None:
    assert to_arrow_schema(SCHEMA, timezone="UTC").equals(ARROW_SCHEMA)


def test_record_batch_columns() -> None:
    msgs = [
        Message("t", b"v0", None, None, None, 1000, 3, 7, (9 << 112) | (5 << 64) | 7, 2000),
        Message("t", b"v1", "tag", b"k", [("h", b"1"), ("h", b"2")], -1, 3, 8, (9 << 112) | (5 << 64) | 8, 2000),
    ]
    rb = to_record_batch(msgs, "t", 3)
    assert rb.schema.equals(ARROW_SCHEMA)
    rows = rb.to_pylist()
    assert [r["value"] for r in rows] == [b"v0", b"v1"]
    assert [r["key"] for r in rows] == [None, b"k"]
    assert [r["attribute"] for r in rows] == [None, "tag"]
    assert [r["offset"] for r in rows] == [7, 8]
    assert [r["partition"] for r in rows] == [3, 3]
    assert [r["message_id"] for r in rows] == [format_message_id(m.id) for m in msgs]
    assert len(rows[0]["message_id"]) == 32
    # a missing producer timestamp falls back to the broker's append time
    assert [int(r["timestamp"].timestamp() * 1000) for r in rows] == [1000, 2000]
    assert rows[0]["headers"] is None
    assert rows[1]["headers"] == [{"key": "h", "value": b"1"}, {"key": "h", "value": b"2"}]


def test_message_ids_across_a_64_bit_carry() -> None:
    base = (1 << 64) - 2
    msgs = [Message("t", b"", id=base + i, offset=i, partition=0, timestamp_ms=0) for i in range(4)]
    ids = to_record_batch(msgs, "t", 0).column("message_id").to_pylist()
    assert ids == [format_message_id(base + i) for i in range(4)]


def test_read_range_is_exact(fake: FakeBroker) -> None:
    with BlockingClient(fake.servers) as client:
        values = _fill(client, 0, batches=20, per_batch=50)
        # small fetches: replies end in cut-off batches, ranges start and end mid-batch
        got = _rows(list(read_range(client, "t", 0, 73, 911, max_bytes=3000)))
        assert [r["offset"] for r in got] == list(range(73, 911))
        assert [r["value"] for r in got] == values[73:911]
        assert {r["topic"] for r in got} == {"t"}
        assert list(read_range(client, "t", 0, 5, 5, max_bytes=3000)) == []


def test_read_range_grows_the_fetch_for_a_large_batch(fake: FakeBroker) -> None:
    with BlockingClient(fake.servers) as client:
        values = _fill(client, 1, batches=2, per_batch=100, size=1000)
        got = _rows(list(read_range(client, "t", 1, 0, 200, max_bytes=1024)))
        assert [r["value"] for r in got] == values


def test_read_range_data_loss(fake: FakeBroker) -> None:
    with BlockingClient(fake.servers) as client:
        values = _fill(client, 0, batches=4, per_batch=10)
        fake.drop_head("t", 0, 20)
        with pytest.raises(DataLossError, match=r"offsets 5\.\.19 were deleted"):
            list(read_range(client, "t", 0, 5, 40, max_bytes=1 << 20))
        got = _rows(list(read_range(client, "t", 0, 5, 40, max_bytes=1 << 20, fail_on_data_loss=False)))
        assert [r["value"] for r in got] == values[20:40]
        # a partition the query discovered late may begin past 0 without that being a loss
        got = _rows(list(read_range(client, "t", 0, 0, 40, max_bytes=1 << 20, new_partition=True)))
        assert [r["offset"] for r in got] == list(range(20, 40))


def test_read_range_past_the_end_is_data_loss(fake: FakeBroker) -> None:
    with BlockingClient(fake.servers) as client:
        _fill(client, 0, batches=1, per_batch=10)
        with pytest.raises(DataLossError, match="beyond the end"):
            list(read_range(client, "t", 0, 15, 20, max_bytes=1 << 20))
        assert list(read_range(client, "t", 0, 15, 20, max_bytes=1 << 20, fail_on_data_loss=False)) == []


def test_read_decodes_keys_attributes_headers(fake: FakeBroker) -> None:
    with BlockingClient(fake.servers) as client:
        msgs = [Message("t", b"a", "tag", b"k1", [("x", b"1")], 5), Message("t", b"b", timestamp_ms=6)]
        client.produce("t", 1, encode_messages(msgs))
        rows = _rows(list(read_range(client, "t", 1, 0, 2, max_bytes=1 << 20)))
        assert [(r["key"], r["value"], r["attribute"]) for r in rows] == [(b"k1", b"a", "tag"), (None, b"b", None)]
        assert rows[0]["headers"] == [{"key": "x", "value": b"1"}]


# -- the sink's side ------------------------------------------------------------------------------

def _fetch_all(client: BlockingClient, topic: str, partition: int) -> list[Message]:
    resp = client.fetch(topic, partition, 0, 1 << 24)
    return decode_fetched(resp.records, topic, partition)[0]


def test_write_plain_values_in_several_batches(fake: FakeBroker) -> None:
    opts = WriteOptions.parse({"servers": fake.servers, "topic": "t", "batchBytes": "4096"})
    values = [f"m{i}".encode().ljust(100, b".") for i in range(500)]
    rb = pa.RecordBatch.from_pydict({"value": pa.array(values, pa.binary())})
    stats = write_arrow([rb, rb.slice(0, 0)], opts)
    assert stats.rows == 500 and stats.batches > 10
    with BlockingClient(fake.servers) as client:
        got = [m for p in (0, 1) for m in _fetch_all(client, "t", p)]
    assert sorted(bytes(m.data) for m in got) == sorted(values)
    assert sum(hi - lo + 1 for lo, hi in stats.ranges.values()) == 500


def test_write_columns_route_rows(fake: FakeBroker) -> None:
    opts = WriteOptions.parse({"servers": fake.servers, "topic": "t"})
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
    with BlockingClient(fake.servers) as client:
        t1 = _fetch_all(client, "t", 1)
        keyed = [m for p in (0, 1) for m in _fetch_all(client, "t", p) if m.key == b"k"]
        u2 = _fetch_all(client, "u", 2)
    assert [(bytes(m.data), m.attribute) for m in t1 if m.key is None] == [(b"a", "x")]
    assert [bytes(m.data) for m in keyed] == [b"b", b"c"]  # one key: one partition, in order
    assert keyed[1].headers == [("h", b"v")]
    assert [bytes(m.data) for m in u2] == [b"d", b"e"]


def test_sink_schema_checks_name_the_column() -> None:
    opts = WriteOptions.parse({"topic": "t"})
    with pytest.raises(ConfigError, match="'value' column"):
        check_input_schema(pa.schema([("payload", pa.binary())]), opts)
    with pytest.raises(ConfigError, match="column 'key' has type int64"):
        check_input_schema(pa.schema([("value", pa.binary()), ("key", pa.int64())]), opts)
    with pytest.raises(ConfigError, match="option 'topic'"):
        check_input_schema(pa.schema([("value", pa.binary())]), WriteOptions.parse({}))
    check_input_schema(pa.schema([("value", pa.string()), ("topic", pa.string())]), WriteOptions.parse({}))


def test_null_value_is_refused() -> None:
    encoder = BatchEncoder(WriteOptions.parse({"topic": "t"}), lambda topic: [0])
    with pytest.raises(ConfigError, match="'value' has a null"):
        list(encoder.encode([pa.RecordBatch.from_pydict({"value": pa.array([b"a", None], pa.binary())})]))


def test_write_headers_from_a_map_column(fake: FakeBroker) -> None:
    opts = WriteOptions.parse({"servers": fake.servers, "topic": "t"})
    rb = pa.RecordBatch.from_pydict({
        "value": pa.array([b"a"], pa.binary()),
        "partition": pa.array([0], pa.int64()),
        "headers": pa.array([[("x", b"1"), ("y", b"2")]], pa.map_(pa.string(), pa.binary())),
    })
    write_arrow([rb], opts)
    with BlockingClient(fake.servers) as client:
        (m,) = _fetch_all(client, "t", 0)
    assert m.headers == [("x", b"1"), ("y", b"2")]
