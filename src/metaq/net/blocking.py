"""Blocking connections to brokers: one plain socket each, driving the sans-IO codec, and their pool.

The blocking twin of :mod:`metaq.net.connection` and :mod:`metaq.net.pool`, for places where an event
loop is a nuisance: Spark executors (one short task, one thread, forked Python workers), scripts and
tests. It drives the same :class:`~metaq.protocol.codec.ClientConnection` with the same settings,
handshake and error replies (:mod:`metaq.net.codec`), so it behaves as the asyncio connection does:

- replies are matched to requests strictly in order; a reply that does not match (or does not decode)
  closes the connection with ConnectionClosedError, as does a broken socket;
- a reply later than ``request_timeout_s`` is RequestTimeoutError, and the connection is closed (every
  reply behind it would be late too);
- requests are written ahead of their replies only up to ``max_in_flight`` (the codec refuses more);
- a broker that refuses the connection for being full raises TooManyConnectionsError, and
  :meth:`BlockingPool.first_answering` passes it over for the next server.

Pipelining is "write several frames, then read as many replies": :meth:`BlockingConnection.send` and
:meth:`BlockingConnection.receive`. Nothing here is thread-safe: one pool per thread. This module
imports no asyncio.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import time
from collections.abc import Sequence
from typing import Any

from metaq.errors import ConnectionClosedError, DuplicateBrokerIdError, MetaqError, ProtocolError, RequestTimeoutError
from metaq.net.codec import (
    ConnectionSettings,
    agree_versions,
    authenticate,
    handshake_request,
    handshake_versions,
    plaintext_hint,
    raise_for_error,
)
from metaq.net.discovery import WALK_ERRORS, ServerBook, WalkFailures
from metaq.net.servers import Address, format_address
from metaq.net.tls import describe_tls_error, wrap_socket
from metaq.protocol.codec import ClientConnection, ResponseEvent
from metaq.protocol.messages import ApiVersionsResponse


class BlockingConnection:
    """A handshaken socket to one broker. Create it with :meth:`open`."""

    def __init__(self, sock: socket.socket, address: Address, settings: ConnectionSettings) -> None:
        self.sock = sock
        self.address = format_address(address)
        """``host:port`` (an IPv6 host in brackets), for messages."""
        self.request_timeout_s = settings.request_timeout_s
        self.codec = ClientConnection(settings.client_id, settings.max_frame_bytes, settings.max_in_flight)
        self.broker_id = -1
        """The broker's id, from the handshake."""
        self.server_version = ""
        self.closed = False
        self.principal: str | None = None
        """Who the broker says this connection is, once authenticated (``User:alice``)."""
        self.throttled_until = 0.0
        """``time.monotonic()`` before which :meth:`send` waits: a reply's ``throttle_time_ms`` (a quota)."""
        self.throttle_ms_total = 0
        """Milliseconds of throttle the broker asked for on this connection."""

    @classmethod
    def open(cls, address: Address, settings: ConnectionSettings) -> BlockingConnection:
        """Connect, set TCP_NODELAY, and agree API versions with the broker (ApiVersions handshake).

        Raises ConnectionClosedError when the broker cannot be reached in ``connect_timeout_s``, and
        the broker's error when it refuses the connection (TooManyConnectionsError).
        """
        host, port = address
        try:
            sock = socket.create_connection((host, port), timeout=settings.connect_timeout_s)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock = wrap_socket(sock, host, settings.ssl_context)
            except BaseException:
                sock.close()
                raise
        except ssl.SSLError as exc:
            raise ConnectionClosedError(f"cannot connect to broker {format_address(address)}: "
                                        f"{describe_tls_error(exc)}") from exc
        except OSError as exc:  # TimeoutError included
            raise ConnectionClosedError(
                f"cannot connect to broker {format_address(address)}: {exc.strerror or exc or 'timed out'}"
                f" (is it running? check the address)") from exc
        conn = cls(sock, address, settings)
        try:
            conn.codec.set_versions(handshake_versions(settings))
            response: ApiVersionsResponse = raise_for_error(conn.call(handshake_request(settings)),
                                                            f"broker {conn.address}")
            conn.codec.set_versions(agree_versions(response))
            conn.broker_id = response.broker_id
            conn.server_version = response.server_version
            steps = authenticate(settings, conn.address)
            try:
                request = next(steps)
                while True:
                    request = steps.send(conn.call(request))
            except StopIteration as done:
                conn.principal = done.value
            sock.settimeout(settings.request_timeout_s)
        except ConnectionClosedError as exc:
            conn.close()
            raise plaintext_hint(exc, settings) from exc
        except BaseException:
            conn.close()
            raise
        return conn

    @property
    def in_flight(self) -> int:
        return self.codec.in_flight

    def peer_closed(self) -> bool:
        """Whether the broker closed this idle connection (a restart, a crash): a request written now would seem
        to be in flight when the close is read, though it never reached the broker. Closed here when it did. Only
        meaningful with nothing in flight (a reply would be read as data)."""
        if self.closed:
            return True
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            readable = [self.sock]
        if not readable:
            return False
        # readable with nothing asked: the end of the stream (or a TLS close_notify) -- nothing a broker sends
        # unasked on an idle connection
        self.close()
        return True

    def send(self, request: Any, expect_response: bool = True) -> None:
        """Write one request; its reply is read by a later :meth:`receive` (replies come in order)."""
        if self.closed:
            raise ConnectionClosedError(f"connection to broker {self.address} is closed")
        if self.throttled_until:
            wait_s = self.throttled_until - time.monotonic()
            self.throttled_until = 0.0
            if wait_s > 0:
                time.sleep(wait_s)  # the broker's quota throttle: it would not read us before then anyway
        _cid, data = self.codec.send(request, expect_response=expect_response)
        try:
            self.sock.sendall(data)
        except OSError as exc:
            raise self._broken(exc, f"writing to broker {self.address} took longer than {self.request_timeout_s}s"
                               ) from None

    def receive(self) -> Any:
        """The response to the oldest request in flight (error codes are NOT raised)."""
        codec = self.codec
        while True:
            try:
                event = codec.next_event()
            except ProtocolError as exc:
                self.close()
                raise ConnectionClosedError(f"broker {self.address} sent a malformed or unexpected reply ({exc}); "
                                            f"connection closed") from exc
            if isinstance(event, ResponseEvent):
                throttle_ms = getattr(event.response, "throttle_time_ms", 0)
                if throttle_ms > 0:
                    self.throttle_ms_total += throttle_ms
                    self.throttled_until = max(self.throttled_until, time.monotonic() + throttle_ms / 1000)
                return event.response
            if self.closed:
                raise ConnectionClosedError(f"connection to broker {self.address} is closed")
            try:
                # into the codec's memory: the rest of a big reply straight into the buffer it decodes from
                n = self.sock.recv_into(codec.get_buffer())
            except OSError as exc:
                raise self._broken(exc, f"broker {self.address} sent no reply within {self.request_timeout_s}s"
                                   ) from None
            if not n:
                self.close()
                raise ConnectionClosedError(f"broker {self.address} closed the connection")
            codec.buffer_updated(n)

    def _broken(self, exc: OSError, late: str) -> MetaqError:
        """Close after a socket error; what to raise: RequestTimeoutError saying ``late`` for a timeout (every
        reply behind a late one would be late too), else ConnectionClosedError."""
        self.close()
        if isinstance(exc, TimeoutError):
            return RequestTimeoutError(late)
        if isinstance(exc, ssl.SSLError):
            return ConnectionClosedError(f"connection to broker {self.address} failed: {describe_tls_error(exc)}")
        return ConnectionClosedError(f"connection to broker {self.address} failed: {exc}")

    def call(self, request: Any) -> Any:
        """Send one request and return its raw response (error codes are NOT raised)."""
        self.send(request)
        return self.receive()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(OSError):
                self.sock.close()
            self.codec.clear()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.codec.in_flight} in flight"
        return f"<BlockingConnection {self.address} broker_id={self.broker_id} {state}>"


