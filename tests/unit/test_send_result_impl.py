"""SendResult as users see it, for both implementations: the compiled one (metaq._speedups, what
``metaq.types.SendResult`` is when the module is built) and the pure-Python dataclass (its reference, and
``SendResult`` without the module or under METAQ_NO_EXTENSIONS=1). Same attributes, defaults, equality, repr,
properties, pickling and ``dataclasses`` helpers; the compiled pass that resolves a batch gives what the Python one
gives.
Plus what only the compiled one promises: a success is not a GC object, a failure is and its cycles are freed."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import gc
import os
import pickle
import subprocess
import sys
import weakref
from typing import Any

import pytest

import metaq
import metaq.types
from metaq import _compiled
from metaq.errors import InvalidArgument
from metaq.types import PartitionId, _PySendResult, format_message_id

_speedups = _compiled.speedups  # None without the module: the dataclass only

IMPLS = [pytest.param(_PySendResult, id="python"),
         pytest.param(getattr(_speedups, "SendResult", None), id="compiled",
                      marks=pytest.mark.skipif(_speedups is None, reason="metaq._speedups not in use"))]
FIELDS = ["success", "message_id", "partition", "offset", "error", "topic", "broker_id"]
MID = (1 << 112) | (0xABCDEF << 64) | 42  # a real-looking 128-bit id: broker 1, offset 42


def values(r: Any) -> dict[str, Any]:
    return {name: getattr(r, name) for name in FIELDS}


def test_the_compiled_one_is_what_users_get_when_the_module_is_in_use() -> None:
    """Whether the module is in use at all is tests/unit/test_compiled.py's: here, that SendResult follows it."""
    if _speedups is None:
        assert metaq.types.SendResult is _PySendResult is metaq.SendResult and not metaq.types.SPEEDUPS
        return
    assert metaq.types.SPEEDUPS
    assert metaq.types.SendResult is _speedups.SendResult is metaq.SendResult
    assert metaq.types.SendResult.__module__ == "metaq.types" and metaq.types.SendResult.__qualname__ == "SendResult"


@pytest.mark.parametrize("cls", IMPLS)
def test_fields_defaults_and_construction(cls: Any) -> None:
    r = cls(True)
    assert values(r) == {"success": True, "message_id": -1, "partition": -1, "offset": -1, "error": None,
                         "topic": "", "broker_id": -1}
    full = cls(True, MID, 3, 42, None, "orders", 1)
    assert values(full) == dict(zip(FIELDS, [True, MID, 3, 42, None, "orders", 1], strict=True))
    assert cls(**values(full)) == full
    assert cls(False, error=InvalidArgument("x"), topic="t").error.args == ("x",)
    with pytest.raises(TypeError):
        cls()  # success is required
    with pytest.raises(TypeError):
        cls(True, 1, 2, 3, None, "t", 4, "one too many")
    with pytest.raises(TypeError):
        cls(True, nope=1)
    assert cls.__match_args__ == tuple(FIELDS)
    match full:
        case cls(True, message_id, partition):  # positional patterns use __match_args__
            assert (message_id, partition) == (MID, 3)
        case _:
            pytest.fail("no match")


@pytest.mark.parametrize("cls", IMPLS)
def test_attributes_are_writable_and_deletable_and_there_are_no_others(cls: Any) -> None:
    r = cls(True, 1, 2, 3, None, "t", 4)
    r.offset = 99
    r.error = ValueError("late")
    r.topic = "u"
    assert (r.offset, r.topic, type(r.error)) == (99, "u", ValueError)
    del r.topic
    with pytest.raises(AttributeError):
        r.topic  # noqa: B018
    with pytest.raises(AttributeError):
        del r.topic
    with pytest.raises(AttributeError):
        r.something_else = 1
    with pytest.raises(TypeError):
        weakref.ref(r)  # slots: no weak references, as the dataclass


