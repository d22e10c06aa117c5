"""TLS for every metaq connection: the one place an ``ssl.SSLContext`` is built, server side and client side.

Every connection is opened from a :class:`~metaq.net.codec.ConnectionSettings` whose ``ssl_context``
(an ``ssl.SSLContext`` or None: plain TCP) decides TLS:

- the asyncio :class:`~metaq.net.connection.BrokerConnection` hands it to ``loop.create_connection``;
- the blocking :class:`~metaq.net.blocking.BlockingConnection` wraps its socket with :func:`wrap_socket`;
- the pools pass their settings to every connection they open, so a session, the blocking client, the
  CLI, the Spark source and sink, the logging handler and the broker's replica fetcher get TLS by
  building their settings with :func:`client_context`.

The broker's listeners (the TLS client port, the HTTP API, /metrics) take :class:`ServerTls`, whose
context is built by :func:`server_context` and reloaded in place by :meth:`ServerTls.reload` (SIGHUP):
OpenSSL copies a context's certificate into each connection when its handshake starts, so loading a new
chain into the live context changes what new connections see and leaves open ones as they are.

Both sides refuse anything below TLS 1.2. Client authentication (mTLS) is ``none`` (no certificate
asked), ``want`` (asked, checked against the CA when given, not required) or ``need`` (required).
"""

from __future__ import annotations

import os
import socket
import ssl
import threading
from dataclasses import dataclass
from typing import Final, Literal

from metaq.errors import ConfigError
from metaq.security.principal import peer_common_name

ClientAuth = Literal["none", "want", "need"]
CLIENT_AUTH_CHOICES: Final[tuple[ClientAuth, ...]] = ("none", "want", "need")
MINIMUM_VERSION: Final = ssl.TLSVersion.TLSv1_2

__all__ = [
    "CLIENT_AUTH_CHOICES",
    "MINIMUM_VERSION",
    "ClientAuth",
    "ClientTls",
    "ServerTls",
    "client_context",
    "describe_tls_error",
    "peer_common_name",
    "server_context",
    "wrap_socket",
]


def _readable(path: str, what: str) -> str:
    if not os.path.isfile(path):
        raise ConfigError(f"{what} {path!r} does not exist or is not a file")
    if not os.access(path, os.R_OK):
        raise ConfigError(f"{what} {path!r} cannot be read by this process")
    return path


def _load_chain(context: ssl.SSLContext, cert_file: str, key_file: str | None, what: str) -> None:
    _readable(cert_file, f"{what} certificate file")
    if key_file is not None:
        _readable(key_file, f"{what} key file")
    try:
        context.load_cert_chain(cert_file, key_file)
    except ssl.SSLError as exc:
        raise ConfigError(f"cannot load the {what} certificate {cert_file!r} with key {key_file!r}: "
                          f"{exc.reason or exc} (PEM files; the key must match the certificate and not be "
                          "password-protected)") from None


def _load_ca(context: ssl.SSLContext, ca_file: str, what: str) -> None:
    _readable(ca_file, f"{what} CA file")
    try:
        context.load_verify_locations(cafile=ca_file)
    except ssl.SSLError as exc:
        raise ConfigError(f"cannot load the {what} CA file {ca_file!r}: {exc.reason or exc} "
                          "(PEM certificates)") from None


def server_context(cert_file: str, key_file: str | None = None, ca_file: str | None = None,
                   client_auth: ClientAuth = "none") -> ssl.SSLContext:
    """The context of a TLS listener: ``cert_file`` (a PEM chain, the key in it or in ``key_file``),
    clients verified against ``ca_file`` as ``client_auth`` says. ConfigError naming the file at fault."""
    if client_auth not in CLIENT_AUTH_CHOICES:
        raise ConfigError(f"client authentication {client_auth!r} is not one of {', '.join(CLIENT_AUTH_CHOICES)}")
    if client_auth == "need" and ca_file is None:
        raise ConfigError("sslClientAuth=need needs sslCaFile: the CA that signs the client certificates")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = MINIMUM_VERSION
    _load_chain(context, cert_file, key_file, "server")
    if ca_file is not None:
        _load_ca(context, ca_file, "client")
    context.verify_mode = {"none": ssl.CERT_NONE, "want": ssl.CERT_OPTIONAL, "need": ssl.CERT_REQUIRED}[client_auth]
    return context


