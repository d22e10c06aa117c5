"""Broker processes of a local cluster: their server.ini, and a launcher that keeps them out of the
terminal's reach.

:func:`cluster_server_ini` writes what a broker of a ZooKeeper-mode cluster needs (``[system]`` with its
``brokerId``, ``[zookeeper]``, optional ``[topic=...]`` sections); the test harness writes its brokers'
files with it too. :class:`DetachedBroker` is a :class:`~metaq.broker.launcher.BrokerLauncher` whose
broker runs in its own session, so that Ctrl-C in the terminal reaches only the parent (the demo, or
``metaq cluster up``), which then stops its brokers in the order it chooses.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from metaq.broker.launcher import BrokerLauncher
from metaq.cluster.layout import DEFAULT_ROOT

__all__ = ["DetachedBroker", "cluster_server_ini"]

_DETACHED_BROKER = """\
import os, runpy, signal, threading, time
os.setsid()
parent = os.getppid()
def watch():
    while os.getppid() == parent:
        time.sleep(1)
    os.kill(os.getpid(), signal.SIGTERM)
threading.Thread(target=watch, daemon=True).start()
runpy.run_module("metaq.broker", run_name="__main__", alter_sys=True)
"""


class DetachedBroker(BrokerLauncher):
    """A broker process in its own session, so that the terminal's Ctrl-C reaches only its parent.

    The parent then stops the broker when it wants (the demo last, after the Spark queries have read
    what arrived; ``metaq cluster up`` before ZooKeeper). Being out of the terminal's process group,
    the broker also watches its parent: if the parent dies without stopping it (kill -9), it stops
    itself (SIGTERM: deregister, flush and close) within a second.
    """

    def command(self) -> list[str]:
        cmd = super().command()
        assert cmd[1:3] == ["-m", "metaq.broker"], cmd
        return [cmd[0], "-c", _DETACHED_BROKER, *cmd[3:]]


def _ini_value(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def cluster_server_ini(broker_id: int, zk_connect: str, *, zk_root: str = DEFAULT_ROOT,
                       session_timeout_ms: int = 10_000, connection_timeout_ms: int = 10_000,
                       system: Mapping[str, Any] | None = None, topics: str = "",
                       zookeeper: Mapping[str, Any] | None = None) -> str:
    """The server.ini of broker ``broker_id`` in the ZooKeeper-mode cluster at ``zk_connect`` and ``zk_root``.

    ``system``: more ``[system]`` options (MetaQ's keys, e.g. ``numPartitions``); ``zookeeper``: more
    ``[zookeeper]`` ones (``zk.zkSaslUser``...); ``topics``: text of ``[topic=NAME]`` sections appended as it is.
    """
    options = {"brokerId": broker_id, **(system or {})}
    lines = ["[system]", *(f"{key}={_ini_value(value)}" for key, value in options.items()), "",
             "[zookeeper]", f"zk.zkConnect={zk_connect}", f"zk.zkRoot={zk_root}",
             f"zk.zkSessionTimeoutMs={session_timeout_ms}", f"zk.zkConnectionTimeoutMs={connection_timeout_ms}",
             *(f"{key}={_ini_value(value)}" for key, value in (zookeeper or {}).items()), ""]
    return "\n".join(lines) + topics
