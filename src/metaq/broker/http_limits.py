"""Limits on a broker's HTTP listeners (the HTTP API and the dashboard): what a stranger may hold before any
request of theirs is checked (docs/security.md#limits-before-authentication).

aiohttp has no cap on connections and no deadline for a request's headers: a client that opens connections and
sends its headers a byte at a time ("slowloris") holds them for ever. :func:`limited` wraps an aiohttp server's
protocol factory so that each listener keeps at most ``httpMaxConnections`` connections (one more is closed at
once), a connection whose first request's headers have not all arrived ``httpHeaderTimeoutSeconds`` after it
opened is closed, and new connections from one address come at most ``maxConnectionRatePerIp`` a second.

:class:`QuietBadRequests` is the logger aiohttp's request handlers get: a request aiohttp refuses as malformed
(an over-long request line or header, a bad method: HTTP 4xx) is one INFO line, not an ERROR with a traceback
each (which a client could use to fill the log).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, cast

from aiohttp.http_exceptions import HttpProcessingError

from metaq.broker.admission import AddressLimits, peer_address
from metaq.broker.connections import ConnectionLimits

log = logging.getLogger("metaq.http")


@dataclass(frozen=True, slots=True)
class HttpLimits:
    max_connections: int = 1000
    header_timeout_s: float = 10.0
    """0: none."""
    connection_rate_per_ip_max: int = 0


class QuietBadRequests(logging.LoggerAdapter):
    """aiohttp's server logger, with malformed requests (4xx) logged in one INFO line."""

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__(logger, {})

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        exc = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1]
        if isinstance(exc, HttpProcessingError) and 400 <= (exc.code or 0) < 500:
            peer = args[0] if args else "?"
            self.logger.info("refused a malformed HTTP request from %s: %s %s", peer, exc.code,
                             str(exc.message)[:200])
            return
        self.logger.error(msg, *args, exc_info=exc_info, **kwargs)

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        return msg, kwargs


class _Connection(asyncio.Protocol):
    """One HTTP connection: aiohttp's request handler inside, counted, with a deadline for its first request."""

    def __init__(self, handler: Any, owner: LimitedFactory) -> None:
        self.handler = handler
        self.owner = owner
        self.counted = False
        self.timer: asyncio.TimerHandle | None = None
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        owner = self.owner
        self.transport = transport
        address = peer_address(transport.get_extra_info("peername"))
        if owner.open >= owner.limits.max_connections or owner.addresses.accept(address) is not None:
            owner.refused += 1
            if owner.open >= owner.limits.max_connections:
                owner.warn(f"{owner.open} HTTP connections are open (httpMaxConnections)")
            cast(asyncio.Transport, transport).abort()
            return
        self.counted = True
        owner.open += 1
        timeout_s = owner.limits.header_timeout_s
        if timeout_s > 0:
            self.timer = asyncio.get_running_loop().call_later(timeout_s, self._check_started)
        self.handler.connection_made(transport)

    def _check_started(self) -> None:
        self.timer = None
        if getattr(self.handler, "_request_count", 1) == 0 and self.transport is not None:
            self.owner.timed_out += 1
            log.info("closing an HTTP connection from %s: its first request's headers did not arrive within "
                     "httpHeaderTimeoutSeconds=%g", peer_address(self.transport.get_extra_info("peername")),
                     self.owner.limits.header_timeout_s)
            cast(asyncio.Transport, self.transport).abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.counted:
            self.counted = False
            self.owner.open -= 1
            self.handler.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.handler.data_received(data)

    def eof_received(self) -> bool | None:
        result: bool | None = self.handler.eof_received()
        return result

    def pause_writing(self) -> None:
        self.handler.pause_writing()

    def resume_writing(self) -> None:
        self.handler.resume_writing()


class LimitedFactory:
    """A protocol factory for ``loop.create_server``: aiohttp's, within :class:`HttpLimits`."""

    def __init__(self, make_handler: Callable[[], Any], limits: HttpLimits) -> None:
        self.make_handler = make_handler
        self.limits = limits
        self.addresses = AddressLimits(ConnectionLimits(connection_rate_per_ip_max=limits.connection_rate_per_ip_max))
        self.open = 0
        self.refused = 0
        self.timed_out = 0
        self._warned_at = -1e9

    def __call__(self) -> asyncio.Protocol:
        return _Connection(self.make_handler(), self)

    def warn(self, why: str) -> None:
        now = asyncio.get_running_loop().time()
        if now - self._warned_at >= 60.0:
            self._warned_at = now
            log.warning("refusing HTTP connections: %s (further refusals are not logged for a minute)", why)


def limits_of(config: Any) -> HttpLimits:
    """The HTTP limits of a broker configuration."""
    return HttpLimits(config.http_max_connections, config.http_header_timeout_s, config.max_connection_rate_per_ip)


def runner_options() -> dict[str, Any]:
    """What every aiohttp AppRunner of the broker is made with (its request handlers' logger)."""
    return {"logger": QuietBadRequests(logging.getLogger("aiohttp.server"))}