@pytest.mark.parametrize("cls", IMPLS)
def test_equality_is_the_dataclass_one_and_results_are_unhashable(cls: Any) -> None:
    a = cls(True, MID, 3, 42, None, "orders", 1)
    same = cls(True, MID, 3, 42, None, "orders", 1)
    assert (a == same) is True and (a != same) is False
    for name, other in [("success", False), ("message_id", MID + 1), ("partition", 4), ("offset", 43),
                        ("error", ValueError()), ("topic", "x"), ("broker_id", 2)]:
        b = dataclasses.replace(a, **{name: other})
        assert (a != b) is True and (a == b) is False, name
    assert a != (True, MID, 3, 42, None, "orders", 1)  # only the same class compares (NotImplemented otherwise)
    with pytest.raises(TypeError):
        a < a  # noqa: B015
    with pytest.raises(TypeError):
        hash(a)
    err = ValueError("same")
    assert cls(False, error=err) == cls(False, error=err)  # the same exception object
    assert cls(False, error=ValueError("a")) != cls(False, error=ValueError("a"))  # exceptions compare by identity


def test_the_two_implementations_do_not_compare_equal_to_each_other() -> None:
    if _speedups is None:
        pytest.skip("metaq._speedups not in use")
    assert _speedups.SendResult(True) != _PySendResult(True)  # different classes, as two dataclasses


@pytest.mark.parametrize("cls", IMPLS)
def test_repr_is_the_dataclass_one(cls: Any) -> None:
    r = cls(False, -1, 2, -1, InvalidArgument("no 'such' topic"), "or'ders", 7)
    expected = f"{cls.__qualname__}(" + ", ".join(f"{k}={v!r}" for k, v in values(r).items()) + ")"
    assert repr(r) == expected and str(r) == expected
    r.error = r  # a result inside itself: '...' as dataclasses' recursive repr
    assert repr(r).endswith("error=..., topic=\"or'ders\", broker_id=7)")
    r.error = None


@pytest.mark.parametrize("cls", IMPLS)
def test_partition_id_and_message_id_hex(cls: Any) -> None:
    r = cls(True, MID, 3, 42, None, "orders", 1)
    assert r.partition_id == PartitionId(1, 3) and type(r.partition_id) is PartitionId
    assert r.message_id_hex == format_message_id(MID) and len(r.message_id_hex) == 32
    assert cls(True, 0).message_id_hex == "0" * 32
    oneway = cls(True, topic="orders")
    assert oneway.message_id_hex == "-1"
    with pytest.raises(InvalidArgument):
        oneway.partition_id  # noqa: B018  (not stored anywhere: broker -1)
    with pytest.raises(AttributeError):
        r.partition_id = PartitionId(0, 0)  # a read-only property


@pytest.mark.parametrize("cls", IMPLS)
def test_pickle_copy_and_dataclasses_helpers(cls: Any) -> None:
    r = cls(True, MID, 3, 42, None, "orders", 1)
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(r, protocol))
        assert type(back) is cls and back == r
    assert copy.copy(r) == r and copy.deepcopy(r) == r and copy.copy(r) is not r
    assert dataclasses.is_dataclass(r) and [f.name for f in dataclasses.fields(r)] == FIELDS
    assert dataclasses.asdict(r) == values(r) and dataclasses.astuple(r) == tuple(values(r).values())
    assert dataclasses.replace(r, offset=43) == cls(True, MID, 3, 43, None, "orders", 1)
    failed = cls(False, error=InvalidArgument("bad"), topic="orders")
    back = pickle.loads(pickle.dumps(failed))
    assert type(back.error) is InvalidArgument and back.error.args == ("bad",) and back.topic == "orders"


@pytest.mark.skipif(_speedups is None, reason="metaq._speedups not in use")
def test_pickles_cross_between_the_implementations() -> None:
    """A result pickled by a process without the extension loads into the compiled one, and the other way."""
    code = ("import pickle, sys; from metaq.types import SendResult, SPEEDUPS; assert SPEEDUPS == {on}; "
            "r = pickle.loads(bytes.fromhex(sys.argv[1])); "
            "assert type(r) is SendResult and r == SendResult(True, {mid}, 3, 42, None, 'orders', 1), r; "
            "sys.stdout.write(pickle.dumps(r).hex())")
    compiled = _speedups.SendResult(True, MID, 3, 42, None, "orders", 1)
    env = {**os.environ, _compiled.NO_EXTENSIONS_ENV: "1"}
    from_python = subprocess.run([sys.executable, "-c", code.format(on=False, mid=MID), pickle.dumps(compiled).hex()],
                                 env=env, capture_output=True, text=True, check=True).stdout
    assert b"copyreg" in bytes.fromhex(from_python) or b"SendResult" in bytes.fromhex(from_python)
    back = pickle.loads(bytes.fromhex(from_python))  # the dataclass's own pickle form, (None, {slots}) state
    assert type(back) is _speedups.SendResult and back == compiled


