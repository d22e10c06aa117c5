"""The generated encoder and decoder of every message (schema.codegen) give what the field-by-field walk gives.

``schema.encode`` and ``schema.decode`` run code generated per class and version; the walk over FIELDS
(``schema.encode_fields``, ``schema.decode_fields``) is the reference. Well-formed input must give the same
bytes and equal objects of the same types, and must not fall back to the walk (else the generated code would
be dead); malformed input and values the schema cannot carry must end as the walk ends them: the same
exception, with the same message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from protocol_strategies import examples, instances
from test_protocol_fuzz import mutated

from metaq.errors import InvalidArgument, ProtocolError
from metaq.protocol import messages as m
from metaq.protocol import schema
from metaq.protocol.messages import APIS
from metaq.protocol.schema import walk

CLASS_VERSIONS = [(cls, version) for _key, spec in sorted(APIS.items())
                  for version in range(spec.min_version, spec.max_version + 1)
                  for cls in (spec.request, spec.response)]
CLASS_IDS = [f"{cls.__name__}-v{version}" for cls, version in CLASS_VERSIONS]

SETTINGS = settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _reference_bytes(obj: Any, version: int) -> bytes:
    return b"".join(schema.encode_fields(obj, schema.active_fields(type(obj), version), []))


def _outcome(call: Any) -> tuple[str, Any]:
    try:
        return "ok", call()
    except (ProtocolError, InvalidArgument) as exc:
        return type(exc).__name__, str(exc)


@pytest.fixture
def no_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Well-formed input must be handled by the generated code alone."""
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the generated codec fell back to the field-by-field walk")
    monkeypatch.setattr(walk, "decode_fields", refused)
    monkeypatch.setattr(walk, "encode_fields", refused)


