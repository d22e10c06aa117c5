"""Arrow conversion and the sink's encoder (no Spark, no broker); data loss on the in-memory broker.

Range reads and writes against a real broker: tests/integration/spark/test_spark_arrow_io.py. The
in-memory broker stays only for what a real one cannot do on demand: drop a partition's head now.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema
from spark_fake_broker import FakeBroker

from metaq.client.blocking import BlockingClient
from metaq.errors import ConfigError
from metaq.protocol import messages as m
from metaq.protocol.records import encode_values
from metaq.spark.arrow import ARROW_SCHEMA, DataLossError, read_range, to_record_batch
from metaq.spark.options import WriteOptions
from metaq.spark.sink import BatchEncoder, check_input_schema
from metaq.spark.source import SCHEMA
from metaq.testing import wait_until
from metaq.types import Message, PartitionId, format_message_id


@pytest.fixture
def fake() -> Iterator[FakeBroker]:
    broker = FakeBroker({"t": 1})
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
    rb = to_record_batch(msgs, "t", PartitionId(9, 3))
    assert rb.schema.equals(ARROW_SCHEMA)
    rows = rb.to_pylist()
    assert [r["value"] for r in rows] == [b"v0", b"v1"]
    assert [r["key"] for r in rows] == [None, b"k"]
    assert [r["attribute"] for r in rows] == [None, "tag"]
    assert [r["offset"] for r in rows] == [7, 8]
    assert [(r["broker_id"], r["partition"]) for r in rows] == [(9, 3), (9, 3)]
    assert [r["message_id"] for r in rows] == [format_message_id(m.id) for m in msgs]
    assert len(rows[0]["message_id"]) == 32
    # a missing producer timestamp falls back to the broker's append time
    assert [int(r["timestamp"].timestamp() * 1000) for r in rows] == [1000, 2000]
    assert rows[0]["headers"] is None
    assert rows[1]["headers"] == [{"key": "h", "value": b"1"}, {"key": "h", "value": b"2"}]


def test_message_ids_across_a_64_bit_carry() -> None:
    base = (1 << 64) - 2
    msgs = [Message("t", b"", id=base + i, offset=i, partition=0, timestamp_ms=0) for i in range(4)]
    ids = to_record_batch(msgs, "t", PartitionId(0, 0)).column("message_id").to_pylist()
    assert ids == [format_message_id(base + i) for i in range(4)]


def test_read_range_data_loss(fake: FakeBroker) -> None:
    with BlockingClient(fake.servers) as client:
        values = _fill(client, 0, batches=4, per_batch=10)
        fake.drop_head("t", 0, 20)
        with pytest.raises(DataLossError, match=r"offsets 5\.\.19 were deleted"):
            list(read_range(client, "t", PartitionId(0, 0), 5, 40, max_bytes=1 << 20))
        got = _rows(list(read_range(client, "t", PartitionId(0, 0), 5, 40, max_bytes=1 << 20, fail_on_data_loss=False)))
        assert [r["value"] for r in got] == values[20:40]
        # a partition the query discovered late may begin past 0 without that being a loss
        got = _rows(list(read_range(client, "t", PartitionId(0, 0), 0, 40, max_bytes=1 << 20, new_partition=True)))
        assert [r["offset"] for r in got] == list(range(20, 40))


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


def test_the_sink_targets_broker_partitions() -> None:
    import zlib

    parts = [PartitionId(2, 0), PartitionId(1, 1), PartitionId(1, 0)]
    encoder = BatchEncoder(WriteOptions.parse({"topic": "t"}), lambda topic: parts)
    rb = pa.RecordBatch.from_pydict({
        "value": [b"a", b"b", b"c", b"d"],
        "key": [b"k1", None, None, None],
        "broker_id": pa.array([None, 2, None, 7], pa.int32()),
        "partition": pa.array([None, 0, 1, None], pa.int64()),
    })
    targets = {p for _t, p, _batch, _n in encoder.encode([rb])}
    # a key hashes over every broker's partitions in (broker id, partition) order, as KeyHashSelector;
    # broker_id + partition name one; a partition alone is a number for the client to resolve; nothing: -1
    assert targets == {sorted(parts)[zlib.crc32(b"k1") % 3], PartitionId(2, 0), 1, -1}
    bad = pa.RecordBatch.from_pydict({"value": [b"a"], "broker_id": [70000], "partition": [0]})
    with pytest.raises(ConfigError, match=r"columns 'broker_id' and 'partition' .* do not name a partition"):
        list(encoder.encode([bad]))


def _fetch_offsets(fake: FakeBroker) -> list[int]:
    return [r.offset for r in list(fake.requests) if isinstance(r, m.FetchRequest)]


def test_read_range_fetches_ahead_and_reads_exactly_the_range(fake: FakeBroker) -> None:
    with BlockingClient(fake.servers) as client:
        values = _fill(client, 0, batches=20, per_batch=10)
        fake.requests.clear()
        # ~3 stored batches per reply: the fetch after each reply goes out before the reply becomes Arrow
        got = _rows(list(read_range(client, "t", PartitionId(0, 0), 13, 187, max_bytes=3 * 1100)))
        assert [r["offset"] for r in got] == list(range(13, 187))
        assert [r["value"] for r in got] == values[13:187]
        fetched = _fetch_offsets(fake)
        assert fetched[0] == 13 and fetched == sorted(set(fetched)), fetched  # each offset asked for once
        assert all(o < 187 for o in fetched)  # nothing fetched past the range


def test_a_damaged_batch_mid_range_drops_the_fetch_sent_ahead(fake: FakeBroker) -> None:
    with BlockingClient(fake.servers) as client:
        values = _fill(client, 0, batches=12, per_batch=10)
        damaged = bytearray(fake.topics["t"][0].batches[5])
        damaged[-1] ^= 0xFF  # offsets 50..59: the header is intact, the CRC is not
        fake.set_batch("t", 0, 5, bytes(damaged))
        with pytest.raises(DataLossError, match="offset 50 is damaged"):
            list(read_range(client, "t", PartitionId(0, 0), 0, 120, max_bytes=4 * 1100))
        # the fetch sent ahead from the headers (past the damage) is not used: the reader goes back to 50
        got = _rows(list(read_range(client, "t", PartitionId(0, 0), 0, 120, max_bytes=4 * 1100,
                                    fail_on_data_loss=False)))
        assert [r["offset"] for r in got] == [*range(0, 50), *range(60, 120)]
        assert [r["value"] for r in got] == values[:50] + values[60:]


def test_a_read_stopped_early_leaves_the_client_usable(fake: FakeBroker) -> None:
    with BlockingClient(fake.servers) as client:
        values = _fill(client, 0, batches=10, per_batch=10)
        fake.requests.clear()
        reader = read_range(client, "t", PartitionId(0, 0), 0, 100, max_bytes=2 * 1100)
        first = next(reader)
        n = first.num_rows
        assert first.column("offset").to_pylist() == list(range(0, n))
        wait_until(lambda: _fetch_offsets(fake) == [0, n], 10, 0.01, "the fetch sent ahead")
        reader.close()
        # the reply of the abandoned fetch must not answer the next request
        assert client.list_offsets("t", PartitionId(0, 0), -1).offset == 100
        got = _rows(list(read_range(client, "t", PartitionId(0, 0), n, 100, max_bytes=2 * 1100)))
        assert [r["value"] for r in got] == values[n:100]
