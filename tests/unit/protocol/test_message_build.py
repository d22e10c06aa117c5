"""Messages a consumer reads: built by the decoder without ``Message.__init__`` (it sets every field of an empty
instance), they must behave exactly as Messages an application builds itself: every field there, equality, repr,
pickling, ``dataclasses`` helpers, mutation. The compiled builder (metaq._speedups.MessageBuilder) and its Python
reference (records.decode.build_messages) build the same Messages."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import sys
from array import array
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from protocol_strategies import examples, messages

from metaq import _compiled
from metaq.protocol import records as rec
from metaq.protocol.records import decode
from metaq.types import Message, PartitionId

_speedups = _compiled.speedups

BASE_ID = (7 << 112) | (0xABCDEF << 64)
APPEND_MS = 1_700_000_000_123
FIELDS = [f.name for f in dataclasses.fields(Message)]


def stored(sent: list[Message], base_offset: int, compression: rec.Compression = rec.Compression.NONE) -> bytes:
    batch = bytearray(rec.encode_messages(sent, compression))
    rec.stamp(batch, base_offset, BASE_ID + base_offset, APPEND_MS)
    return bytes(batch)


def as_read(m: Message, offset: int, partition: int = 3, broker_id: int = 7) -> Message:
    """What a consumer of partition ``broker_id-partition`` must get for sent message ``m`` at ``offset``."""
    return Message(m.topic, m.data, attribute=m.attribute, key=m.key, headers=m.headers or None,  # [] is stored as none
                   timestamp_ms=m.timestamp_ms, partition=partition, offset=offset, id=BASE_ID + offset,
                   append_time_ms=APPEND_MS, broker_id=broker_id)


def check_plain_object(m: Message) -> None:
    """Every field is set and of a plain type; repr, asdict, replace, copy and pickle work on it."""
    assert type(m) is Message
    values = {name: getattr(m, name) for name in FIELDS}  # AttributeError for a slot the decoder left unset
    assert dataclasses.asdict(m) == values
    assert type(m.data) is bytes
    assert repr(m) == "Message(" + ", ".join(f"{k}={v!r}" for k, v in values.items()) + ")"
    assert pickle.loads(pickle.dumps(m)) == m
    assert copy.copy(m) == m and copy.deepcopy(m) == m
    assert dataclasses.replace(m, offset=m.offset + 1) != m
    assert dataclasses.replace(m) == m


@pytest.mark.parametrize("compression", list(rec.Compression))
def test_plain_messages_read_back_equal_the_sent_ones_with_every_field(compression: rec.Compression) -> None:
    sent = [Message("orders", b"payload-%d" % i, timestamp_ms=1000 + i) for i in range(50)]
    got, next_offset = rec.decode_fetched(stored(sent, 100, compression), "orders", 3, 100, True, 7)
    assert next_offset == 150
    assert got == [as_read(m, 100 + i) for i, m in enumerate(sent)]
    for m in got:
        check_plain_object(m)
        assert m.partition_id == PartitionId(7, 3)
        assert m.deliver_at is None and m.delay_ms is None


def test_keys_attributes_and_headers_read_back_equal_the_sent_ones() -> None:
    sent = [Message("orders", b"v%d" % i, attribute="attr" if i % 2 else None, key=b"k%d" % i if i % 3 else None,
                    headers=[("h", b"%d" % i), ("x", b"")] if i % 4 else None, timestamp_ms=5 + i)
            for i in range(40)]
    batches, _ = rec.decode_fetched_batches(stored(sent, 0), "orders", 3, 0, True, 7)
    got = [m for batch in batches for m in batch]
    assert got == [as_read(m, i) for i, m in enumerate(sent)]
    for m in got:
        check_plain_object(m)


def test_a_fetch_starting_inside_a_batch_and_a_cut_batch_build_only_their_window() -> None:
    first = [Message("t", b"a%d" % i, timestamp_ms=1) for i in range(10)]
    second = [Message("t", b"b%d" % i, key=b"k", timestamp_ms=2) for i in range(10)]
    reply = stored(first, 0) + stored(second, 10)
    batches, next_offset = rec.decode_fetched_batches(reply, "t", 3, 4, True, 7)
    assert next_offset == 20
    assert [m for b in batches for m in b] == [as_read(m, i) for i, m in enumerate(first + second)][4:]
    head = batches[1].head(3)
    assert list(head) == [as_read(m, 10 + i) for i, m in enumerate(second)][:3]
    assert list(head) == list(head)  # iterating twice gives equal, separate Messages
    assert next(iter(head)) is not next(iter(head))


def test_messages_read_back_are_ordinary_mutable_messages() -> None:
    (m,) = rec.decode_batch(stored([Message("t", b"x", timestamp_ms=9)], 0), "t", 3, broker_id=7)
    built = Message("t", b"x", timestamp_ms=9, partition=3, offset=0, id=BASE_ID, append_time_ms=APPEND_MS,
                    broker_id=7)
    assert m == built and built == m
    m.attribute = "changed"
    m.offset = 42
    assert m != built and (m.attribute, m.offset) == ("changed", 42)
    with pytest.raises(AttributeError):
        m.not_a_field = 1  # type: ignore[attr-defined]


def test_keyword_construction_and_its_defaults_are_unchanged() -> None:
    m = Message(topic="t", data=b"d")
    assert [getattr(m, f) for f in FIELDS] == ["t", b"d", None, None, None, -1, -1, -1, -1, -1, -1, None, None]
    assert Message("t", b"d", "a", b"k") == Message(topic="t", data=b"d", attribute="a", key=b"k")
    assert Message("t", b"d") != Message("t", b"e")
    assert Message("t", b"d") != ("t", b"d")
    assert repr(Message("t", b"d")).startswith("Message(topic='t', data=b'd', attribute=None, key=None,")


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sent=st.lists(messages("topic"), min_size=1, max_size=8), base=st.integers(0, 1 << 40))
def test_any_messages_read_back_equal_the_sent_ones(sent: list[Message], base: int) -> None:
    got = rec.decode_batch(stored(sent, base), "topic", 3, broker_id=7)
    assert got == [as_read(m, base + i) for i, m in enumerate(sent)]
    for m in got:
        assert dataclasses.asdict(m).keys() == set(FIELDS)
        assert pickle.loads(pickle.dumps(m)) == m


@pytest.mark.parametrize("compression", [rec.Compression.NONE, rec.Compression.LZ4])
@pytest.mark.parametrize("keyed", [False, True])
def test_large_payloads_read_back_as_bytes_of_their_own_with_every_field(compression: rec.Compression,
                                                                        keyed: bool) -> None:
    """Large payloads, plain or with keys, attributes and headers, compressed or not: each is bytes of its own,
    equal to what was sent, and holds nothing of the fetched reply (which may be reused once the Messages
    are built). A guard for any change to how payloads are copied out of a reply (docs/benchmarks-history.md,
    "Issue 13 review leftovers": copying each from the reply's view was tried)."""
    sizes = [70_000, 1_000_000, 3, 200_001]
    sent = [Message("big", bytes([i + 1]) * size, attribute="a" if keyed and i % 2 else None,
                    key=b"k%d" % i if keyed else None, headers=[("h", b"%d" % i)] if keyed and i != 1 else None,
                    timestamp_ms=10 + i) for i, size in enumerate(sizes)]
    reply = bytearray(stored(sent, 40, compression))
    batches, next_offset = rec.decode_fetched_batches(memoryview(reply), "big", 3, 41, True, 7)
    assert next_offset == 44
    got = [m for batch in batches for m in batch]
    assert got == [as_read(m, 40 + i) for i, m in enumerate(sent)][1:]
    assert batches[0].keys == [m.key for m in sent[1:]] and batches[0].headers == [m.headers for m in sent[1:]]
    assert batches[0].attributes == [m.attribute for m in sent[1:]]
    for m in got:
        check_plain_object(m)
    del batches
    reply[:] = bytes(len(reply))  # the fetched buffer overwritten: the Messages' payloads are their own
    assert [m.data for m in got] == [m.data for m in sent[1:]]


# -- the compiled builder (metaq._speedups.MessageBuilder) against its reference (records.decode.build_messages) --

COMPILED = pytest.mark.skipif(_speedups is None, reason="metaq._speedups not in use")


def test_the_compiled_builder_is_in_use_when_the_module_is() -> None:
    """A silent fallback to the Python builder would go unnoticed otherwise."""
    if _speedups is None:
        assert decode._build is decode.build_messages
    else:
        assert type(decode._build.__self__) is _speedups.MessageBuilder


def _builders() -> list[Any]:
    compiled = [_speedups.MessageBuilder(Message, FIELDS).messages] if _speedups is not None else []
    return [decode.build_messages, *compiled]


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payloads=st.lists(st.binary(max_size=40), max_size=12), base=st.integers(0, 1 << 62),
       base_id=st.integers(0, (1 << 128) - (1 << 32)), short=st.integers(0, 3), which=st.integers(0, 5),
       keyed=st.booleans(), prefix=st.binary(max_size=5), gaps=st.booleans(), same_time=st.booleans())
