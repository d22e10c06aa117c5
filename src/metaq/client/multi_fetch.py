"""MultiFetch batching: the fetches of one broker's partitions sent together over one connection.

A consumer that owns many partitions of a broker gives each its own worker (fetch, deliver, fetch
again, in offset order). With :class:`BrokerFetcher` the workers hand their fetches to their broker's
fetcher, which sends them together as MultiFetch requests (:meth:`~metaq.client.fetcher.Fetcher.fetch_many`)
and long-polls on all of them at once; each worker still gets only its own partition's result, so
what it does with it is unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from metaq.client.fetcher import DEFAULT_MULTI_FETCH_MAX_BYTES, Fetcher, FetchResult
from metaq.client.metadata import Partition
from metaq.net.connection import BrokerConnection

MULTI_FETCHES_IN_FLIGHT_MAX = 16
"""MultiFetch requests one consumer keeps in flight per broker; partitions asked meanwhile wait for one to
return. Several are needed: a long poll over idle partitions must not hold up a partition that was just
delivered and has more to read."""
MULTI_FETCH_PARTITIONS_PER_REQUEST = 2000
"""Partitions per MultiFetch request (more queued wait for the next)."""

_Wanted = tuple[str, Partition, int, int, "asyncio.Future[FetchResult]"]
"""(topic, partition, offset, max bytes, the asking worker's future)."""


class BrokerFetcher:
    """The fetches of one broker's partitions, sent together as MultiFetch requests over one connection.

    A worker calls :meth:`fetch` and awaits its own partition's result. Partitions asked in the same
    event-loop step go in one request; while MULTI_FETCHES_IN_FLIGHT_MAX requests are out, more wait.
    A partition is in at most one request at a time (its worker waits for it), so per-partition order
    is kept. A failure of the whole request (the connection lost, a broker limit) is every worker's
    failure: each handles it as it would a single fetch's.

    ``connect()`` returns the connection to fetch over (MultiFetch replies may overtake others on it, so
    it may be shared with other requests); ``max_wait_ms`` is the long poll (0: none).
    """

    def __init__(self, fetcher: Fetcher, broker_id: int, connect: Callable[[], Awaitable[BrokerConnection]], *,
                 max_wait_ms: int, group: str) -> None:
        self.fetcher = fetcher
        self.broker_id = broker_id
        self.connect = connect
        self.max_wait_ms = max_wait_ms
        self.group = group
        self.queue: list[_Wanted] = []
        self.in_flight = 0
        self.requests = 0
        """MultiFetch requests sent (for tests and the benchmark)."""
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()

    def fetch(self, topic: str, part: Partition, offset: int, max_bytes: int) -> asyncio.Future[FetchResult]:
        fut: asyncio.Future[FetchResult] = asyncio.get_running_loop().create_future()
        self.queue.append((topic, part, offset, max_bytes, fut))
        self._schedule()
        return fut

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._send)

    def _send(self) -> None:
        self._scheduled = False
        while self.queue and self.in_flight < MULTI_FETCHES_IN_FLIGHT_MAX:
            batch = [entry for entry in self.queue[:MULTI_FETCH_PARTITIONS_PER_REQUEST] if not entry[4].done()]
            del self.queue[:MULTI_FETCH_PARTITIONS_PER_REQUEST]
            if not batch:
                continue
            self.in_flight += 1
            task = asyncio.ensure_future(self._run(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: list[_Wanted]) -> None:
        try:
            conn = await self.connect()
            wanted = [(topic, part, offset, max_bytes) for topic, part, offset, max_bytes, _f in batch]
            self.requests += 1
            results = await self.fetcher.fetch_many(
                conn, wanted, max_wait_ms=self.max_wait_ms,
                max_bytes=max(DEFAULT_MULTI_FETCH_MAX_BYTES, max(entry[3] for entry in batch)), group=self.group,
                columns=True)
        except Exception as exc:  # every worker of the batch handles it (retries, backs off)
            for *_w, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
                    fut.exception()  # a worker that gave up never retrieves it
            return
        finally:
            self.in_flight -= 1
            if self.queue:
                self._schedule()
        for (*_w, fut), result in zip(batch, results, strict=True):
            if fut.done():
                continue  # the worker stopped (its partition was revoked): nothing was delivered
            if isinstance(result, BaseException):
                fut.set_exception(result)
                fut.exception()
            else:
                fut.set_result(result)

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for *_w, fut in self.queue:
            if not fut.done():
                fut.cancel()
        self.queue.clear()


__all__ = ["MULTI_FETCHES_IN_FLIGHT_MAX", "MULTI_FETCH_PARTITIONS_PER_REQUEST", "BrokerFetcher"]
