"""Certificates for TLS tests and benchmarks, made on the spot with ``cryptography`` (the test extra).

:func:`make_pki` writes, in one directory: a CA, a broker certificate for 127.0.0.1/localhost signed by it,
a client certificate (CN ``alice``), an expired broker certificate, a broker certificate for another host
name, and a second CA with a broker certificate of its own (what a client trusting only the first CA must
refuse). Every key is an unencrypted P-256 key in PEM; every file name is in :class:`Pki`.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Pki", "issue", "make_pki"]

_DAY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class Pki:
    directory: Path
    ca: Path
    """The CA everyone trusts (PEM certificate)."""
    ca_key: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    """CN=alice, signed by the CA: a client certificate for mTLS."""
    client_key: Path
    expired_cert: Path
    """For 127.0.0.1/localhost, signed by the CA, expired yesterday."""
    expired_key: Path
    other_host_cert: Path
    """Signed by the CA, valid, but for broker.example.com only (a host name mismatch on 127.0.0.1)."""
    other_host_key: Path
    rogue_ca: Path
    """Another CA, trusted by nobody."""
    rogue_cert: Path
    """For 127.0.0.1/localhost, signed by the rogue CA."""
    rogue_key: Path


def _key() -> Any:
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _name(cn: str) -> Any:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(path: Path, cert: Any, key: Any) -> None:
    from cryptography.hazmat.primitives import serialization

    path.with_suffix(".pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    path.with_suffix(".key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                           serialization.PrivateFormat.PKCS8,
                                                           serialization.NoEncryption()))


def _ca(cn: str) -> tuple[Any, Any]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn)).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - _DAY).not_valid_after(now + 30 * _DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return cert, key


def issue(ca_cert: Any, ca_key: Any, cn: str, *, hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
          not_before: datetime.datetime | None = None, not_after: datetime.datetime | None = None,
          serial: int | None = None) -> tuple[Any, Any]:
    """A leaf certificate and its key, signed by ``ca_cert``/``ca_key``, for ``hosts`` (IPs and DNS names),
    good for both server and client authentication (a broker presents one to its master as a slave)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID

    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    builder = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(ca_cert.subject)
               .public_key(key.public_key()).serial_number(serial or x509.random_serial_number())
               .not_valid_before(not_before or now - _DAY).not_valid_after(not_after or now + 30 * _DAY)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                     ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                              critical=False))
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def load_ca(pki: Pki) -> tuple[Any, Any]:
    """The CA certificate and key of ``pki`` (to issue more certificates, e.g. for a reload)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    return (x509.load_pem_x509_certificate(pki.ca.read_bytes()),
            serialization.load_pem_private_key(pki.ca_key.read_bytes(), None))


def write_cert(path: Path, cert: Any, key: Any) -> tuple[Path, Path]:
    """``path``.pem and ``path``.key."""
    _write(path, cert, key)
    return path.with_suffix(".pem"), path.with_suffix(".key")


def make_pki(directory: str | Path) -> Pki:
    """Write a whole test PKI into ``directory`` (created if needed); see the module docstring."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = _ca("metaq test CA")
    _write(d / "ca", ca_cert, ca_key)
    _write(d / "server", *issue(ca_cert, ca_key, "broker"))
    _write(d / "client", *issue(ca_cert, ca_key, "alice", hosts=()))
    now = datetime.datetime.now(datetime.UTC)
    _write(d / "expired", *issue(ca_cert, ca_key, "broker", not_before=now - 10 * _DAY, not_after=now - _DAY))
    _write(d / "other-host", *issue(ca_cert, ca_key, "broker", hosts=("broker.example.com",)))
    rogue_cert, rogue_key = _ca("rogue CA")
    _write(d / "rogue-ca", rogue_cert, rogue_key)
    _write(d / "rogue", *issue(rogue_cert, rogue_key, "broker"))
    return Pki(d, d / "ca.pem", d / "ca.key", d / "server.pem", d / "server.key", d / "client.pem", d / "client.key",
               d / "expired.pem", d / "expired.key", d / "other-host.pem", d / "other-host.key", d / "rogue-ca.pem",
               d / "rogue.pem", d / "rogue.key")
