"""Long polling: fetches waiting for data at the end of a partition, woken by appends."""

from __future__ import annotations

import asyncio
from typing import Protocol

from metaq.errors import TooManyRequestsError


class WaitOwner(Protocol):
    """Who a waiting fetch belongs to (a connection): counts its own waiting fetches."""

    waiting_fetches: int


class FetchWaiters:
    """One future per partition that every waiting fetch shares; an append resolves it.

    Waking is per partition and costs one dict lookup per append when nobody waits. The number of
    waiting fetches is bounded twice: in all (``max_waiting``) and per owner, a connection
    (``max_waiting_per_owner``), so that one connection cannot take every slot. Past either limit a
    fetch gets TOO_MANY_REQUESTS instead of holding memory and a socket. A waiting fetch gives its slots
    back the moment it ends, times out or is cancelled (its connection closed).
    """

    def __init__(self, max_waiting: int, max_waiting_per_owner: int | None = None) -> None:
        self.max_waiting = max_waiting
        self.max_waiting_per_owner = min(max_waiting, max_waiting_per_owner or max_waiting)
        self.waiting = 0
        self._futures: dict[tuple[str, int], asyncio.Future[None]] = {}

    async def wait(self, topic: str, partition: int, timeout_s: float, owner: WaitOwner | None = None) -> None:
        """Return when the partition is appended to, or after ``timeout_s``, whichever comes first."""
        if self.waiting >= self.max_waiting:
            raise TooManyRequestsError(f"{self.max_waiting} fetches are already waiting (maxWaitingFetches)")
        if owner is not None and owner.waiting_fetches >= self.max_waiting_per_owner:
            raise TooManyRequestsError(
                f"this connection already has {owner.waiting_fetches} fetches waiting "
                f"(maxWaitingFetchesPerConnection={self.max_waiting_per_owner}); spread long polls over "
                "more connections or wait for some to return")
        key = (topic, partition)
        fut = self._futures.get(key)
        if fut is None or fut.done():
            fut = asyncio.get_running_loop().create_future()
            self._futures[key] = fut
        self.waiting += 1
        if owner is not None:
            owner.waiting_fetches += 1
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except TimeoutError:
            pass
        finally:
            self.waiting -= 1
            if owner is not None:
                owner.waiting_fetches -= 1

    def notify(self, topic: str, partition: int) -> None:
        fut = self._futures.pop((topic, partition), None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    def notify_all(self) -> None:
        for fut in self._futures.values():
            if not fut.done():
                fut.set_result(None)
        self._futures.clear()
