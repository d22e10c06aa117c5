"""Long polling: fetches waiting for data at the end of a partition, woken by appends."""

from __future__ import annotations

import asyncio

from metaq.errors import TooManyRequestsError


class FetchWaiters:
    """One future per partition that every waiting fetch shares; an append resolves it.

    Waking is per partition and costs one dict lookup per append when nobody waits. The total number of
    waiting fetches is bounded (``max_waiting``): past it a fetch gets TOO_MANY_REQUESTS instead of
    holding memory and a socket indefinitely.
    """

    def __init__(self, max_waiting: int) -> None:
        self.max_waiting = max_waiting
        self.waiting = 0
        self._futures: dict[tuple[str, int], asyncio.Future[None]] = {}

    async def wait(self, topic: str, partition: int, timeout_s: float) -> None:
        """Return when the partition is appended to, or after ``timeout_s``, whichever comes first."""
        if self.waiting >= self.max_waiting:
            raise TooManyRequestsError(f"{self.max_waiting} fetches are already waiting (maxWaitingFetches)")
        key = (topic, partition)
        fut = self._futures.get(key)
        if fut is None or fut.done():
            fut = asyncio.get_running_loop().create_future()
            self._futures[key] = fut
        self.waiting += 1
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except TimeoutError:
            pass
        finally:
            self.waiting -= 1

    def notify(self, topic: str, partition: int) -> None:
        fut = self._futures.pop((topic, partition), None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    def notify_all(self) -> None:
        for fut in self._futures.values():
            if not fut.done():
                fut.set_result(None)
        self._futures.clear()
