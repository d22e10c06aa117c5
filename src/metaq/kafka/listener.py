"""The Kafka listener: Kafka's wire protocol on ``kafkaPort`` (and ``kafkaSslPort``), beside the binary
protocol and HTTP, on the broker's own event loop.

:class:`metaq.broker.service.BrokerService` binds it before the data directory is opened (a port in use
is refused before anything is created), starts it once the core is serving, and closes it on stop. Each
connection decodes frames with the sans-IO codec (:mod:`metaq.protocol.kafka.codec`), runs each request's
translation (:mod:`metaq.kafka.apis`) as a task, and writes the replies strictly in request order, as
Kafka requires (a produce waiting for its fsync does not hold up the reading of the next one: that is
what lets one fsync cover the batches of several requests). A produce with acks=0 gets no reply.

Nothing a client sends stops the listener: a frame that cannot be Kafka closes that connection; an API
or version not served is answered with UNSUPPORTED_VERSION; an unexpected failure is logged and
answered with UNKNOWN_SERVER_ERROR.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections import deque
from typing import Any, cast

from metaq.broker.admission import AddressLimits, TlsGate, peer_address
from metaq.broker.core import Broker
from metaq.broker.quotas import ANONYMOUS
from metaq.broker.session import Session
from metaq.errors import NotMasterError, ProtocolError
from metaq.kafka.apis import HANDLERS, Advertised, Context, Peers
from metaq.protocol.kafka import codec
from metaq.security.principal import peer_common_name, user_principal

log = logging.getLogger("metaq.kafka")

PIPELINED_REQUESTS_MAX = 1024
"""Replies one connection may owe; past it, reading pauses until they drain (backpressure)."""
TLS_HANDSHAKE_TIMEOUT_S = 30.0
UNKNOWN_SERVER_ERROR = -1


REPLICA_NODE_BASE = 0x10000
"""Kafka node ids from here up are a broker id's slaves (above every broker id, BROKER_ID_MAX)."""


def replica_node_id(broker_id: int, slave_id: int) -> int:
    """The Kafka node id of slave ``slave_id`` of ``broker_id``: a node that leads no partition but answers
    Metadata, so that a client whose only leader died (one broker id, HA) still knows whom to ask who leads
    now (Kafka clients forget their bootstrap servers once they have the cluster's list)."""
    return REPLICA_NODE_BASE + broker_id * 1025 + slave_id


class _Slot:
    __slots__ = ("data", "done")

    def __init__(self) -> None:
        self.data = b""
        self.done = False


