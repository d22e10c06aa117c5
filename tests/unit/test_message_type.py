"""Message as users see it, for both implementations: the compiled type (metaq._speedups.Message, what
``metaq.types.Message`` is when the module is in use) and the dataclass (its one reference, and ``Message`` without the
module or under METAQ_NO_EXTENSIONS=1). Hypothesis draws constructions, values and operations and holds the two to
the same outcome: the same fields, or the same error (type and text); the same equality, repr, ``dataclasses``
helpers, copies and pickles; the same behaviour for instances built without ``__init__`` and for subclasses."""

from __future__ import annotations

import copy
import dataclasses
import gc
import inspect
import os
import pickle
import subprocess
import sys
import typing
import weakref
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import metaq
import metaq.types
from metaq import _compiled
from metaq.errors import InvalidArgument
from metaq.types import PartitionId, _PyMessage

_speedups = _compiled.speedups  # None without the module: the dataclass only
COMPILED: Any = getattr(_speedups, "Message", None)
needs_compiled = pytest.mark.skipif(_speedups is None, reason="metaq._speedups not in use")
IMPLS = [pytest.param(_PyMessage, id="python"), pytest.param(COMPILED, id="compiled", marks=needs_compiled)]

FIELDS = ["topic", "data", "attribute", "key", "headers", "timestamp_ms", "partition", "offset", "id",
          "append_time_ms", "broker_id", "deliver_at", "delay_ms"]
DEFAULTS = [None, None, None, None, None, -1, -1, -1, -1, -1, -1, None, None]
MID = (1 << 112) | (0xABCDEF << 64) | 42


def values(m: Any) -> list[Any]:
    return [getattr(m, name) for name in FIELDS]


def outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    """What ``fn()`` gives, comparable across the two classes: ("ok", value) or ("raise", type name, text), with the
    reference's class name (``_PyMessage`` while the compiled one is in use) written as ``Message``."""
    try:
        result = fn()
    except Exception as exc:
        return "raise", (type(exc).__name__, str(exc).replace("_PyMessage", "Message"))
    return "ok", result


def same(fn: Callable[[Any], Any]) -> tuple[str, Any]:
    """fn(cls)'s outcome for both classes, asserted equal (as reprs: a NaN unpickled is another object, unequal to
    itself); the reference's."""
    expected = outcome(lambda: fn(_PyMessage))
    if COMPILED is not None:
        got = outcome(lambda: fn(COMPILED))
        assert repr(got).replace("_PyMessage", "Message") == repr(expected).replace("_PyMessage", "Message")
    return expected


# Field values: what producers and consumers put there, plus odd things (a list that is not headers, a float that is
# not equal to itself, a Message) since the type checks nothing, as the dataclass.
nan = float("nan")
field_values = st.one_of(
    st.none(), st.integers(-(1 << 130), 1 << 130), st.text(max_size=8), st.binary(max_size=8), st.booleans(),
    st.lists(st.tuples(st.text(max_size=4), st.binary(max_size=4)), max_size=3), st.just(nan),
    st.sampled_from([(), b"", "", 0, -1, MID]))
arg_names = st.sampled_from([*FIELDS, "nope", "Topic", "partition_id"])


