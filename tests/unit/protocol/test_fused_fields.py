"""The fast paths of a MultiFetch reply's decode give what the general paths give (issue 13).

``schema.Struct`` packs and unpacks adjacent fixed-width fields in one call; the reference is the
field-by-field walk (``Struct._decode_fields``, and the fields' own encoders). ``decode_fetched_batches``
takes a reply of exactly one whole batch without the general walk; the reference is the same reply with a
cut-off tail after the batch (a few bytes, which the general walk drops silently), which never takes the
fast path.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metaq.errors import CorruptRecordError, InvalidArgument, ProtocolError
from metaq.protocol import messages as m
from metaq.protocol import schema
from metaq.protocol.records import HEADER_BYTES, decode_fetched, decode_fetched_batches, encode_messages, stamp
from metaq.types import Message

I64 = st.integers(-(1 << 63), (1 << 63) - 1)


def _reference_encode(value: Any) -> bytes:
    out: list[bytes] = []
    for f in type(value).FIELDS:
        f.type.encode(getattr(value, f.name), out)
    return b"".join(out)


def _entries() -> st.SearchStrategy[m.FetchedPartition]:
    return st.builds(m.FetchedPartition, topic=st.text(max_size=20), partition=st.integers(-(1 << 31), (1 << 31) - 1),
                     error_code=st.integers(-(1 << 15), (1 << 15) - 1), error_message=st.none() | st.text(max_size=30),
                     log_start_offset=I64, log_end_offset=I64, reset_offset=I64, damaged_offset=I64,
                     resume_offset=I64, high_watermark=I64, records=st.binary(max_size=64))


@given(_entries())
def test_a_fetched_partition_encodes_and_decodes_as_field_by_field(entry: m.FetchedPartition) -> None:
    codec = schema.Struct(m.FetchedPartition)
    out: list[bytes] = []
    codec.encode(entry, out)
    raw = b"".join(out)
    assert raw == _reference_encode(entry)
    got, end = codec.decode(raw + b"tail", 0)
    want, want_end = codec._decode_fields(raw + b"tail", 0)
    assert end == want_end == len(raw)
    assert type(got) is m.FetchedPartition and got == want == entry


def test_error_entries_and_empty_records_decode_to_the_same_objects() -> None:
    entries = [m.FetchedPartition("t", 0, 3, "unknown topic 't'"),
               m.FetchedPartition("t", 1, log_start_offset=0, log_end_offset=7, reset_offset=-1, high_watermark=5),
               m.FetchedPartition("t", 2, 0, None, 0, 9, 2, -1, -1, -1, b"\x00" * 80)]
    response = m.MultiFetchResponse(partitions=entries, throttle_time_ms=12)
    raw = b"".join(schema.encode(response, 1))
    got = schema.decode(m.MultiFetchResponse, 1, raw)
    assert got == response
    assert [type(p) for p in got.partitions] == [m.FetchedPartition] * 3
    assert got.partitions[1].records == b"" and got.partitions[0].error_message == "unknown topic 't'"


class _FieldByField(schema.Struct):
    def decode(self, buf: Any, pos: int) -> tuple[Any, int]:
        return self._decode_fields(buf, pos)


def _reference_decode(raw: bytes) -> Any:
    """A MultiFetchResponse v1 decoded with its entries' fields one at a time."""
    pos = 0
    for f in schema.active_fields(m.MultiFetchResponse, 1):
        wire = schema.Array(_FieldByField(m.FetchedPartition)) if isinstance(f.type, schema.Array) else f.type
        _, pos = wire.decode(raw, pos)
    return pos


def test_a_cut_off_fused_run_raises_the_fields_own_error() -> None:
    raw = b"".join(schema.encode(m.MultiFetchResponse(partitions=[m.FetchedPartition("t", 1, records=b"ab")]), 1))
    assert _reference_decode(raw) == len(raw)
    for cut in range(len(raw)):
        with pytest.raises(ProtocolError) as fast:
            schema.decode(m.MultiFetchResponse, 1, raw[:cut])
        with pytest.raises(ProtocolError) as slow:
            _reference_decode(raw[:cut])
        assert str(fast.value) == str(slow.value), cut


def test_a_value_out_of_range_names_its_own_field() -> None:
    for name in ("partition", "error_code", "log_end_offset", "high_watermark"):
        entry = m.FetchedPartition("t", 1)
        setattr(entry, name, 1 << 70)
        with pytest.raises(InvalidArgument) as fast:
            schema.encode(m.MultiFetchResponse(partitions=[entry]), 1)
        with pytest.raises(struct.error) as alone:  # the field's own encoder, alone
            next(f for f in m.FetchedPartition.FIELDS if f.name == name).type.encode(1 << 70, [])
        assert str(alone.value) in str(fast.value) and "MultiFetchResponse.partitions" in str(fast.value)


def _batch(base: int, count: int) -> bytes:
    raw = bytearray(encode_messages([Message("t", b"v%d" % i, timestamp_ms=1000 + i) for i in range(count)]))
    stamp(raw, base, base << 4, 5000)
    return bytes(raw)


def _outcome(buf: bytes, from_offset: int) -> Any:
    try:
        batches, next_offset = decode_fetched_batches(buf, "t", 3, from_offset, True, 2)
    except CorruptRecordError as exc:
        return ("error", str(exc), exc.offset, exc.resume_offset)
    return ([[(x.offset, x.data, x.id, x.partition, x.broker_id) for x in b] for b in batches], next_offset)


@pytest.mark.parametrize("from_offset", [0, 40, 41, 42, 43, 44, 50])
@pytest.mark.parametrize("damage", [None, 20, HEADER_BYTES + 3, -1])
def test_a_one_batch_reply_decodes_as_the_general_walk_does(from_offset: int, damage: int | None) -> None:
    batch = bytearray(_batch(40, 4))
    if damage is not None:
        batch[damage] ^= 0x10
    buf = bytes(batch)
    general = _outcome(buf + b"\x00" * 5, from_offset)  # a cut-off tail: never the one-batch path
    assert _outcome(buf, from_offset) == general
    if damage is None:
        messages, next_offset = decode_fetched(buf, "t", 3, from_offset, True, 2)
        assert [x.offset for x in messages] == [o for o in range(40, 44) if o >= from_offset]
        assert next_offset == (44 if from_offset < 44 else from_offset)


@dataclass
class _Reordered:
    """FIELDS in another order than the dataclass's own: built by name, not by position."""

    a: int = 0
    b: int = 0
    c: str = ""
    FIELDS: ClassVar = (schema.Field("c", schema.STRING), schema.Field("b", schema.INT64),
                        schema.Field("a", schema.INT32))


def test_a_struct_whose_fields_are_in_another_order_is_built_by_name() -> None:
    codec = schema.Struct(_Reordered)
    value = _Reordered(1, -2, "x")
    out: list[bytes] = []
    codec.encode(value, out)
    raw = b"".join(out)
    assert raw == _reference_encode(value)
    assert codec.decode(raw, 0) == (value, len(raw)) == codec._decode_fields(raw, 0)
