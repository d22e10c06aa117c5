"""HTTP Basic credentials checked against the stored SCRAM credentials (docs/security.md#http-authentication).

Shared by the two HTTP servers of a broker: the HTTP API (:mod:`metaq.http.auth`) and the dashboard
(:mod:`metaq.broker.dashboard.server`). No HTTP library here: a server hands over the ``Authorization``
header and whether the request came over TLS, and gets a principal or a :class:`Refusal` to answer with.

The password is checked by deriving its StoredKey with the stored credential's salt and iterations and
comparing in constant time (:func:`metaq.security.scram.password_matches`); the broker never keeps the
password. An unknown user costs the same PBKDF2 as a known one (against a fixed dummy credential), so the
answer's timing does not tell which user names exist. A success is remembered for :data:`VERIFIED_TTL_S`
(keyed by a hash of user and password and by the stored key it matched, so a changed password or a
removed user applies at once), so a client sending many requests does not pay PBKDF2 for each. Basic
sends the password with every request: on plain HTTP it is refused unless ``httpBasicAuthOverPlaintext``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import hashlib
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from metaq.broker.security_sources import credential_lookup
from metaq.errors import ConfigError, MetaqError
from metaq.security.principal import check_user_name, user_principal
from metaq.security.scram import ScramCredential, make_credential, password_matches

if TYPE_CHECKING:
    from metaq.broker.core import Broker

log = logging.getLogger("metaq.broker.auth")

REALM: Final = 'Basic realm="metaq", charset="UTF-8"'
"""The ``WWW-Authenticate`` value of a 401."""
VERIFIED_TTL_S: Final = 60.0
VERIFIED_MAX: Final = 10_000


@functools.cache
def _dummy() -> ScramCredential:
    return make_credential("not a password anyone has", salt=b"metaq-dummy-salt")


@dataclass(frozen=True, slots=True)
class Refusal:
    """What to answer instead: 401 (with :data:`REALM`) or 403, and why."""

    status: int
    message: str


def basic_credentials(header: str) -> tuple[str, str] | None:
    """(user, password) of an ``Authorization: Basic ...`` value; None when it is not one."""
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, colon, password = base64.b64decode(encoded.strip(), validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (user, password) if colon else None


class BasicAuthenticator:
    """Checks Basic credentials for one broker, remembering successes for a while."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._verified: dict[bytes, tuple[bytes, float]] = {}

    async def authenticate(self, header: str | None, secure: bool, peer: str) -> str | Refusal:
        """The principal (``User:<name>``) of a request with this ``Authorization`` header, or the refusal."""
        if header is None:
            return Refusal(401, "this broker requires authentication (authRequired): send HTTP Basic credentials "
                                "of a metaq user (metaq acl user add)")
        if not secure and not self.broker.config.http_basic_auth_over_plaintext:
            return Refusal(403, "HTTP Basic credentials are refused on plain HTTP (they would travel in clear text): "
                                "use HTTPS (sslCertFile with sslHttp=true), or set httpBasicAuthOverPlaintext=true "
                                "on a trusted network")
        try:
            principal = await self._check(header)
        except (ConfigError, MetaqError) as exc:
            log.error("cannot look up an HTTP user: %s", exc)
            return Refusal(401, "the broker cannot read its users now; try again later")
        if principal is None:
            log.warning("HTTP authentication from %s failed", peer)
            return Refusal(401, "wrong user name or password")
        return principal

    async def _check(self, header: str) -> str | None:
        parsed = basic_credentials(header)
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
            await asyncio.to_thread(password_matches, _dummy(), password)  # as long as for a known user
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
