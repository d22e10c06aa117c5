"""Connections to brokers: one shared connection per (broker address, channel), reopened on demand.

Replies on a connection come back in request order, so one slow request (a long-polling fetch) holds
back every reply behind it. Callers keep such traffic apart with *channels*: the client's producers
send on ``"produce"``, short requests (metadata, admin, offsets, non-waiting fetches) go on
``"default"``, and a long-polling iterator gets a connection of its own (:meth:`ConnectionPool.connect`).

A closed connection is not reopened in the background: the next request that needs it reconnects,
with the pool's :class:`~metaq.net.retry.RetryPolicy` (the client's: ``reconnect_attempts`` attempts,
exponential backoff with jitter) before it fails.

The pool also knows the servers it was given (:class:`~metaq.net.discovery.ServerBook`): every
connection it opens to one of them records the broker id that answered there, and it walks them for
the first that answers (:meth:`ConnectionPool.first_answering`) or reaches all that have not answered
yet (:meth:`ConnectionPool.reach`), which is how a standalone broker's id is found.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

from metaq.errors import ClientClosedError, ConnectionClosedError, DuplicateBrokerIdError, MetaqError
from metaq.net.codec import ConnectionSettings
from metaq.net.connection import BrokerConnection, ThrottleStats
from metaq.net.discovery import WALK_ERRORS, ServerBook, WalkFailures
from metaq.net.retry import Random, RetryPolicy
from metaq.net.servers import Address


class ConnectionPool:
    """Connections opened with ``settings``, retried under ``retry``; ``servers``: the bootstrap list."""

    def __init__(self, settings: ConnectionSettings, retry: RetryPolicy, servers: Sequence[Address] = (), *,
                 rand: Random = random.random) -> None:
        self.settings = settings
        self.retry = retry
        self.servers = ServerBook(servers)
        self._conns: dict[tuple[Address, str], BrokerConnection] = {}
        self._connecting: dict[tuple[Address, str], asyncio.Task[BrokerConnection]] = {}
        self._dedicated: set[BrokerConnection] = set()
        self._rand = rand
        self._closed = False
        self.throttle = ThrottleStats()
        """Quota throttles over every connection of the pool (``metaq.net.connection.ThrottleStats``)."""

    def cached(self, address: Address, channel: str = "default") -> BrokerConnection | None:
        """The open shared connection, if there is one (no I/O)."""
        conn = self._conns.get((address, channel))
        return conn if conn is not None and not conn.closed else None

    async def get(self, address: Address, channel: str = "default") -> BrokerConnection:
        """The shared connection for ``address`` and ``channel``, connecting (with retries) if needed."""
        key = (address, channel)
        conn = self._conns.get(key)
        if conn is not None and not conn.closed:
            return conn
        if self._closed:
            raise ClientClosedError("the session is closed")
        task = self._connecting.get(key)
        if task is None:
            task = asyncio.ensure_future(self._open(address))
            self._connecting[key] = task
            task.add_done_callback(lambda t: self._connected(key, t))
        # Shielded: one caller giving up must not cancel the attempt others wait on.
        return await asyncio.shield(task)

    def _connected(self, key: tuple[Address, str], task: asyncio.Task[BrokerConnection]) -> None:
        if self._connecting.get(key) is task:
            del self._connecting[key]
        if task.cancelled() or task.exception() is not None:
            return
        conn = task.result()
        if self._closed:
            conn.close()
            return
        self._conns[key] = conn

    async def connect(self, address: Address) -> BrokerConnection:
        """A new connection of the caller's own (with retries); the caller closes it."""
        if self._closed:
            raise ClientClosedError("the session is closed")
        conn = await self._open(address)
        self._dedicated.add(conn)
        conn.on_close(self._dedicated.discard)
        return conn

    async def _open(self, address: Address) -> BrokerConnection:
        backoff = self.retry.start(rand=self._rand)
        while True:
            if self._closed:
                raise ClientClosedError("the session is closed")
            try:
                conn = await BrokerConnection.open(address, self.settings)
            except ConnectionClosedError as exc:
                delay = backoff.next_delay_s()
                if delay is None:
                    raise ConnectionClosedError(f"{exc} (gave up after {backoff.failures} attempts)") from exc
                await asyncio.sleep(delay)
                continue
            try:
                self.servers.learn(address, conn.broker_id)
            except DuplicateBrokerIdError:
                conn.close()
                raise
            conn.throttle = self.throttle
            return conn

    async def first_answering(self, addresses: Sequence[Address] | None = None, channel: str = "default", *,
                              failed: Sequence[MetaqError] = ()) -> tuple[Address, BrokerConnection]:
        """The first of ``addresses`` (default: every server, in order) whose shared connection can be had.

        A server that cannot be reached or refuses the connection is passed over; when none answers,
        the error names each, after the ``failed`` attempts the caller made before
        (:class:`~metaq.net.discovery.WalkFailures`).
        """
        failures = WalkFailures(self.servers.text)
        for exc in failed:
            failures.add(exc)
        for address in self.servers.servers if addresses is None else addresses:
            try:
                return address, await self.get(address, channel)
            except WALK_ERRORS as exc:
                failures.add(exc)
        raise failures.error()

    async def reach(self, addresses: Sequence[Address]) -> list[BrokerConnection | BaseException]:
        """The shared default connection of each address, all opened at once (their broker ids are
        learnt); a failure is returned in its place, not raised."""
        return list(await asyncio.gather(*(self.get(a) for a in addresses), return_exceptions=True))

    def close(self) -> None:
        self._closed = True
        for task in self._connecting.values():
            task.cancel()
        self._connecting.clear()
        for conn in list(self._conns.values()) + list(self._dedicated):
            conn.close()
        self._conns.clear()
        self._dedicated.clear()
