"""Quotas per principal: produce and fetch byte rates, and how many connections one principal may hold.

Kafka's model. Bytes are measured per principal (``User:alice``, ``User:<CN>`` for a client certificate,
:data:`ANONYMOUS` for a connection that has not authenticated where authRequired is off), over every
connection and every protocol together (the binary and TLS ports, HTTP, Kafka): the state is the
principal's, not the connection's.

The rate is measured with a virtual clock per (principal, direction) (GCRA, the generic cell rate
algorithm, which is a leaky bucket): each request moves the principal's "paid until" time forward by
``bytes / rate``; what lies more than :data:`QUOTA_WINDOW_S` ahead of now is the principal's **debt**. A
principal may burst one window's worth of bytes; then three things hold it to its rate:

- **a request of a principal in debt waits** (:meth:`Quotas.wait_s`, applied by the core before the
  request is handled, on whichever connection or protocol it came): the answer is delayed until the
  debt is paid, and the connection handles nothing else meanwhile (requests it had already pipelined wait
  behind it, in order: ``Session.quota_queue``), so more connections do not help;
- **a fetch is cut to what is left of the window** (:meth:`Quotas.fetch_allowance`: its ``max_bytes``
  lowered), so a 1 MiB fetch of a 50 KiB/s principal gets about 50 KiB, not 1 MiB and 20 s of debt
  (a fetch still returns its first batch whole, however big);
- the answer that takes the principal into debt carries ``throttle_time_ms`` (at most
  :data:`THROTTLE_MAX_MS`), and its connection is not read for that long (:attr:`Session.throttle_ms`):
  the client is told, and one that ignores it is slowed all the same.

A produce is counted as it is admitted (so the next request, however soon, sees its debt), a fetch once
answered (its size is known then). So over any span of T seconds a principal gets at most
``rate x (T + QUOTA_WINDOW_S)`` bytes, plus one request per connection it holds (quotaMaxConnections
bounds them), plus, for fetches, the part of a first batch bigger than what was left of the window. With
the defaults and batches well under one second of quota, that is within 1.25x the quota over 10 s
(docs/security.md#quotas, figures in docs/benchmarks.md). Nobody is dropped: a throttled request is
answered, late.

Slaves' replica fetches are not counted (replication must keep up whatever clients do). The limits are
read from the broker's configuration at each request, so a reload applies them without a restart.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from metaq.errors import TooManyConnectionsError
from metaq.wording import plural

if TYPE_CHECKING:
    from metaq.broker.config import BrokerConfig
    from metaq.broker.session import Session

ANONYMOUS: Final = "User:ANONYMOUS"
"""The principal of a connection that has not authenticated (only possible where authRequired is off)."""
QUOTA_WINDOW_S: Final = 1.0
"""The burst a principal may send at once (one second of its rate) before it is throttled."""
THROTTLE_MAX_MS: Final = 10_000
"""The longest throttle one answer tells (and mutes its connection for; well below the clients' request
timeout): a longer debt is paid by the wait of the principal's next request (:meth:`Quotas.wait_s`)."""
PRODUCE: Final = "produce"
FETCH: Final = "fetch"


@dataclass(frozen=True, slots=True)
class QuotaLimits:
    """One principal's limits; 0 = unlimited."""

    produce_bytes_per_s: int = 0
    fetch_bytes_per_s: int = 0
    connections_max: int = 0


def limits_for(config: BrokerConfig, principal: str) -> QuotaLimits:
    """The limits of ``principal``: its quotaOverrides entry, over the [system] defaults."""
    override = config.quota_overrides.get(principal)
    produce, fetch, conns = (config.quota_producer_byte_rate, config.quota_consumer_byte_rate,
                             config.quota_max_connections)
    if override is not None:
        produce = produce if override.produce_bytes_per_s is None else override.produce_bytes_per_s
        fetch = fetch if override.fetch_bytes_per_s is None else override.fetch_bytes_per_s
        conns = conns if override.connections_max is None else override.connections_max
    return QuotaLimits(produce, fetch, conns)


@dataclass(slots=True)
class PrincipalUsage:
    """What one principal has used: for throttling, and for /metrics and ``metaq stats``."""

    connections: int = 0
    paid_until: dict[str, float] | None = None
    bytes_total: dict[str, int] | None = None
    throttle_ms_total: dict[str, int] | None = None
    throttled_total: dict[str, int] | None = None
    connections_refused: int = 0


