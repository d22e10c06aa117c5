"""The broker's TCP transport: one :class:`BrokerProtocol` per client connection.

It decodes frames with the sans-IO codec, hands each request to the broker core
(:meth:`metaq.broker.core.Broker.handle`) with the connection's :class:`~metaq.broker.session.Session`,
and writes the replies. Requests on a connection are handled concurrently (a produce waiting for its
group-commit fsync does not hold up the next produce: that is what lets one fsync cover many batches)
but answered strictly in request order, as the protocol requires -- except the replies of
``REPLIES_OUT_OF_ORDER`` APIs (MultiFetch), written as soon as they are ready, so that a long-polling
multi-partition fetch holds up nothing behind it; past MAX_PIPELINED_REQUESTS replies
owed, the connection stops reading (backpressure). A fetch reply whose records stay in a segment file
(:class:`~metaq.broker.session.FileReply`) is sent with ``loop.sendfile``.

What connections share (maxConnections, the idle and handshake timeouts, the partial-frame budget) is
the :class:`~metaq.broker.connections.ConnectionRegistry`. Nothing here knows topics or partitions.
"""

from __future__ import annotations

import asyncio
import asyncio.selector_events
import contextlib
import functools
import logging
import os
import socket
import ssl
from collections import deque
from collections.abc import Coroutine
from typing import Any

from metaq.broker.connections import REFUSAL_TIMEOUT_S, REFUSING_CONNECTIONS_MAX, ConnectionRegistry
from metaq.broker.core import Broker
from metaq.broker.error_mapping import error_response
from metaq.broker.quotas import ANONYMOUS
from metaq.broker.session import DeferredReply, FileReply, Session
from metaq.errors import (
    BrokerStoppingError,
    ProtocolError,
    TooManyConnectionsError,
    TooManyRequestsError,
    UnknownServerError,
)
from metaq.protocol import messages as m
from metaq.protocol import schema
from metaq.protocol.codec import NEED_DATA, BadRequest, RequestEvent, RequestHeader, ServerConnection
from metaq.security.principal import peer_common_name, user_principal
from metaq.storage import FileSlice

log = logging.getLogger("metaq.broker")

MAX_PIPELINED_REQUESTS = 1024
"""Per connection; past it the broker stops reading the socket until replies drain (backpressure)."""
_PRODUCE = m.ProduceRequest.API_KEY
_MULTI_PRODUCE = m.MultiProduceRequest.API_KEY
_PRODUCES = (_PRODUCE, _MULTI_PRODUCE)
TLS_HANDSHAKE_TIMEOUT_S = 30.0
"""A TLS connection whose handshake has not finished by then is closed (asyncio's own default: 60 s)."""


class _Reply:
    """One answer slot; replies leave the connection in slot order."""

    __slots__ = ("data", "done", "file_slice", "header", "unordered")

    def __init__(self, header: RequestHeader | None, unordered: bool = False) -> None:
        self.header = header
        self.unordered = unordered
        """Not in the ordered queue: written as soon as it is done (REPLIES_OUT_OF_ORDER)."""
        self.done = False
        self.data: bytes = b""
        self.file_slice: FileSlice | None = None


class _SliceFile:
    """What ``loop.sendfile`` needs from a file: the fd, plus seek/readinto for its copying fallback.

    Reads use pread with our own position, so the log's shared fd offset is never moved.
    """

    def __init__(self, fd: int, position: int) -> None:
        self._fd = fd
        self._pos = position

    def fileno(self) -> int:
        return self._fd

    def seek(self, position: int, whence: int = 0) -> int:
        self._pos = position
        return position

    def readinto(self, buf: Any) -> int:
        data = os.pread(self._fd, len(buf), self._pos)
        n = len(data)
        buf[:n] = data
        self._pos += n
        return n