def build(cls: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    return cls(*args, **kwargs)


def test_the_compiled_one_is_what_users_get_unless_the_module_is_off() -> None:
    """Whether the module is in use at all is tests/unit/test_compiled.py's: here, that Message follows it."""
    if _speedups is None:
        assert metaq.types.Message is _PyMessage is metaq.Message and not metaq.types.SPEEDUPS
        assert _PyMessage.__qualname__ == "Message"
        return
    assert os.environ.get(_compiled.NO_EXTENSIONS_ENV, "") in ("", "0")
    assert metaq.types.SPEEDUPS
    assert metaq.types.Message is COMPILED is metaq.Message
    assert (COMPILED.__module__, COMPILED.__qualname__, COMPILED.__name__) == ("metaq.types", "Message", "Message")
    assert _PyMessage.__qualname__ == "_PyMessage"  # the reference's own instances pickle by its own name


@settings(max_examples=300, deadline=None)
@given(nargs=st.integers(0, 15), args=st.lists(field_values, min_size=15, max_size=15),
       kwargs=st.dictionaries(arg_names, field_values, max_size=6))
def test_any_construction_gives_the_same_fields_or_the_same_error(nargs: int, args: list[Any],
                                                                  kwargs: dict[str, Any]) -> None:
    kind, result = same(lambda cls: values(build(cls, args[:nargs], kwargs)))
    if kind == "ok":
        given_values = {**dict(zip(FIELDS, args[:nargs], strict=False)), **kwargs}
        assert result == [given_values.get(name, default) for name, default in zip(FIELDS, DEFAULTS, strict=True)]


@pytest.mark.parametrize("cls", IMPLS)
def test_the_constructor_errors_are_the_dataclass_ones(cls: Any) -> None:
    expected = [
        ((), {}, "Message.__init__() missing 2 required positional arguments: 'topic' and 'data'"),
        (("t",), {}, "Message.__init__() missing 1 required positional argument: 'data'"),
        ((), {"data": b""}, "Message.__init__() missing 1 required positional argument: 'topic'"),
        (tuple(range(14)), {}, "Message.__init__() takes from 3 to 14 positional arguments but 15 were given"),
        (("t", b""), {"nope": 1}, "Message.__init__() got an unexpected keyword argument 'nope'"),
        (("t", b""), {"topic": 1}, "Message.__init__() got multiple values for argument 'topic'"),
        (tuple(range(14)), {"nope": 1}, "Message.__init__() got an unexpected keyword argument 'nope'"),
        (("t",), {1: 2}, "keywords must be strings"),
    ]
    for args, kwargs, text in expected:
        with pytest.raises(TypeError) as info:
            cls(*args, **kwargs)
        assert str(info.value) == text, (args, kwargs)
    m = cls("t", b"")
    for args, kwargs, text in expected:  # __init__ called on an instance: the same checks
        with pytest.raises(TypeError) as info:
            cls.__init__(m, *args, **kwargs)
        assert str(info.value) == text, (args, kwargs)


@settings(max_examples=200, deadline=None)
@given(a=st.lists(field_values, min_size=13, max_size=13), b=st.lists(field_values, min_size=13, max_size=13),
       mix=st.lists(st.booleans(), min_size=13, max_size=13), name=st.sampled_from(FIELDS), value=field_values)
def test_equality_repr_replace_copy_and_pickle_are_the_same(a: list[Any], b: list[Any], mix: list[bool], name: str,
                                                            value: Any) -> None:
    b = [x if take else y for x, y, take in zip(a, b, mix, strict=True)]  # b shares some of a's values
    same(lambda cls: (cls(*a) == cls(*b), cls(*a) != cls(*b), cls(*a) == cls(*a), cls(*a) != cls(*a)))
    same(lambda cls: (cls(*a) == tuple(a), cls(*a).__eq__(tuple(a)), cls(*a).__eq__(cls(*b))))
    same(lambda cls: repr(cls(*a)).replace("_PyMessage", "Message"))
    same(lambda cls: str(cls(*b)).replace("_PyMessage", "Message"))
    same(lambda cls: values(dataclasses.replace(cls(*a), **{name: value})))
    same(lambda cls: (dataclasses.asdict(cls(*a)), dataclasses.astuple(cls(*a))))
    same(lambda cls: values(copy.copy(cls(*a))))
    same(lambda cls: values(copy.deepcopy(cls(*a))))
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        same(lambda cls: values(pickle.loads(pickle.dumps(cls(*a), protocol))))  # noqa: B023
    same(lambda cls: hash(cls(*a)))
    same(lambda cls: cls(*a) < cls(*b))
    same(lambda cls: cls(*a).partition_id)


@settings(max_examples=200, deadline=None)
@given(start=st.lists(field_values, min_size=13, max_size=13),
       ops=st.lists(st.tuples(st.sampled_from(["set", "del", "get"]), arg_names, field_values), max_size=10))
def test_fields_set_get_and_delete_the_same(start: list[Any], ops: list[tuple[str, str, Any]]) -> None:
    def run(cls: Any) -> list[tuple[str, Any]]:
        m = cls(*start)
        seen = []
        for op, name, value in ops:
            if op == "set":
                seen.append(outcome(lambda: setattr(m, name, value)))  # noqa: B023
            elif op == "del":
                seen.append(outcome(lambda: delattr(m, name)))  # noqa: B023
            else:
                seen.append(outcome(lambda: getattr(m, name)))  # noqa: B023
        seen.append(outcome(lambda: repr(m).replace("_PyMessage", "Message")))
        seen.append(outcome(lambda: m == cls(*start)))
        seen.append(outcome(lambda: values(copy.copy(m))))
        seen.append(outcome(lambda: pickle.loads(pickle.dumps(m)) == m))
        return seen

    same(run)


@pytest.mark.parametrize("cls", IMPLS)
def test_an_instance_built_without_init_has_its_fields_unset(cls: Any) -> None:
    """What the consumer's decoder starts from (Message.__new__(Message)), then sets each field of."""
    m = cls.__new__(cls)
    assert type(m) is cls and cls.__new__ is object.__new__
    with pytest.raises(AttributeError, match=r"^'(_Py)?Message' object has no attribute 'topic'$"):
        m.topic  # noqa: B018
    for protocol in (2, 5):
        assert not hasattr(pickle.loads(pickle.dumps(m, protocol)), "topic")
    for name, value in zip(FIELDS, ["t", b"x", *DEFAULTS[2:]], strict=True):
        setattr(m, name, value)
    assert m == cls("t", b"x")
    assert cls.__new__(cls, 1, x=2) is not None  # object.__new__ leaves the arguments to __init__, as the dataclass's


@settings(max_examples=100, deadline=None)
@given(a=st.lists(field_values, min_size=13, max_size=13), unset=st.sets(st.sampled_from(FIELDS)),
       unset_b=st.sets(st.sampled_from(FIELDS)))
def test_unset_fields_fail_the_same_way(a: list[Any], unset: set[str], unset_b: set[str]) -> None:
    def partial(cls: Any, missing: set[str]) -> Any:
        m = cls(*a)
        for name in missing:
            delattr(m, name)
        return m

    same(lambda cls: repr(partial(cls, unset)))
    same(lambda cls: partial(cls, unset) == partial(cls, unset_b))
    same(lambda cls: values(copy.copy(partial(cls, unset))) if not unset else sorted(
        n for n in FIELDS if hasattr(copy.copy(partial(cls, unset)), n)))
    same(lambda cls: dataclasses.replace(partial(cls, unset)) == cls(*a))


@pytest.mark.parametrize("cls", IMPLS)
def test_class_level_behaviour_is_the_dataclass_one(cls: Any) -> None:
    assert dataclasses.is_dataclass(cls) and [f.name for f in dataclasses.fields(cls)] == FIELDS
    assert [f.default for f in dataclasses.fields(cls)][2:] == DEFAULTS[2:]
    assert cls.__match_args__ == tuple(FIELDS) and cls.__slots__ == tuple(FIELDS)
    assert cls.__hash__ is None and cls.__doc__ == _PyMessage.__doc__
    assert typing.get_type_hints(cls) == typing.get_type_hints(_PyMessage)
    assert typing.get_type_hints(cls)["headers"] == list[tuple[str, bytes]] | None
    params = inspect.signature(cls).parameters.values()  # the compiled one's has no annotations
    assert [(p.name, p.kind, p.default) for p in params] == [
        (name, inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.empty if default is None and i < 2 else
         default) for i, (name, default) in enumerate(zip(FIELDS, DEFAULTS, strict=True))]
    for name in FIELDS:
        assert type(getattr(cls, name)).__name__ == "member_descriptor"  # what MessageBuilder and PlainRun use
    m = cls("orders", b"x", partition=3, broker_id=1)
    match m:
        case cls("orders", data, partition=3):
            assert data == b"x"
        case _:
            pytest.fail("no match")
    assert m.partition_id == PartitionId(1, 3) and type(m.partition_id) is PartitionId
    with pytest.raises(InvalidArgument):
        cls("t", b"").partition_id  # noqa: B018  (not read from a broker)
    with pytest.raises(AttributeError):
        m.partition_id = PartitionId(0, 0)
    with pytest.raises(AttributeError, match=r"^'(_Py)?Message' object has no attribute 'other'$"):
        m.other = 1
    with pytest.raises(TypeError):
        weakref.ref(m)
    with pytest.raises(TypeError, match=r"^unhashable type: '(_Py)?Message'$"):
        hash(m)
    cls.__init__(m, "again", b"y")  # __init__ on an instance sets every field again
    assert values(m) == ["again", b"y", *DEFAULTS[2:]]
    m.headers = [("h", b"v")]
    m.headers.append(("m", b"m"))  # every field is mutable, the headers list too
    assert m.headers == [("h", b"v"), ("m", b"m")]


def test_a_message_inside_itself_reprs_with_dots() -> None:
    for cls in (_PyMessage, COMPILED) if COMPILED is not None else (_PyMessage,):
        m = cls("t", b"x")
        m.headers = [("self", m)]
        assert repr(m).replace("_PyMessage", "Message").startswith(
            "Message(topic='t', data=b'x', attribute=None, key=None, headers=[('self', ...)], timestamp_ms=-1")
        m.headers = None


def subclasses(base: Any) -> tuple[Any, Any]:
    """A subclass with a __dict__ and a dataclass subclass with one more field, at module level (pickle finds them)."""
    suffix = "Py" if base is _PyMessage else "C"

    class WithDict(base):  # type: ignore[misc, valid-type]
        pass

    @dataclasses.dataclass(slots=True)
    class Extended(base):  # type: ignore[misc, valid-type]
        extra: int = 7

    for cls in (WithDict, Extended):
        cls.__qualname__ = cls.__name__ = cls.__name__ + suffix
        globals()[cls.__name__] = cls
    return WithDict, Extended


SUBCLASSES = {base: subclasses(base) for base in (_PyMessage, COMPILED) if base is not None}


@pytest.mark.parametrize("cls", IMPLS)
def test_subclasses_behave_as_the_dataclass_ones(cls: Any) -> None:
    class Slotted(cls):  # type: ignore[misc, valid-type]
        __slots__ = ()

    WithDict, Extended = SUBCLASSES[cls]

    class Upper(cls):  # type: ignore[misc, valid-type]
        """__init__ and == reach a subclass's fields through its attributes, as the dataclass's code does."""
        __slots__ = ()

        def __setattr__(self, name: str, value: Any) -> None:
            super().__setattr__(name, value.upper() if name == "topic" else value)

    s = Slotted("t", b"x")
    assert isinstance(s, cls) and type(s) is not cls and s == Slotted("t", b"x") and s != cls("t", b"x")
    assert repr(s).endswith("Slotted(topic='t', data=b'x', attribute=None, key=None, headers=None, timestamp_ms=-1, "
                            "partition=-1, offset=-1, id=-1, append_time_ms=-1, broker_id=-1, deliver_at=None, "
                            "delay_ms=None)")
    w = WithDict("t", b"x", key=b"k")
    w.note = "extra"
    for back in (pickle.loads(pickle.dumps(w)), copy.copy(w), copy.deepcopy(w)):
        assert type(back) is WithDict and back == w and back.note == "extra"
    assert Upper("abc", b"").topic == "ABC" and Upper("abc", b"") == Upper("ABC", b"")
    e = Extended("t", b"x", extra=9)
    assert [f.name for f in dataclasses.fields(e)] == [*FIELDS, "extra"] and e.extra == 9
    assert e == Extended("t", b"x", extra=9) and e != Extended("t", b"x") and values(e) == ["t", b"x", *DEFAULTS[2:]]
    assert pickle.loads(pickle.dumps(e)) == e
    with pytest.raises(TypeError, match=r"^Message\.__init__\(\) missing 1 required positional argument: 'data'$"):
        Slotted("t")
    del s, w, e
    gc.collect()


@needs_compiled
def test_the_compiled_message_is_collected_in_a_cycle() -> None:
    class Marker:
        pass

    m = COMPILED("t", b"x")
    m.headers = [("self", m), Marker()]
    gone = weakref.ref(m.headers[1])
    assert gc.is_tracked(m)
    del m
    gc.collect()
    assert gone() is None


@needs_compiled
def test_pickles_cross_between_the_implementations() -> None:
    """A Message pickled where the module is off (a Spark driver without it, say) loads into the compiled type, and
    the other way: both pickle as metaq.types.Message with the dataclass's state."""
    code = ("import pickle, sys; from metaq.types import Message, SPEEDUPS; assert SPEEDUPS == {on}; "
            "m = pickle.loads(bytes.fromhex(sys.argv[1])); "
            "assert type(m) is Message and m == Message('orders', b'x', key=b'k', headers=[('h', b'v')], "
            "id={mid}, broker_id=1), m; sys.stdout.write(pickle.dumps(m).hex())")
    m = COMPILED("orders", b"x", key=b"k", headers=[("h", b"v")], id=MID, broker_id=1)
    env = {**os.environ, _compiled.NO_EXTENSIONS_ENV: "1"}
    from_python = subprocess.run([sys.executable, "-c", code.format(on=False, mid=MID), pickle.dumps(m).hex()],
                                 env=env, capture_output=True, text=True, check=True).stdout
    assert bytes.fromhex(from_python) == pickle.dumps(m)  # the same bytes: the same reduce and state
    back = pickle.loads(bytes.fromhex(from_python))
    assert type(back) is COMPILED and back == m
