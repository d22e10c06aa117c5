"""The producer's compiled seam (docs/producer.md, "The compiled seam"): the deferred run of plain messages
(``PlainRun``) and a stored batch's results (``resolve_successes``), each held to its Python reference on the same
inputs -- what each takes or declines, the runs it hands over, the buffer's count, the hooks it calls and in which
order, the results each future gets. Run without the compiled module (METAQ_NO_EXTENSIONS=1), the reference alone is
checked against the specification below."""

from __future__ import annotations

import asyncio
import gc
import weakref
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaq import _compiled
from metaq.client.producer import plain_run, results
from metaq.client.producer.plain_run import PlainRunPy
from metaq.client.producer.results import resolve_successes_py
from metaq.types import Message, SendResult

_speedups = _compiled.speedups
compiled_only = pytest.mark.skipif(_speedups is None, reason="metaq._speedups not in use")

RUNS = [pytest.param(PlainRunPy, id="python"),
        pytest.param(getattr(_speedups, "PlainRun", None), id="compiled", marks=compiled_only)]
RESOLVERS = [pytest.param(resolve_successes_py, id="python"),
             pytest.param(getattr(_speedups, "resolve_successes", None), id="compiled", marks=compiled_only)]

OVERHEAD = 24
MAX_MESSAGE = 200
CAPACITY = 5
KEPT = {"a", "b"}
DIRECT = {"c": "partitions", "a": "partitions"}  # the placement's kept topics: a deferred one is deferred


@dataclass
class Buffer:
    limit: int
    used: int = 0


class Harness:
    """A run as the placement holds it: its hooks log what they are told, on_flush takes the run."""

    def __init__(self, impl: type[PlainRunPy], *, acks: int = 1, limit: int = 1000, flush_takes: bool = True) -> None:
        self.log: list[Any] = []
        self.buffer = Buffer(limit)
        self.futures = 0
        self.flush_takes = flush_takes
        self.run = impl(Message, KEPT, DIRECT, self.buffer, self.create_future, self.on_start, self.on_flush,
                        self.place_one, acks, MAX_MESSAGE, CAPACITY, OVERHEAD)

    def create_future(self) -> str:
        self.futures += 1
        return f"future {self.futures}"

    def on_start(self) -> None:
        self.log.append(("start", len(self.run)))

    def on_flush(self) -> None:
        self.log.append(("flush", self.run.take() if self.flush_takes else None))

    def place_one(self, topic: str, data: bytes, stamp: int, waiter: Any, size: int, acks: int) -> None:
        self.log.append(("place", topic, data, stamp, waiter, size, acks, len(self.run)))
        self.buffer.used += size  # the placement counts a placed message's bytes


def plain(topic: str = "a", data: bytes = b"x", **fields: Any) -> Message:
    return Message(topic, data, **fields)


# -- the specification, for both ----------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", RUNS)
def test_a_run_keeps_its_messages_columns_counts_their_bytes_and_hands_them_over_whole(impl: Any) -> None:
    h = Harness(impl)
    assert len(h.run) == 0 and not h.run
    assert h.run.add_async(plain(data=b"one")) == "future 1"
    assert h.log == [("start", 0)]  # the run's first message schedules its placement
    assert h.run.add_async(plain(data=b"two", timestamp_ms=7)) == "future 2"
    assert h.run.add_async(plain(data=b"three")) == "future 3"
    assert len(h.run) == 3 and h.buffer.used == 3 * OVERHEAD + 11
    assert h.run.take() == ("a", 1, [b"one", b"two", b"three"], [-1, 7, -1], ["future 1", "future 2", "future 3"],
                            3 * OVERHEAD + 11)
    assert len(h.run) == 0 and h.buffer.used == 3 * OVERHEAD + 11  # the placement takes the bytes over
    assert h.run.take() == ("", 0, [], None, [], 0)
    assert h.run.add_oneway(plain(data=b"ow"))
    assert h.run.take() == ("a", 0, [b"ow"], None, [], OVERHEAD + 2)  # one-way: no futures, no timestamps given


@pytest.mark.parametrize("impl", RUNS)
def test_another_topic_or_acks_places_the_run_first_and_a_full_run_is_placed(impl: Any) -> None:
    h = Harness(impl)
    h.run.add_async(plain("a", b"1"))
    h.run.add_async(plain("b", b"2"))  # another topic: the run so far goes first
    h.run.add_oneway(plain("b", b"3"))  # another acks: likewise
    assert h.log == [("start", 0), ("flush", ("a", 1, [b"1"], None, ["future 1"], OVERHEAD + 1)), ("start", 0),
                     ("flush", ("b", 1, [b"2"], None, ["future 2"], OVERHEAD + 1)), ("start", 0)]
    h.log.clear()
    for i in range(CAPACITY - 1):
        assert h.run.add_oneway(plain("b", b"%d" % i))
    assert h.log == [("flush", ("b", 0, [b"3", b"0", b"1", b"2", b"3"], None, [], 5 * OVERHEAD + 5))]
    assert len(h.run) == 0


