"""How metaq authenticates to ZooKeeper and which ACL each of its znodes gets (docs/security.md#zookeeper).

Nothing here talks to ZooKeeper (no kazoo): the broker's options, the clients' settings and the CLI build
a :class:`ZkSecurity`, and :mod:`metaq.cluster.zookeeper` turns it into kazoo's arguments and ACLs.

**Authentication.** SASL DIGEST-MD5 (ZooKeeper's ``SASLAuthenticationProvider`` with a ``DigestLoginModule``
JAAS section on the server), the identity ZooKeeper then knows the session by being ``sasl:<user>``; and
the client port over TLS (ZooKeeper's ``secureClientPort``), the server's certificate checked against a CA.

**ACLs** (Kafka's ``zookeeper.set.acl``), when :attr:`ZkSecurity.set_acl` is on, by :func:`acl_for`:

=====================================================  ===========================================
znode                                                  ACL
=====================================================  ===========================================
``<root>/metaq-security`` and below (users, ACLs)      the owner: all; nobody else anything
``<root>/consumers``                                   the owner: all; anyone: read, create
``<root>/consumers/<group>`` and below                 whoever made it (the group's consumers): all;
                                                       anyone: read
everything else (``<root>``, ``brokers/...``)          the owner: all; anyone: read
=====================================================  ===========================================

The owner is the ZooKeeper identity of the process that creates the node: the brokers' (they all share
one, as Kafka's brokers do) for the layout, and the consumer's own for its group's nodes. Stored SCRAM
credentials are readable by the brokers' identity only (as Kafka keeps ``/config/users``): they are salted
keys that cannot be used to log in, but they are what an offline guess of a password needs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from metaq.cluster.layout import Paths
from metaq.errors import ConfigError

__all__ = ["ADMIN", "ALL", "CREATE", "DELETE", "MECHANISMS", "READ", "WRITE", "ZK_PASSWORD_ENV", "AclEntry",
           "ZkSecurity", "acl_for", "describe_acl"]

ZK_PASSWORD_ENV = "METAQ_ZK_PASSWORD"
"""Where a broker (and the CLI) finds its ZooKeeper SASL password: never in a file metaq writes or reads."""
MECHANISMS = ("DIGEST-MD5",)
"""The SASL mechanisms metaq speaks to ZooKeeper (ZooKeeper's server offers DIGEST-MD5 and Kerberos's GSSAPI;
GSSAPI is not built)."""

# ZooKeeper's permission bits (ZooDefs.Perms)
READ, WRITE, CREATE, DELETE, ADMIN = 1, 2, 4, 8, 16
ALL = READ | WRITE | CREATE | DELETE | ADMIN
_PERM_NAMES = ((READ, "read"), (WRITE, "write"), (CREATE, "create"), (DELETE, "delete"), (ADMIN, "admin"))


@dataclass(frozen=True, slots=True)
class AclEntry:
    """One ZooKeeper ACL entry: ``perms`` for the identity ``scheme:id`` (``sasl:metaq``, ``world:anyone``)."""

    perms: int
    scheme: str
    id: str

    def __str__(self) -> str:
        names = "all" if self.perms == ALL else "+".join(n for bit, n in _PERM_NAMES if self.perms & bit) or "none"
        return f"{self.scheme}:{self.id}={names}"


ANYONE = ("world", "anyone")


@dataclass(frozen=True)
class ZkSecurity:
    """How to reach ZooKeeper securely, and whether to put ACLs on the znodes this process creates."""

    sasl_user: str | None = None
    """Authenticate with SASL as this user (None: an anonymous session)."""
    sasl_password: str | None = field(default=None, repr=False)
    sasl_mechanism: str = "DIGEST-MD5"
    set_acl: bool = False
    """Create every znode with the ACL of :func:`acl_for` (the identity ``sasl:<sasl_user>`` owns it)."""
    tls: bool = False
    """Connect to ZooKeeper's TLS client port (secureClientPort)."""
    tls_ca_file: str | None = None
    """The CA the ZooKeeper server's certificate is checked against (None: the system's CAs)."""
    tls_cert_file: str | None = None
    """A client certificate (PEM), for a server with ``ssl.clientAuth=need``."""
    tls_key_file: str | None = None
    tls_check_hostname: bool = True

    def __post_init__(self) -> None:
        if self.sasl_mechanism not in MECHANISMS:
            raise ConfigError(f"ZooKeeper SASL mechanism {self.sasl_mechanism!r} is not supported; metaq speaks "
                              f"{', '.join(MECHANISMS)}")
        if self.set_acl and not self.sasl_user:
            raise ConfigError("ZooKeeper ACLs (zk.zkSetAcl) need a ZooKeeper identity to give them to: set "
                              f"zk.zkSaslUser (and {ZK_PASSWORD_ENV})")
        if self.sasl_user and not self.sasl_password:
            raise ConfigError(f"ZooKeeper SASL user {self.sasl_user!r} has no password: set {ZK_PASSWORD_ENV}")
        if not self.tls and (self.tls_ca_file or self.tls_cert_file or self.tls_key_file):
            object.__setattr__(self, "tls", True)
        if self.tls_key_file and not self.tls_cert_file:
            raise ConfigError("a ZooKeeper TLS key file needs its certificate file too")

    @classmethod
    def from_env(cls, sasl_user: str | None, **kwargs: object) -> ZkSecurity:
        """With the password from ``METAQ_ZK_PASSWORD`` when a user is given."""
        password = os.environ.get(ZK_PASSWORD_ENV) if sasl_user else None
        return cls(sasl_user=sasl_user or None, sasl_password=password or None, **kwargs)  # type: ignore[arg-type]

    @property
    def active(self) -> bool:
        """Anything asked beyond a plain anonymous session."""
        return bool(self.sasl_user or self.tls or self.set_acl)

    @property
    def identity(self) -> tuple[str, str] | None:
        """How ZooKeeper names this session (its ACL id), None when anonymous."""
        return ("sasl", self.sasl_user) if self.sasl_user else None

    def describe(self) -> str:
        """For logs and ``metaq stats``: no secret."""
        parts = [f"SASL {self.sasl_mechanism} as {self.sasl_user}" if self.sasl_user else "anonymous"]
        if self.tls:
            parts.append("TLS")
        if self.set_acl:
            parts.append("ACLs on")
        return ", ".join(parts)


def acl_for(path: str, paths: Paths, owner: tuple[str, str]) -> tuple[AclEntry, ...]:
    """The ACL a metaq znode at ``path`` gets when ``owner`` (``("sasl", user)``) creates it (the table in the
    module docstring). Group nodes are the consumers': ``owner`` is then the consumer's identity."""
    mine = AclEntry(ALL, *owner)
    security = f"{paths.root}/metaq-security"
    if path == security or path.startswith(security + "/"):
        return (mine,)
    if path == paths.consumers:
        return (mine, AclEntry(READ | CREATE, *ANYONE))
    return (mine, AclEntry(READ, *ANYONE))


def describe_acl(entries: tuple[AclEntry, ...] | list[AclEntry]) -> str:
    """``sasl:metaq=all, world:anyone=read``."""
    return ", ".join(str(e) for e in entries)
