"""SCRAM-SHA-256 (RFC 5802, RFC 7677) as two sans-IO state machines: bytes in, bytes out.

The password never crosses the wire: the client proves it knows ``SaltedPassword = PBKDF2(password, salt,
iterations)`` and the server, which stores only ``StoredKey = H(HMAC(SaltedPassword, "Client Key"))`` and
``ServerKey = HMAC(SaltedPassword, "Server Key")``, proves it knows ServerKey. Channel binding is not used
(the GS2 header is ``n,,``); under TLS the channel is already authenticated by the broker's certificate.

Names are restricted to ASCII (:func:`metaq.security.principal.check_user_name`), so no SASLprep is
needed for them; passwords are taken as their UTF-8 bytes (NFC-normalised), not SASLprep'ed.

Every malformed or out-of-order message raises :class:`ScramError`; nothing here raises anything else
on any input (a fuzz test holds the broker to that).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from metaq.errors import MetaqError

MECHANISM: Final = "SCRAM-SHA-256"
DEFAULT_ITERATIONS: Final = 4096
MIN_ITERATIONS: Final = 4096
"""RFC 7677's minimum; a stored credential with fewer is refused."""
MAX_ITERATIONS: Final = 1_000_000
"""More would let a hostile server make a client spin for minutes."""
MESSAGE_BYTES_MAX: Final = 4096
_NONCE_BYTES: Final = 24


class ScramError(MetaqError):
    """The exchange failed: a malformed message, a wrong proof, an unknown user (said the same way)."""


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """What a server stores for a user: never the password."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    def to_json(self) -> dict[str, object]:
        b64 = _b64
        return {"mechanism": MECHANISM, "salt": b64(self.salt), "iterations": self.iterations,
                "stored_key": b64(self.stored_key), "server_key": b64(self.server_key)}

    @classmethod
    def from_json(cls, doc: object) -> ScramCredential:
        """ValueError when ``doc`` is not what :meth:`to_json` writes."""
        if not isinstance(doc, dict) or doc.get("mechanism") != MECHANISM:
            raise ValueError(f"not a {MECHANISM} credential")
        try:
            iterations = doc["iterations"]
            if not isinstance(iterations, int) or not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
                raise ValueError(f"iterations {iterations!r} outside {MIN_ITERATIONS}..{MAX_ITERATIONS}")
            cred = cls(_unb64(doc["salt"]), iterations, _unb64(doc["stored_key"]), _unb64(doc["server_key"]))
        except (KeyError, TypeError, ScramError) as exc:
            raise ValueError(f"damaged {MECHANISM} credential: {exc}") from None
        if len(cred.stored_key) != 32 or len(cred.server_key) != 32 or not cred.salt:
            raise ValueError(f"damaged {MECHANISM} credential: wrong key lengths")
        return cred


def _h(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _hmac(key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: object) -> bytes:
    if not isinstance(text, str):
        raise ScramError("expected base64 text")
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise ScramError("malformed base64") from None


def _normalize(password: str) -> bytes:
    return unicodedata.normalize("NFC", password).encode("utf-8")


def salted_password(password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac("sha256", _normalize(password), salt, iterations)


def password_matches(credential: ScramCredential, password: str) -> bool:
    """Whether ``password`` is the one ``credential`` was made from (HTTP Basic): derive its StoredKey
    with the credential's salt and iterations and compare in constant time. The cost is the PBKDF2 of
    the credential's iterations, as for a SCRAM login."""
    salted = salted_password(password, credential.salt, credential.iterations)
    return hmac.compare_digest(_h(_hmac(salted, b"Client Key")), credential.stored_key)


def make_credential(password: str, *, salt: bytes | None = None,
                    iterations: int = DEFAULT_ITERATIONS) -> ScramCredential:
    """The stored form of ``password``: a fresh random salt unless one is given."""
    if not password:
        raise ValueError("the password is empty")
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(f"iterations must be {MIN_ITERATIONS}..{MAX_ITERATIONS}")
    salt = os.urandom(16) if salt is None else salt
    salted = salted_password(password, salt, iterations)
    return ScramCredential(salt, iterations, _h(_hmac(salted, b"Client Key")), _hmac(salted, b"Server Key"))


def _nonce() -> str:
    return _b64(os.urandom(_NONCE_BYTES))