class Quotas:
    """The byte rates and connection counts of every principal, against the broker's configuration.

    ``config`` is called for the configuration in force (the broker's, which a reload replaces).
    Network-free: the transport and the SASL handler call :meth:`admit` / :meth:`release` /
    :meth:`reassign`; :meth:`Broker.handle <metaq.broker.core.Broker.handle>` calls :meth:`record`.
    """

    def __init__(self, config: Callable[[], BrokerConfig], clock: Callable[[], float] = time.monotonic) -> None:
        self._config = config
        self.clock = clock
        self.usage: dict[str, PrincipalUsage] = {}

    def _usage(self, principal: str) -> PrincipalUsage:
        usage = self.usage.get(principal)
        if usage is None:
            usage = self.usage[principal] = PrincipalUsage(0, {}, {}, {}, {})
        return usage

    # -- connections ----------------------------------------------------------------------------

    def admit(self, session: Session, principal: str) -> str | None:
        """Count ``session`` as one of ``principal``'s connections; the refusal message when that would be
        over its limit (then it is not counted)."""
        limit = limits_for(self._config(), principal).connections_max
        usage = self._usage(principal)
        if limit and usage.connections >= limit:
            usage.connections_refused += 1
            return (f"{principal} already has {plural(usage.connections, 'connection')} open to this broker, its limit "
                    f"(quotaMaxConnections / quotaOverrides); {TooManyConnectionsError.hint.split('; ', 1)[-1]}")
        usage.connections += 1
        session.quota_principal = principal
        return None

    def release(self, session: Session) -> None:
        principal = session.quota_principal
        if principal is not None:
            session.quota_principal = None
            self._usage(principal).connections -= 1

    def reassign(self, session: Session, principal: str) -> str | None:
        """``session`` authenticated as ``principal``: count it there instead (the refusal, if over)."""
        old = session.quota_principal
        if old == principal:
            return None
        self.release(session)
        refusal = self.admit(session, principal)
        if refusal is not None and old is not None:
            self._usage(old).connections += 1
            session.quota_principal = old
        return refusal

    # -- byte rates -----------------------------------------------------------------------------

    def record(self, session: Session, direction: str, nbytes: int) -> int:
        """Count ``nbytes`` of ``direction`` (PRODUCE or FETCH) for the session's principal; the throttle
        in ms (0: none), also left in ``session.throttle_ms`` for the transport to mute the connection."""
        principal = session.principal or ANONYMOUS
        rate = self._rate(principal, direction)
        usage = self.usage.get(principal) or self._usage(principal)
        assert usage.bytes_total is not None and usage.paid_until is not None
        usage.bytes_total[direction] = usage.bytes_total.get(direction, 0) + nbytes
        if not rate:
            return 0
        now = self.clock()
        paid = max(usage.paid_until.get(direction, now), now) + nbytes / rate
        usage.paid_until[direction] = paid
        throttle_ms = min(int((paid - now - QUOTA_WINDOW_S) * 1000), THROTTLE_MAX_MS)
        if throttle_ms <= 0:
            return 0
        assert usage.throttle_ms_total is not None and usage.throttled_total is not None
        usage.throttle_ms_total[direction] = usage.throttle_ms_total.get(direction, 0) + throttle_ms
        usage.throttled_total[direction] = usage.throttled_total.get(direction, 0) + 1
        session.throttle_ms = max(session.throttle_ms, throttle_ms)
        return throttle_ms

    def _rate(self, principal: str, direction: str) -> int:
        config = self._config()
        override = config.quota_overrides.get(principal) if config.quota_overrides else None
        if direction == PRODUCE:
            rate = config.quota_producer_byte_rate
            if override is not None and override.produce_bytes_per_s is not None:
                rate = override.produce_bytes_per_s
        else:
            rate = config.quota_consumer_byte_rate
            if override is not None and override.fetch_bytes_per_s is not None:
                rate = override.fetch_bytes_per_s
        return rate

    def wait_s(self, session: Session, direction: str) -> float:
        """How long a request of the session's principal must wait before it is handled: its debt (0: none)."""
        usage = self.usage.get(session.principal or ANONYMOUS)
        if usage is None or not usage.paid_until:
            return 0.0
        paid = usage.paid_until.get(direction)
        if paid is None:
            return 0.0
        debt = paid - self.clock() - QUOTA_WINDOW_S
        return debt if debt > 0.0005 and self._rate(session.principal or ANONYMOUS, direction) else 0.0

    def fetch_allowance(self, session: Session) -> int | None:
        """The bytes the session's principal may still fetch in this window (at least 1); None: no fetch quota."""
        principal = session.principal or ANONYMOUS
        rate = self._rate(principal, FETCH)
        if not rate:
            return None
        usage = self.usage.get(principal)
        now = self.clock()
        paid = max((usage.paid_until or {}).get(FETCH, now), now) if usage is not None else now
        return max(1, int((now + QUOTA_WINDOW_S - paid) * rate))

    def describe(self) -> dict[str, Any]:
        """Per principal: connections, bytes, throttles (``metaq stats`` ``quotas``, /metrics)."""
        return {p: {"connections": u.connections, "connections_refused": u.connections_refused,
                    "bytes": dict(u.bytes_total or {}), "throttle_ms": dict(u.throttle_ms_total or {}),
                    "throttled": dict(u.throttled_total or {})}
                for p, u in sorted(self.usage.items())}