def test_both_builders_make_the_same_messages_and_stop_at_the_shortest_column(
        payloads: list[bytes], base: int, base_id: int, short: int, which: int, keyed: bool, prefix: bytes,
        gaps: bool, same_time: bool) -> None:
    """Same fields, same types, each payload its own bytes (the payloads start after ``prefix``); offsets and ids
    from the deltas, consecutive or with gaps (a thinned batch); as zip does, the first column to run out ends the
    batch."""
    raw = prefix + b"".join(payloads)
    n = len(payloads)
    deltas = [3 * i + (i % 2) for i in range(n)] if gaps else list(range(n))
    stamps = [1000] * n if same_time else [1000 + i for i in range(n)]
    columns: list[Any] = [array("i", [len(p) for p in payloads]), array("i", deltas), array("q", stamps),
                          [f"a{i}" if i % 2 else None for i in range(n)] if keyed else None,
                          [b"k%d" % i for i in range(n)] if keyed else None,
                          [[("h", b"%d" % i)] if i % 3 else None for i in range(n)] if keyed else None]
    if columns[which] is not None:
        columns[which] = columns[which][:max(0, n - short)]
    expected = min([n] + [len(c) for c in columns if c is not None])
    built = [list(build("t", raw, len(prefix), *columns, base, base_id, 3, APPEND_MS, 7)) for build in _builders()]
    for got in built:
        assert len(got) == expected
        assert [m.data for m in got] == payloads[:expected]
        for i, m in enumerate(got):
            check_plain_object(m)
            assert (m.timestamp_ms, m.offset, m.id) == (stamps[i], base + deltas[i], base_id + deltas[i])
            assert (m.partition, m.append_time_ms, m.broker_id, m.topic) == (3, APPEND_MS, 7, "t")
            assert (m.attribute, m.key, m.headers) == ((columns[3][i], columns[4][i], columns[5][i]) if keyed
                                                       else (None, None, None))
    assert all(got == built[0] for got in built)


