"""SaslHandshake and SaslAuthenticate: SCRAM-SHA-256 on a connection (docs/security.md).

A connection that fails (a wrong password, an unknown user, a malformed or out-of-order message, an
unsupported mechanism) gets the error and is closed (``session.close_after_reply``): a client cannot
try passwords on one connection, and nothing it sends can do more than that. Credentials are looked up
off the event loop: in the users file of an embedded broker, in ZooKeeper in cluster mode.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from metaq.broker.security_sources import CredentialLookup, credential_lookup
from metaq.broker.session import Session
from metaq.errors import (
    ConfigError,
    IllegalSaslStateError,
    InvalidRequestError,
    MetaqError,
    SaslAuthenticationError,
    TooManyConnectionsError,
    UnsupportedSaslMechanismError,
)
from metaq.protocol import messages as m
from metaq.security.principal import user_principal
from metaq.security.scram import MECHANISM, ScramError, ScramServer

if TYPE_CHECKING:
    from metaq.broker.core import Broker, Handler

log = logging.getLogger("metaq.broker.auth")

def _refuse(session: Session, exc: MetaqError) -> MetaqError:
    session.close_after_reply = True
    session.sasl = None
    return exc


def handle_sasl_handshake(broker: Broker, req: m.SaslHandshakeRequest, session: Session | None) -> Any:
    if session is None:
        raise InvalidRequestError("SaslHandshake is for connections")
    # A connection known by its client certificate may still log in with SASL (a slave with sslReplication
    # and replicationUser, to a master with sslClientAuth=want): the SASL principal then replaces the
    # certificate's, as Kafka's SASL_SSL listener does. A second SASL exchange is refused.
    if session.sasl_authenticated or session.sasl is not None:
        raise _refuse(session, IllegalSaslStateError(
            "SaslHandshake again on a connection that " + ("is authenticated" if session.sasl_authenticated
                                                           else "has an exchange in progress")))
    if req.mechanism != MECHANISM:
        raise _refuse(session, UnsupportedSaslMechanismError(
            f"mechanism {req.mechanism[:50]!r} is not supported; this broker accepts {MECHANISM}"))
    session.sasl = ScramServer()
    return m.SaslHandshakeResponse(mechanisms=[MECHANISM])


def handle_sasl_authenticate(broker: Broker, req: m.SaslAuthenticateRequest, session: Session | None) -> Any:
    if session is None:
        raise InvalidRequestError("SaslAuthenticate is for connections")
    scram = session.sasl
    if not isinstance(scram, ScramServer):
        raise _refuse(session, IllegalSaslStateError("SaslAuthenticate before SaslHandshake"))
    if scram.stage == "start":
        try:
            name = scram.parse_first(req.auth_bytes)
        except ScramError as exc:
            raise _refuse(session, SaslAuthenticationError(f"authentication failed: {exc}")) from None
        return _first(broker, session, scram, name)
    try:
        server_final = scram.final(req.auth_bytes)
    except ScramError as exc:
        log.warning("authentication of %r from %s failed: %s", scram.username, session.peer, exc)
        raise _refuse(session, SaslAuthenticationError(str(exc))) from None
    session.sasl = None
    principal = user_principal(scram.username)
    refusal = broker.quotas.reassign(session, principal)
    if refusal is not None:  # quotaMaxConnections: the password was right, the connection is one too many
        log.warning("refused %s from %s: %s", principal, session.peer, refusal)
        raise _refuse(session, TooManyConnectionsError(refusal))
    if session.principal is not None and session.principal != principal:
        log.info("%s, known by its certificate as %s, authenticated as %s", session.peer, session.principal, principal)
    session.principal = principal
    session.sasl_authenticated = True
    log.info("%s authenticated as %s", session.peer, session.principal)
    return m.SaslAuthenticateResponse(auth_bytes=server_final, principal=session.principal)


async def _first(broker: Broker, session: Session, scram: ScramServer, name: str) -> m.SaslAuthenticateResponse:
    if broker.credentials is None:
        broker.credentials = credential_lookup(broker)
    lookup: CredentialLookup = broker.credentials
    try:
        credential = await asyncio.to_thread(lookup, name)
    except (ConfigError, MetaqError) as exc:
        log.error("cannot look up user %r: %s", name, exc)
        raise _refuse(session, SaslAuthenticationError(
            "the broker cannot read its users now; try again later")) from None
    try:
        return m.SaslAuthenticateResponse(auth_bytes=scram.first(credential))
    except ScramError as exc:
        raise _refuse(session, SaslAuthenticationError(str(exc))) from None


HANDLERS: dict[type, Handler] = {
    m.SaslHandshakeRequest: handle_sasl_handshake,
    m.SaslAuthenticateRequest: handle_sasl_authenticate,
}
