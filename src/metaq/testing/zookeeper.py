"""ZooKeeper for tests: a real server (Debian's ``zookeeper``) and kazoo-style fault helpers.

``ZooKeeperServer`` (from :mod:`metaq.devcluster.zookeeper`) starts a standalone server on a free
loopback port. The helpers here do to a session what the faults in production do:
:func:`expire_session` expires a kazoo client's session the way ZooKeeper itself would (a second
connection that presents the same session id and password, then closes: the server drops the
session), as kazoo's own test harness does. A broker *process*'s session is expired by pausing the
process (SIGSTOP) for longer than its session timeout.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

from metaq.devcluster.broker import cluster_server_ini
from metaq.devcluster.zookeeper import ZooKeeperServer, ZooKeeperTls, ZooKeeperUnavailable, four_letter_word

__all__ = ["ZooKeeperServer", "ZooKeeperTls", "ZooKeeperUnavailable", "cluster_config", "expire_session",
           "four_letter_word", "unique_root"]

_roots = itertools.count()


def unique_root(prefix: str = "/metaq-test") -> str:
    """A fresh chroot-like root path, so tests can share one server without seeing each other."""
    return f"{prefix}-{next(_roots)}"


def expire_session(client: Any, server: ZooKeeperServer, timeout_s: float = 30.0) -> None:
    """Expire ``client``'s (a started KazooClient) session and wait until the client has seen it."""
    from kazoo.client import KazooClient
    from kazoo.protocol.states import KazooState

    lost = threading.Event()

    def watch(state: Any) -> bool:
        if state == KazooState.LOST:
            lost.set()
            return True  # stop listening
        return False

    client.add_listener(watch)
    session_id, password = client.client_id
    other = KazooClient(hosts=server.connect_string, client_id=(session_id, password))
    other.start(timeout_s)
    other.stop()
    other.close()
    if not lost.wait(timeout_s):
        raise AssertionError(f"the session {session_id:#x} was not reported lost within {timeout_s}s")


def cluster_config(broker_id: int, zk_connect: str, zk_root: str, session_timeout_ms: int = 4000,
                   system: dict[str, Any] | None = None, topics: str = "",
                   zookeeper: dict[str, Any] | None = None) -> str:
    """server.ini text of a ZooKeeper-mode broker for tests: ``[system]`` (brokerId, 2 partitions, group
    commit, plus ``system``), ``[zookeeper]`` (plus ``zookeeper``: ``zk.zkSaslUser``...) and any
    ``[topic=...]`` sections in ``topics``."""
    return cluster_server_ini(broker_id, zk_connect, zk_root=zk_root, session_timeout_ms=session_timeout_ms,
                              system={"numPartitions": 2, "unflushThreshold": 0, **(system or {})}, topics=topics,
                              zookeeper=zookeeper)
