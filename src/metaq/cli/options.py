"""Options shared by several commands: where the brokers are (``--servers``, or ZooKeeper), one
definition of each for every command (``metaq cluster``, the client commands, ``metaq group``).

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

from metaq.net import servers as net_servers

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
    mode, ``zk_connect`` set) a description of the ZooKeeper cluster for messages."""

    zk_connect: str | None
    zk_root: str

    def __new__(cls, servers: str, zk_connect: str | None = None, zk_root: str = DEFAULT_ZK_ROOT) -> Target:
        text = servers if zk_connect is None else f"the cluster in ZooKeeper {zk_connect} (root {zk_root})"
        target = super().__new__(cls, text)
        target.zk_connect = zk_connect
        target.zk_root = zk_root
        return target


def target_options(fn: F) -> F:
    """``--servers``, or ``--zk-connect``/``--zk-root`` (cluster mode): the command gets one ``servers``
    argument, a :class:`Target`. A flag on the command line wins over the environment; with both
    variables set (as ``metaq cluster up`` suggests) ZooKeeper is used; both flags at once is an error."""

    @functools.wraps(fn)
    def wrapper(*args: Any, servers: str, zk_connect: str | None, zk_root: str, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        if zk_connect is not None:
            from_line = {name: ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE
                         for name in ("servers", "zk_connect")}
            if from_line["servers"] and from_line["zk_connect"]:
                raise click.UsageError("give --servers or --zk-connect, not both")
            if from_line["servers"]:
                zk_connect = None
        return fn(*args, servers=Target(servers, zk_connect, zk_root), **kwargs)

    help_text = ("ZooKeeper host:port[,host:port] of a cluster (env METAQ_ZK_CONNECT), instead of --servers: "
                 "the brokers are the ones registered there.")
    decorated = servers_option(zk_connect_option(None, help_text)(zk_root_option(wrapper)))
    return decorated  # type: ignore[return-value]