class BrokerProtocol(asyncio.Protocol):
    """One client connection: decode frames, hand requests to the core, reply in order, sendfile.

    Transport concerns live here and in :class:`ConnectionRegistry` (connection count, idle and
    handshake timeouts, the partial-frame budget); the :class:`Broker` sees a :class:`Session`.
    When the connection closes, its requests still running (long polls above all) are cancelled, so
    they give back their waiting-fetch slots at once.
    """

    def __init__(self, broker: Broker, registry: ConnectionRegistry) -> None:
        self.broker = broker
        self.registry = registry
        self.codec = ServerConnection(broker.config.max_frame_bytes)
        self.transport: asyncio.Transport | None = None
        self.session = Session()
        self.replies: deque[_Reply] = deque()
        self.ready: list[_Reply] = []
        """Finished replies of REPLIES_OUT_OF_ORDER requests: written at the next pump, whatever is before them."""
        self.tasks: set[asyncio.Task[Any]] = set()
        self.deferred: set[DeferredReply] = set()
        """Waiting fetches answered by a callback (:class:`DeferredReply`): cancelled when the connection closes."""
        self.sending = False
        self.paused = False
        self.closed = False
        self.refused = False
        self.closing = False
        """The core asked to close once the replies owed are out (an authentication failure)."""
        """Over maxConnections: only the first request's header is read, to answer it with the refusal."""
        self.handshaken = False
        """A whole request has arrived (before that, the handshake timeout applies)."""
        self.partial_bytes = 0
        """Bytes of the unfinished frame buffered (kept in step with the registry's sum)."""
        self.receiving = False
        """Requests of one read are being handled: their replies are written together at its end."""
        self.loop = asyncio.get_event_loop()
        self.opened_at = self.last_active = self.registry.clock()
        self._refusal_timer: asyncio.TimerHandle | None = None
        self.muted = False
        """Over a byte-rate quota: nothing is read from the connection until ``_unmute`` (metaq.broker.quotas)."""
        self.held = False
        """A request in progress must take effect before the next one (``Session.hold``): none is handled meanwhile."""
        self._mute_timer: asyncio.TimerHandle | None = None
        self._refusal_text: str | None = None
        # uvloop has no loop.sendfile (not even its copying fallback): there, file replies are pread
        # and written; asyncio's selector loop sends them with the sendfile(2) system call.
        self.native_sendfile = isinstance(self.loop, asyncio.selector_events.BaseSelectorEventLoop)

    @property
    def idle(self) -> bool:
        """Nothing in progress: no reply owed, no request running (a waiting long poll is running)."""
        return not self.replies and not self.tasks and not self.deferred and not self.sending

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.session.peer = self._peer()
        if transport.get_extra_info("sslcontext") is not None:
            self.session.tls = True
            self.session.peer_cn = peer_common_name(transport.get_extra_info("peercert"))
            if self.session.peer_cn is not None:  # a verified client certificate: its CN is who this is
                self.session.principal = user_principal(self.session.peer_cn)
        if not self.registry.admit(self):
            self._start_refusal()
            return
        if self.session.principal is not None or not self.broker.config.auth_required:
            # who this is, is known now (a certificate, or nobody where authRequired is off); a SASL
            # principal is counted when it authenticates
            principal = self.session.principal or ANONYMOUS
            refusal = self.broker.quotas.admit(self.session, principal)
            if refusal is not None:
                log.warning("refused a connection from %s: %s", self.session.peer, refusal)
                self.registry.remove(self)
                self._refusal_text = refusal
                self._start_refusal()
                return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.refused:
            self.registry.refusing -= 1
            if self._refusal_timer is not None:
                self._refusal_timer.cancel()
            return
        self.registry.remove(self)
        self.broker.quotas.release(self.session)
        if self._mute_timer is not None:
            self._mute_timer.cancel()
        for task in self.tasks:
            task.cancel()  # its reply can never be sent: give back what it holds (a waiting-fetch slot)
        deferred, self.deferred = self.deferred, set()
        for pending in deferred:
            pending.cancel()  # the same for a waiting fetch: its slot back, its callbacks never called
            self.broker.request_finished()
        for reply in self.replies:
            if reply.file_slice is not None:
                reply.file_slice.release()
                reply.file_slice = None
        self.replies.clear()
        self.ready.clear()

    def data_received(self, data: bytes) -> None:
        if self.refused:
            self._refuse(data)
            return
        self.last_active = self.registry.clock()
        self.codec.receive_data(data)
        self._process()

    def _process(self) -> None:
        """Handle the whole requests buffered, unless (or until) the connection is muted by a throttle. The
        replies answered meanwhile (produce acks, above all) leave in one write at the end, not one each;
        the multi-partition fetches its appends woke are answered just before (``FetchWaiters.hold``)."""
        self.receiving = True
        waiters = self.broker.waiters
        waiters.hold()
        try:
            while not self.muted and not self.held:
                try:
                    event = self.codec.next_event()
                except ProtocolError as exc:
                    log.warning("closing connection from %s: %s", self.session.peer, exc)
                    self._abort()
                    return
                if event is NEED_DATA:
                    break
                self.handshaken = True
                if isinstance(event, BadRequest):
                    reply = _Reply(event.header)
                    self.replies.append(reply)
                    self._complete(reply, m.error_response(event.header.api_key, event.error_code,
                                                           str(event.error)))
                    continue
                assert isinstance(event, RequestEvent)
                self._handle(event)
                if self.closing:
                    return  # refused (authentication): nothing more is read from this connection
                if self.session.throttle_ms:
                    self._throttle()
        finally:
            waiters.release()
            self.receiving = False
            if self.transport is not None and not self.transport.is_closing():
                self._pump()
        partial = self.codec.partial_frame_bytes
        if partial != self.partial_bytes:
            self.registry.partial_changed(self, partial)
        if len(self.replies) > MAX_PIPELINED_REQUESTS and not self.paused and self.transport:
            self.paused = True
            if not self.muted and not self.held:
                self.transport.pause_reading()

    # -- limits ----------------------------------------------------------------------------------

    def _start_refusal(self) -> None:
        self.refused = True
        self.registry.refusing += 1
        if self.registry.refusing > REFUSING_CONNECTIONS_MAX:
            self._abort()  # too many at once to answer each: close without a word
            return
        self._refusal_timer = self.loop.call_later(REFUSAL_TIMEOUT_S, self._abort)

    def _refuse(self, data: bytes) -> None:
        """Answer the first request of a connection over maxConnections with TOO_MANY_CONNECTIONS."""
        self.codec.receive_data(data)
        try:
            header = self.codec.peek_header()
        except ProtocolError:
            self._abort()
            return
        if header is None:  # not even 12 bytes yet
            return
        assert self.transport is not None
        self.transport.pause_reading()
        response = m.error_response(header.api_key, TooManyConnectionsError.code,
                                    self._refusal_text or self.registry.refusal_message())
        self.transport.write(self.codec.encode_response(header, response))
        self.transport.close()

    def _throttle(self) -> None:
        """Read nothing more for ``session.throttle_ms`` (the principal went over its byte rate; the reply
        says so, in ``throttle_time_ms``). Requests already buffered wait too."""
        until = self.loop.time() + self.session.throttle_ms / 1000
        self.session.throttle_ms = 0
        if self.transport is None or self.closed:
            return
        if self._mute_timer is not None:
            if self._mute_timer.when() >= until:
                return  # muted for longer already
            self._mute_timer.cancel()
        if not self.muted:
            self.muted = True
            if not self.paused and not self.held:
                self.transport.pause_reading()
        self._mute_timer = self.loop.call_at(until, self._unmute)

    def _unmute(self) -> None:
        self._mute_timer = None
        self.muted = False
        if self.closed or self.closing or self.transport is None:
            return
        if not self.paused and not self.held:
            self.transport.resume_reading()
        self._process()

    def _hold(self, hold: asyncio.Future[None]) -> None:
        """Handle no further request until ``hold`` is done (its request must take effect first)."""
        if hold.done():
            return
        self.held = True
        if not self.paused and not self.muted and self.transport is not None:
            self.transport.pause_reading()
        hold.add_done_callback(self._release)

    def _release(self, _hold: object = None) -> None:
        if not self.held:
            return
        self.held = False
        if self.closed or self.closing or self.transport is None:
            return
        if not self.paused and not self.muted:
            self.transport.resume_reading()
        if not self.receiving:
            self._process()

    def refuse_partial_frame(self, reason: str) -> None:
        """Drop the unfinished frame being received (the partial-frame budget is spent) and answer it
        with TOO_MANY_REQUESTS once the replies before it are out; the rest of the frame is skipped."""
        dropped = self.codec.discard_partial_frame()
        self.registry.partial_changed(self, 0)
        if dropped is None:
            log.warning("closing connection from %s: %s", self.session.peer, reason)
            self._abort()
            return
        header, body_head = dropped
        log.warning("refused a request of %s from %s: %s", m.APIS[header.api_key].name
                    if header.api_key in m.APIS else header.api_key, self.session.peer, reason)
        if _oneway_produce(header, body_head):
            return  # a one-way produce expects no reply: the message is dropped, as on any failure
        reply = _Reply(header)
        self.replies.append(reply)
        self._complete(reply, m.error_response(header.api_key, TooManyRequestsError.code, reason))

    def close_quietly(self, reason: str, level: int) -> None:
        """Close after what is already written (a timeout: nothing is owed to the peer)."""
        log.log(level, "closing connection from %s: %s", self.session.peer, reason)
        if self.transport is not None:
            self.transport.close()

    def _handle(self, event: RequestEvent) -> None:
        header, request = event.header, event.request
        api_key = header.api_key
        if api_key in _PRODUCES and request.acks == 0:
            reply = None  # one-way
        elif api_key in m.REPLIES_OUT_OF_ORDER:
            reply = _Reply(header, True)
        else:
            reply = _Reply(header)
            self.replies.append(reply)
        result = self.broker.handle(request, self.session, deferred=True)
        if isinstance(result, DeferredReply):  # a waiting fetch: answered from the append that wakes it
            self.broker.request_started()
            self.deferred.add(result)
            result.on_done(functools.partial(self._deferred_done, result, reply))
        elif asyncio.iscoroutine(result):
            self.broker.request_started()
            task = self.loop.create_task(self._serve(result, reply, api_key))
            self.tasks.add(task)
            task.add_done_callback(functools.partial(self._task_done, pending=result, reply=reply,
                                                     api_key=api_key))
            hold, self.session.hold = self.session.hold, None
            if hold is not None:
                task.add_done_callback(functools.partial(_settle, hold))  # also when the coroutine never ran
                self._hold(hold)
        elif reply is not None:
            self._complete(reply, result)
        if self.session.close_after_reply:
            self._check_closing()

    def _check_closing(self) -> None:
        """Once the core said to close (``session.close_after_reply``): read no more, close after the replies."""
        if self.session.close_after_reply and not self.closing and self.transport is not None:
            self.closing = True
            self.transport.pause_reading()
            self._pump()

    async def _serve(self, pending: Coroutine[Any, Any, Any], reply: _Reply | None, api_key: int) -> None:
        """Run a request's coroutine and answer it from the same task, so that the reply is written in the
        loop step its answer is ready in (a woken long poll, a durable ack), not a step later from a done
        callback."""
        try:
            result = await pending
        except asyncio.CancelledError:  # the connection closed, or the broker is stopping
            self._answer(reply, m.error_response(api_key, BrokerStoppingError.code, "request cancelled"))
            raise
        except Exception as exc:  # a safety net: the core answers the errors of its coroutines
            result = error_response(api_key, exc)
        self._answer(reply, result)

    def _deferred_done(self, pending: DeferredReply, reply: _Reply | None, result: Any) -> None:
        """A waiting fetch answered, in the loop step that woke it: written now (with the rest of the read
        when it was woken by a request of this same connection)."""
        self.deferred.discard(pending)
        self.broker.request_finished()
        self._answer(reply, result)

    def _task_done(self, task: asyncio.Task[Any], *, pending: Coroutine[Any, Any, Any], reply: _Reply | None,
                   api_key: int) -> None:
        self.broker.request_finished()
        self.tasks.discard(task)
        pending.close()  # a no-op, unless the task was cancelled before it started (then it never ran)
        if task.cancelled() and reply is not None and not reply.done:
            self._answer(reply, m.error_response(api_key, BrokerStoppingError.code, "request cancelled"))
        elif self.closing:
            self._pump()  # a connection closing after its replies: this was maybe the last request running

    def _answer(self, reply: _Reply | None, result: Any) -> None:
        if self.session.close_after_reply and not self.closing and self.transport is not None:
            self.closing = True
            self.transport.pause_reading()
        if self.session.throttle_ms and not self.closing:
            self._throttle()
        if reply is None:
            if isinstance(result, FileReply):
                result.file_slice.release()
            if self.closing:
                self._pump()
            return
        self._complete(reply, result)

    def _complete(self, reply: _Reply, result: Any) -> None:
        if self.closed:
            if isinstance(result, FileReply):
                result.file_slice.release()
            return
        assert reply.header is not None
        try:
            if isinstance(result, FileReply):
                reply.data = self.codec.encode_response_head(reply.header, result.response, result.file_slice.size)
                reply.file_slice = result.file_slice
            else:
                reply.data = self.codec.encode_response(reply.header, result)
        except Exception as exc:
            log.exception("cannot encode reply")
            reply.data = self.codec.encode_response(reply.header,
                                                    m.error_response(reply.header.api_key, UnknownServerError.code,
                                                                     str(exc)))
        reply.done = True
        if reply.unordered:
            assert reply.file_slice is None, "an out-of-order reply carries its records in memory"
            self.ready.append(reply)
        self._pump()

    def _pump(self) -> None:
        """Write every finished reply at the head of the queue; a file reply hands over to sendfile."""
        if self.sending or self.receiving or self.transport is None:
            return
        out: list[bytes] = []
        if self.ready:
            out = [r.data for r in self.ready]
            self.ready.clear()
        while self.replies and self.replies[0].done:
            reply = self.replies.popleft()
            out.append(reply.data)
            if reply.file_slice is not None and not self.native_sendfile:
                fslice, reply.file_slice = reply.file_slice, None
                try:
                    out.append(fslice.read_bytes())
                finally:
                    fslice.release()
            elif reply.file_slice is not None:
                self.transport.write(b"".join(out))
                out = []
                self.sending = True
                self.loop.create_task(self._sendfile(reply.file_slice))
                return
        if out:
            self.transport.write(b"".join(out) if len(out) > 1 else out[0])
            self.last_active = self.registry.clock()
        if self.closing:
            if not self.replies and not self.tasks and not self.deferred:
                self.transport.close()  # after what was written
            return
        if self.paused and len(self.replies) <= MAX_PIPELINED_REQUESTS // 2:
            self.paused = False
            if not self.muted and not self.held:
                self.transport.resume_reading()

    async def _sendfile(self, fslice: FileSlice) -> None:
        try:
            if self.transport is not None and not self.closed:
                slice_file: Any = _SliceFile(fslice.fileno(), fslice.position)
                await self.loop.sendfile(self.transport, slice_file,
                                         fslice.position, fslice.size)
        except Exception as exc:
            log.warning("sendfile to %s failed: %r", self._peer(), exc)
            self._abort()
        finally:
            fslice.release()
            self.sending = False
        if not self.closed:
            self._pump()

    def _peer(self) -> str:
        if self.transport is None:
            return "?"
        peer = self.transport.get_extra_info("peername")
        return f"{peer[0]}:{peer[1]}" if peer else "?"

    def _abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