@pytest.mark.parametrize(("cls", "version"), CLASS_VERSIONS, ids=CLASS_IDS)
@SETTINGS
@given(data=st.data())
def test_well_formed_messages_encode_and_decode_as_the_walk_does(cls: Any, version: int, data: st.DataObject) -> None:
    obj = data.draw(instances(cls, version), label="message")
    raw = _reference_bytes(obj, version)
    out: list[bytes] = [b"head"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(walk, "encode_fields", _no_walk)
        patch.setattr(walk, "decode_fields", _no_walk)
        schema.encode(obj, version, out)
        got = schema.decode(cls, version, raw)
        at_offset = schema.decode(cls, version, memoryview(b"xyz" + raw), 3)
    assert out[0] == b"head" and b"".join(out[1:]) == raw
    want = schema.decode_fields(cls, version, raw)
    assert type(got) is cls and got == want
    assert at_offset == want
    for a, b in ((got, want), (at_offset, want)):  # records: the same kind of slice of the frame
        for f in schema.active_fields(cls, version):
            assert type(getattr(a, f.name)) is type(getattr(b, f.name)) or f.type is schema.RECORDS


def _no_walk(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the generated codec fell back to the field-by-field walk")


@pytest.mark.parametrize(("cls", "version"), CLASS_VERSIONS, ids=CLASS_IDS)
@SETTINGS
@given(data=st.data())
def test_malformed_bodies_end_as_the_walk_ends_them(cls: Any, version: int, data: st.DataObject) -> None:
    body = _reference_bytes(data.draw(instances(cls, version), label="message"), version)
    bad = data.draw(mutated(body) | st.binary(max_size=64), label="body")
    exact = data.draw(st.booleans(), label="exact")
    got = _outcome(lambda: schema.decode(cls, version, bad, exact=exact))
    want = _outcome(lambda: schema.decode_fields(cls, version, bad, exact=exact))
    assert got == want


class _Weird:
    """Not a value any field can carry."""


@pytest.mark.parametrize(("cls", "version"), CLASS_VERSIONS, ids=CLASS_IDS)
@SETTINGS
@given(data=st.data())
def test_values_the_schema_cannot_carry_raise_the_walks_error(cls: Any, version: int, data: st.DataObject) -> None:
    obj = data.draw(instances(cls, version), label="message")
    active = schema.active_fields(cls, version)
    if not active:
        return
    f = data.draw(st.sampled_from(active), label="field")
    value = data.draw(st.sampled_from([None, _Weird(), -(1 << 200), 1 << 200, "x" * 40000, b"b", "s", [_Weird()]]),
                      label="value")
    setattr(obj, f.name, value)
    out: list[bytes] = [b"head"]
    got = _outcome(lambda: b"".join(schema.encode(obj, version, out)[1:]))
    reference: list[bytes] = []
    want = _outcome(lambda: b"".join(schema.encode_fields(obj, active, reference)))
    assert got == want
    if got[0] != "ok":
        assert out[0] == b"head"


def test_a_cut_off_field_and_trailing_bytes_keep_their_own_messages() -> None:
    raw = b"".join(schema.encode(m.FetchRequest(topic="orders", partition=3, offset=9), 3))
    with pytest.raises(ProtocolError, match="int64 field cut off"):
        schema.decode(m.FetchRequest, 3, raw[:12])
    with pytest.raises(ProtocolError, match="1 unexpected trailing bytes"):
        schema.decode(m.FetchRequest, 3, raw + b"!")
    assert schema.decode(m.FetchRequest, 3, raw + b"!", exact=False).topic == "orders"
    with pytest.raises(InvalidArgument, match="non-nullable string field is None"):
        schema.encode(m.FetchRequest(topic=None), 3)  # type: ignore[arg-type]


def test_the_no_id_sentinel_and_nested_structs_round_trip(no_fallback: None) -> None:
    response = m.MultiProduceResponse(partitions=[
        m.ProducedPartition("t", 0, 0, None, 5, -1, 7),
        m.ProducedPartition("t", 1, 0, None, 6, (1 << 128) - 2, 8),
        m.ProducedPartition("t", 2, 17, "refused", -1, 0, -1)])
    raw = b"".join(schema.encode(response, 0))
    assert schema.decode(m.MultiProduceResponse, 0, raw) == response
    assert raw.count(b"\xff" * 16) == 1  # -1 travels as all ones


def test_a_bool_byte_other_than_0_or_1_is_refused() -> None:
    raw = bytearray(b"".join(schema.encode(m.PartitionStateRequest(topic="t", partition=1, open=True), 0)))
    assert schema.decode(m.PartitionStateRequest, 0, bytes(raw)).open is True
    raw[-1] = 2
    with pytest.raises(ProtocolError, match="bool field has value 2"):
        schema.decode(m.PartitionStateRequest, 0, bytes(raw))


@dataclass
class _Inner:
    when: int = 0
    ids: list[int] = field(default_factory=list)
    FIELDS: ClassVar = (schema.Field("when", schema.INT64), schema.Field("ids", schema.Array(schema.UINT128)))


@dataclass
class _Shapes:
    """What no message declares today, so that a message that does is generated right: arrays of fixed-width items,
    of arrays, of nullable bytes, a struct as a field, a bool between fixed-width fields."""

    counts: list[int] | None = None
    flag: bool = False
    inner: _Inner = field(default_factory=_Inner)
    nested: list[list[str]] = field(default_factory=list)
    blobs: list[bytes | None] = field(default_factory=list)
    tail: int = 0
    FIELDS: ClassVar = (schema.Field("counts", schema.Array(schema.INT32, nullable=True)),
                        schema.Field("flag", schema.BOOL), schema.Field("inner", schema.Struct(_Inner)),
                        schema.Field("nested", schema.Array(schema.Array(schema.STRING))),
                        schema.Field("blobs", schema.Array(schema.NULLABLE_BYTES)), schema.Field("tail", schema.INT16))


@SETTINGS
@given(data=st.data())
def test_shapes_no_message_has_yet_are_generated_as_the_walk_does(data: st.DataObject) -> None:
    obj = data.draw(instances(_Shapes), label="shapes")
    raw = _reference_bytes(obj, 0)
    with pytest.MonkeyPatch.context() as patch:  # the generated code alone
        patch.setattr(walk, "encode_fields", _no_walk)
        patch.setattr(walk, "decode_fields", _no_walk)
        encoded = b"".join(schema.encode(obj, 0))
        got = schema.decode(_Shapes, 0, raw)
    assert encoded == raw
    assert got == schema.decode_fields(_Shapes, 0, raw) == obj
    bad = data.draw(mutated(raw), label="bad")
    assert _outcome(lambda: schema.decode(_Shapes, 0, bad)) == _outcome(lambda: schema.decode_fields(_Shapes, 0, bad))
