"""Hypothesis strategies for the wire protocol, derived from the declared schemas.

:func:`for_type` walks a declared wire type, so every field of every message — including APIs and
fields added later — gets random values without this file changing. A wire type it does not know
fails loudly instead of being skipped.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

from hypothesis import strategies as st

from metaq.protocol import schema
from metaq.protocol.records import Compression, encode_messages
from metaq.types import Message

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

_SCALE = float(os.environ.get("METAQ_HYPOTHESIS_SCALE", "1"))


def examples(n: int) -> int:
    """``n`` scaled by $METAQ_HYPOTHESIS_SCALE, for a long fuzzing run (e.g. 50) outside the normal suite."""
    return max(1, int(n * _SCALE))


# Small text: hypothesis' default alphabet is every code point except surrogates, so a string is
# always valid UTF-8, and 16 characters is at most 64 bytes, far under STRING's 32767.
small_text = st.text(max_size=16)
small_bytes = st.binary(max_size=48)


@st.composite
def record_batches(draw: st.DrawFn, max_messages: int = 4) -> bytes:
    """A real record batch (as a producer builds it) for RECORDS fields."""
    msgs = draw(st.lists(messages(), min_size=1, max_size=max_messages))
    return encode_messages(msgs, draw(st.sampled_from(list(Compression))))


_PRIMITIVES: dict[Any, st.SearchStrategy[Any]] = {
    schema.INT8: st.integers(-(1 << 7), (1 << 7) - 1),
    schema.INT16: st.integers(-(1 << 15), (1 << 15) - 1),
    schema.INT32: st.integers(-(1 << 31), (1 << 31) - 1),
    schema.INT64: st.integers(INT64_MIN, INT64_MAX),
    schema.BOOL: st.booleans(),
    # All ones is the wire form of -1 ("no id"), so the largest id that round-trips is 2**128 - 2.
    schema.UINT128: st.one_of(st.just(-1), st.integers(0, (1 << 128) - 2), st.just((1 << 128) - 2)),
    schema.STRING: small_text,
    schema.NULLABLE_STRING: st.none() | small_text,
    schema.BYTES: small_bytes,
    schema.NULLABLE_BYTES: st.none() | small_bytes,
    schema.RECORDS: st.one_of(small_bytes, record_batches()),
}


def for_type(wire_type: Any) -> st.SearchStrategy[Any]:
    """Random values of one declared wire type."""
    if isinstance(wire_type, schema.Array):
        items = st.lists(for_type(wire_type.item), max_size=4)
        return st.none() | items if wire_type.nullable else items
    if isinstance(wire_type, schema.Struct):
        return instances(wire_type.cls)
    strategy = _PRIMITIVES.get(wire_type)
    if strategy is None:
        raise NotImplementedError(f"no strategy for wire type {wire_type.name!r}: add it to _PRIMITIVES")
    return strategy


def active_fields(cls: Any, version: int | None = None) -> list[schema.Field]:
    return [f for f in cls.FIELDS if version is None or f.since <= version]


def instances(cls: Any, version: int | None = None) -> st.SearchStrategy[Any]:
    """Random instances of a message or struct class; fields newer than ``version`` keep their defaults."""
    return st.builds(cls, **{f.name: for_type(f.type) for f in active_fields(cls, version)})


def normalized(value: Any) -> Any:
    """A comparable form: RECORDS (bytes or memoryview) become bytes, dataclasses become tuples."""
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, list):
        return [normalized(v) for v in value]
    fields = getattr(type(value), "FIELDS", None)
    if fields is not None:
        return (type(value).__name__, tuple((f.name, normalized(getattr(value, f.name))) for f in fields))
    return value


def messages(topic: str = "") -> st.SearchStrategy[Message]:
    """Messages as a producer hands them over: any key, attribute, headers, timestamp and payload."""
    headers = st.none() | st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=16)), max_size=3)
    return st.builds(
        Message,
        topic=st.just(topic),
        data=st.binary(max_size=64),
        attribute=st.none() | st.text(max_size=12),
        key=st.none() | st.binary(max_size=16),
        headers=headers,
        timestamp_ms=st.integers(0, INT64_MAX),
    )


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at the given positions (sorted and clamped), so a reader sees arbitrary chunks."""
    points = sorted({min(max(c, 0), len(data)) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)] or [b""]


def chunks(draw: st.DrawFn, data: bytes) -> list[bytes]:
    return split(data, draw(st.lists(st.integers(0, max(len(data), 0)), max_size=12)))