def _oneway_produce(header: RequestHeader, body_head: bytes) -> bool:
    """Whether a request is a produce that expects no reply, from its leading fields (Produce: topic,
    partition, acks; MultiProduce: acks)."""
    try:
        if header.api_key == _MULTI_PRODUCE:
            acks, _ = schema.INT16.decode(body_head, 0)
        elif header.api_key == _PRODUCE:
            _topic, pos = schema.STRING.decode(body_head, 0)
            _partition, pos = schema.INT32.decode(body_head, pos)
            acks, _ = schema.INT16.decode(body_head, pos)
        else:
            return False
    except ProtocolError:
        return False
    return bool(acks == 0)


async def listen_tcp(broker: Broker, registry: ConnectionRegistry, host: str, port: int, *,
                     backlog: int = 4096, ssl_context: ssl.SSLContext | None = None,
                     handshake_timeout_s: float = TLS_HANDSHAKE_TIMEOUT_S) -> asyncio.Server:
    """Bind ``host:port`` (port 0: the kernel picks one), not serving yet: ``start_serving()`` once the
    core is open. Raises OSError when the address cannot be bound.

    With ``ssl_context`` (:class:`metaq.net.tls.ServerTls`) every connection is TLS; a failed handshake
    (wrong CA, no client certificate where one is needed, a plaintext client) closes it before the
    core sees anything."""
    loop = asyncio.get_running_loop()
    extra: dict[str, Any] = {}
    if ssl_context is not None:
        extra = {"ssl": ssl_context, "ssl_handshake_timeout": handshake_timeout_s}
    return await loop.create_server(lambda: BrokerProtocol(broker, registry), host, port, backlog=backlog,
                                    reuse_address=True, start_serving=False, **extra)


def _settle(hold: asyncio.Future[None], _task: object) -> None:
    if not hold.done():
        hold.set_result(None)
