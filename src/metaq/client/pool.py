"""Connections to brokers: one shared connection per (broker address, channel), reopened on demand.

Replies on a connection come back in request order, so one slow request (a long-polling fetch) holds
back every reply behind it. Callers keep such traffic apart with *channels*: the producer sends on
``"produce"``, short requests (metadata, admin, offsets, non-waiting fetches) on ``"default"``, and a
long-polling iterator gets a connection of its own (:meth:`ConnectionPool.connect`).

A closed connection is not reopened in the background: the next request that needs it reconnects,
trying ``reconnect_attempts`` times with exponential backoff and jitter before it fails.
"""

from __future__ import annotations

import asyncio
import random

from metaq.client.config import ClientConfig
from metaq.client.connection import BrokerConnection
from metaq.client.exceptions import ClientClosedError
from metaq.errors import ConnectionClosedError
from metaq.net.retry import Random
from metaq.net.servers import Address


class ConnectionPool:
    def __init__(self, config: ClientConfig, *, rand: Random = random.random) -> None:
        self.config = config
        self._conns: dict[tuple[Address, str], BrokerConnection] = {}
        self._connecting: dict[tuple[Address, str], asyncio.Task[BrokerConnection]] = {}
        self._dedicated: set[BrokerConnection] = set()
        self._rand = rand
        self._closed = False

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
        cfg = self.config
        backoff = cfg.reconnect_retry().start(rand=self._rand)
        while True:
            if self._closed:
                raise ClientClosedError("the session is closed")
            try:
                return await BrokerConnection.open(
                    address[0], address[1], client_id=cfg.client_id, connect_timeout_s=cfg.connect_timeout_s,
                    request_timeout_s=cfg.request_timeout_s, max_in_flight=cfg.max_in_flight,
                    max_frame_bytes=cfg.max_frame_bytes, write_buffer_high_bytes=cfg.write_buffer_high_bytes)
            except ConnectionClosedError as exc:
                delay = backoff.next_delay_s()
                if delay is None:
                    raise ConnectionClosedError(f"{exc} (gave up after {backoff.failures} attempts)") from exc
            await asyncio.sleep(delay)

    def close(self) -> None:
        self._closed = True
        for task in self._connecting.values():
            task.cancel()
        self._connecting.clear()
        for conn in list(self._conns.values()) + list(self._dedicated):
            conn.close()
        self._conns.clear()
        self._dedicated.clear()