class KafkaConnection(asyncio.Protocol):
    """One Kafka client connection."""

    def __init__(self, broker: Broker, advertised: Advertised, peers: Peers, connections: set[KafkaConnection],
                 addresses: AddressLimits | None = None, counted_address: str | None = None) -> None:
        self.broker = broker
        self.session = Session(whole_cluster_groups=True)
        self.ctx = Context(broker, self.session, advertised, peers, on_hold=self._hold)
        config = broker.config
        self.pre_auth = config.auth_required
        """Not authenticated yet where authRequired is set: smaller frames, the authentication timeout
        (docs/security.md#limits-before-authentication, as on the binary port)."""
        self.codec = codec.KafkaServerConnection(min(config.max_frame_bytes, config.max_frame_bytes_before_auth)
                                                 if self.pre_auth else config.max_frame_bytes)
        self.addresses = addresses
        self.address = counted_address
        """The peer's address once counted against the per-address limits (the TLS gate counts it first)."""
        self._auth_timer: asyncio.TimerHandle | None = None
        self.transport: asyncio.Transport | None = None
        self.replies: deque[_Slot] = deque()
        self.tasks: set[asyncio.Task[Any]] = set()
        self.connections = connections
        self.paused = False
        """Reading paused for backpressure (too many replies owed)."""
        self.muted = False
        """Reading paused for a quota's throttle, until ``_unmute``."""
        self._mute_timer: asyncio.TimerHandle | None = None
        self.held = False
        """Reading paused while a request waits for its principal's quota debt (``Session.hold``): the requests
        behind it would only wait too."""
        self.closing = False
        self.admitted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.session.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.session.close = self._close_now
        if transport.get_extra_info("sslcontext") is not None:
            self.session.tls = True
            self.session.peer_cn = peer_common_name(transport.get_extra_info("peercert"))
            if self.session.peer_cn is not None:
                self.session.principal = user_principal(self.session.peer_cn)
        if self.addresses is not None and self.address is None:
            address = peer_address(peer)
            if (self.addresses.accept(address) or self.addresses.admit(address, self.session.principal is not None)) \
                    is not None:
                self.transport = None
                cast(asyncio.Transport, transport).abort()
                return
            self.address = address
        self.connections.add(self)
        if self.pre_auth and self.session.principal is not None:
            self._authenticated()
        elif self.pre_auth and self.broker.config.connection_auth_timeout_s > 0:
            self._auth_timer = asyncio.get_running_loop().call_later(self.broker.config.connection_auth_timeout_s,
                                                                     self._auth_timed_out)
        if self.session.principal is not None or not self.broker.config.auth_required:
            refusal = self.broker.quotas.admit(self.session, self.session.principal or ANONYMOUS)
            if refusal is not None:
                log.warning("refused a Kafka connection from %s: %s", self.session.peer, refusal)
                transport.close()
                return
        self.admitted = True
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _authenticated(self) -> None:
        """The connection authenticated (SASL, or its certificate): the limits before authentication end."""
        self.pre_auth = False
        self.codec.max_frame_bytes = self.broker.config.max_frame_bytes
        if self._auth_timer is not None:
            self._auth_timer.cancel()
            self._auth_timer = None
        if self.addresses is not None and self.address is not None:
            self.addresses.authenticated(self.address)

    def _auth_timed_out(self) -> None:
        self._auth_timer = None
        if self.pre_auth and self.transport is not None:
            log.info("closing Kafka connection from %s: not authenticated within connectionAuthTimeoutSeconds=%d",
                     self.session.peer, self.broker.config.connection_auth_timeout_s)
            self.transport.abort()

    def _close_now(self, reason: str) -> None:
        """The core ends the connection (its user was removed, or its password changed)."""
        log.info("closing Kafka connection from %s: %s", self.session.peer, reason)
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.addresses is not None and self.address is not None:
            self.addresses.remove(self.address, self.pre_auth)
            self.address = None
        if self._auth_timer is not None:
            self._auth_timer.cancel()
            self._auth_timer = None
        self.broker.sessions.discard(self.session)
        self.connections.discard(self)
        if self.admitted:
            self.broker.quotas.release(self.session)
        for task in self.tasks:
            task.cancel()
        if self._mute_timer is not None:
            self._mute_timer.cancel()
        self.replies.clear()
        self.transport = None

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self.codec.receive_data(data)
        self._process()

    def _process(self) -> None:
        """Handle the whole requests buffered, unless (or until) the connection is muted by a throttle."""
        while not self.muted and not self.held and not self.closing:
            try:
                event = self.codec.next_event()
            except ProtocolError as exc:
                log.warning("closing Kafka connection from %s: %s", self.session.peer, exc)
                if self.transport is not None:
                    self.transport.abort()
                return
            if event is codec.NEED_DATA:
                break
            if isinstance(event, codec.UnsupportedRequest):
                log.info("Kafka request from %s (%s) not served: %s", self.session.peer, event.header.client_id,
                         event.reason)
                slot = _Slot()
                self.replies.append(slot)
                self._complete(slot, codec.encode_unsupported(
                    event.header, codec.error_body(event.header, codec.UNSUPPORTED_VERSION)))
                continue
            assert isinstance(event, codec.KafkaRequest)
            self._handle(event)
        if self._owed() > PIPELINED_REQUESTS_MAX and not self.paused and self.transport is not None:
            self.paused = True
            if not self.muted and not self.held:
                self.transport.pause_reading()

    def _owed(self) -> int:
        """Requests still running or replies not yet written (a produce with acks=0 has a task but no reply)."""
        return max(len(self.replies), len(self.tasks))

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if self.paused and not self.replies:
            self._pump()  # the last one-way produce done: reading resumes

    def _handle(self, request: codec.KafkaRequest) -> None:
        header = request.header
        oneway = header.api_key == 0 and request.body.acks == 0
        slot = None if oneway else _Slot()
        if slot is not None:
            self.replies.append(slot)
        task = asyncio.get_running_loop().create_task(self._serve(request, slot))
        self.tasks.add(task)
        task.add_done_callback(self._task_done)

    async def _serve(self, request: codec.KafkaRequest, slot: _Slot | None) -> None:
        header = request.header
        try:
            body = await HANDLERS[header.api_key](self.ctx, header, request.body)
            data = b"" if body is None else codec.encode_response(header, body)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("Kafka %s v%d from %s failed", codec.SERVED[header.api_key][0], header.api_version,
                          self.session.peer)
            data = codec.encode_unsupported(header, codec.error_body(header, UNKNOWN_SERVER_ERROR))
        if self.pre_auth and self.session.principal is not None:
            self._authenticated()
        if slot is not None:
            self._complete(slot, data)
        if self.ctx.mute_ms:
            self._mute(self.ctx.mute_ms)
            self.ctx.mute_ms = 0
        if self.session.close_after_reply and not self.closing:
            self.closing = True  # the core refused authentication: nothing more is read
            if self.transport is not None:
                self.transport.pause_reading()
            self._pump()

    def _mute(self, ms: int) -> None:
        """Read nothing for ``ms`` (over a byte-rate quota; the reply said so in throttle_time_ms)."""
        if self.transport is None or self.closing:
            return
        loop = asyncio.get_running_loop()
        until = loop.time() + ms / 1000
        if self._mute_timer is not None:
            if self._mute_timer.when() >= until:
                return
            self._mute_timer.cancel()
        if not self.muted and not self.paused and not self.held:
            self.transport.pause_reading()
        self.muted = True
        self._mute_timer = loop.call_at(until, self._unmute)

    def _unmute(self) -> None:
        self._mute_timer = None
        self.muted = False
        if self.transport is not None and not self.closing:
            self._process()  # the requests that arrived before the mute, then the socket again
            if not self.paused and not self.muted and not self.held:
                self.transport.resume_reading()

    def _hold(self, hold: asyncio.Future[None]) -> None:
        """Read and handle nothing more until ``hold`` is done (a request waits for its principal's debt)."""
        if hold.done() or self.transport is None or self.closing:
            return
        if not self.muted and not self.paused and not self.held:
            self.transport.pause_reading()
        self.held = True
        hold.add_done_callback(self._release)

    def _release(self, _hold: object = None) -> None:
        if not self.held:
            return
        self.held = False
        if self.transport is not None and not self.closing:
            self._process()
            if not self.paused and not self.muted and not self.held:
                self.transport.resume_reading()

    def _complete(self, slot: _Slot, data: bytes) -> None:
        slot.data = data
        slot.done = True
        self._pump()

    def _pump(self) -> None:
        transport = self.transport
        if transport is None:
            return
        out = []
        replies = self.replies
        while replies and replies[0].done:
            out.append(replies.popleft().data)
        if out:
            transport.write(b"".join(out) if len(out) > 1 else out[0])
        if self.closing and not replies:
            transport.close()
            return
        if self.paused and self._owed() <= PIPELINED_REQUESTS_MAX // 2:
            self.paused = False
            if not self.muted and not self.held:
                transport.resume_reading()


