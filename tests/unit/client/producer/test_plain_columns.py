"""An open batch's plain columns (docs/producer.md, "The compiled seam"): ``PlainColumns`` held to its Python
reference -- the columns each keeps, the counts, the errors -- on the same operations; ``ProducerBatch`` on top of it.
Run without the compiled module (METAQ_NO_EXTENSIONS=1), the reference alone is checked against the specification."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaq import _compiled
from metaq.client.producer import columns
from metaq.client.producer.batches import ProducerBatch
from metaq.client.producer.columns import PlainColumnsPy
from metaq.protocol.records import HEADER_BYTES, Compression, decode_batch

_speedups = _compiled.speedups
compiled_only = pytest.mark.skipif(_speedups is None, reason="metaq._speedups not in use")

IMPLS = [pytest.param(PlainColumnsPy, id="python"),
         pytest.param(getattr(_speedups, "PlainColumns", None), id="compiled", marks=compiled_only)]

CREATED = 1_700_000_000_000


def state(c: Any) -> tuple[Any, ...]:
    return (list(c.values), list(c.timestamps), list(c.waiters), c.count, c.size_bytes, c.created_ms)


# -- the specification, for both ----------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
def test_records_join_in_order_a_negative_timestamp_taking_the_creation_time(impl: Any) -> None:
    c = impl(CREATED, HEADER_BYTES)
    assert state(c) == ([], [], [], 0, HEADER_BYTES, CREATED)
    c.append(-1, b"one", "f1", 27)
    c.append(5, b"two", None, 28)
    c.extend([b"3", b"4"], None, [3, 4], 50)
    c.extend((b"5", b"6"), (7, -9), ("f5", None), 50)
    assert state(c) == ([b"one", b"two", b"3", b"4", b"5", b"6"], [CREATED, 5, CREATED, CREATED, 7, CREATED],
                        ["f1", None, 3, 4, "f5", None], 6, HEADER_BYTES + 155, CREATED)
    values, waiters = c.values, c.waiters
    c.drop_payloads()  # encoded: the payloads go, the waiters and counts stay
    assert state(c) == ([], [], ["f1", None, 3, 4, "f5", None], 6, HEADER_BYTES + 155, CREATED)
    assert values == [b"one", b"two", b"3", b"4", b"5", b"6"] and c.waiters is waiters  # handed out, not copied


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("call", "error"), [
    pytest.param(lambda c: c.append(1.0, b"x", None, 1), TypeError, id="a float timestamp"),
    pytest.param(lambda c: c.append(True, b"x", None, 1), TypeError, id="a bool timestamp"),
    pytest.param(lambda c: c.append(1, b"x", None, "1"), TypeError, id="a str size"),
    pytest.param(lambda c: c.extend([b"x"], None, [None], 1.5), TypeError, id="a float size"),
    pytest.param(lambda c: c.extend(5, None, [None], 1), TypeError, id="values not iterable"),
    pytest.param(lambda c: c.extend([b"x"], None, 5, 1), TypeError, id="waiters not iterable"),
    pytest.param(lambda c: c.extend([b"x"], 5, [None], 1), TypeError, id="timestamps not iterable"),
    pytest.param(lambda c: c.extend([b"x"], [1.0], [None], 1), TypeError, id="a timestamp not an int"),
    pytest.param(lambda c: c.extend([b"x", b"y"], None, [None], 1), ValueError, id="fewer waiters"),
    pytest.param(lambda c: c.extend([b"x"], [1, 2], [None], 1), ValueError, id="more timestamps"),
])
def test_a_bad_call_raises_and_nothing_joins(impl: Any, call: Any, error: type[Exception]) -> None:
    c = impl(CREATED, HEADER_BYTES)
    c.append(3, b"kept", None, 10)
    before = state(c)
    with pytest.raises(error):
        call(c)
    assert state(c) == before


@pytest.mark.parametrize("impl", IMPLS)
def test_the_constructor_takes_two_ints(impl: Any) -> None:
    with pytest.raises(TypeError):
        impl(1.5, 0)
    with pytest.raises(TypeError):
        impl(0, "0")


@pytest.mark.parametrize("impl", IMPLS)
def test_a_subclass_adds_its_own_slots_and_cycles_are_collected(impl: Any) -> None:
    class Batch(impl):  # type: ignore[misc,valid-type]
        __slots__ = ("__weakref__", "key", "other")

        def __init__(self, key: str) -> None:
            super().__init__(CREATED, 0)
            self.key = key

    b = Batch("k")
    b.other = b  # a cycle through the subclass's slot
    b.append(-1, b"x", b, 1)  # and one through a column
    assert (b.key, b.count, b.timestamps, b.waiters[0] is b) == ("k", 1, [CREATED], True)
    gone = weakref.ref(b)
    del b
    gc.collect()
    assert gone() is None


def test_a_producer_batch_keeps_keys_beside_its_columns_and_encodes_them() -> None:
    batch = ProducerBatch(("t", 0, 1, 1), 0.0, 1.0)
    assert batch.plain and batch.size_bytes == HEADER_BYTES
    batch.append(-1, b"plain", "f0", 30)
    batch.add(4, b"keyed", b"k", None, None, "f1", 35)
    batch.add(6, b"last", None, "attr", [("h", b"v")], "f2", 40)
    assert not batch.plain and batch.count == 3 and batch.size_bytes == HEADER_BYTES + 105
    assert batch.keys == [None, b"k", None] and batch.attributes == [None, None, "attr"]
    other = ProducerBatch(("t", 0, 1, 1), 0.0, 0.5)
    other.append(9, b"more", "f3", 28)
    batch.absorb(other)
    assert batch.count == 4 and batch.waiters == ["f0", "f1", "f2", "f3"] and batch.keys == [None, b"k", None, None]
    records = decode_batch(batch.build(Compression.NONE))
    assert [(m.data, m.key, m.timestamp_ms) for m in records] == [
        (b"plain", None, batch.created_ms), (b"keyed", b"k", 4), (b"last", None, 6), (b"more", None, 9)]
    assert batch.values == [] and batch.waiters == ["f0", "f1", "f2", "f3"]


# -- the compiled columns are the reference's twin ----------------------------------------------------------------

stamps = st.one_of(st.integers(-5, 2**40), st.sampled_from([2**70, -(2**70), 1.0, True]))
sizes = st.one_of(st.integers(-10, 10**6), st.sampled_from([1.5, "3"]))
seqs = st.one_of(st.lists(st.integers(0, 3), max_size=5), st.just(None), st.just(7))
operations = st.lists(st.one_of(
    st.tuples(st.just("append"), st.tuples(stamps, st.binary(max_size=4), st.sampled_from([None, "f", 3]), sizes)),
    st.tuples(st.just("extend"), st.tuples(st.lists(st.binary(max_size=3), max_size=5),
                                           st.one_of(st.none(), st.lists(stamps, max_size=5), st.just(7)),
                                           seqs, sizes)),
    st.tuples(st.just("drop"), st.none()),
    st.tuples(st.just("set"), st.tuples(st.integers(0, 9), st.integers(0, 10**6))),
), max_size=30)


def replay(impl: Any, created: Any, size: Any, ops: list[tuple[str, Any]]) -> list[Any]:
    try:
        c = impl(created, size)
    except Exception as exc:
        return [type(exc)]
    out: list[Any] = []
    for op, arg in ops:
        try:
            if op == "append":
                c.append(*arg)
            elif op == "extend":
                values, timestamps, waiters, n = arg
                c.extend(values, timestamps, [None] * len(values) if waiters is None else waiters, n)
            elif op == "drop":
                c.drop_payloads()
            else:
                c.count, c.size_bytes = arg
            out.append(state(c))
        except Exception as exc:
            out.append((type(exc), state(c)))
    return out


@compiled_only
@settings(max_examples=300, deadline=None)
@given(created=st.one_of(st.integers(0, 2**42), st.just(1.0)), size=st.sampled_from([0, HEADER_BYTES, "x"]),
       ops=operations)
def test_the_compiled_columns_do_what_the_reference_does(created: Any, size: Any, ops: list[tuple[str, Any]]) -> None:
    assert _speedups is not None
    assert replay(_speedups.PlainColumns, created, size, ops) == replay(PlainColumnsPy, created, size, ops)


def test_the_compiled_columns_are_in_use_unless_the_module_is_off() -> None:
    assert (columns.PlainColumns is not PlainColumnsPy) == (_compiled.speedups is not None)
    assert issubclass(ProducerBatch, columns.PlainColumns)
