"""Kafka record batches to metaq batches and back (metaq.protocol.kafka.records), checked against
kafka-python's own record batch encoder and reader: keys, values, headers, timestamps, the idempotent
producer's id, epoch and sequence, and every compression codec survive; damaged input raises only
CorruptRecordError (or InvalidArgument for what is not stored), never anything else."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaq.errors import CorruptRecordError, InvalidArgument
from metaq.protocol import records as mrec
from metaq.protocol.kafka import records as kr

kafka_records = pytest.importorskip("kafka.record.default_records")
Builder, Reader = kafka_records.DefaultRecordBatchBuilder, kafka_records.DefaultRecordBatch
CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
MAX = 1 << 24

record = st.tuples(
    st.one_of(st.none(), st.binary(max_size=40)),                      # key
    st.binary(max_size=300),                                           # value
    st.lists(st.tuples(st.text(min_size=1, max_size=10), st.binary(max_size=20)), max_size=3),  # headers
    st.integers(0, 10_000),                                            # timestamp delta
)


def kafka_batch(recs: list[tuple[bytes | None, bytes, list[tuple[str, bytes]], int]], codec: int = 0,
                producer: tuple[int, int, int] = (-1, -1, -1), base_ts: int = 1_700_000_000_000) -> bytes:
    b = Builder(magic=2, compression_type=codec, is_transactional=False, producer_id=producer[0],
                producer_epoch=producer[1], base_sequence=producer[2], batch_size=1 << 24)
    for i, (key, value, headers, delta) in enumerate(recs):
        b.append(i, timestamp=base_ts + delta, key=key, value=value, headers=headers)
    return bytes(b.build())


def metaq_messages(batch: bytes) -> list[tuple[bytes | None, bytes, list[tuple[str, bytes]], int, str | None]]:
    mrec.validate_batch(batch, MAX, MAX)  # what the broker checks of a produced batch
    return [(m.key, bytes(m.data), m.headers or [], m.timestamp_ms, m.attribute) for m in mrec.decode_batch(batch)]


@settings(max_examples=60, deadline=None)
@given(st.lists(record, min_size=1, max_size=30), st.sampled_from(["none", "gzip", "lz4", "zstd"]))
def test_a_kafka_batch_becomes_a_metaq_batch_with_the_same_records(recs: list, codec: str) -> None:
    raw = kafka_batch(recs, CODECS[codec])
    [batch] = list(kr.iter_kafka_batches(raw, MAX))
    converted = kr.to_metaq(batch)
    got = metaq_messages(converted)
    base = 1_700_000_000_000
    assert got == [(k, v, [(n, hv) for n, hv in h], base + d, None) for k, v, h, d in recs]


@settings(max_examples=60, deadline=None)
@given(st.lists(record, min_size=1, max_size=30))
def test_a_stored_batch_becomes_a_kafka_batch_kafka_python_reads(recs: list) -> None:
    values = [v for _k, v, _h, _d in recs]
    timestamps = [1_700_000_000_000 + d for *_x, d in recs]
    keys = [k for k, *_ in recs]
    headers = [h or None for _k, _v, h, _d in recs]
    batch = bytearray(mrec.encode_columns(values, timestamps, keys=keys, headers=headers))
    mrec.stamp(batch, 500, 1, 1)
    out, cut = kr.to_kafka(bytes(batch), 500)
    assert cut == 0
    got = [(r.offset, r.key, r.value, [tuple(x) for x in r.headers], r.timestamp) for r in Reader(out)]
    assert got == [(500 + i, k, v, [(n, hv) for n, hv in h], 1_700_000_000_000 + d)
                   for i, (k, v, h, d) in enumerate(recs)]
    assert Reader(out).validate_crc()


@pytest.mark.parametrize("framing", ["raw", "xerial"])
def test_snappy_batches_raw_as_librdkafka_sends_and_framed_as_the_java_client_does(framing: str) -> None:
    import struct

    import cramjam
    import crc32c

    recs = [(b"k%d" % i, b"value %d" % i * 20, [("h", b"%d" % i)], i) for i in range(50)]
    raw = bytearray(kafka_batch(recs))
    body = bytes(raw[61:])
    if framing == "raw":
        packed = bytes(cramjam.snappy.compress_raw(body))
    else:  # xerial: magic, version, compatible version, then (length, raw snappy block) for each 32 KiB
        blocks = [bytes(cramjam.snappy.compress_raw(body[i:i + 32768])) for i in range(0, len(body), 32768)]
        packed = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + b"".join(struct.pack(">i", len(b)) + b for b in blocks)
    out = raw[:61] + packed
    struct.pack_into(">h", out, 21, 2)  # attributes: snappy
    struct.pack_into(">i", out, 8, len(out) - 12)
    struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    converted = kr.to_metaq(next(kr.iter_kafka_batches(bytes(out), MAX)))
    assert metaq_messages(converted) == [(k, v, h, 1_700_000_000_000 + d, None) for k, v, h, d in recs]


def test_the_attribute_travels_as_a_header_both_ways() -> None:
    raw = kafka_batch([(b"k", b"v", [("metaq.attribute", b"tag"), ("x", b"1")], 0)])
    converted = kr.to_metaq(next(kr.iter_kafka_batches(raw, MAX)))
    assert metaq_messages(converted) == [(b"k", b"v", [("x", b"1")], 1_700_000_000_000, "tag")]
    stamped = bytearray(converted)
    mrec.stamp(stamped, 0, 1, 1)
    out, _ = kr.to_kafka(bytes(stamped), 0)
    assert [list(map(tuple, r.headers)) for r in Reader(out)] == [[("metaq.attribute", b"tag"), ("x", b"1")]]


def test_an_idempotent_producers_id_epoch_and_sequence_become_the_producer_block() -> None:
    raw = kafka_batch([(None, b"a", [], 0), (None, b"b", [], 1)], producer=(12345, 3, 40))
    converted = kr.to_metaq(next(kr.iter_kafka_batches(raw, MAX)))
    header = mrec.validate_batch(converted, MAX, MAX)
    assert mrec.producer_stamp(converted, header) == mrec.ProducerStamp(12345, 3, 40)


def test_whole_batches_are_served_and_a_cut_off_one_is_reported() -> None:
    parts = []
    for base, size in ((0, 50), (3, 80)):  # sizes differ: a cut-off batch's size names which one it is
        b = bytearray(mrec.encode_values([b"x" * size] * 3, 1000))
        mrec.stamp(b, base, 1, 1)
        parts.append(bytes(b))
    whole = parts[0] + parts[1]
    out, cut = kr.to_kafka(whole[:-10], 0)
    assert [r.offset for r in Reader(out)] == [0, 1, 2] and cut == 0  # the next fetch starts at 3
    out, cut = kr.to_kafka(whole[:20], 0)
    assert out == b"" and cut == len(parts[0])
    out, cut = kr.to_kafka(whole, 3)  # batches wholly below the fetch offset are skipped
    assert [r.offset for r in Reader(out)] == [3, 4, 5] and cut == 0
    out, cut = kr.to_kafka(whole[:-10], 3)  # skipped, then cut off: the cut one's size
    assert out == b"" and cut == len(parts[1])
    out, cut = kr.to_kafka(whole, 3)
    assert [r.offset for r in Reader(out)] == [3, 4, 5] and cut == 0


def test_a_flipped_byte_anywhere_fails_the_crc() -> None:
    raw = kafka_batch([(b"key", b"value", [("h", b"1")], 5)])
    for pos in range(21, len(raw)):
        damaged = bytearray(raw)
        damaged[pos] ^= 0x40
        with pytest.raises(CorruptRecordError):
            list(kr.iter_kafka_batches(bytes(damaged), MAX))


def test_transactional_batches_are_refused() -> None:
    b = Builder(magic=2, compression_type=0, is_transactional=True, producer_id=7, producer_epoch=0,
                base_sequence=0, batch_size=1 << 20)
    b.append(0, timestamp=1, key=None, value=b"v", headers=[])
    with pytest.raises(InvalidArgument, match="transactional"):
        list(kr.iter_kafka_batches(bytes(b.build()), MAX))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_corrupt_record(data: bytes) -> None:
    try:
        for batch in kr.iter_kafka_batches(data, MAX):
            kr.to_metaq(batch)
    except (CorruptRecordError, InvalidArgument):
        pass


@settings(max_examples=200, deadline=None)
@given(st.lists(record, min_size=1, max_size=5), st.integers(61, 400), st.binary(min_size=1, max_size=8))
def test_damaged_records_with_a_matching_crc_raise_only_corrupt_record(recs: list, at: int, junk: bytes) -> None:
    """A producer bug, not line noise: the CRC is right but the records are not."""
    import struct

    import crc32c

    raw = bytearray(kafka_batch(recs))
    at = min(at, len(raw) - 1)
    raw[at:at + len(junk)] = junk
    raw = raw[:max(len(raw), 61)]
    struct.pack_into(">i", raw, 8, len(raw) - 12)
    struct.pack_into(">I", raw, 17, crc32c.crc32c(bytes(raw[21:])))
    try:
        for batch in kr.iter_kafka_batches(bytes(raw), MAX):
            kr.to_metaq(batch)
    except (CorruptRecordError, InvalidArgument):
        pass


def test_a_decompression_bomb_is_refused() -> None:
    raw = kafka_batch([(None, b"\0" * 100_000, [], 0)], codec=CODECS["gzip"])
    with pytest.raises(CorruptRecordError, match="more than"):
        list(kr.iter_kafka_batches(raw, 10_000))


# -- the compiled conversions give the Python reference's bytes ----------------------------------------

compiled = pytest.mark.skipif(not kr.COMPILED, reason="metaq._kafka_speedups is not built")
any_record = st.tuples(
    st.one_of(st.none(), st.binary(max_size=40)),
    st.binary(max_size=300),
    st.lists(st.tuples(st.one_of(st.text(min_size=1, max_size=10), st.sampled_from(["metaq.attribute", "h"])),
                       st.binary(max_size=20)), max_size=3),
    st.integers(0, 10_000),
)


@compiled
@settings(max_examples=150, deadline=None)
@given(st.lists(any_record, min_size=1, max_size=30), st.sampled_from(["none", "lz4", "zstd"]),
       st.booleans())
def test_compiled_produce_conversion_gives_the_reference_bytes(recs: list, codec: str, idempotent: bool) -> None:
    raw = kafka_batch(recs, CODECS[codec], producer=(99, 1, 7) if idempotent else (-1, -1, -1))
    [batch] = list(kr.iter_kafka_batches(raw, MAX))

    def outcome() -> object:
        try:
            return kr.to_metaq(batch)
        except (CorruptRecordError, InvalidArgument) as exc:  # an attribute that is not UTF-8...
            return type(exc)

    fast = outcome()
    saved = kr._records_to_region
    kr._records_to_region = None
    try:
        assert outcome() == fast
    finally:
        kr._records_to_region = saved


@compiled
@settings(max_examples=150, deadline=None)
@given(st.lists(any_record, min_size=1, max_size=30), st.booleans())
def test_compiled_fetch_conversion_gives_the_reference_bytes(recs: list, attributes: bool) -> None:
    values = [v for _k, v, _h, _d in recs]
    timestamps = [1_700_000_000_000 + d for *_x, d in recs]
    keys = [k for k, *_ in recs]
    headers = [h or None for _k, _v, h, _d in recs]
    attrs = [f"a{i}" if i % 2 else None for i in range(len(recs))] if attributes else None
    batch = mrec.encode_columns(values, timestamps, keys=keys, headers=headers, attributes=attrs)
    _, cols = mrec.batch_columns(batch)
    body = bytes(cols.body)
    assert kr._region_to_records(body, cols.n, min(timestamps)) == kr.region_to_records_py(cols, body, min(timestamps))


@compiled
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(-1, 40), st.integers(-(2**40), 2**40))
def test_compiled_conversions_take_any_bytes_without_failing(data: bytes, n: int, ts: int) -> None:
    for fn in (kr._records_to_region, kr._region_to_records):
        assert fn is not None
        fn(data, n, ts)  # a result or None, never a crash or an exception