class BlockingPool:
    """One connection per address, reopened when it was closed; ``servers``: the bootstrap list.

    Every connection to one of the servers records the broker id that answered there
    (:class:`~metaq.net.discovery.ServerBook`), which is how :meth:`find` locates a standalone broker.
    """

    def __init__(self, settings: ConnectionSettings, servers: Sequence[Address] = ()) -> None:
        self.settings = settings
        self.servers = ServerBook(servers)
        self._conns: dict[Address, BlockingConnection] = {}

    def cached(self, address: Address) -> BlockingConnection | None:
        """The open connection to ``address``, if there is one (no I/O)."""
        conn = self._conns.get(address)
        return conn if conn is not None and not conn.closed else None

    def get(self, address: Address) -> BlockingConnection:
        """The connection to ``address``, opened (once: no retries) if needed."""
        conn = self._conns.get(address)
        if conn is not None and not conn.closed:
            return conn
        conn = BlockingConnection.open(address, self.settings)
        try:
            self.servers.learn(address, conn.broker_id)
        except DuplicateBrokerIdError:
            conn.close()
            raise
        self._conns[address] = conn
        return conn

    def first_answering(self, addresses: Sequence[Address] | None = None, *,
                        failed: Sequence[MetaqError] = ()) -> tuple[Address, BlockingConnection]:
        """The first of ``addresses`` (default: every server, in order) that can be connected to; the
        error names each server otherwise (see :meth:`metaq.net.pool.ConnectionPool.first_answering`)."""
        failures = WalkFailures(self.servers.text)
        for exc in failed:
            failures.add(exc)
        for address in self.servers.servers if addresses is None else addresses:
            try:
                return address, self.get(address)
            except WALK_ERRORS as exc:
                failures.add(exc)
        raise failures.error()

    def find(self, broker_id: int) -> BlockingConnection | None:
        """A connection to the server that answers as ``broker_id``, looked for among the servers not
        reached yet (those that fail are passed over); None if none does."""
        for address in self.servers.unreached():
            try:
                conn = self.get(address)
            except WALK_ERRORS:
                continue
            if conn.broker_id == broker_id:
                return conn
        return None

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