def client_context(ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None,
                   check_hostname: bool = True) -> ssl.SSLContext:
    """The context of a client: the broker's certificate verified against ``ca_file`` (None: the system's
    trusted CAs), its host name checked unless ``check_hostname`` is False, and ``cert_file``/``key_file``
    presented when the broker asks (mTLS). Verification is never off: a self-signed broker needs its CA."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = MINIMUM_VERSION
    if ca_file is not None:
        _load_ca(context, ca_file, "broker")
    else:
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    context.check_hostname = check_hostname
    context.verify_mode = ssl.CERT_REQUIRED
    if cert_file is not None:
        _load_chain(context, cert_file, key_file, "client")
    elif key_file is not None:
        raise ConfigError("a client key file needs its certificate file too")
    return context


@dataclass(frozen=True, slots=True)
class ClientTls:
    """A client's TLS options, as the client configuration, the CLI, Spark and the logging handler take them."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    check_hostname: bool = True

    def context(self) -> ssl.SSLContext:
        """A client SSL context from these files (the broker's certificate always verified)."""
        return client_context(self.ca_file, self.cert_file, self.key_file, self.check_hostname)


class ServerTls:
    """A listener's TLS context and the files it came from; :meth:`reload` reads them again in place."""

    def __init__(self, cert_file: str, key_file: str | None = None, ca_file: str | None = None,
                 client_auth: ClientAuth = "none") -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.ca_file = ca_file
        self.client_auth: ClientAuth = client_auth
        self.context = server_context(cert_file, key_file, ca_file, client_auth)
        self.reloads = 0
        self._lock = threading.Lock()

    def reload(self) -> None:
        """Read the certificate, key and CA files again: new handshakes use them, open connections keep theirs.

        The files are checked on a fresh context first, so a bad file (ConfigError) leaves the live
        context as it was. A CA file's certificates are added to those already trusted (OpenSSL cannot
        forget one): to stop trusting a CA, restart the broker.
        """
        server_context(self.cert_file, self.key_file, self.ca_file, self.client_auth)  # raises before any change
        with self._lock:
            self.context.load_cert_chain(self.cert_file, self.key_file)
            if self.ca_file is not None:
                self.context.load_verify_locations(cafile=self.ca_file)
            self.reloads += 1


def wrap_socket(sock: socket.socket, host: str, context: ssl.SSLContext | None) -> socket.socket:
    """``sock`` as it is without a context; else a TLS socket whose handshake with ``host`` is done."""
    if context is None:
        return sock
    return context.wrap_socket(sock, server_hostname=host)


def describe_tls_error(exc: BaseException) -> str:
    """What a failed TLS handshake means, in words a user can act on (appended to the connection error)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        reason = exc.verify_message or exc.reason or str(exc)
        if "expired" in reason:
            hint = "the broker's certificate has expired: renew it (and send SIGHUP to the broker)"
        elif "Hostname mismatch" in reason or "IP address mismatch" in reason:
            hint = "the broker's certificate does not name the host connected to: connect by a name it lists"
        else:
            hint = "the broker's certificate is not signed by the CA given (check --ca-file / tls_ca_file)"
        return f"TLS certificate verification failed: {reason}; {hint}"
    if isinstance(exc, ssl.SSLError):
        reason = exc.reason or str(exc)
        if "CERTIFICATE_REQUIRED" in reason.upper():
            return f"TLS refused by the broker ({reason}): it needs a client certificate (--cert-file/--key-file)"
        if "WRONG_VERSION_NUMBER" in reason.upper() or "RECORD_LAYER_FAILURE" in reason.upper():
            return f"TLS handshake failed ({reason}): is that port a TLS port (sslPort) and not the plaintext one?"
        return f"TLS handshake failed: {reason}"
    return str(exc)
