"""Long polling: fetches waiting for data at the end of a partition, woken by appends."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from metaq.errors import TooManyRequestsError

log = logging.getLogger("metaq.broker")


class WaitOwner(Protocol):
    """Who a waiting fetch belongs to (a connection): counts its own waiting fetches."""

    waiting_fetches: int


class Waiter:
    """One waiting fetch: in the sets of the partitions it waits on while armed; it holds its waiting-fetch
    slots (and its timer) from :meth:`FetchWaiters.park` until :meth:`FetchWaiters.finish`."""

    __slots__ = ("armed", "finished", "keys", "on_wake", "owner", "timer")

    def __init__(self, keys: list[tuple[str, int]], owner: WaitOwner | None,
                 on_wake: Callable[[bool], None]) -> None:
        self.keys = keys
        self.owner = owner
        self.on_wake = on_wake
        """Called with ``timed_out``; the waiter is disarmed by then: finish it, or rearm it."""
        self.armed = False
        self.finished = False
        self.timer: asyncio.TimerHandle | None = None


class FetchWaiters:
    """Each waiting fetch is a :class:`Waiter` in its partitions' sets; an append wakes the set at once.

    Waking is per partition and costs one dict lookup per append when nobody waits. A woken waiter's
    callback runs inside ``notify`` (the append's own step): it answers its fetch then and there, or
    rearms when there is still nothing it may return (the high watermark has not moved, a MultiFetch's
    min_bytes). A fetch that ends another way (its timer, or cancelled because its connection closed)
    leaves the sets in O(1) each, so ten thousand polls of a closed connection are released in
    milliseconds.

    A waiter on several partitions (a MultiFetch) woken while a transport handles one read
    (:meth:`hold` ... :meth:`release`) is answered at the end of that read, still before the read's
    acks are written: the produces of one read (a producer's burst, one batch per partition) then
    leave in ONE reply, not the first partition now and the others a consumer round trip later. A
    single-partition waiter has nothing to gain from waiting and is answered inside the append.

    The number of waiting fetches is bounded twice: in all (``max_waiting``) and per owner, a
    connection (``max_waiting_per_owner``), so that one connection cannot take every slot. Past either
    limit a fetch gets TOO_MANY_REQUESTS instead of holding memory and a socket. A waiting fetch gives
    its slots back the moment it ends, times out or is cancelled (its connection closed).
    """

    def __init__(self, max_waiting: int, max_waiting_per_owner: int | None = None) -> None:
        self.max_waiting = max_waiting
        self.max_waiting_per_owner = min(max_waiting, max_waiting_per_owner or max_waiting)
        self.waiting = 0
        self._waiting: dict[tuple[str, int], set[Waiter]] = {}
        self._holding = 0
        self._held: list[Waiter] = []
        """Multi-partition waiters woken while holding: answered by :meth:`release`."""
        self._held_keys: set[tuple[str, int]] = set()
        """The partitions of the held waiters."""
        self._after_release: list[Callable[[], None]] = []
        """The ``answered`` callbacks of the notifies that held a waiter: called at the end of :meth:`release`."""

    def park(self, partitions: Iterable[tuple[str, int]], timeout_s: float, owner: WaitOwner | None,
             on_wake: Callable[[bool], None]) -> Waiter:
        """Wait on ``partitions`` (topic, partition): ``on_wake(False)`` at the first append to any of
        them (or ``notify_all``), ``on_wake(True)`` after ``timeout_s``. One waiter stands in every
        partition's set: a multi-partition fetch is one waiting fetch of its connection.

        Raises TooManyRequestsError past maxWaitingFetches or maxWaitingFetchesPerConnection."""
        if self.waiting >= self.max_waiting:
            raise TooManyRequestsError(f"{self.max_waiting} fetches are already waiting (maxWaitingFetches)")
        if owner is not None and owner.waiting_fetches >= self.max_waiting_per_owner:
            raise TooManyRequestsError(
                f"this connection already has {owner.waiting_fetches} fetches waiting "
                f"(maxWaitingFetchesPerConnection={self.max_waiting_per_owner}); spread long polls over "
                "more connections or wait for some to return")
        waiter = Waiter(list(dict.fromkeys(partitions)), owner, on_wake)
        waiter.timer = asyncio.get_running_loop().call_later(timeout_s, self._time_up, waiter)
        self.waiting += 1
        if owner is not None:
            owner.waiting_fetches += 1
        self.rearm(waiter)
        return waiter

    def rearm(self, waiter: Waiter) -> None:
        """Wait again (woken, but with nothing it may answer yet); its timer keeps running."""
        if waiter.armed or waiter.finished:
            return
        waiter.armed = True
        for key in waiter.keys:
            waiters = self._waiting.get(key)
            if waiters is None:
                waiters = self._waiting[key] = set()
            waiters.add(waiter)

    def finish(self, waiter: Waiter) -> None:
        """The fetch is answered (or cancelled): out of every set, timer stopped, slots given back."""
        if waiter.finished:
            return
        waiter.finished = True
        self._disarm(waiter)
        if waiter.timer is not None:
            waiter.timer.cancel()
            waiter.timer = None
        self.waiting -= 1
        if waiter.owner is not None:
            waiter.owner.waiting_fetches -= 1

    def _disarm(self, waiter: Waiter) -> None:
        if not waiter.armed:
            return
        waiter.armed = False
        for key in waiter.keys:
            waiters = self._waiting.get(key)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiting[key]

    def _wake(self, waiter: Waiter, timed_out: bool) -> None:
        if waiter.finished or (not waiter.armed and not timed_out):
            return
        self._disarm(waiter)
        try:
            waiter.on_wake(timed_out)
        except Exception:  # the callback answers its own errors; this is a safety net for the append
            log.exception("a waiting fetch's wake-up failed")
            self.finish(waiter)

    def _time_up(self, waiter: Waiter) -> None:
        waiter.timer = None
        self._wake(waiter, True)
        self.finish(waiter)  # whatever the callback did, the time is up

    async def wait(self, topic: str, partition: int, timeout_s: float, owner: WaitOwner | None = None) -> None:
        """Return when the partition is appended to, or after ``timeout_s``, whichever comes first."""
        await self.wait_any(((topic, partition),), timeout_s, owner)

    async def wait_any(self, partitions: Iterable[tuple[str, int]], timeout_s: float,
                       owner: WaitOwner | None = None) -> None:
        """Return when any of ``partitions`` (topic, partition) is appended to, or after ``timeout_s``:
        :meth:`park` for a coroutine (it resumes a loop step after the wake-up)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def woken(timed_out: bool) -> None:
            if not fut.done():
                fut.set_result(None)

        waiter = self.park(partitions, timeout_s, owner, woken)
        try:
            await fut
        finally:
            self.finish(waiter)

    def waiting_on(self, topic: str, partition: int) -> bool:
        """Whether a fetch waits on the partition now: an append to it would wake one, or one woken in this
        read (held, see :meth:`hold`) will read it when answered."""
        key = (topic, partition)
        return key in self._waiting or key in self._held_keys

    def notify(self, topic: str, partition: int, answered: Callable[[], None] | None = None) -> None:
        """An append (or a high watermark) moved: wake the partition's waiters, here and now (a
        multi-partition waiter, while holding: at :meth:`release`). ``answered`` is called once the waiters
        this woke have answered: before this returns, or at the end of :meth:`release` when one was held."""
        key = (topic, partition)
        waiters = self._waiting.pop(key, None)
        if waiters:
            for waiter in tuple(waiters):
                if self._holding and len(waiter.keys) > 1:
                    if waiter.armed and not waiter.finished:
                        self._disarm(waiter)
                        self._held.append(waiter)
                        self._held_keys.update(waiter.keys)
                    continue
                self._wake(waiter, False)
        if answered is not None:
            if key in self._held_keys:
                self._after_release.append(answered)
            else:
                answered()

    def hold(self) -> None:
        """A transport starts handling the requests of one read (calls nest; each needs its :meth:`release`)."""
        self._holding += 1

    def release(self) -> None:
        """The read is handled: answer the multi-partition waiters its appends woke, once each."""
        self._holding -= 1
        if self._holding or not self._held:
            return
        held, self._held = self._held, []
        after, self._after_release = self._after_release, []
        self._held_keys = set()
        try:
            for waiter in held:
                if waiter.finished:
                    continue
                waiter.armed = True  # as it was when woken: _wake disarms it again and calls it back
                self._wake(waiter, False)
        finally:
            for answered in after:
                answered()

    def notify_all(self) -> None:
        everyone, self._waiting = self._waiting, {}
        woken: dict[Waiter, None] = {}
        for waiters in everyone.values():
            woken.update(dict.fromkeys(waiters))
        for waiter in woken:
            self._wake(waiter, False)
