"""``Message(...)``: with metaq._speedups built, calling the class builds the instance in compiled code
(``bind_constructor``, the class's vectorcall) instead of running the dataclass ``__init__``. Every producer makes a
Message per send, so it must be exactly what the dataclass makes: the same fields and defaults (the very default
objects), the same TypeErrors with the same words (a call the __init__ refuses goes through it), and nothing
changed for subclasses, for ``Message.__init__`` called directly, or once somebody replaces ``Message.__init__``."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaq import types
from metaq.types import Message

FIELDS = [f.name for f in dataclasses.fields(Message)]
COMPILED = pytest.mark.skipif(not types.COMPILED_MESSAGE_CONSTRUCTOR, reason="metaq._speedups not in use")


def by_dataclass_init(*args: Any, **kwargs: Any) -> Message:
    """What the class call gives without the compiled constructor: a bare instance, then the dataclass __init__."""
    m = object.__new__(Message)
    Message.__init__(m, *args, **kwargs)
    return m


def outcome(make: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, Any]:
    try:
        m = make(*args, **kwargs)
    except TypeError as exc:
        return "TypeError", str(exc)
    assert type(m) is Message
    return "ok", [getattr(m, name) for name in FIELDS]


def test_the_compiled_constructor_is_in_use_when_the_extension_is() -> None:
    """CI builds metaq._speedups (METAQ_NO_SPEEDUPS unset): a silent fallback to __init__ would go unnoticed."""
    if types.SPEEDUPS and not os.environ.get("METAQ_NO_SPEEDUPS"):
        assert types.COMPILED_MESSAGE_CONSTRUCTOR
    else:
        assert not types.COMPILED_MESSAGE_CONSTRUCTOR


VALUES = st.sampled_from([None, -1, 0, 7, "t", b"d", b"", [("h", b"v")], 1 << 70])
NAMES = st.sampled_from([*FIELDS, "zz", "self", "Topic"])


@settings(max_examples=300, deadline=None)
@given(args=st.lists(VALUES, max_size=15), kwargs=st.dictionaries(NAMES, VALUES, max_size=5))
def test_any_call_gives_what_the_dataclass_init_gives(args: list[Any], kwargs: dict[str, Any]) -> None:
    """Positional and keyword arguments in any mix: the same fields, or the same TypeError word for word
    (missing, unexpected, repeated and too many arguments)."""
    got = outcome(Message, tuple(args), kwargs)
    assert got == outcome(by_dataclass_init, tuple(args), kwargs)
    if got[0] == "ok":  # the defaults are the dataclass's own objects, not equal copies
        made, expected = Message(*args, **kwargs), by_dataclass_init(*args, **kwargs)
        assert all(getattr(made, f) is getattr(expected, f) for f in FIELDS)


def test_the_errors_users_see_name_the_arguments() -> None:
    with pytest.raises(TypeError, match=r"^Message.__init__\(\) missing 2 required positional arguments: 'topic' and "
                                        r"'data'$"):
        Message()  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"missing 1 required positional argument: 'data'$"):
        Message("t")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"got an unexpected keyword argument 'payload'$"):
        Message("t", payload=b"x")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"got multiple values for argument 'topic'$"):
        Message("t", b"x", topic="u")  # type: ignore[misc]
    with pytest.raises(TypeError, match=r"takes from 3 to 14 positional arguments but 15 were given$"):
        Message(*range(14))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Message("t", b"x", **{1: 2})  # type: ignore[arg-type]


def test_messages_made_either_way_are_the_same_ordinary_objects() -> None:
    m = Message("t", b"d", key=b"k", delay_ms=5)
    assert m == by_dataclass_init("t", b"d", key=b"k", delay_ms=5)
    assert dataclasses.replace(m, topic="u") == Message("u", b"d", key=b"k", delay_ms=5)
    m.offset = 9
    assert m.offset == 9
    with pytest.raises(AttributeError):
        m.other = 1  # type: ignore[attr-defined]


def test_a_subclass_keeps_its_own_init() -> None:
    @dataclasses.dataclass(slots=True)
    class Tagged(Message):
        tag: str = "x"

    t = Tagged("t", b"d", tag="y")
    assert type(t) is Tagged and (t.topic, t.data, t.tag, t.offset) == ("t", b"d", "y", -1)

    class Plain(Message):
        __slots__ = ()

        def __init__(self, topic: str) -> None:
            super().__init__(topic, b"fixed")

    assert (Plain("t").topic, Plain("t").data) == ("t", b"fixed")


@COMPILED
def test_a_replaced_init_is_what_runs_afterwards() -> None:
    """The compiled constructor stands in for the dataclass __init__ only while the class is unchanged: an
    application (or a test double) that replaces Message.__init__ gets its own __init__ run. In a child process,
    because the class stays changed (the compiled constructor off) for the rest of that process."""
    code = """
import metaq.types as t
from metaq.types import Message
assert t.COMPILED_MESSAGE_CONSTRUCTOR
calls = []
original = Message.__init__
def init(self, *args, **kwargs):
    calls.append(args)
    original(self, *args, **kwargs)
Message.__init__ = init
m = Message("t", b"d")
assert calls == [("t", b"d")] and m.data == b"d", calls
Message.__init__ = original
assert Message("u", b"e", key=b"k").key == b"k"
print("ok")
"""
    env = {k: v for k, v in os.environ.items() if k != "METAQ_NO_SPEEDUPS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@COMPILED
def test_it_refuses_a_class_whose_init_differs_and_keeps_its_binding() -> None:
    from metaq import _speedups

    @dataclasses.dataclass(slots=True)
    class Other:
        topic: str
        data: bytes

    with pytest.raises(TypeError):
        _speedups.bind_constructor(Other)  # not the class bind_message bound
    assert Message("t", b"d").data == b"d"


@COMPILED
def test_no_reference_is_leaked_or_lost() -> None:
    payload, topic = b"p" * 100, "leak-check-topic"
    before = sys.getrefcount(payload), sys.getrefcount(topic)
    made = [Message(topic, payload, key=payload) for _ in range(1000)]
    assert sys.getrefcount(payload) == before[0] + 2000
    for bad in range(100):
        with pytest.raises(TypeError):
            Message(topic, payload, nope=bad)  # type: ignore[call-arg]
    del made
    assert (sys.getrefcount(payload), sys.getrefcount(topic)) == before
