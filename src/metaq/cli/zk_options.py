"""The ZooKeeper options shared by `metaq cluster` and the commands that work in cluster mode (`metaq group`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

DEFAULT_ZK_PORT = 2181
DEFAULT_ZK_ROOT = "/meta"


def zk_connect_option(default: str | None, help_suffix: str = "") -> Callable[[Any], Any]:
    """``-z/--zk-connect`` (env METAQ_ZK_CONNECT)."""
    return click.option("-z", "--zk-connect", default=default, show_default=default is not None,
                        envvar="METAQ_ZK_CONNECT",
                        help="ZooKeeper, host:port[,host:port] (env METAQ_ZK_CONNECT)." + help_suffix)


zk_root_option = click.option("--zk-root", default=DEFAULT_ZK_ROOT, show_default=True, envvar="METAQ_ZK_ROOT",
                              help="The cluster's ZooKeeper root (env METAQ_ZK_ROOT).")
