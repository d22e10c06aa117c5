"""HTTP Basic authentication for the HTTP API (docs/security.md#http-authentication).

With ``authRequired`` every request but ``/openapi.json`` needs an ``Authorization: Basic`` header whose
user and password match a stored SCRAM credential (the users file, or ZooKeeper in cluster mode: the same
store the SCRAM handshake reads). The password is checked by deriving its StoredKey with the credential's
salt and iterations and comparing in constant time (:func:`metaq.security.scram.password_matches`); the
broker never holds the password itself. Basic sends the password in every request, so it is refused on
plain HTTP unless ``httpBasicAuthOverPlaintext=true`` says the network is trusted.

The principal (``User:<name>``) goes into the request's :class:`~metaq.broker.session.Session`, and the
core's one dispatch point (:meth:`Broker.handle <metaq.broker.core.Broker.handle>`) applies the ACLs and
quotas to it exactly as to a TCP connection. A successful check is remembered for
:data:`VERIFIED_TTL_S` (keyed by a hash of user and password, and the stored key it matched, so a changed
password or a removed user takes effect at once), so a client sending many requests does not pay
PBKDF2 for each.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import web

from metaq.broker.authorization import credential_lookup
from metaq.broker.core import Broker
from metaq.errors import ConfigError, MetaqError, SaslAuthenticationError
from metaq.http import errors
from metaq.security.principal import check_user_name, user_principal
from metaq.security.scram import password_matches

log = logging.getLogger("metaq.broker.auth")

routes_handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

PRINCIPAL_KEY: Final = "metaq.principal"
"""Where the middleware leaves the authenticated principal on the aiohttp request."""
REALM: Final = 'Basic realm="metaq", charset="UTF-8"'
VERIFIED_TTL_S: Final = 60.0
VERIFIED_MAX: Final = 10_000
OPEN_PATHS: Final = frozenset({"/openapi.json"})


def _unauthorized(message: str) -> web.Response:
    response = errors.json_error(401, errors.error_body(401, SaslAuthenticationError.code,
                                                        "SASL_AUTHENTICATION_FAILED", message))
    response.headers["WWW-Authenticate"] = REALM
    return response


def _basic_credentials(header: str) -> tuple[str, str] | None:
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, colon, password = base64.b64decode(encoded.strip(), validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    if not colon:
        return None
    return user, password


class BasicAuthenticator:
    """Checks Basic credentials for one broker, remembering successes for a while."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._verified: dict[bytes, tuple[bytes, float]] = {}

    async def principal(self, header: str) -> str | None:
        """``User:<name>`` for a valid ``Authorization`` header, None for a wrong one; MetaqError when the
        users cannot be read."""
        parsed = _basic_credentials(header)
        if parsed is None:
            return None
        user, password = parsed
        try:
            check_user_name(user)
        except ValueError:
            return None
        if self.broker.credentials is None:
            self.broker.credentials = credential_lookup(self.broker)
        credential = await asyncio.to_thread(self.broker.credentials, user)
        if credential is None:
            return None
        key = hashlib.sha256(f"{user}\0{password}".encode()).digest()
        seen = self._verified.get(key)
        now = time.monotonic()
        if seen is not None and seen[0] == credential.stored_key and seen[1] > now:
            return user_principal(user)
        if not await asyncio.to_thread(password_matches, credential, password):
            return None
        if len(self._verified) >= VERIFIED_MAX:
            self._verified.clear()
        self._verified[key] = (credential.stored_key, now + VERIFIED_TTL_S)
        return user_principal(user)


@web.middleware
async def basic_auth_middleware(request: web.Request, handler: routes_handler) -> web.StreamResponse:
    broker: Broker = request.app[AUTHENTICATOR_KEY].broker
    if not broker.config.auth_required or request.path in OPEN_PATHS:
        return await handler(request)
    header = request.headers.get("Authorization")
    if header is None:
        return _unauthorized("this broker requires authentication (authRequired): send HTTP Basic credentials "
                             "of a metaq user (metaq acl user add)")
    if not request.secure and not broker.config.http_basic_auth_over_plaintext:
        return errors.json_error(403, errors.error_body(
            403, SaslAuthenticationError.code, "SASL_AUTHENTICATION_FAILED",
            "HTTP Basic credentials are refused on plain HTTP (they would travel in clear text): use HTTPS "
            "(sslCertFile with sslHttp=true), or set httpBasicAuthOverPlaintext=true on a trusted network"))
    try:
        principal = await request.app[AUTHENTICATOR_KEY].principal(header)
    except (ConfigError, MetaqError) as exc:
        log.error("cannot look up an HTTP user: %s", exc)
        return _unauthorized("the broker cannot read its users now; try again later")
    if principal is None:
        log.warning("HTTP authentication from %s failed", request.remote)
        return _unauthorized("wrong user name or password")
    request[PRINCIPAL_KEY] = principal
    return await handler(request)


AUTHENTICATOR_KEY: web.AppKey[BasicAuthenticator] = web.AppKey("authenticator", BasicAuthenticator)
