"""The columnar read path (``fetch_to_arrow``) against the Message-based reference (``_decode_range`` +
``to_record_batch``), on random fetch replies: keys, attributes and headers present or absent, compression,
batches thinned out by a server-side filter (``rebuild_batch``), ids near 2**32 and 2**64 boundaries,
ranges starting and ending anywhere, a cut-off tail."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from spark_fake_broker import FakeBroker

import metaq.spark.arrow as arrow_mod
from metaq.client.blocking import BlockingClient
from metaq.errors import CorruptRecordError
from metaq.protocol.records import (
    BatchBuilder,
    Compression,
    decode_batch,
    encode_values,
    fetched_batches,
    read_header,
    rebuild_batch,
    stamp,
)
from metaq.spark.arrow import ARROW_SCHEMA, fetch_to_arrow, read_range, to_record_batch
from metaq.types import Message, PartitionId, format_message_id

TOPIC, PARTITION = "t", PartitionId(2, 3)

_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=6)
_header = st.tuples(_text, st.binary(max_size=6))
_record = st.fixed_dictionaries({
    "value": st.binary(max_size=20),
    "key": st.none() | st.binary(max_size=8),
    "attribute": st.none() | _text,
    "headers": st.none() | st.lists(_header, min_size=1, max_size=3),
    # -1: no producer timestamp, the broker's append time stands in
    "timestamp": st.sampled_from([-1, 0, 1_700_000_000_000]) | st.integers(0, 4_102_444_800_000),
})


@st.composite
def _batch_spec(draw: st.DrawFn) -> dict[str, object]:
    records = draw(st.lists(_record, min_size=1, max_size=12))
    # whole batches without keys / attributes / headers take the "absent" fast paths
    for field in ("key", "attribute", "headers"):
        if draw(st.booleans()):
            for r in records:
                r[field] = None
    return {
        "records": records,
        "compression": draw(st.sampled_from(list(Compression))),
        # None: unfiltered; else which records a server-side filter kept (possibly none)
        "kept": draw(st.none() | st.lists(st.booleans(), min_size=len(records), max_size=len(records))),
        # ids of a batch need not continue the previous batch's (another broker, a gap)
        "id_skip": draw(st.sampled_from([0, 0, 0, 5])),
    }


# base message ids: a broker's (low 64 bits = offset), or ids whose low 32/64 bits carry inside the reply
_ID_BASES = st.sampled_from([
    (1 << 112) | (0xABCDEF123456 << 64),
    (5 << 112) | (7 << 64) | ((1 << 32) - 20),
    (9 << 112) | ((1 << 64) - 30),
    (1 << 128) - (1 << 64) - 10,
    0,
])


def _build_reply(specs: list[dict[str, object]], first_offset: int, id_base: int, append_time: int,
                 cut: int) -> bytes:
    parts = []
    offset = first_offset
    for spec in specs:
        records = spec["records"]
        assert isinstance(records, list)
        builder = BatchBuilder(max_bytes=1 << 30, compression=spec["compression"])  # type: ignore[arg-type]
        for r in records:
            builder.try_append(r["timestamp"], r["value"], r["key"], r["attribute"], r["headers"])
        raw = bytearray(builder.build())
        stamp(raw, offset, id_base + offset + spec["id_skip"], append_time)  # type: ignore[operator]
        batch = bytes(raw)
        kept = spec["kept"]
        if kept is not None:
            header = read_header(batch)
            msgs = decode_batch(batch, TOPIC, PARTITION, header)
            batch = rebuild_batch(batch, header, [m for m, k in zip(msgs, kept, strict=True) if k])  # type: ignore[arg-type]
        parts.append(batch)
        offset += len(records)
    reply = b"".join(parts)
    cut = min(cut, len(parts[-1]) - 1)
    if cut:  # a fetch reply may end inside a batch: that tail is not part of the reply's records
        reply += parts[-1][:cut]
    return reply


def _decode_range(records: bytes, topic: str, partition: PartitionId, start: int,
                  end: int) -> tuple[list[Message], int]:
    """Messages with start <= offset < end among the whole batches of an intact fetch reply, and the offset to
    fetch next (``start`` if the reply held no whole batch at or after ``start``), decoded batch by batch."""
    out: list[Message] = []
    next_offset = start
    view = memoryview(records)
    for pos, header in fetched_batches(view, start):
        if header.base_offset >= end:
            break
        msgs = decode_batch(view[pos:pos + header.total_bytes], topic, partition.partition, header,
                            broker_id=partition.broker_id)
        out.extend(m for m in msgs if start <= m.offset < end)
        next_offset = min(header.next_offset, end)
        if header.next_offset >= end:
            break
    return out, next_offset


def _reference(reply: bytes, start: int, end: int) -> tuple[pa.RecordBatch | None, int]:
    messages, next_offset = _decode_range(reply, TOPIC, PARTITION, start, end)
    return (to_record_batch(messages, TOPIC, PARTITION) if messages else None), next_offset


def _check_same(reply: bytes, start: int, end: int) -> list[pa.RecordBatch]:
    ref, ref_next = _reference(reply, start, end)
    batches, next_offset, first_base = fetch_to_arrow(reply, TOPIC, PARTITION, start, end)
    assert next_offset == ref_next
    for b in batches:
        assert b.schema.equals(ARROW_SCHEMA)
        assert b.num_rows > 0
        b.validate(full=True)
    if ref is None:
        assert batches == []
    else:
        got = pa.Table.from_batches(batches, schema=ARROW_SCHEMA).combine_chunks()
        assert got.num_rows == ref.num_rows
        for name in ARROW_SCHEMA.names:
            assert got.column(name).chunk(0).equals(ref.column(name)), name
        assert first_base <= ref.column("offset")[0].as_py()
    return batches


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=st.lists(_batch_spec(), min_size=1, max_size=4), first_offset=st.sampled_from([0, 17, (1 << 32) - 9]),
       id_base=_ID_BASES, append_time=st.integers(0, 4_102_444_800_000), cut=st.integers(0, 80), data=st.data())
def test_columnar_path_matches_the_message_path(specs: list[dict[str, object]], first_offset: int, id_base: int,
                                                 append_time: int, cut: int, data: st.DataObject) -> None:
    total = sum(len(s["records"]) for s in specs)  # type: ignore[arg-type]
    id_base = min(id_base, (1 << 128) - 6 - first_offset - total)  # ids stay 128-bit
    reply = _build_reply(specs, first_offset, id_base, append_time, cut)
    start = data.draw(st.integers(first_offset - 3, first_offset + total + 1), label="start")
    end = data.draw(st.integers(start, first_offset + total + 3), label="end")
    _check_same(reply, start, end)
    _check_same(reply, first_offset, first_offset + total)


def test_ids_cross_a_32_bit_and_a_64_bit_boundary() -> None:
    values = [b"v%d" % i for i in range(50)]
    for id_base in ((3 << 64) | ((1 << 32) - 25), (1 << 64) - 25, (1 << 128) - 60):
        parts = []
        for offset in (0, 50):
            raw = bytearray(encode_values(values, 1000))
            stamp(raw, offset, id_base + offset, 2000)
            parts.append(bytes(raw))
        (batch,), _, _ = fetch_to_arrow(b"".join(parts), TOPIC, PARTITION, 3, 97)
        assert batch.column("message_id").to_pylist() == [format_message_id(id_base + i) for i in range(3, 97)]


def test_filtered_batches_take_offsets_from_their_deltas() -> None:
    raw = bytearray(encode_values([b"a", b"b", b"c", b"d", b"e", b"f"], 1000))
    stamp(raw, 100, (1 << 64) | 100, 2000)
    header = read_header(raw)
    msgs = decode_batch(bytes(raw), TOPIC, PARTITION, header)
    thinned = rebuild_batch(bytes(raw), header, [msgs[1], msgs[4]])
    empty = rebuild_batch(bytes(raw), header, [])
    raw2 = bytearray(encode_values([b"g"], 1000))
    stamp(raw2, 106, (1 << 64) | 106, 2000)
    (batch,), next_offset, first_base = fetch_to_arrow(thinned + bytes(raw2), TOPIC, PARTITION, 100, 200)
    assert batch.column("offset").to_pylist() == [101, 104, 106]
    assert batch.column("value").to_pylist() == [b"b", b"e", b"g"]
    assert batch.column("message_id").to_pylist() == [format_message_id((1 << 64) | o) for o in (101, 104, 106)]
    assert (next_offset, first_base) == (107, 100)
    # a batch left with no record at all still moves the reader past its offsets
    assert fetch_to_arrow(empty, TOPIC, PARTITION, 102, 200) == ([], 106, 100)


def test_a_damaged_batch_fails_its_crc() -> None:
    raw = bytearray(encode_values([b"payload"] * 3, 1000))
    stamp(raw, 0, 0, 0)
    raw[-2] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="CRC32C"):
        fetch_to_arrow(bytes(raw), TOPIC, PARTITION, 0, 3)


def test_large_replies_are_split_into_several_arrow_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    parts = []
    for b in range(5):
        raw = bytearray(encode_values([b"%d-%d" % (b, i) for i in range(10)], 1000 + b))
        stamp(raw, 10 * b, 10 * b, 2000)
        parts.append(bytes(raw))
    reply = b"".join(parts)
    monkeypatch.setattr(arrow_mod, "CHUNK_BYTES", 70)  # about two batches' values
    batches = _check_same(reply, 4, 47)
    assert [b.num_rows for b in batches] == [16, 20, 7]
    monkeypatch.setattr(arrow_mod, "CHUNK_BYTES", 1 << 30)
    monkeypatch.setattr(arrow_mod, "CHUNK_ROWS", 25)  # a batch of more rows still goes whole
    assert [b.num_rows for b in _check_same(reply, 4, 47)] == [16, 20, 7]
    monkeypatch.setattr(arrow_mod, "CHUNK_ROWS", 5)
    assert [b.num_rows for b in _check_same(reply, 4, 47)] == [6, 10, 10, 10, 7]


@pytest.fixture
def fake() -> Iterator[FakeBroker]:
    broker = FakeBroker({"t": 1})
    yield broker
    broker.stop()


def test_read_range_over_filtered_batches_is_not_data_loss(fake: FakeBroker) -> None:
    with BlockingClient(fake.servers) as client:
        for b in range(3):
            client.produce("t", 0, encode_values([b"%d-%d" % (b, i) for i in range(10)], 1000))
        stored = fake.topics["t"][0].batches[1]
        header = read_header(stored)
        fake.set_batch("t", 0, 1, rebuild_batch(stored, header, [decode_batch(stored, "t", 0, header)[7]]))
        batches = list(read_range(client, "t", PartitionId(0, 0), 12, 25, max_bytes=1 << 20))
        rows = pa.Table.from_batches(batches).to_pylist()
        assert [r["offset"] for r in rows] == [17, 20, 21, 22, 23, 24]
        assert [r["value"] for r in rows] == [b"1-7", b"2-0", b"2-1", b"2-2", b"2-3", b"2-4"]
