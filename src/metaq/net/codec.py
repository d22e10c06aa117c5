"""What every connection does with the sans-IO codec besides moving bytes, asyncio or blocking alike.

:class:`~metaq.protocol.codec.ClientConnection` numbers requests and matches replies; a connection
around it also needs the settings it is opened with, the ApiVersions handshake's outcome (the highest
version of each API both sides support), and one way to turn an error reply into the matching
:class:`~metaq.errors.BrokerError` with the reply attached (``exc.response``: a FetchResponse's offset
range, say). Keeping them here is what makes the two connection kinds behave alike.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from metaq.errors import ConnectionClosedError, SaslAuthenticationError, error_for_code
from metaq.protocol.messages import (
    APIS,
    ApiVersionsRequest,
    ApiVersionsResponse,
    SaslAuthenticateRequest,
    SaslHandshakeRequest,
)
from metaq.security.scram import MECHANISM, ScramClient, ScramError

if TYPE_CHECKING:
    import ssl

DEFAULT_WRITE_BUFFER_HIGH_BYTES: Final = 1024 * 1024


@dataclass(frozen=True, slots=True)
class ConnectionSettings:
    """How a connection to a broker is opened and used."""

    client_id: str
    """Sent in every request header."""
    connect_timeout_s: float
    """TCP connect plus the ApiVersions handshake."""
    request_timeout_s: float
    """Longest wait for a reply, unless the request says otherwise."""
    max_in_flight: int
    """Requests sent and not yet answered on one connection."""
    max_frame_bytes: int
    """Largest frame sent or accepted."""
    write_buffer_high_bytes: int = DEFAULT_WRITE_BUFFER_HIGH_BYTES
    """Bytes queued in an asyncio transport before writers wait for it to drain (asyncio only)."""
    ssl_context: ssl.SSLContext | None = None
    """TLS for this connection (:mod:`metaq.net.tls`); None: plain TCP."""
    sasl_username: str | None = None
    """Authenticate as this user (SCRAM-SHA-256) right after the ApiVersions handshake; None: do not."""
    sasl_password: str | None = field(default=None, repr=False)
    replica_id: int = -1
    """>= 0: a slave's replica fetcher, which says so at the handshake (ApiVersions v1); docs/security.md."""


def handshake_request(settings: ConnectionSettings | None = None) -> ApiVersionsRequest:
    """The first request on every connection (a replica fetcher's names its replica id)."""
    replica_id = settings.replica_id if settings is not None else -1
    return ApiVersionsRequest(replica_id=replica_id)


def handshake_versions(settings: ConnectionSettings) -> dict[int, int]:
    """The ApiVersions version to send before the versions are agreed: v1 only for a replica fetcher (it needs
    the field), v0 for everyone else, so that a broker that knows only v0 still answers every other client."""
    return {ApiVersionsRequest.API_KEY: 1 if settings.replica_id >= 0 else 0}


def agree_versions(response: ApiVersionsResponse) -> dict[int, int]:
    """API key -> the highest version both this client and the broker support (keys with none are left out)."""
    theirs = {r.api_key: r for r in response.apis}
    versions: dict[int, int] = {}
    for key, spec in APIS.items():
        r = theirs.get(key)
        if r is None:
            continue
        version = min(spec.max_version, r.max_version)
        if version >= max(spec.min_version, r.min_version):
            versions[key] = version
    return versions


def raise_for_error(response: Any, what: str = "") -> Any:
    """Return ``response``, or raise its error (with ``exc.response`` set) when error_code != 0.

    ``what`` (e.g. ``"Fetch orders:1-3 at offset 42"``) goes in front of the broker's message.
    """
    code = response.error_code
    if code:
        message = response.error_message or ""
        raise error_for_code(code, f"{what}: {message}" if what else message, response)
    return response


def plaintext_hint(exc: ConnectionClosedError, settings: ConnectionSettings) -> ConnectionClosedError:
    """A connection closed during the handshake: without TLS, say that the port may be a TLS one."""
    if settings.ssl_context is not None:
        return exc
    return ConnectionClosedError(f"{exc} (if this is the broker's TLS port, sslPort, connect with TLS: --tls, "
                                 "or tls=True)")


def authenticate(settings: ConnectionSettings, broker: str) -> Generator[Any, Any, str | None]:
    """The SASL exchange both connection kinds run after ApiVersions, as a generator: it yields each
    request, is sent its response, and returns the principal (None: no user configured, nothing sent).

    Raises the broker's error (SaslAuthenticationError for a wrong password), or SaslAuthenticationError
    when the broker's final message does not prove it holds the user's credential."""
    if settings.sasl_username is None:
        return None
    if settings.sasl_password is None:
        raise SaslAuthenticationError(f"no password for user {settings.sasl_username!r}")
    what = f"authenticating to broker {broker} as {settings.sasl_username!r}"
    scram = ScramClient(settings.sasl_username, settings.sasl_password)
    raise_for_error((yield SaslHandshakeRequest(MECHANISM)), what)
    first = raise_for_error((yield SaslAuthenticateRequest(scram.first())), what)
    try:
        final = scram.final(first.auth_bytes)
    except ScramError as exc:
        raise SaslAuthenticationError(f"{what}: {exc}") from None
    done = raise_for_error((yield SaslAuthenticateRequest(final)), what)
    try:
        scram.verify(done.auth_bytes)
    except ScramError as exc:
        raise SaslAuthenticationError(f"{what}: {exc}") from None
    return str(done.principal or "")