class KafkaListener:
    """``broker``'s Kafka protocol on ``host:port`` (0: a free port) and, with ``ssl_context``, on
    ``ssl_port`` too. ``advertised_host`` is what Metadata and FindCoordinator tell clients (hostName)."""

    def __init__(self, broker: Broker, host: str, port: int | None, *, ssl_port: int | None = None,
                 ssl_context: ssl.SSLContext | None = None, advertised_host: str | None = None,
                 peers: Peers | None = None, addresses: AddressLimits | None = None) -> None:
        self.broker = broker
        self.addresses = addresses
        """The per-address limits shared with the binary and TLS ports (None: none)."""
        self.host = host
        self.port = port
        self.ssl_port = ssl_port
        self.ssl_context = ssl_context
        self.advertised = Advertised(advertised_host or host, port or 0, None)
        self.peers = peers or self._cluster_peers
        self.connections: set[KafkaConnection] = set()
        self._servers: list[asyncio.Server] = []
        self._plain: asyncio.Server | None = None
        self._tls: asyncio.Server | None = None

    def _cluster_peers(self) -> dict[int, tuple[str, int, int | None]]:
        """The Kafka addresses of the masters of the cluster's broker ids but this process, and of every slave
        (under :func:`replica_node_id`), as they registered them."""
        out: dict[int, tuple[str, int, int | None]] = {}
        own_id = self.broker.config.broker_id
        own = (self.broker.cluster_host, self.broker.port)
        master_here = self._master_here()
        for broker_id, entry in self.broker.cluster.snapshot().brokers.items():
            if entry.master is None:
                continue
            if broker_id == own_id and (master_here or (entry.master.host, entry.master.port) == own):
                continue  # this process is the master of its broker id: it advertises itself
            # another broker id; or this one's master when this process is a slave of it (HA), whose
            # partitions Kafka clients must produce to and fetch from there
            ports = entry.ports.get(-1, {})
            plain, tls = ports.get("kafkaPort"), ports.get("kafkaSslPort")
            port = plain if plain is not None else tls
            if port is not None:
                out[broker_id] = (entry.master.host, port, tls)
        for broker_id, entry in self.broker.cluster.snapshot().brokers.items():
            for slave_id, address in entry.slaves.items():
                ports = entry.ports.get(slave_id, {})
                plain, tls = ports.get("kafkaPort"), ports.get("kafkaSslPort")
                port = plain if plain is not None else tls
                if port is not None:
                    out[replica_node_id(broker_id, slave_id)] = (address.host, port, tls)
        return out

    def _master_here(self) -> bool:
        """Whether this process takes writes for its broker id now (its own HA state, which knows of a takeover
        before the cluster view shows the new registration)."""
        if self.broker.slave is not None and self.broker.ha is None:
            return False
        if self.broker.ha is None:
            return True
        try:
            self.broker.ha.check_writable("Kafka clients")
        except NotMasterError:
            return False
        return True

    def _factory(self) -> KafkaConnection:
        return KafkaConnection(self.broker, self.advertised, self.peers, self.connections, self.addresses)

    def _tls_factory(self) -> asyncio.Protocol:
        """A TLS connection: the per-address limits before its handshake (TlsGate), as on the binary TLS port."""
        assert self.ssl_context is not None
        if self.addresses is None:
            return self._factory()
        addresses = self.addresses
        return TlsGate(lambda address: KafkaConnection(self.broker, self.advertised, self.peers, self.connections,
                                                       addresses, address),
                       addresses, self.ssl_context, TLS_HANDSHAKE_TIMEOUT_S)

    async def bind(self) -> None:
        """Take the port(s), not serving yet; OSError when one cannot be bound (nothing left bound then)."""
        loop = asyncio.get_running_loop()
        try:
            if self.port is not None:
                self._plain = await loop.create_server(self._factory, self.host, self.port, reuse_address=True,
                                                       start_serving=False)
                self._servers.append(self._plain)
                self.advertised.port = self._plain.sockets[0].getsockname()[1]
            if self.ssl_port is not None:
                assert self.ssl_context is not None
                if self.addresses is not None:  # the handshake is started by the TlsGate
                    self._tls = await loop.create_server(self._tls_factory, self.host, self.ssl_port,
                                                         reuse_address=True, start_serving=False)
                else:
                    self._tls = await loop.create_server(self._factory, self.host, self.ssl_port, reuse_address=True,
                                                         start_serving=False, ssl=self.ssl_context,
                                                         ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S)
                self._servers.append(self._tls)
                self.advertised.tls_port = self._tls.sockets[0].getsockname()[1]
                if self._plain is None:
                    self.advertised.port = self.advertised.tls_port
        except BaseException:
            await self.close()
            raise

    @property
    def bound_port(self) -> int | None:
        return self.advertised.port if self._plain is not None else None

    @property
    def bound_ssl_port(self) -> int | None:
        return self.advertised.tls_port

    def registered_ports(self) -> dict[str, int]:
        """What the broker registers in the cluster beside its address, so that every broker's Metadata
        can send Kafka clients to this one (kafkaPort, kafkaSslPort)."""
        ports = {}
        if self._plain is not None:
            ports["kafkaPort"] = self.advertised.port
        if self._tls is not None and self.advertised.tls_port is not None:
            ports["kafkaSslPort"] = self.advertised.tls_port
        return ports

    def ready_lines(self) -> list[str]:
        """What `metaq broker` prints once serving (the test harness reads the ports from them)."""
        a = self.advertised
        lines = []
        if self._plain is not None:
            lines.append(f"metaq kafka ready {a.host}:{a.port}")
        if self._tls is not None:
            lines.append(f"metaq kafka tls ready {a.host}:{a.tls_port}")
        return lines

    async def start(self) -> None:
        for server in self._servers:
            await server.start_serving()
        a = self.advertised
        if self._plain is not None:
            log.info("Kafka clients on %s:%d", a.host, a.port)
        if self._tls is not None:
            log.info("Kafka TLS clients on %s:%d", a.host, a.tls_port)

    async def stop_accepting(self) -> None:
        for server in self._servers:
            server.close()

    async def close(self) -> None:
        await self.stop_accepting()
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()
        self._servers.clear()


def bind_error(host: str, exc: OSError) -> str:
    """StartupError's line for a Kafka port that cannot be bound."""
    import errno

    reason = exc.strerror or str(exc)
    if exc.errno == errno.EADDRINUSE:
        reason = "the address is already in use (choose another kafkaPort / kafkaSslPort, or 0 for a free one)"
    return f"cannot listen for Kafka clients on {host}: {reason}"