@pytest.mark.skipif(_speedups is None, reason="metaq._speedups not in use")
def test_compiled_success_is_not_a_gc_object_and_a_failure_is() -> None:
    ok = _speedups.SendResult(True, MID, 3, 42, None, "orders", 1)
    assert not gc.is_tracked(ok) and gc.get_referents(ok) == []
    failed = _speedups.SendResult(False, error=ValueError("x"))
    assert gc.is_tracked(failed) and any(isinstance(o, ValueError) for o in gc.get_referents(failed))
    empty = _speedups.SendResult.__new__(_speedups.SendResult)  # fields set later: could get anything
    assert gc.is_tracked(empty)
    with pytest.raises(AttributeError):
        empty.topic  # noqa: B018
    assert not gc.is_tracked(copy.deepcopy(ok)) and not gc.is_tracked(pickle.loads(pickle.dumps(ok)))


class _Boom(Exception):
    pass


@pytest.mark.skipif(_speedups is None, reason="metaq._speedups not in use")
def test_compiled_failure_in_a_cycle_through_its_traceback_is_freed() -> None:
    """The failure's exception -> traceback -> frame -> locals -> the result: the collector frees it."""
    def fail() -> tuple[weakref.ref[_Boom], Any]:
        try:
            raise _Boom("lost connection")
        except _Boom as exc:
            result = _speedups.SendResult(False, error=exc, topic="t")
            return weakref.ref(exc), result

    gone, result = fail()
    assert result.error.__traceback__ is not None
    del result
    gc.collect()
    assert gone() is None


@pytest.mark.parametrize("cls", IMPLS)
def test_a_subclass_works(cls: Any) -> None:
    class Mine(cls):  # type: ignore[misc, valid-type]
        pass

    r = Mine(True, 1, 2, 3, None, "t", 4)
    assert isinstance(r, cls) and r.partition_id == PartitionId(4, 2)
    assert repr(r).startswith("Mine(success=True") or repr(r).startswith(
        "test_a_subclass_works.<locals>.Mine(success=True")
    assert r == Mine(True, 1, 2, 3, None, "t", 4) and r != cls(True, 1, 2, 3, None, "t", 4)
    del r
    gc.collect()


@pytest.mark.parametrize("base_id", [MID, -1])
def test_resolving_a_batch_gives_each_future_its_result_and_skips_cancelled_ones(base_id: int) -> None:
    """Waiter i gets id base+i and offset base+i (or -1 without ids), None slots are left alone, and a future its
    caller cancelled is skipped without stopping the pass; with the compiled SendResult a success is a plain
    object (the window of results is not the GC's work)."""
    from metaq.client.producer.results import ManyTable, resolve_batch

    async def main() -> None:
        loop = asyncio.get_running_loop()
        waiters: list[Any] = [loop.create_future() for _ in range(8)]
        waiters[3] = None
        waiters[5].cancel()
        resolve_batch(waiters, (2, 1000, base_id, None, "orders", 7), ManyTable())
        for i in (0, 1, 2, 4, 6, 7):
            r = waiters[i].result()
            assert type(r) is metaq.types.SendResult
            expected = (True, base_id + i, 2, 1000 + i, None, "orders", 7) if base_id >= 0 else (
                True, -1, 2, -1, None, "orders", 7)
            assert tuple(values(r).values()) == expected, i
            if metaq.types.SPEEDUPS:
                assert not gc.is_tracked(r)
        assert waiters[5].cancelled()

    asyncio.run(main())
