"""What passes between a transport and the broker core besides the protocol's messages.

A transport (TCP today, :mod:`metaq.broker.transport`; an HTTP transport and the replica fetcher later)
creates one :class:`Session` per client connection and hands it to :meth:`Broker.handle
<metaq.broker.core.Broker.handle>` with each request. A fetch may be answered with a
:class:`FileReply`, whose records stay in the segment file until the transport sends them.
"""

from __future__ import annotations

from dataclasses import dataclass

from metaq.protocol import messages as m
from metaq.storage import FileSlice


@dataclass(slots=True)
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
    close_after_reply: bool = False
    """Set by the core when the connection must be closed once its reply is out (an authentication failure)."""
    waiting_fetches: int = 0
    """Long polls of this connection waiting now (bounded by maxWaitingFetchesPerConnection)."""
    quota_principal: str | None = None
    """The principal this connection is counted under for quotaMaxConnections (:mod:`metaq.broker.quotas`)."""
    throttle_ms: int = 0
    """Set by the core when a reply took the principal over its byte rate: the transport reads nothing more
    from this connection for that long (then sets it back to 0)."""


@dataclass(slots=True)
class FileReply:
    """A fetch response whose records are ``file_slice``: sent from the file (sendfile over TCP).

    Whoever receives it owns the slice: it must ``release()`` it once the bytes are sent, or when the
    reply is dropped (a closed connection, a one-way request), so that retention may remove the segment.
    """

    response: m.FetchResponse
    file_slice: FileSlice
