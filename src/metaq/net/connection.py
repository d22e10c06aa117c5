"""One TCP connection to a broker: pipelined requests, replies matched by correlation id, bounded in-flight.

The sans-IO :class:`~metaq.protocol.codec.ClientConnection` numbers requests and matches replies;
this class only moves its bytes. It is the hot path of the producer, so:

* frames written in one event-loop step leave in one ``writelines`` call (one syscall) at the end of
  the step, or at once when the writer says it has nothing more (:meth:`BrokerConnection.flush`), and
  the writer waits only when the transport's buffer is over its high-water mark;
* the reader is the protocol's ``buffer_updated`` callback (a buffered protocol: a big reply is received
  straight into its own buffer): no task, no stream copies;
* a reply resolves a plain future; no per-request timer: one watchdog per connection checks
  deadlines every ``_WATCHDOG_TICK_S`` while anything is in flight.

Replies come back in request order (except MultiFetch's, which may overtake the others: the codec
checks the order and the futures are found by correlation id), so a request that times out means
everything after it is stuck too: the connection is closed, the late request fails with
RequestTimeoutError and every other one with ConnectionClosedError (either may still have been applied by the broker).

It is the asyncio twin of :class:`metaq.net.blocking.BlockingConnection`: the same codec, settings,
handshake and error replies (:mod:`metaq.net.codec`). The client's producers and consumers use it
through :class:`metaq.net.pool.ConnectionPool`.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from metaq.errors import ConnectionClosedError, ProtocolError, RequestTimeoutError
from metaq.net.codec import (
    ConnectionSettings,
    agree_versions,
    authenticate,
    handshake_request,
    handshake_versions,
    plaintext_hint,
    raise_for_error,
)
from metaq.net.servers import Address, format_address
from metaq.net.tls import describe_tls_error
from metaq.protocol.codec import NEED_DATA, ClientConnection
from metaq.protocol.messages import ApiVersionsResponse

_WATCHDOG_TICK_S: Final = 0.05
_FLUSH_NOW_BYTES: Final = 256 * 1024
"""Frames queued in one loop step are written at once past this size (a tight producer loop)."""


@dataclass(slots=True)
class ThrottleStats:
    """Quota throttles the brokers asked for (replies' ``throttle_time_ms``): honoured, and counted here."""

    throttle_ms_total: int = 0
    throttled_total: int = 0


class _Pending:
    __slots__ = ("deadline", "future")

    def __init__(self, future: asyncio.Future[Any], deadline: float) -> None:
        self.future = future
        self.deadline = deadline


class _Wire(asyncio.BufferedProtocol):
    """Forwards transport callbacks to its BrokerConnection (kept apart so they are not public API).

    A buffered protocol: the transport receives into memory the codec lends (``get_buffer``), so the
    rest of a big reply (a 1 MB fetch) goes from the kernel straight into the buffer it is decoded from,
    with no bytes object per read and no copy into a stream buffer.
    """

    def __init__(self, conn: BrokerConnection) -> None:
        self.conn = conn

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.conn._codec.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self.conn._on_data(nbytes)

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn._on_lost(exc)

    def pause_writing(self) -> None:
        self.conn._paused = True

    def resume_writing(self) -> None:
        self.conn._paused = False
        self.conn._wake_writers()


class BrokerConnection:
    """A handshaken connection to one broker. Create it with :meth:`open`."""

    def __init__(self, address: Address, settings: ConnectionSettings) -> None:
        self.host, self.port = address
        self.address = format_address(address)
        """``host:port`` (an IPv6 host in brackets), for messages."""
        self.request_timeout_s = settings.request_timeout_s
        self.max_in_flight = settings.max_in_flight
        self._settings = settings
        self.principal: str | None = None
        """Who the broker says this connection is, once authenticated (``User:alice``)."""
        self.broker_id = -1
        """The broker's id, from the handshake."""
        self.server_version = ""
        self._codec = ClientConnection(settings.client_id, settings.max_frame_bytes, settings.max_in_flight)
        self._pending: dict[int, _Pending] = {}
        """Correlation id -> the request's future, oldest first."""
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._wbuf: list[bytes] = []
        self._wbuf_bytes = 0
        self._paused = False
        self._closed_exc: BaseException | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self._close_callbacks: list[Callable[[BrokerConnection], None]] = []
        self.throttled_until = 0.0
        """The broker said to send nothing before this ``loop.time()`` (a reply's ``throttle_time_ms``:
        the principal is over a quota); :attr:`writable` is False until then."""
        self.throttle = ThrottleStats()
        """What the brokers' quotas throttled (a pool shares one between its connections)."""

    # -- opening and closing ------------------------------------------------------------------

    @classmethod
    async def open(cls, address: Address, settings: ConnectionSettings) -> BrokerConnection:
        """Connect, set TCP_NODELAY, and agree API versions with the broker (ApiVersions handshake).

        Raises ConnectionClosedError when the broker cannot be reached in ``connect_timeout_s``, and
        the broker's error when it refuses the connection (TooManyConnectionsError).
        """
        conn = cls(address, settings)
        loop = conn._loop
        try:
            async with asyncio.timeout(settings.connect_timeout_s):
                transport, _ = await loop.create_connection(lambda: _Wire(conn), conn.host, conn.port,
                                                            ssl=settings.ssl_context)
        except ssl.SSLError as exc:
            raise ConnectionClosedError(f"cannot connect to broker {conn.address}: {describe_tls_error(exc)}") from exc
        except (OSError, TimeoutError) as exc:
            raise ConnectionClosedError(
                f"cannot connect to broker {conn.address}: {exc or 'timed out'}"
                f" (is it running? check the address)") from exc
        # (uvloop's transports are not asyncio.Transport subclasses, though they behave as one.)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.set_write_buffer_limits(high=settings.write_buffer_high_bytes)
        conn._transport = transport
        try:
            await conn._handshake(settings.connect_timeout_s)
        except ConnectionClosedError as exc:
            conn.close()
            raise plaintext_hint(exc, settings) from exc
        except BaseException:
            conn.close()
            raise
        return conn

    async def _handshake(self, timeout_s: float) -> None:
        self._codec.set_versions(handshake_versions(self._settings))
        resp: ApiVersionsResponse = raise_for_error(await self.submit(handshake_request(self._settings), timeout_s),
                                                    f"broker {self.address}")
        self._codec.set_versions(agree_versions(resp))
        self.broker_id = resp.broker_id
        self.server_version = resp.server_version
        steps = authenticate(self._settings, self.address)
        try:
            request = next(steps)
            while True:
                request = steps.send(await self.submit(request, timeout_s))
        except StopIteration as done:
            self.principal = done.value

    def supports(self, api_key: int) -> bool:
        """Whether the broker serves ``api_key`` (from the ApiVersions handshake): an older broker may not."""
        return self._codec.supports(api_key)

    @property
    def closed(self) -> bool:
        return self._closed_exc is not None

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def on_close(self, callback: Callable[[BrokerConnection], None]) -> None:
        """Call ``callback(self)`` once the connection is closed (or now, if it already is)."""
        if self._closed_exc is not None:
            callback(self)
        else:
            self._close_callbacks.append(callback)

    def close(self) -> None:
        """Close now; requests still in flight fail with ConnectionClosedError."""
        self._fail(ConnectionClosedError(f"connection to broker {self.address} was closed by the client"))

    # -- sending ------------------------------------------------------------------------------

    @property
    def writable(self) -> bool:
        """A request can be sent now without going over max_in_flight or the write buffer limit."""
        return (len(self._pending) < self.max_in_flight and not self._paused and self._closed_exc is None
                and (not self.throttled_until or self._loop.time() >= self.throttled_until))

    async def wait_writable(self) -> None:
        """Wait for an in-flight slot and a drained transport; ConnectionClosedError if it closes."""
        while not self.writable:
            if self._closed_exc is not None:
                raise self._closed_exc
            waiter: asyncio.Future[None] = self._loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if not waiter.done():
                    waiter.cancel()

    def submit(self, request: Any, timeout_s: float | None = None) -> asyncio.Future[Any]:
        """Send ``request`` now and return a future of its raw response (error codes are NOT raised).

        The caller makes sure the connection is :attr:`writable` (this does not wait); if it is not,
        the request is still sent. Raises ConnectionClosedError, without sending anything, when the
        connection is already closed -- so such a request is always safe to send again elsewhere.
        """
        if self._closed_exc is not None:
            raise self._closed_exc
        correlation_id, frame = self._codec.send(request)
        fut: asyncio.Future[Any] = self._loop.create_future()
        deadline = time.monotonic() + (self.request_timeout_s if timeout_s is None else timeout_s)
        self._pending[correlation_id] = _Pending(fut, deadline)
        self._write(frame)
        if self._watchdog is None:
            self._watchdog = self._loop.call_later(_WATCHDOG_TICK_S, self._check_deadlines)
        return fut

    def send_oneway(self, request: Any) -> None:
        """Send a request the broker does not answer (a produce with acks=0)."""
        if self._closed_exc is not None:
            raise self._closed_exc
        _, frame = self._codec.send(request, expect_response=False)
        self._write(frame)

    async def request(self, request: Any, timeout_s: float | None = None) -> Any:
        """Send and wait for the response; raise the broker's error when error_code != 0.

        The raised BrokerError carries the response as ``exc.response`` (a FetchResponse's range,
        for instance).
        """
        if not self.writable:
            await self.wait_writable()
        return raise_for_error(await self.submit(request, timeout_s))

    @property
    def unflushed_bytes(self) -> int:
        """Bytes of requests sent in this loop step and not yet handed to the transport."""
        return self._wbuf_bytes

    def flush(self) -> None:
        """Hand the frames queued in this loop step to the transport now, instead of at the end of the
        step: a producer that has written every batch it had calls it to save one loop step of latency."""
        self._flush()

    def _write(self, frame: bytes) -> None:
        wbuf = self._wbuf
        wbuf.append(frame)
        self._wbuf_bytes += len(frame)
        if len(wbuf) == 1:
            self._loop.call_soon(self._flush)
        elif self._wbuf_bytes >= _FLUSH_NOW_BYTES:
            self._flush()

    def _flush(self) -> None:
        if not self._wbuf:
            return
        frames, self._wbuf, self._wbuf_bytes = self._wbuf, [], 0
        transport = self._transport
        if transport is None or self._closed_exc is not None:
            return
        if len(frames) == 1:
            transport.write(frames[0])
        else:
            transport.writelines(frames)

    # -- receiving ----------------------------------------------------------------------------

    def _on_data(self, nbytes: int) -> None:
        codec = self._codec
        codec.buffer_updated(nbytes)
        pending = self._pending
        try:
            while True:
                event = codec.next_event()
                if event is NEED_DATA:
                    break
                entry = pending.pop(event.correlation_id)  # type: ignore[union-attr]
                fut = entry.future
                response = event.response  # type: ignore[union-attr]
                if getattr(response, "throttle_time_ms", 0) > 0:
                    self._throttled(response.throttle_time_ms)
                if not fut.done():
                    fut.set_result(response)
        except ProtocolError as exc:
            self._fail(ConnectionClosedError(
                f"broker {self.address} sent a malformed or unexpected reply ({exc}); connection closed"), exc)
            return
        if self._waiters and len(pending) < self.max_in_flight:
            self._wake_writers()

    def _throttled(self, throttle_ms: int) -> None:
        """Honour a quota throttle: no new request is written before it ends (the broker mutes the
        connection for that long anyway; waiting here keeps the requests out of its socket buffer)."""
        self.throttle.throttle_ms_total += throttle_ms
        self.throttle.throttled_total += 1
        until = self._loop.time() + throttle_ms / 1000
        if until > self.throttled_until:
            self.throttled_until = until
            self._loop.call_at(until, self._throttle_over, until)

    def _throttle_over(self, until: float) -> None:
        # asyncio runs a timer up to its clock resolution early: comparing loop.time() with the deadline
        # here could leave the connection unwritable with nobody left to wake its writers
        if self.throttled_until <= until:  # no later throttle came meanwhile (that one has its own timer)
            self.throttled_until = 0.0
            self._wake_writers()

    def _wake_writers(self) -> None:
        waiters = self._waiters
        while waiters and self.writable:
            w = waiters.popleft()
            if not w.done():
                w.set_result(None)

    def _on_lost(self, exc: Exception | None) -> None:
        reason = f": {describe_tls_error(exc) if isinstance(exc, ssl.SSLError) else exc}" if exc else ""
        self._fail(ConnectionClosedError(
            f"connection to broker {self.address} was lost{reason}; requests in flight may or may not "
            f"have been applied"), exc)

    def _check_deadlines(self) -> None:
        self._watchdog = None
        if self._closed_exc is not None or not self._pending:
            return
        now = time.monotonic()
        late = [p for p in self._pending.values() if p.deadline <= now and not p.future.done()]
        if late:
            for p in late:
                p.future.set_exception(RequestTimeoutError(
                    f"no reply from broker {self.address} within the request timeout; the request may "
                    f"still be applied. The connection was closed because later replies queue behind it"))
            self._fail(ConnectionClosedError(
                f"connection to broker {self.address} closed after a request timed out; requests in flight "
                f"may or may not have been applied"))
            return
        self._watchdog = self._loop.call_later(_WATCHDOG_TICK_S, self._check_deadlines)

    def _fail(self, exc: ConnectionClosedError, cause: BaseException | None = None) -> None:
        if self._closed_exc is not None:
            return
        if cause is not None:
            exc.__cause__ = cause
        self._closed_exc = exc
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        self._wbuf.clear()
        pending, self._pending = self._pending, {}
        self._codec.clear()
        for p in pending.values():
            if not p.future.done():
                p.future.set_exception(exc)
                # A caller that gave up (cancelled) never retrieves it: silence the "never retrieved" log.
                p.future.exception()
        waiters, self._waiters = self._waiters, deque()
        for w in waiters:
            if not w.done():
                w.set_exception(exc)
                w.exception()
        if self._transport is not None:
            self._transport.abort()
        callbacks, self._close_callbacks = self._close_callbacks, []
        for cb in callbacks:
            cb(self)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self._pending)} in flight"
        return f"<BrokerConnection {self.address} broker_id={self.broker_id} {state}>"