@COMPILED
def test_the_compiled_builder_refuses_what_it_cannot_fill() -> None:
    @dataclasses.dataclass(slots=True)
    class Other:
        topic: str
        data: bytes

    with pytest.raises(ValueError, match="MessageBuilder fills the fields"):
        _speedups.MessageBuilder(Other, ["topic", "data"])
    with pytest.raises(ValueError):
        _speedups.MessageBuilder(Message, list(reversed(FIELDS)))  # every field, but not in order

    @dataclasses.dataclass
    class NoSlots:  # a class attribute, not a descriptor, where each field should be: nothing to set it with
        topic: str = "t"

    with pytest.raises(ValueError, match="not a settable attribute descriptor"):
        _speedups.MessageBuilder(NoSlots, FIELDS)


@COMPILED
def test_the_compiled_builder_refuses_bad_columns() -> None:
    build = _speedups.MessageBuilder(Message, FIELDS).messages
    lengths, one, stamps = array("i", [1]), array("i", [0]), array("q", [5])
    with pytest.raises(ValueError, match="negative"):
        next(build("t", b"ab", 0, array("i", [-1]), one, stamps, None, None, None, 0, 0, 0, 0, 0))
    with pytest.raises(ValueError, match="negative"):
        build("t", b"ab", -1, lengths, one, stamps, None, None, None, 0, 0, 0, 0, 0)
    with pytest.raises(TypeError):
        build("t", bytearray(b"ab"), 0, lengths, one, stamps, None, None, None, 0, 0, 0, 0, 0)
    with pytest.raises(TypeError, match="array"):
        build("t", b"ab", 0, array("q", [2]), one, stamps, None, None, None, 0, 0, 0, 0, 0)  # not int32 lengths
    with pytest.raises(TypeError, match="array"):
        build("t", b"ab", 0, lengths, one, array("i", [5]), None, None, None, 0, 0, 0, 0, 0)  # not int64 timestamps
    with pytest.raises(TypeError):
        build("t", b"ab", 0, lengths, one, stamps, 5, None, None, 0, 0, 0, 0, 0)  # a column that is not iterable
    # bounds past the payloads are clamped as a slice is; an offset beyond 64 bits is still right
    (m,) = build("t", b"ab", 1, array("i", [8]), array("i", [2]), stamps, None, ["k"], None, (1 << 63) - 1, 7, 0, 0,
                 0)
    assert type(m) is Message and m.data == b"b" and (m.key, m.timestamp_ms, m.offset, m.id) == (
        "k", 5, (1 << 63) + 1, 9)


@COMPILED
def test_the_compiled_builder_leaks_no_reference() -> None:
    topic, raw = "leak-check-topic", b"x" * 3000
    build = _speedups.MessageBuilder(Message, FIELDS).messages
    lengths, deltas, stamps = array("i", [3] * 1000), array("i", range(1000)), array("q", [9] * 1000)
    before = sys.getrefcount(topic), sys.getrefcount(raw), sys.getrefcount(lengths)
    made = list(build(topic, raw, 0, lengths, deltas, stamps, None, None, None, 10, 1 << 100, 0, 0, 0))
    assert sys.getrefcount(topic) == before[0] + 1000
    del made
    assert (sys.getrefcount(topic), sys.getrefcount(raw), sys.getrefcount(lengths)) == before
