"""The records region of a plain batch (no key, attribute or headers): what the producer encodes for every
``send_async`` batch and every ``send_batch`` chunk. Built in one compiled pass (metaq._speedups.plain_region)
when the module is there, by its Python reference (records.encode.plain_region_py) otherwise; both must give the
same bytes, and the batch must read back as what was sent. And the broker's side: the compiled check of a produced
batch's columns (metaq._speedups.plain_columns_ok) against its reference (records.validate.plain_columns_ok_py)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from protocol_strategies import examples

from metaq import types
from metaq.errors import CorruptRecordError, InvalidArgument
from metaq.protocol import records as rec
from metaq.protocol.records import encode, validate
from metaq.protocol.records.validate import Columns

PLAIN_REGION = encode.plain_region_compiled
PLAIN_COLUMNS_OK = validate.plain_columns_ok_compiled
COMPILED = pytest.mark.skipif(PLAIN_REGION is None, reason="metaq._speedups not in use")
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)


def builders() -> list[Any]:
    return [encode.plain_region_py] + ([PLAIN_REGION] if PLAIN_REGION is not None else [])


@settings(max_examples=examples(150), deadline=None)
@given(values=st.lists(st.binary(max_size=60), min_size=1, max_size=40), stamps=st.data(),
       as_bytearray=st.booleans())
def test_both_builders_give_the_same_region_and_timestamp_range(values: list[bytes], stamps: st.DataObject,
                                                                as_bytearray: bool) -> None:
    """One timestamp for all, one each (equal or not): the same bytes, smallest and largest timestamp."""
    n = len(values)
    kind = stamps.draw(st.sampled_from(["one", "each", "equal"]))
    timestamps: Any = (stamps.draw(INT64) if kind == "one" else stamps.draw(st.lists(INT64, min_size=n, max_size=n))
                       if kind == "each" else [stamps.draw(INT64)] * n)
    items: list[Any] = [bytearray(v) for v in values] if as_bytearray else values
    built = [build(items, timestamps) for build in builders()]
    assert all(b == built[0] for b in built)
    region, lo, hi = built[0]
    each = [timestamps] * n if isinstance(timestamps, int) else timestamps
    assert (lo, hi) == (min(each), max(each))
    assert len(region) == 24 * n + sum(map(len, values)) and region.endswith(b"".join(values))


@settings(max_examples=examples(60), deadline=None)
@given(values=st.lists(st.binary(max_size=80), min_size=1, max_size=30),
       timestamps=st.lists(st.integers(0, 1 << 45), min_size=30, max_size=30))
def test_a_plain_batch_reads_back_as_sent(values: list[bytes], timestamps: list[int]) -> None:
    stamps = timestamps[:len(values)]
    batch = bytearray(rec.encode_columns(values, stamps))
    rec.stamp(batch, 100, 5000, 1_700_000_000_000)
    got = rec.decode_batch(bytes(batch), "t", 2, broker_id=1)
    assert [(m.data, m.timestamp_ms, m.offset) for m in got] == [
        (v, t, 100 + i) for i, (v, t) in enumerate(zip(values, stamps, strict=True))]
    header = rec.read_header(batch)
    assert (header.first_timestamp_ms, header.max_timestamp_ms) == (min(stamps), max(stamps))


def test_a_memoryview_payload_is_encoded_by_the_python_columns() -> None:
    """send_batch takes memoryviews too: the compiled pass declines them (None) and the batch is still right."""
    if PLAIN_REGION is not None:
        assert PLAIN_REGION([b"a", memoryview(b"bc")], 5) is None
    batch = bytearray(rec.encode_values([b"a", memoryview(b"bc")], 5))  # type: ignore[list-item]
    rec.stamp(batch, 0, 0, 6)
    assert [m.data for m in rec.decode_batch(bytes(batch), "t", 0)] == [b"a", b"bc"]


@pytest.mark.parametrize("build", [pytest.param(encode.plain_region_py, id="python"),
                                   pytest.param(PLAIN_REGION, id="compiled", marks=COMPILED)])
def test_misuse_is_refused_the_same_way(build: Any) -> None:
    with pytest.raises(ValueError):
        build([b"a", b"b"], [1])  # a timestamp short
    with pytest.raises(OverflowError):
        build([b"a"], [1 << 63])
    with pytest.raises(OverflowError):
        build([b"a"], 1 << 63)
    with pytest.raises(TypeError):
        build([b"a"], ["1"])
    with pytest.raises(ValueError):
        build([], [])


# -- the broker's side: metaq._speedups.plain_columns_ok against plain_columns_ok_py --

def keyed_region(values: list[bytes], keys: list[bytes | None]) -> bytes:
    batch = rec.encode_columns(values, [7] * len(values), keys=keys)
    return batch[rec.HEADER_BYTES:]  # uncompressed: the records region follows the header


def columns_checks() -> list[Any]:
    return [validate.plain_columns_ok_py] + ([PLAIN_COLUMNS_OK] if PLAIN_COLUMNS_OK is not None else [])


@settings(max_examples=examples(300), deadline=None)
@given(values=st.lists(st.binary(max_size=30), min_size=1, max_size=20), keyed=st.booleans(), data=st.data())
def test_both_columns_checks_decide_the_same(values: list[bytes], keyed: bool, data: st.DataObject) -> None:
    """The columns of a plain batch, with any bytes changed, any record count and any size limit: the compiled check
    and its reference say the same; and they say yes to what producers send (so that the fast path is taken), no
    for one byte less than the largest record."""
    keys = [data.draw(st.one_of(st.none(), st.binary(max_size=10))) for _ in values] if keyed else [None] * len(values)
    region = bytearray(keyed_region(values, keys))
    n = len(values)
    biggest = max(24 + len(k or b"") + len(v) for k, v in zip(keys, values, strict=True))
    for check in columns_checks():
        assert check(bytes(region), n, biggest)
        assert not check(bytes(region), n, biggest - 1)  # one record over the limit
    for _ in range(data.draw(st.integers(0, 3))):
        at = data.draw(st.integers(0, len(region) - 1))
        region[at] = data.draw(st.integers(0, 255))
    count = data.draw(st.sampled_from([n, n, n - 1, n + 1, 0, -1]))
    limit = data.draw(st.sampled_from([biggest, 1 << 20, 24, 0, -1, 1 << 70]))
    decided = {check(bytes(region), count, limit) for check in columns_checks()}
    assert len(decided) == 1, (count, limit)


@settings(max_examples=examples(150), deadline=None)
@given(values=st.lists(st.binary(max_size=30), min_size=1, max_size=40), keyed=st.booleans(), data=st.data())
def test_validate_batch_decides_the_same_with_the_compiled_columns_check_and_without(
        values: list[bytes], keyed: bool, data: st.DataObject) -> None:
    """Whole batches (a valid CRC around columns with bytes changed, compressed or not): validate_batch gives the
    same header or the same error whether the compiled checks run or not."""
    keys = [data.draw(st.one_of(st.none(), st.binary(max_size=10))) for _ in values] if keyed else [None] * len(values)
    region = bytearray(keyed_region(values, keys))
    for _ in range(data.draw(st.integers(0, 2))):
        region[data.draw(st.integers(0, len(region) - 1))] = data.draw(st.integers(0, 255))
    n = len(values)
    batch = encode.wrap(bytes(region), n, n - 1, 7, 7, data.draw(st.sampled_from(list(rec.Compression))))
    limit = data.draw(st.sampled_from([1 << 20, 40, 24]))

    def outcome() -> Any:
        try:
            return rec.validate_batch(batch, limit, 1 << 22)
        except (CorruptRecordError, InvalidArgument) as exc:
            return type(exc), str(exc)

    first = outcome()
    saved = validate.validate_plain, validate.plain_columns_ok_compiled
    validate.validate_plain = validate.plain_columns_ok_compiled = None
    try:
        assert outcome() == first
    finally:
        validate.validate_plain, validate.plain_columns_ok_compiled = saved


def test_columns_with_attributes_or_headers_are_left_to_the_general_check() -> None:
    batch = rec.encode_messages([types.Message("t", b"v", attribute="a"), types.Message("t", b"w",
                                                                                          headers=[("h", b"x")])])
    region = batch[rec.HEADER_BYTES:]
    for check in columns_checks():
        assert not check(region, 2, 1 << 20)
    cols = Columns.parse(region, 2, 1, producer=True)
    assert not cols.no_attrs and not cols.no_headers
    header = rec.validate_batch(batch, 1 << 20, 1 << 22)  # accepted by the general check
    assert header.record_count == 2
