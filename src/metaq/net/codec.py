"""What every connection does with the sans-IO codec besides moving bytes, asyncio or blocking alike.

:class:`~metaq.protocol.codec.ClientConnection` numbers requests and matches replies; a connection
around it also needs the settings it is opened with, the ApiVersions handshake's outcome (the highest
version of each API both sides support), and one way to turn an error reply into the matching
:class:`~metaq.errors.BrokerError` with the reply attached (``exc.response``: a FetchResponse's offset
range, say). Keeping them here is what makes the two connection kinds behave alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from metaq.errors import error_for_code
from metaq.protocol.messages import APIS, ApiVersionsRequest, ApiVersionsResponse

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
    """TLS for this connection (:mod:`metaq.net.tls`); None: plain TCP, the only mode brokers serve today."""


def handshake_request() -> ApiVersionsRequest:
    """The first request on every connection."""
    return ApiVersionsRequest()


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
