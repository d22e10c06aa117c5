"""The broker core's one dispatch point: a request's way from a transport to its handler.

:meth:`metaq.broker.core.Broker.handle` (this mixin's, :class:`RequestDispatch`) is where every
transport's request enters the core, and so where the checks no handler may skip are made, in order:
authentication (authRequired), the ACLs (:mod:`metaq.broker.authorization`), a slave's right to
replicate (:mod:`metaq.broker.replica_access`), the draining broker's refusals, the principal's quotas
(a wait for its debt, a fetch cut to its allowance, and the bytes metered into the reply's throttle). The
handler registered for the request's type answers it; whatever it raises becomes the API's error response
through :mod:`metaq.broker.error_mapping`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from metaq.broker import audit, authorization
from metaq.broker.config import BrokerConfig
from metaq.broker.error_mapping import error_response
from metaq.broker.quotas import FETCH, PRODUCE, Quotas
from metaq.broker.replica_access import replica_fetch_refusal
from metaq.broker.session import DeferredReply, FileReply, Session
from metaq.errors import BrokerStoppingError, InvalidRequestError, SaslAuthenticationError
from metaq.protocol import messages as m
from metaq.security.acl import Acls

REFUSED_WHILE_STOPPING: frozenset[type] = frozenset({m.ProduceRequest, m.MultiProduceRequest, m.FetchRequest,
                                                     m.MultiFetchRequest})
"""Requests a draining broker answers with BROKER_STOPPING (the others still work while it drains)."""
METERED: frozenset[type] = frozenset({m.ProduceRequest, m.MultiProduceRequest, m.FetchRequest, m.MultiFetchRequest})
PRODUCES: frozenset[type] = frozenset({m.ProduceRequest, m.MultiProduceRequest})
FETCHES: frozenset[type] = METERED - PRODUCES
"""Requests whose bytes count against the principal's quotas (metaq.broker.quotas); slaves' fetches do not.
A produce is counted as it is admitted, a fetch once it is answered (its size is known then).
A MultiFetch v0 reply has no throttle_time_ms (v1 has): its connection is muted all the same, the client not told."""
BEFORE_AUTHENTICATION: frozenset[type] = frozenset({m.ApiVersionsRequest, m.SaslHandshakeRequest,
                                                    m.SaslAuthenticateRequest})
"""What an unauthenticated connection may send when authRequired is set; anything else is refused and
the connection closed."""


class RequestDispatch:
    """:meth:`handle` and the quota steps around it: a mixin of :class:`metaq.broker.core.Broker`, whose
    attributes below are."""

    config: BrokerConfig
    handlers: dict[type, Callable[..., Any]]
    """Request type -> handler (:data:`metaq.broker.core.Handler`)."""
    stopping: bool
    quotas: Quotas
    acls: Acls
    topics: dict[str, Any]
    audit: audit.Audit

    def handle(self, request: Any, session: Session | None = None, *, deferred: bool = False,
               quota_waited: bool = False) -> Any:
        """The response to ``request``, or a coroutine of it; never raises (see error_mapping).

        ``session`` is the connection the request came on, as the handlers see it (a fetch counts its
        long polls against it). A coroutine answers its own errors too; only its cancellation is left
        to the caller. With ``deferred`` a waiting fetch comes back as a
        :class:`~metaq.broker.waiters.DeferredReply`, resolved (metered first) in the step of the append
        that wakes it; without it, as a coroutine awaiting that reply. ``quota_waited``: the request has
        waited its turn and its principal's debt (only :meth:`_after_quota_wait` says so).
        """
        kind = type(request)
        if (session is not None and session.principal is None and self.config.auth_required
                and kind not in BEFORE_AUTHENTICATION):
            session.close_after_reply = True
            name = getattr(kind, "API_NAME", kind.__name__)
            return m.error_response(getattr(kind, "API_KEY", -1), SaslAuthenticationError.code,
                                    f"{name} refused: this broker requires authentication (authRequired) and "
                                    f"the connection has not authenticated; {SaslAuthenticationError.hint}")
        replica = kind is m.FetchRequest and request.replica_id >= 0
        produce_throttle_ms = 0
        try:
            answer_filter = None
            if session is not None and self.config.acl_enabled and session.principal is not None:
                request, answer_filter = authorization.authorize(self, session, request)
            if replica:
                refusal = replica_fetch_refusal(self.config, request, session)
                if refusal is not None:
                    replica = False  # metered as the consumer's fetch it is
                    raise refusal
            handler = self.handlers.get(kind)
            if handler is None:
                raise InvalidRequestError(f"{kind.API_NAME} is not served by this broker version")
            if self.stopping and kind in REFUSED_WHILE_STOPPING:
                raise BrokerStoppingError(BrokerStoppingError.hint)
            if kind in METERED and session is not None and not replica \
                    and self.config.quotas_set:
                direction = PRODUCE if kind in PRODUCES else FETCH
                behind = session.quota_queue
                if behind is not None and behind.done():
                    behind = session.quota_queue = None
                if not quota_waited and (behind is not None or self.quotas.wait_s(session, direction) > 0):
                    # the principal is in debt (on any connection), or an earlier request of this connection
                    # waits for it: this one waits behind it (first in, first handled, as the replies go out)
                    hold: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                    session.hold = hold  # its connection handles nothing else meanwhile (the transports)
                    session.quota_queue = hold
                    return self._answer(kind.API_KEY,
                                        self._after_quota_wait(request, session, direction, behind, hold))
                if direction == FETCH:
                    allowance = self.quotas.fetch_allowance(session)
                    if allowance is not None and allowance < request.max_bytes:
                        request = dataclasses.replace(request, max_bytes=allowance)
            if kind in PRODUCES and session is not None:
                # counted as it is admitted, not when it is stored: the next request of the principal then sees
                # this one's debt, however many were read at once (a Kafka client pipelines up to 1,024)
                produce_throttle_ms = self.quotas.record(session, PRODUCE, _produced_bytes(request))
            result = handler(self, request, session)
            if answer_filter is not None:
                result = authorization.filtered(result, answer_filter)
        except Exception as exc:
            result = error_response(kind.API_KEY, exc)
        after: Callable[[Any], None] | None = None
        if produce_throttle_ms:
            after = functools.partial(_tell_throttle, produce_throttle_ms)
        elif session is not None and kind in FETCHES and not replica:
            after = functools.partial(self._meter_fetch, request, session=session)
        if isinstance(result, DeferredReply):
            if after is not None:
                result.on_done(after)
            return result if deferred else self._answer(kind.API_KEY, result.wait())
        if inspect.iscoroutine(result):
            return self._answer(kind.API_KEY, result, after)
        if after is not None:
            after(result)
        return result

    async def _after_quota_wait(self, request: Any, session: Session, direction: str,
                                behind: asyncio.Future[None] | None, hold: asyncio.Future[None]) -> Any:
        """Handle ``request`` once the connection's earlier waiting request (``behind``) is done and its
        principal's debt is paid (docs/security.md#quotas); its connection handles nothing else meanwhile
        (``hold``), so more connections or pipelining gain nothing."""
        try:
            if behind is not None:
                await asyncio.wait([behind])
            while (wait_s := self.quotas.wait_s(session, direction)) > 0:
                await asyncio.sleep(wait_s)  # and again: other connections of the principal went on meanwhile
            # the hold the handler may set is this request's own: another one's (a transport that did not take it:
            # HTTP has no connection to hold) is put back after, and this one's own hold is nobody's to wait for
            outer, session.hold = session.hold, None
            if outer is hold:
                outer = None
            result = self.handle(request, session, quota_waited=True)
            inner, session.hold = session.hold, outer
            if isinstance(result, DeferredReply):
                result = result.wait()
            if inspect.isawaitable(result):
                result = await result
            if inner is not None:
                await inner
            return result
        finally:
            if not hold.done():
                hold.set_result(None)

    async def _answer(self, api_key: int, pending: Awaitable[Any],
                      after: Callable[[Any], None] | None = None) -> Any:
        try:
            result = await pending
        except Exception as exc:
            result = error_response(api_key, exc)
        if after is not None:
            after(result)
        return result

    def _meter_fetch(self, request: Any, result: Any, *, session: Session) -> None:
        """Count a fetch's bytes against the principal's quota (known once it is answered); the throttle into
        the reply."""
        if isinstance(request, m.MultiFetchRequest):
            nbytes = sum(len(p.records) for p in getattr(result, "partitions", ()))
        else:
            nbytes = result.file_slice.size if isinstance(result, FileReply) else len(getattr(result, "records", b""))
        _tell_throttle(self.quotas.record(session, FETCH, nbytes), result)


def _produced_bytes(request: m.ProduceRequest | m.MultiProduceRequest) -> int:
    """The record bytes a produce offers (a MultiProduce's batches count as that many Produces)."""
    if isinstance(request, m.ProduceRequest):
        return len(request.records)
    return sum(len(p.records) for p in request.partitions)


def _tell_throttle(throttle_ms: int, result: Any) -> None:
    """Put a quota's throttle into the reply's ``throttle_time_ms`` (where its API version has one)."""
    if throttle_ms:
        response = result.response if isinstance(result, FileReply) else result
        if hasattr(response, "throttle_time_ms"):
            response.throttle_time_ms = throttle_ms
