"""FetchWaiters: long polls woken by appends, bounded in all and per connection, released when cancelled."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from metaq.broker.waiters import FetchWaiters
from metaq.errors import TooManyRequestsError
from metaq.testing import until


@dataclass
class Owner:
    waiting_fetches: int = 0


def test_limits_in_all_and_per_owner_and_release_on_cancel() -> None:
    async def scenario() -> None:
        waiters = FetchWaiters(max_waiting=5, max_waiting_per_owner=3)
        a, b = Owner(), Owner()
        polls = [asyncio.ensure_future(waiters.wait("t", 0, 600, a)) for _ in range(3)]
        await until(lambda: a.waiting_fetches == 3, 5, message="a's three polls to wait")
        with pytest.raises(TooManyRequestsError, match="maxWaitingFetchesPerConnection=3"):
            await waiters.wait("t", 0, 600, a)
        others = [asyncio.ensure_future(waiters.wait("t", 1, 600, b)) for _ in range(2)]
        await until(lambda: b.waiting_fetches == 2, 5, message="b's two polls to wait")
        assert (waiters.waiting, a.waiting_fetches, b.waiting_fetches) == (5, 3, 2)
        with pytest.raises(TooManyRequestsError, match="maxWaitingFetches"):
            await waiters.wait("t", 2, 600, Owner())
        for poll in polls:  # what closing a connection does
            poll.cancel()
        await asyncio.gather(*polls, return_exceptions=True)
        assert (waiters.waiting, a.waiting_fetches) == (2, 0)
        waiters.notify("t", 1)
        await asyncio.gather(*others)
        assert waiters.waiting == 0 and b.waiting_fetches == 0
        await asyncio.wait_for(waiters.wait("t", 0, 0.01, a), 10)  # its own timer ends it
        assert waiters.waiting == 0

    asyncio.run(scenario())


def test_a_notify_wakes_only_that_partition_and_notify_all_wakes_everyone() -> None:
    async def scenario() -> None:
        waiters = FetchWaiters(max_waiting=100)
        p0 = [asyncio.ensure_future(waiters.wait("t", 0, 600)) for _ in range(3)]
        p1 = asyncio.ensure_future(waiters.wait("t", 1, 600))
        await until(lambda: waiters.waiting == 4, 5, message="the four polls to wait")
        waiters.notify("t", 0)
        waiters.notify("t", 9)  # nobody waits there
        await asyncio.gather(*p0)
        assert not p1.done() and waiters.waiting == 1
        waiters.notify_all()
        await p1
        assert waiters.waiting == 0

    asyncio.run(scenario())


def test_one_waiter_on_many_partitions_wakes_on_any_and_leaves_every_list() -> None:
    async def scenario() -> None:
        waiters = FetchWaiters(max_waiting=10, max_waiting_per_owner=10)
        owner = Owner()
        poll = asyncio.ensure_future(waiters.wait_any([("t", p) for p in range(1000)], 600, owner))
        await until(lambda: waiters.waiting, 5, message="the poll to wait")
        # a 1000-partition long poll is ONE waiting fetch of its connection
        assert (waiters.waiting, owner.waiting_fetches) == (1, 1)
        waiters.notify("t", 777)
        await asyncio.wait_for(poll, 5)
        assert (waiters.waiting, owner.waiting_fetches) == (0, 0)
        assert waiters._waiting == {}  # gone from the other 999 partitions' lists too

        # cancelled (its connection closed): the same
        poll = asyncio.ensure_future(waiters.wait_any([("t", 1), ("u", 2), ("t", 1)], 600, owner))
        await until(lambda: waiters.waiting, 5, message="the poll to wait")
        poll.cancel()
        await asyncio.gather(poll, return_exceptions=True)
        assert (waiters.waiting, owner.waiting_fetches, waiters._waiting) == (0, 0, {})

    asyncio.run(scenario())


def test_a_parked_waiter_is_woken_inside_notify_can_rearm_and_its_timer_ends_it() -> None:
    async def scenario() -> None:
        waiters = FetchWaiters(max_waiting=10)
        owner = Owner()
        woken: list[bool] = []

        def on_wake(timed_out: bool) -> None:
            woken.append(timed_out)
            if not timed_out and len(woken) == 1:
                waiters.rearm(waiter)  # nothing it may answer yet (a high watermark that did not move)

        waiter = waiters.park([("t", 0), ("t", 1)], 0.05, owner, on_wake)
        waiters.notify("t", 1)
        assert woken == [False]  # called in notify itself, not a loop step later
        assert (waiters.waiting, owner.waiting_fetches, set(waiters._waiting)) == (1, 1, {("t", 0), ("t", 1)})
        waiters.notify("t", 0)
        assert woken == [False, False] and waiters._waiting == {}  # not rearmed: out of every set
        assert waiters.waiting == 1  # the slot is held until the fetch is finished (or its time is up)
        await until(lambda: waiters.waiting == 0, 5, message="its timer to end it")
        assert woken == [False, False, True] and (waiters.waiting, owner.waiting_fetches) == (0, 0)

    asyncio.run(scenario())


def test_a_multi_partition_waiter_woken_during_a_read_is_answered_once_at_its_end() -> None:
    async def scenario() -> None:
        waiters = FetchWaiters(max_waiting=10)
        calls: list[str] = []
        multi = waiters.park([("t", 0), ("t", 1), ("t", 2)], 600, None, lambda timed_out: calls.append("multi"))
        single = waiters.park([("t", 1)], 600, None, lambda timed_out: calls.append("single"))
        waiters.hold()  # a transport handles one read: three produces, to partitions 0, 1 and 2
        waiters.notify("t", 0)
        waiters.notify("t", 1)
        assert calls == ["single"]  # a single-partition fetch is answered inside its append
        waiters.notify("t", 2)
        waiters.release()
        assert calls == ["single", "multi"]  # once, with what the whole read appended
        waiters.finish(multi)
        waiters.finish(single)
        assert waiters.waiting == 0

        # a waiter that rearms (nothing it may see yet) is in its partitions' sets again, and finished while
        # held (its connection closed during the read) it is never called back
        rearmed = waiters.park([("t", 0), ("t", 1)], 600, None, lambda timed_out: waiters.rearm(rearmed))
        waiters.hold()
        waiters.notify("t", 0)
        waiters.release()
        assert rearmed.armed and not rearmed.finished
        dropped = waiters.park([("u", 0), ("u", 1)], 600, None, lambda timed_out: calls.append("dropped"))
        waiters.hold()
        waiters.notify("u", 1)
        waiters.finish(dropped)
        waiters.release()
        assert calls == ["single", "multi"]
        waiters.finish(rearmed)
        assert waiters.waiting == 0

    asyncio.run(scenario())


def test_an_appends_answered_callback_runs_once_its_woken_waiters_have_answered() -> None:
    """notify's ``answered`` (the broker drops the batch it kept in memory for the woken fetches): called
    inside notify when every waiter it woke answered there, at the end of the read when one is held; and
    a partition some held waiter covers counts as waited on until then (its next append is kept too)."""
    async def scenario() -> None:
        waiters = FetchWaiters(max_waiting=10)
        events: list[str] = []
        assert not waiters.waiting_on("t", 0)
        waiters.notify("t", 0, lambda: events.append("nobody waited"))
        assert events == ["nobody waited"]
        waiters.park([("t", 0)], 600, None, lambda timed_out: events.append("single"))
        multi = waiters.park([("t", 1), ("t", 2)], 600, None, lambda timed_out: events.append("multi"))
        assert [waiters.waiting_on("t", p) for p in range(4)] == [True, True, True, False]
        waiters.hold()
        waiters.notify("t", 0, lambda: events.append("answered 0"))
        assert events[1:] == ["single", "answered 0"]
        waiters.notify("t", 1, lambda: events.append("answered 1"))
        assert waiters.waiting_on("t", 2) and not waiters.waiting_on("t", 0)  # held, not in any set now
        waiters.notify("t", 2, lambda: events.append("answered 2"))
        assert events[3:] == []
        waiters.release()
        assert events[3:] == ["multi", "answered 1", "answered 2"]
        assert not waiters.waiting_on("t", 2)
        waiters.finish(multi)

    asyncio.run(scenario())
