"""What a broker's TCP connections share: their count, the idle and handshake sweep, the budget of
unfinished request frames.

Transport bookkeeping only: the broker core never sees it. A connection is whatever has what
:class:`Connection` declares (the TCP transport's :class:`~metaq.broker.transport.BrokerProtocol`); the
registry admits it (or not, past maxConnections), closes it when it idles or never completes a request,
and sheds the largest unfinished frame when the frames being received together outgrow
maxPartialFramesSize.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from metaq.broker.config import BrokerConfig
from metaq.broker.stats import BrokerStats
from metaq.errors import TooManyConnectionsError
from metaq.wording import plural

log = logging.getLogger("metaq.broker")


class Connection(Protocol):
    """What the registry needs of a connection."""

    partial_bytes: int
    """Bytes of the unfinished request frame it buffers (the registry keeps it, with the sum over all)."""
    handshaken: bool
    """Whether it has sent a whole request (before that, the handshake timeout applies)."""
    opened_at: float
    last_active: float
    """When it opened and when it last received or sent, by the registry's clock."""

    @property
    def idle(self) -> bool:
        """No request in hand (the idle timeout applies only then)."""

    def refuse_partial_frame(self, reason: str) -> None:
        """Drop its unfinished frame, answer ``reason`` and close."""

    def close_quietly(self, reason: str, level: int) -> None:
        """Close it, logging ``reason`` at ``level``."""


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The transport's limits (server.ini names in the docs); 0 disables a timeout."""

    max_connections: int = 10_000
    idle_timeout_s: float = 600.0
    handshake_timeout_s: float = 30.0
    partial_frames_bytes_max: int = 128 * 1024 * 1024

    @classmethod
    def from_config(cls, config: BrokerConfig) -> ConnectionLimits:
        return cls(config.max_connections, config.connection_idle_timeout_s,
                   config.connection_handshake_timeout_s, config.max_partial_frames_bytes)


REFUSING_CONNECTIONS_MAX = 256
"""Connections over maxConnections waiting for their first request to be refused with an answer; past it
more are closed at once, without one."""
REFUSAL_TIMEOUT_S = 5.0
"""How long a refused connection may take to send the header of its first request."""
SWEEP_INTERVAL_MAX_S = 1.0


class ConnectionRegistry:
    """What the broker's connections share: their count, the idle sweep and the partial-frame budget.

    Transport bookkeeping only (the request handlers never see it). Every operation is O(1) per
    connection event, except two: the sweep, once per SWEEP_INTERVAL_MAX_S (or a quarter of the
    shortest timeout), walks the open connections; and shedding, which happens only past the
    partial-frame budget, looks for the connection with the biggest unfinished frame.
    """

    def __init__(self, limits: ConnectionLimits, stats: BrokerStats,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self.stats = stats
        self.clock = clock
        self.open: set[Connection] = set()
        self.refusing = 0
        self.partial_bytes = 0
        """Bytes of unfinished request frames buffered over every open connection."""

    # -- admission ----------------------------------------------------------------------------

    def admit(self, conn: Connection) -> bool:
        """Count a new connection in, or False when maxConnections are open (the caller refuses it)."""
        if len(self.open) >= self.limits.max_connections:
            self.stats.connections_refused += 1
            return False
        self.open.add(conn)
        self.stats.connections = len(self.open)
        self.stats.connections_total += 1
        return True

    def remove(self, conn: Connection) -> None:
        if conn in self.open:
            self.open.discard(conn)
            self.stats.connections = len(self.open)
            self.partial_changed(conn, 0)

    def refusal_message(self) -> str:
        return (f"the broker already has {plural(len(self.open), 'connection')} open (maxConnections="
                f"{self.limits.max_connections}); {TooManyConnectionsError.hint.split('; ', 1)[-1]}")

    # -- unfinished frames ----------------------------------------------------------------------

    def partial_changed(self, conn: Connection, partial_bytes: int) -> None:
        """``conn`` now buffers ``partial_bytes`` of an unfinished frame; shed frames past the budget."""
        self.partial_bytes += partial_bytes - conn.partial_bytes
        conn.partial_bytes = partial_bytes
        self.stats.partial_frame_bytes = self.partial_bytes
        while self.partial_bytes > self.limits.partial_frames_bytes_max:
            victim = max(self.open, key=lambda c: c.partial_bytes)
            if victim.partial_bytes == 0:  # pragma: no cover - the sum says otherwise
                break
            self.stats.partial_frames_refused += 1
            victim.refuse_partial_frame(
                f"the broker is buffering {self.partial_bytes} bytes of unfinished request frames, over "
                f"maxPartialFramesSize={self.limits.partial_frames_bytes_max}, and this request's was the "
                "largest; retry, or send smaller batches")

    # -- timeouts -------------------------------------------------------------------------------

    @property
    def sweep_interval_s(self) -> float | None:
        timeouts = [t for t in (self.limits.idle_timeout_s, self.limits.handshake_timeout_s) if t > 0]
        return min(SWEEP_INTERVAL_MAX_S, min(timeouts) / 4) if timeouts else None

    def sweep(self) -> int:
        """Close connections past the idle or handshake timeout; returns how many."""
        now = self.clock()
        idle_s, handshake_s = self.limits.idle_timeout_s, self.limits.handshake_timeout_s
        closed = 0
        for conn in list(self.open):
            if not conn.handshaken:
                if handshake_s > 0 and now - conn.opened_at > handshake_s:
                    conn.close_quietly(f"no request within connectionHandshakeTimeoutSeconds={handshake_s:g}",
                                       logging.INFO)
                    self.stats.connections_timed_out += 1
                    closed += 1
            elif idle_s > 0 and conn.idle and now - conn.last_active > idle_s:
                conn.close_quietly(f"idle for connectionIdleTimeoutSeconds={idle_s:g}", logging.DEBUG)
                self.stats.connections_timed_out += 1
                closed += 1
        return closed

    async def run_sweeper(self) -> None:
        interval = self.sweep_interval_s
        if interval is None:
            return
        while True:
            await asyncio.sleep(interval)
            try:
                self.sweep()
            except Exception:  # the sweeper must outlive a bug in one connection's bookkeeping
                log.exception("connection sweep failed")
