"""What passes between a transport and the broker core besides the protocol's messages.

A transport (TCP today, :mod:`metaq.broker.transport`; an HTTP transport and the replica fetcher later)
creates one :class:`Session` per client connection and hands it to :meth:`Broker.handle
<metaq.broker.core.Broker.handle>` with each request. A fetch may be answered with a
:class:`FileReply`, whose records stay in the segment file until the transport sends them; a fetch that
waits for data with a :class:`DeferredReply`, resolved by the append that wakes it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from metaq.protocol import messages as m
from metaq.storage import FileSlice

log = logging.getLogger("metaq.broker")


@dataclass(slots=True, eq=False)
class Session:
    """A client connection as the request handlers see it: who it is, and what it holds of the broker."""

    peer: str = "?"
    tls: bool = False
    """The connection came in on the TLS port (sslPort)."""
    peer_cn: str | None = None
    """The subject CN of the client's verified certificate (mTLS), if it sent one."""
    principal: str | None = None
    """Who the connection acts as once authenticated (``User:alice``): by SASL, or by its certificate's CN."""
    sasl: object | None = None
    """The SCRAM exchange in progress (:mod:`metaq.broker.handlers.sasl`)."""
    sasl_authenticated: bool = False
    """The principal came from a SASL exchange (one per connection; a certificate's may be replaced by it)."""
    replica_id: int = -1
    """>= 0: the connection said at its handshake (ApiVersions v1) that it fetches as this replica of the
    broker id (a slave's replica fetcher); :mod:`metaq.broker.replica_access` checks it with the principal."""
    close_after_reply: bool = False
    """Set by the core when the connection must be closed once its reply is out (an authentication failure)."""
    whole_cluster_groups: bool = False
    """The groups this connection joins are balanced over every partition its JoinGroup reports, other brokers'
    included (the Kafka listener: a Kafka group has one coordinator for the whole cluster, and what it reports
    is the broker's own cluster view). Otherwise a broker balances only its own partitions (standalone groups)."""
    waiting_fetches: int = 0
    """Long polls of this connection waiting now (bounded by maxWaitingFetchesPerConnection)."""
    quota_principal: str | None = None
    """The principal this connection is counted under for quotaMaxConnections (:mod:`metaq.broker.quotas`)."""
    throttle_ms: int = 0
    """Set by the core when a reply took the principal over its byte rate: the transport reads nothing more
    from this connection for that long (then sets it back to 0)."""
    credential_key: bytes | None = None
    """The StoredKey of the credential the connection authenticated with by SASL (None: not by SASL): a
    connection whose user is removed, or whose password changed since, is closed (metaq.broker.user_watch)."""
    close: Callable[[str], None] | None = None
    """Set by the transport: end the connection now (the reason is logged)."""
    opened_at: float = 0.0
    """time.monotonic() at connect (the transport sets it)."""
    replica_fetch_at: float = -1.0
    """time.monotonic() when the last replica fetch on this connection came in: the next one, sent only after
    its reply arrived, renews the master's lease from that slave (docs/replication.md#the-masters-lease)."""
    replica_master: object | None = None
    """The mastership this connection was counted in (a slave's connections tell the master it is alive)."""
    hold: asyncio.Future[None] | None = None
    """Set by a handler that returns a coroutine and whose request must take effect before the connection's
    next one does (a produce checked in a worker thread): the transport handles no further request of this
    connection until it is done, or until that coroutine ends (then takes it back to None)."""
    quota_queue: asyncio.Future[None] | None = None
    """Done when the last request of this connection that waits for its principal's quota debt is handled:
    the connection's next metered request waits behind it (requests already read when the debt began, as a
    pipelining Kafka client sends them, are handled in order)."""


class SessionTable:
    """The connections authenticated by SASL, by principal (what a change of user must reach)."""

    def __init__(self) -> None:
        self.by_principal: dict[str, set[Session]] = {}

    def add(self, session: Session) -> None:
        if session.principal is not None:
            self.by_principal.setdefault(session.principal, set()).add(session)

    def discard(self, session: Session) -> None:
        if session.principal is None:
            return
        sessions = self.by_principal.get(session.principal)
        if sessions is not None:
            sessions.discard(session)
            if not sessions:
                del self.by_principal[session.principal]

    def of(self, principal: str) -> list[Session]:
        return list(self.by_principal.get(principal, ()))


@dataclass(slots=True)
class FileReply:
    """A fetch response whose records are ``file_slice``: sent from the file (sendfile over TCP).

    Whoever receives it owns the slice: it must ``release()`` it once the bytes are sent, or when the
    reply is dropped (a closed connection, a one-way request), so that retention may remove the segment.
    """

    response: m.FetchResponse
    file_slice: FileSlice


class DeferredReply:
    """A reply completed by a callback in the very step its answer is ready, not by a coroutine.

    A long-polling fetch as a coroutine awaiting a future would answer a loop step late: the append that
    woke it sets the future, and the fetch's task runs a step later (behind the rest of the read that
    carried the append, and every other callback of that step), re-plans and answers. A fetch that waits
    returns one of these instead; the waiter's wake-up callback reads the partition and calls :meth:`resolve`
    right inside the append's ``notify``, and whoever holds the reply (the transport) writes it from its
    :meth:`on_done` callback, in the same step. Callers that would rather await use :meth:`wait`.

    :meth:`cancel` is for the holder that can no longer deliver it (its connection closed): the waiter's
    slot is given back at once and the done callbacks are never called.
    """

    __slots__ = ("_callbacks", "done", "on_cancel", "result")

    def __init__(self) -> None:
        self._callbacks: list[Callable[[Any], None]] = []
        self.done = False
        self.result: Any = None
        self.on_cancel: Callable[[], None] | None = None

    def on_done(self, callback: Callable[[Any], None]) -> None:
        """Call ``callback(result)`` when resolved (now, if it is); callbacks run in the order added."""
        if self.done:
            callback(self.result)
        else:
            self._callbacks.append(callback)

    def resolve(self, result: Any) -> None:
        if self.done:
            return
        self.done = True
        self.result = result
        callbacks, self._callbacks = self._callbacks, []
        self.on_cancel = None
        for callback in callbacks:
            try:
                callback(result)
            except Exception:  # one holder's failure must not break the append that woke this reply
                log.exception("a deferred reply's callback failed")

    def cancel(self) -> None:
        if self.done:
            return
        self.done = True
        self._callbacks = []
        on_cancel, self.on_cancel = self.on_cancel, None
        if on_cancel is not None:
            on_cancel()

    async def wait(self) -> Any:
        """The result, for a caller that awaits; cancelling the wait cancels the reply."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def answered(result: Any) -> None:
            if not fut.done():
                fut.set_result(result)

        self.on_done(answered)
        try:
            return await fut
        except asyncio.CancelledError:
            self.cancel()
            raise
