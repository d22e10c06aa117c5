"""Options shared by several commands: where the brokers are (``--servers``, or ZooKeeper), one
definition of each for every command (``metaq cluster``, the client commands, ``metaq group``).

Every command that talks to a broker or to ZooKeeper takes the same security options through
:func:`client_security_options`: the brokers' TLS flags (``--tls --ca-file --cert-file --key-file``, env
``METAQ_TLS*``), the brokers' SASL user (env ``METAQ_USER``/``METAQ_PASSWORD``), and ZooKeeper's (``--zk-user``,
``--zk-tls --zk-ca-file --zk-cert-file --zk-key-file``, env ``METAQ_ZK_USER``, ``METAQ_ZK_PASSWORD``,
``METAQ_ZK_TLS*``). Passwords are never flags: they would show in process lists.

``metaq cluster`` reads ZooKeeper itself; the client commands (``produce``, ``consume``, ``topic``,
``stats``, ``admin``) take ``--zk-connect``/``--zk-root`` as an alternative to ``--servers``: the
session then reads the brokers, topics and partitions from ZooKeeper (cluster mode,
``connect(zk_connect=...)``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from metaq.errors import MetaqError
from metaq.net import servers as net_servers
from metaq.types import PartitionId, partition_key

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_ZK_ROOT = "/meta"
DEFAULT_ZK_PORT = 2181
DEFAULT_SERVERS = os.environ.get("METAQ_SERVERS", net_servers.DEFAULT_SERVERS)

servers_option = click.option("-s", "--servers", default=DEFAULT_SERVERS, show_default=True, envvar="METAQ_SERVERS",
                              help="The brokers, host:port[,host:port] (env METAQ_SERVERS): give every broker of "
                                   "the topic space.")


def zk_connect_option(default: str | None, help_text: str = "") -> Callable[[F], F]:
    return click.option("-z", "--zk-connect", default=default, show_default=default is not None,
                        envvar="METAQ_ZK_CONNECT",
                        help=help_text or "ZooKeeper, host:port[,host:port] (env METAQ_ZK_CONNECT).")


zk_root_option = click.option("--zk-root", default=DEFAULT_ZK_ROOT, show_default=True, envvar="METAQ_ZK_ROOT",
                              help="The cluster's ZooKeeper root (env METAQ_ZK_ROOT).")


class Target(str):
    """Where a command's session goes, passed as its ``servers`` argument: the servers text, or (cluster
    mode, ``zk_connect`` set) a description of the ZooKeeper cluster for messages. ``client_options`` holds
    the ClientConfig TLS options (``--tls``, ``--ca-file``...) and the user of METAQ_USER/METAQ_PASSWORD."""

    zk_connect: str | None
    zk_root: str
    client_options: dict[str, Any]

    def __new__(cls, servers: str, zk_connect: str | None = None, zk_root: str = DEFAULT_ZK_ROOT,
                client_options: dict[str, Any] | None = None) -> Target:
        text = servers if zk_connect is None else f"the cluster in ZooKeeper {zk_connect} (root {zk_root})"
        target = super().__new__(cls, text)
        target.zk_connect = zk_connect
        target.zk_root = zk_root
        target.client_options = {**(client_options or {}), **credentials_from_env()}
        return target


def credentials_from_env() -> dict[str, Any]:
    """``sasl_username``/``sasl_password`` from METAQ_USER and METAQ_PASSWORD (a password is never a flag:
    it would show in process lists); empty without METAQ_USER."""
    user = os.environ.get("METAQ_USER") or None
    if user is None:
        return {}
    password = os.environ.get("METAQ_PASSWORD")
    if not password:
        raise click.UsageError("METAQ_USER is set but METAQ_PASSWORD is not: export the password in "
                               "METAQ_PASSWORD (never on the command line)")
    return {"sasl_username": user, "sasl_password": password}


def tls_config(tls: bool, ca_file: str | None, cert_file: str | None, key_file: str | None,
               no_verify_hostname: bool = False) -> dict[str, Any]:
    """The ClientConfig options of the TLS flags (an empty dict: plain TCP)."""
    if not (tls or ca_file or cert_file or key_file):
        return {}
    if key_file and not cert_file:
        raise click.UsageError("--key-file needs --cert-file (env METAQ_TLS_CERT_FILE)")
    out: dict[str, Any] = {"tls": True, "tls_ca_file": ca_file, "tls_cert_file": cert_file, "tls_key_file": key_file}
    if no_verify_hostname:
        out["tls_check_hostname"] = False
    return out


def tls_options(fn: F) -> F:
    """``--tls``, ``--ca-file``, ``--cert-file``, ``--key-file`` (env METAQ_TLS, METAQ_TLS_CA_FILE,
    METAQ_TLS_CERT_FILE, METAQ_TLS_KEY_FILE): the command gets them as keyword arguments ``tls``,
    ``ca_file``, ``cert_file``, ``key_file``; :func:`tls_config` turns them into ClientConfig options."""
    path = click.Path(exists=True, dir_okay=False)
    options = [
        click.option("--tls", is_flag=True, default=False, envvar="METAQ_TLS",
                     help="Connect over TLS (the brokers' sslPort; env METAQ_TLS=1). Implied by --ca-file, "
                          "--cert-file or --key-file."),
        click.option("--ca-file", type=path, default=None, envvar="METAQ_TLS_CA_FILE",
                     help="CA certificates (PEM) the broker's certificate is checked against (env "
                          "METAQ_TLS_CA_FILE); default: the system's trusted CAs."),
        click.option("--cert-file", type=path, default=None, envvar="METAQ_TLS_CERT_FILE",
                     help="Client certificate (PEM) for brokers that ask for one (mTLS; env METAQ_TLS_CERT_FILE)."),
        click.option("--key-file", type=path, default=None, envvar="METAQ_TLS_KEY_FILE",
                     help="Key of --cert-file (PEM; env METAQ_TLS_KEY_FILE); default: inside --cert-file."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def zk_security_config(zk_user: str | None, zk_tls: bool, zk_ca_file: str | None, zk_cert_file: str | None,
                       zk_key_file: str | None) -> dict[str, Any]:
    """The ClientConfig ``zk_*`` options of the ZooKeeper security flags (the password from METAQ_ZK_PASSWORD)."""
    out: dict[str, Any] = {}
    if zk_user:
        password = os.environ.get("METAQ_ZK_PASSWORD")
        if not password:
            raise click.UsageError("--zk-user (env METAQ_ZK_USER) needs its password in METAQ_ZK_PASSWORD (never on "
                                   "the command line)")
        out.update(zk_sasl_username=zk_user, zk_sasl_password=password)
    if zk_key_file and not zk_cert_file:
        raise click.UsageError("--zk-key-file needs --zk-cert-file (env METAQ_ZK_TLS_CERT_FILE)")
    if zk_tls or zk_ca_file or zk_cert_file:
        out.update(zk_tls=True, zk_tls_ca_file=zk_ca_file, zk_tls_cert_file=zk_cert_file, zk_tls_key_file=zk_key_file)
    return out


def zk_security_of(options: dict[str, Any]) -> Any:
    """A :class:`metaq.cluster.zk_security.ZkSecurity` from ClientConfig options (for the commands that open a
    ZooKeeper registry themselves): with a user, the nodes the command makes get ACLs naming it."""
    from metaq.cluster.zk_security import ZkSecurity
    from metaq.errors import ConfigError

    user = options.get("zk_sasl_username")
    try:
        return ZkSecurity(sasl_user=user, sasl_password=options.get("zk_sasl_password"), set_acl=user is not None,
                          tls=bool(options.get("zk_tls")), tls_ca_file=options.get("zk_tls_ca_file"),
                          tls_cert_file=options.get("zk_tls_cert_file"), tls_key_file=options.get("zk_tls_key_file"))
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None


def zk_security_options(fn: F) -> F:
    """``--zk-user``, ``--zk-tls``, ``--zk-ca-file``, ``--zk-cert-file``, ``--zk-key-file`` (env METAQ_ZK_USER,
    METAQ_ZK_TLS, METAQ_ZK_TLS_CA_FILE, METAQ_ZK_TLS_CERT_FILE, METAQ_ZK_TLS_KEY_FILE; the password in
    METAQ_ZK_PASSWORD): keyword arguments ``zk_user``, ``zk_tls``, ``zk_ca_file``, ``zk_cert_file``,
    ``zk_key_file`` (:func:`zk_security_config` turns them into ClientConfig options)."""
    path = click.Path(exists=True, dir_okay=False)
    options = [
        click.option("--zk-user", default=None, envvar="METAQ_ZK_USER",
                     help="Log in to ZooKeeper with SASL DIGEST-MD5 as this user (env METAQ_ZK_USER; password in "
                          "METAQ_ZK_PASSWORD). docs/security.md#zookeeper."),
        click.option("--zk-tls", is_flag=True, default=False, envvar="METAQ_ZK_TLS",
                     help="Reach ZooKeeper over TLS (its secureClientPort; env METAQ_ZK_TLS=1)."),
        click.option("--zk-ca-file", type=path, default=None, envvar="METAQ_ZK_TLS_CA_FILE",
                     help="CA (PEM) ZooKeeper's certificate is checked against (env METAQ_ZK_TLS_CA_FILE)."),
        click.option("--zk-cert-file", type=path, default=None, envvar="METAQ_ZK_TLS_CERT_FILE",
                     help="Client certificate (PEM) for ZooKeeper (env METAQ_ZK_TLS_CERT_FILE)."),
        click.option("--zk-key-file", type=path, default=None, envvar="METAQ_ZK_TLS_KEY_FILE",
                     help="Key of --zk-cert-file (PEM; env METAQ_ZK_TLS_KEY_FILE)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def client_security_options(fn: F) -> F:
    """The brokers' TLS flags (:func:`tls_options`), their SASL user (METAQ_USER/METAQ_PASSWORD) and ZooKeeper's
    security flags (:func:`zk_security_options`), all turned into ClientConfig options: the command gets them as
    one keyword argument ``client_options``. The one decorator every command reaching a broker or ZooKeeper uses."""

    @functools.wraps(fn)
    def wrapper(*args: Any, tls: bool, ca_file: str | None, cert_file: str | None, key_file: str | None,
                zk_user: str | None, zk_tls: bool, zk_ca_file: str | None, zk_cert_file: str | None,
                zk_key_file: str | None, **kwargs: Any) -> Any:
        options = {**tls_config(tls, ca_file, cert_file, key_file),
                   **zk_security_config(zk_user, zk_tls, zk_ca_file, zk_cert_file, zk_key_file),
                   **credentials_from_env()}
        return fn(*args, client_options=options, **kwargs)

    return tls_options(zk_security_options(wrapper))  # type: ignore[return-value]


def broker_tls(options: dict[str, Any]) -> Any:
    """The :class:`metaq.net.tls.ClientTls` of ClientConfig options (None: plain TCP)."""
    from metaq.net.tls import ClientTls

    if not options.get("tls"):
        return None
    return ClientTls(options.get("tls_ca_file"), options.get("tls_cert_file"), options.get("tls_key_file"),
                     options.get("tls_check_hostname", True))


def target_options(fn: F) -> F:
    """``--servers``, or ``--zk-connect``/``--zk-root`` (cluster mode), and the security flags
    (:func:`client_security_options`): the command gets one ``servers`` argument, a :class:`Target`. A flag on
    the command line wins over the environment; with both variables set (as ``metaq cluster up`` suggests)
    ZooKeeper is used; both flags at once is an error."""

    @functools.wraps(fn)
    def wrapper(*args: Any, servers: str, zk_connect: str | None, zk_root: str, client_options: dict[str, Any],
                **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        if zk_connect is not None:
            from_line = {name: ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE
                         for name in ("servers", "zk_connect")}
            if from_line["servers"] and from_line["zk_connect"]:
                raise click.UsageError("give --servers or --zk-connect, not both")
            if from_line["servers"]:
                zk_connect = None
        return fn(*args, servers=Target(servers, zk_connect, zk_root, client_options), **kwargs)

    help_text = ("ZooKeeper host:port[,host:port] of a cluster (env METAQ_ZK_CONNECT), instead of --servers: "
                 "the brokers are the ones registered there.")
    decorated = servers_option(zk_connect_option(None, help_text)(zk_root_option(client_security_options(wrapper))))
    return decorated  # type: ignore[return-value]


class PartitionType(click.ParamType):
    """A partition argument: ``brokerId-partition`` (``1-3``), or a bare number, accepted where only one
    broker has a partition with that number (checked against the topic's partitions when used)."""

    name = "brokerId-partition"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> PartitionId | int:
        if isinstance(value, (PartitionId, int)):
            return value
        try:
            return partition_key(str(value))
        except MetaqError:
            self.fail(f"{value!r} is not brokerId-partition (e.g. 1-3) or a partition number", param, ctx)


PARTITION = PartitionType()
broker_id_option = click.option("-b", "--broker-id", type=click.IntRange(0), default=None,
                                help="The broker to do it on (default: the first server that answers).")