@pytest.mark.parametrize("impl", RUNS)
@pytest.mark.parametrize("message", [
    pytest.param(plain("elsewhere"), id="a topic not kept"),
    pytest.param(plain(data=bytearray(b"x")), id="bytearray data"),
    pytest.param(plain(key=b"k"), id="a key"),
    pytest.param(plain(attribute="attr"), id="an attribute"),
    pytest.param(plain(headers=[("h", b"v")]), id="headers"),
    pytest.param(plain(deliver_at=10**13), id="deliver_at"),
    pytest.param(plain(delay_ms=5), id="delay_ms"),
    pytest.param(plain(timestamp_ms=True), id="a timestamp that is not an int"),
    pytest.param(plain(data=bytes(MAX_MESSAGE - OVERHEAD + 1)), id="over max_message_bytes"),
    pytest.param(("a", b"x"), id="not a Message"),
])
def test_what_is_not_the_common_case_is_declined_and_nothing_changes(impl: Any, message: Any) -> None:
    h = Harness(impl)
    h.run.add_async(plain())
    h.log.clear()
    assert h.run.add_async(message) is None
    assert h.run.add_oneway(message) is False
    assert h.log == [] and len(h.run) == 1 and h.buffer.used == OVERHEAD + 1 and h.futures == 1


@pytest.mark.parametrize("impl", RUNS)
def test_a_kept_topic_not_deferred_is_placed_at_once_after_the_run(impl: Any) -> None:
    """The direct case (a topic sent to once per event-loop step): checked, its future made, the run so far placed
    first, then the message handed to place_one, which counts its bytes."""
    h = Harness(impl)
    h.run.add_async(plain("a", b"1"))
    h.log.clear()
    assert h.run.add_async(plain("c", b"two", timestamp_ms=9)) == "future 2"
    assert h.log == [("flush", ("a", 1, [b"1"], None, ["future 1"], OVERHEAD + 1)),
                     ("place", "c", b"two", 9, "future 2", OVERHEAD + 3, 1, 0)]
    assert h.run.add_oneway(plain("c", b"3"))
    assert h.log[-1] == ("place", "c", b"3", -1, None, OVERHEAD + 1, 0, 0)
    assert len(h.run) == 0 and h.buffer.used == 3 * OVERHEAD + 5 and h.futures == 2
    assert h.run.add_async(plain("c", key=b"k")) is None  # not plain: the general path
    assert h.run.add_oneway(plain("c", data=bytes(MAX_MESSAGE))) is False


@pytest.mark.parametrize("impl", RUNS)
def test_a_subclass_of_message_is_declined(impl: Any) -> None:
    class Mine(Message):
        __slots__ = ()

    h = Harness(impl)
    assert h.run.add_async(Mine("a", b"x")) is None and not h.run


@pytest.mark.parametrize("impl", RUNS)
def test_the_buffer_limit_is_kept_and_a_message_larger_than_it_goes_alone(impl: Any) -> None:
    h = Harness(impl, limit=OVERHEAD + 10)
    assert h.run.add_oneway(plain(data=bytes(100)))  # nothing held: it goes, as BufferLimit.fits allows
    assert not h.run.add_oneway(plain(data=b"y"))  # the buffer is full: the caller reports it
    h.buffer.used = 0
    assert h.run.add_oneway(plain(data=b"y"))


@pytest.mark.parametrize("impl", RUNS)
def test_acks_zero_takes_no_async_send(impl: Any) -> None:
    h = Harness(impl, acks=0)
    assert h.run.add_async(plain()) is None and h.futures == 0
    assert h.run.add_oneway(plain())


@pytest.mark.parametrize("impl", RUNS)
def test_an_on_flush_that_does_not_take_the_run_is_an_error(impl: Any) -> None:
    h = Harness(impl, flush_takes=False)
    h.run.add_async(plain("a"))
    with pytest.raises(RuntimeError, match="on_flush did not take the run"):
        h.run.add_async(plain("b"))


@pytest.mark.parametrize("impl", RUNS)
def test_a_hook_that_raises_propagates(impl: Any) -> None:
    def boom() -> None:
        raise ValueError("boom")

    run = impl(Message, KEPT, DIRECT, Buffer(1000), boom, lambda: None, lambda: None, lambda *_: None, 1, MAX_MESSAGE,
               CAPACITY, OVERHEAD)
    with pytest.raises(ValueError, match="boom"):
        run.add_async(plain())


@pytest.mark.parametrize("impl", RUNS)
def test_a_run_in_a_reference_cycle_is_collected(impl: Any) -> None:
    """The placement holds the run and the run holds the placement's bound methods: the collector frees both."""

    class Holder:
        def hook(self) -> None:
            pass

    holder = Holder()
    holder.run = impl(Message, KEPT, DIRECT, Buffer(1000), holder.hook, holder.hook, holder.hook,  # type: ignore[attr-defined]
                      holder.hook, 1, MAX_MESSAGE, CAPACITY, OVERHEAD)
    holder.run.add_async(plain())  # type: ignore[attr-defined]
    gone = weakref.ref(holder)
    del holder
    gc.collect()
    assert gone() is None


