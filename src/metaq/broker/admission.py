"""Admission by address: what a broker's connections from one address may hold before they authenticate
(docs/security.md#limits-before-authentication), shared by every listener (the binary and TLS ports, the Kafka
ports, the HTTP listeners' rate), and the TLS gate that checks it before a TLS handshake.

Transport bookkeeping: the broker core never sees it.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from asyncio.sslproto import SSLProtocol
from collections.abc import Callable
from typing import Protocol, cast

log = logging.getLogger("metaq.broker")


class AdmissionLimits(Protocol):
    """The limits :class:`AddressLimits` applies (:class:`metaq.broker.connections.ConnectionLimits`)."""

    @property
    def auth_required(self) -> bool: ...

    @property
    def unauthenticated_per_ip_max(self) -> int: ...

    @property
    def connections_per_ip_max(self) -> int: ...

    @property
    def connection_rate_per_ip_max(self) -> int: ...


class AddressLimits:
    """Connections per address: how many are open, how many have not authenticated, how fast new ones come.

    Shared by the binary and TLS ports (and the Kafka port); the HTTP listeners keep their own (they see no
    authentication before a request). The rate is a token bucket per address: ``rate`` tokens a second, at most
    ``rate`` stored (one second's burst)."""

    def __init__(self, limits: AdmissionLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self.clock = clock
        self.open: dict[str, int] = {}
        self.unauthenticated: dict[str, int] = {}
        self._buckets: dict[str, tuple[float, float]] = {}
        self._warned: dict[str, float] = {}
        self.refused = 0

    def accept(self, address: str) -> str | None:
        """A new connection from ``address`` (counted against its rate); why it is refused, or None."""
        rate = self.limits.connection_rate_per_ip_max
        if rate:
            now = self.clock()
            tokens, at = self._buckets.get(address, (float(rate), now))
            tokens = min(float(rate), tokens + (now - at) * rate)
            if tokens < 1.0:
                self._buckets[address] = (tokens, now)
                return self._refuse(address, f"more than maxConnectionRatePerIp={rate} new connections a second")
            self._buckets[address] = (tokens - 1.0, now)
            if len(self._buckets) > 100_000:  # a spoofed-address flood must not grow this without bound
                self._forget_full(now)
        return None

    def admit(self, address: str, authenticated: bool) -> str | None:
        """Count an open connection from ``address``; why it is refused (then not counted), or None."""
        limits = self.limits
        open_now = self.open.get(address, 0)
        if limits.connections_per_ip_max and open_now >= limits.connections_per_ip_max:
            return self._refuse(address, f"{open_now} connections open from it (maxConnectionsPerIp)")
        pending = not authenticated and limits.auth_required
        if pending and limits.unauthenticated_per_ip_max:
            waiting = self.unauthenticated.get(address, 0)
            if waiting >= limits.unauthenticated_per_ip_max:
                return self._refuse(address, f"{waiting} connections from it have not authenticated "
                                             "(maxUnauthenticatedConnectionsPerIp)")
        self.open[address] = open_now + 1
        if pending:
            self.unauthenticated[address] = self.unauthenticated.get(address, 0) + 1
        return None

    def authenticated(self, address: str) -> None:
        _decrement(self.unauthenticated, address)

    def remove(self, address: str, pending: bool) -> None:
        _decrement(self.open, address)
        if pending:
            _decrement(self.unauthenticated, address)

    def _refuse(self, address: str, why: str) -> str:
        self.refused += 1
        now = self.clock()
        if now - self._warned.get(address, -1e9) >= 60.0:
            if len(self._warned) > 10_000:
                self._warned.clear()
            self._warned[address] = now
            log.warning("refusing connections from %s: %s (further refusals of it are not logged for a minute)",
                        address, why)
        return why

    def _forget_full(self, now: float) -> None:
        rate = self.limits.connection_rate_per_ip_max
        self._buckets = {a: (t, at) for a, (t, at) in self._buckets.items()
                         if min(float(rate), t + (now - at) * rate) < rate}


def _decrement(counts: dict[str, int], key: str) -> None:
    n = counts.get(key, 0) - 1
    if n > 0:
        counts[key] = n
    else:
        counts.pop(key, None)


def peer_address(peername: object) -> str:
    """The address part of a transport's ``peername`` (what per-address limits count)."""
    if isinstance(peername, tuple) and peername:
        return str(peername[0])
    return "?"


class TlsGate(asyncio.Protocol):
    """A TLS port's connection before its handshake: the per-address limits are checked at accept, so a
    connection flood is refused before it costs a TLS handshake each; then the TLS layer (asyncio's
    SSLProtocol) takes the transport over in the same step, before any byte is read past the check, does the
    handshake, and hands the connection to the protocol ``make(address)`` gives."""

    def __init__(self, make: Callable[[str], asyncio.BaseProtocol], addresses: AddressLimits,
                 context: ssl.SSLContext, handshake_timeout_s: float) -> None:
        self.make = make
        self.addresses = addresses
        self.context = context
        self.handshake_timeout_s = handshake_timeout_s

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, base)  # uvloop's transports are not asyncio.Transport subclasses
        address = peer_address(transport.get_extra_info("peername"))
        if (self.addresses.accept(address) or self.addresses.admit(address, False)) is not None:
            transport.abort()
            return
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        tls = SSLProtocol(loop, self.make(address), self.context, waiter, server_side=True,
                          call_connection_made=True, ssl_handshake_timeout=self.handshake_timeout_s)  # type: ignore[arg-type]
        transport.set_protocol(tls)
        tls.connection_made(transport)

        def settled(done: asyncio.Future[None]) -> None:
            if done.cancelled() or done.exception() is not None:  # the protocol never took the connection over
                log.debug("TLS handshake with %s failed: %r", address,
                          None if done.cancelled() else done.exception())
                self.addresses.remove(address, True)

        waiter.add_done_callback(settled)