def _escape(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


def _unescape(name: str) -> str:
    if "=" in name.replace("=3D", "").replace("=2C", ""):
        raise ScramError("malformed user name escape")
    return name.replace("=2C", ",").replace("=3D", "=")


def _decode(message: bytes) -> str:
    if not isinstance(message, (bytes, bytearray)) or len(message) > MESSAGE_BYTES_MAX:
        raise ScramError("SCRAM message missing or too long")
    try:
        return bytes(message).decode("utf-8")
    except UnicodeDecodeError:
        raise ScramError("SCRAM message is not UTF-8") from None


def _attributes(text: str, expected: str) -> dict[str, str]:
    """``a=x,b=y`` with the keys in ``expected`` order at its start (extensions after are refused)."""
    parts = text.split(",")
    out: dict[str, str] = {}
    for part, key in zip(parts, expected, strict=False):
        if len(part) < 2 or part[0] != key or part[1] != "=":
            raise ScramError(f"malformed SCRAM message: expected attribute {key!r}")
        out[key] = part[2:]
    if len(parts) != len(expected):
        raise ScramError("malformed SCRAM message: wrong number of attributes")
    return out


def _printable_nonce(nonce: str) -> str:
    if not nonce or any(not (0x21 <= ord(c) <= 0x7E) or c == "," for c in nonce):
        raise ScramError("malformed nonce")
    return nonce


class ScramClient:
    """The client side: :meth:`first`, then :meth:`final` with the server's first message, then
    :meth:`verify` with the server's final message (which proves the server knew the credential)."""

    def __init__(self, username: str, password: str, *, nonce: str | None = None) -> None:
        self.username = username
        self._password = password
        self._nonce = _printable_nonce(nonce or _nonce())
        self._state = "start"
        self._client_first_bare = ""
        self._server_signature = b""

    def first(self) -> bytes:
        if self._state != "start":
            raise ScramError("first() called twice")
        self._state = "first"
        self._client_first_bare = f"n={_escape(self.username)},r={self._nonce}"
        return f"n,,{self._client_first_bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        if self._state != "first":
            raise ScramError("final() out of order")
        self._state = "final"
        text = _decode(server_first)
        attrs = _attributes(text, "rsi")
        nonce = _printable_nonce(attrs["r"])
        if not nonce.startswith(self._nonce) or len(nonce) == len(self._nonce):
            raise ScramError("the server's nonce does not extend the client's")
        salt = _unb64(attrs["s"])
        try:
            iterations = int(attrs["i"])
        except ValueError:
            raise ScramError("malformed iteration count") from None
        if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
            raise ScramError(f"iteration count {iterations} outside {MIN_ITERATIONS}..{MAX_ITERATIONS}")
        salted = salted_password(self._password, salt, iterations)
        client_key = _hmac(salted, b"Client Key")
        without_proof = f"c={_b64(b'n,,')},r={nonce}"
        auth_message = f"{self._client_first_bare},{text},{without_proof}".encode()
        signature = _hmac(_h(client_key), auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_signature = _hmac(_hmac(salted, b"Server Key"), auth_message)
        return f"{without_proof},p={_b64(proof)}".encode()

    def verify(self, server_final: bytes) -> None:
        """ScramError unless the server proved it holds this user's credential."""
        if self._state != "final":
            raise ScramError("verify() out of order")
        self._state = "done"
        text = _decode(server_final)
        if text.startswith("e="):
            raise ScramError(f"the server refused: {text[2:100]}")
        signature = _unb64(_attributes(text, "v")["v"])
        if not hmac.compare_digest(signature, self._server_signature):
            raise ScramError("the server's signature is wrong: it does not hold this user's credential")


CredentialLookup = Callable[[str], "ScramCredential | None"]


class ScramServer:
    """The server side: :meth:`first` takes the client's first message and returns the server's first
    (after :attr:`username` is known, the caller looks the credential up and passes it); :meth:`final`
    checks the proof and returns the server's final message. An unknown user gets a made-up salt and
    fails at :meth:`final` exactly as a wrong password does."""

    def __init__(self, *, nonce: str | None = None) -> None:
        self._nonce = nonce
        self._state = "start"
        self.username = ""
        self._credential: ScramCredential | None = None
        self._known = False
        self._client_first_bare = ""
        self._server_first = ""
        self._combined_nonce = ""

    @property
    def stage(self) -> str:
        """``start`` (expects the client's first message), ``first`` (its final one), ``done``."""
        return "start" if self._state in ("start", "parsed") else self._state

    def parse_first(self, client_first: bytes) -> str:
        """The user name of the client's first message (ScramError if malformed)."""
        if self._state != "start":
            raise ScramError("the client's first message was already received")
        text = _decode(client_first)
        gs2, sep, bare = text.partition(",,")
        if not sep or gs2 not in ("n", "y"):
            raise ScramError("unsupported GS2 header: channel binding and authzid are not supported")
        attrs = _attributes(bare, "nr")
        self.username = _unescape(attrs["n"])
        self._client_first_bare = bare
        self._combined_nonce = _printable_nonce(attrs["r"]) + _printable_nonce(self._nonce or _nonce())
        self._state = "parsed"
        return self.username

    def first(self, credential: ScramCredential | None) -> bytes:
        """The server's first message, for ``credential`` (None: the user is unknown)."""
        if self._state != "parsed":
            raise ScramError("the client's first message has not been parsed")
        self._state = "first"
        self._known = credential is not None
        self._credential = credential or make_credential(_nonce(), salt=_h(self.username.encode())[:16])
        self._server_first = (f"r={self._combined_nonce},s={_b64(self._credential.salt)},"
                              f"i={self._credential.iterations}")
        return self._server_first.encode()

    def final(self, client_final: bytes) -> bytes:
        """The server's final message; ScramError when the proof is wrong or the user unknown."""
        if self._state != "first":
            raise ScramError("the client's final message came out of order")
        self._state = "done"
        text = _decode(client_final)
        attrs = _attributes(text, "crp")
        if attrs["c"] not in (_b64(b"n,,"), _b64(b"y,,")):
            raise ScramError("channel binding is not supported")
        if attrs["r"] != self._combined_nonce:
            raise ScramError("the nonce is not the one of this exchange")
        proof = _unb64(attrs["p"])
        credential = self._credential
        assert credential is not None
        without_proof = text[: text.rindex(",p=")]
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        signature = _hmac(credential.stored_key, auth_message)
        if len(proof) != len(signature):
            raise ScramError("authentication failed: wrong user name or password")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not self._known or not hmac.compare_digest(_h(client_key), credential.stored_key):
            raise ScramError("authentication failed: wrong user name or password")
        return f"v={_b64(_hmac(credential.server_key, auth_message))}".encode()