# -- the compiled run is the reference's twin -----------------------------------------------------------------------

topics = st.sampled_from(["a", "b", "c", "elsewhere"])
messages = st.builds(
    Message, topics, st.one_of(st.binary(max_size=MAX_MESSAGE), st.just(bytearray(b"ba"))),
    key=st.sampled_from([None, None, None, b"k"]), attribute=st.sampled_from([None, None, None, "at"]),
    headers=st.sampled_from([None, None, [], (), [("h", b"v")]]), timestamp_ms=st.sampled_from([-1, -1, 0, 5, 2**70]),
    deliver_at=st.sampled_from([None, None, None, 10**13]), delay_ms=st.sampled_from([None, None, None, 3]))
operations = st.lists(st.one_of(st.tuples(st.sampled_from(["async", "oneway"]), messages), st.just(("take", None)),
                                st.tuples(st.just("release"), st.integers(0, 400))), max_size=40)


def replay(impl: Any, acks: int, limit: int, ops: list[tuple[str, Any]]) -> list[Any]:
    h = Harness(impl, acks=acks, limit=limit)
    out: list[Any] = []
    for op, arg in ops:
        if op == "async":
            out.append(("async", h.run.add_async(arg)))
        elif op == "oneway":
            out.append(("oneway", h.run.add_oneway(arg)))
        elif op == "take":
            out.append(("take", h.run.take()))
        else:
            h.buffer.used = max(0, h.buffer.used - arg)
        out.append((len(h.run), h.buffer.used, h.futures, list(h.log)))
    return out


@compiled_only
@settings(max_examples=300, deadline=None)
@given(acks=st.sampled_from([1, -1, 0]), limit=st.integers(1, 2000), ops=operations)
def test_the_compiled_run_does_what_the_reference_does(acks: int, limit: int, ops: list[tuple[str, Any]]) -> None:
    assert _speedups is not None
    assert replay(_speedups.PlainRun, acks, limit, ops) == replay(PlainRunPy, acks, limit, ops)


# -- resolve_successes ----------------------------------------------------------------------------------------------


def fields(r: Any) -> tuple[Any, ...]:
    return (r.success, r.message_id, r.partition, r.offset, r.error, r.topic, r.broker_id)


@pytest.mark.parametrize("resolve", RESOLVERS)
def test_each_future_gets_its_success_and_a_done_one_is_left_alone(resolve: Any) -> None:
    base_id = (1 << 112) | 42

    async def main() -> None:
        loop = asyncio.get_running_loop()
        waiters: list[Any] = [loop.create_future() for _ in range(6)]
        waiters[1] = None
        waiters[3].cancel()
        waiters[4].set_result("earlier")
        resolve(waiters, base_id, 1000, 2, "orders", 7)
        for i in (0, 2, 5):
            r = waiters[i].result()
            assert isinstance(r, SendResult)
            assert fields(r) == (True, base_id + i, 2, 1000 + i, None, "orders", 7)
        assert waiters[3].cancelled() and waiters[4].result() == "earlier"

    asyncio.run(main())


@pytest.mark.parametrize("resolve", RESOLVERS)
def test_a_set_result_failing_otherwise_propagates(resolve: Any) -> None:
    class Broken:
        def done(self) -> bool:
            return False

        def set_result(self, result: Any) -> None:
            raise KeyError("broken")

    with pytest.raises(KeyError):
        resolve([Broken()], 0, 0, 0, "t", 0)


class Recorder:
    """A future that records what it is given."""

    def __init__(self, done: bool) -> None:
        self.was_done = done
        self.got: Any = None

    def done(self) -> bool:
        return self.was_done

    def set_result(self, result: Any) -> None:
        import asyncio

        if self.was_done:
            raise asyncio.InvalidStateError("done")
        self.got = fields(result)


@compiled_only
@settings(max_examples=200, deadline=None)
@given(slots=st.lists(st.sampled_from(["future", "none", "done"]), max_size=30),
       base_id=st.sampled_from([0, 5, 2**64 - 3, (1 << 127) + 9]), base_offset=st.integers(0, 2**63 - 100),
       partition=st.integers(0, 1000), topic=st.text(max_size=5), broker_id=st.integers(-1, 100))
def test_the_compiled_pass_gives_what_the_reference_gives(slots: list[str], base_id: int, base_offset: int,
                                                         partition: int, topic: str, broker_id: int) -> None:
    assert _speedups is not None

    def run(resolve: Any) -> list[Any]:
        waiters = [None if s == "none" else Recorder(s == "done") for s in slots]
        resolve(waiters, base_id, base_offset, partition, topic, broker_id)
        return [None if w is None else w.got for w in waiters]

    assert run(_speedups.resolve_successes) == run(resolve_successes_py)


def test_the_compiled_twins_are_in_use_unless_the_module_is_off() -> None:
    compiled = _compiled.speedups is not None
    assert (plain_run.PlainRun is not PlainRunPy) == compiled
    assert (results.resolve_successes is not resolve_successes_py) == compiled
    assert compiled == _compiled.ENABLED
