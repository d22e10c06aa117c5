"""The brokers a ZooKeeper-mode cluster has registered, for a process that hands their addresses on instead of
opening a session (the Spark driver gives its tasks plain ``servers``; `metaq cluster` shows them).

Read-only: nothing is created in ZooKeeper, and a wrong root reads as an empty cluster. kazoo is imported when
ZooKeeper is first read, not with this module, so code that only may use ZooKeeper does not need it installed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from metaq.cluster.layout import DEFAULT_ROOT, normalize_root
from metaq.errors import ConnectionClosedError

__all__ = ["BrokerStatus", "ZooKeeperBrokers", "registered_brokers"]


@dataclass(frozen=True, slots=True)
class BrokerStatus:
    """One broker id (a replica group) as ZooKeeper holds it: where its master and its slaves can be reached."""

    broker_id: int
    master: str | None
    """``host:port``, None while only slaves are registered."""
    slaves: dict[int, str] = field(default_factory=dict)
    """slave id -> ``host:port``."""


def registered_brokers(snapshot: Any) -> list[BrokerStatus]:
    """Every broker id of a registry snapshot (``metaq.cluster.registry.ClusterSnapshot``), in broker id order."""
    return [BrokerStatus(b, str(e.master) if e.master else None, {s: str(a) for s, a in sorted(e.slaves.items())})
            for b, e in sorted(snapshot.brokers.items())]


class ZooKeeperBrokers:
    """The brokers registered under ``zk_root`` at ``zk_connect`` (MetaQ's layout, docs/cluster.md), read when first
    asked for and watched from then on: a broker registering or going away is seen without asking ZooKeeper again.
    Not picklable state: one per process, closed with :meth:`close`."""

    DEFAULT_ROOT: ClassVar[str] = DEFAULT_ROOT
    """MetaQ's root znode (``zk.zkRoot``)."""

    def __init__(self, zk_connect: str, zk_root: str = DEFAULT_ROOT, *, timeout_ms: int = 30_000) -> None:
        self.zk_connect = zk_connect
        self.zk_root = zk_root
        self.timeout_ms = timeout_ms
        self._registry: Any = None

    @staticmethod
    def normalize_root(root: str) -> str:
        """``meta`` or ``/meta/`` as ``/meta`` (MetaQ's normalisation), ``/`` for the top; LayoutError (a
        :class:`~metaq.errors.MetaqError`) for a root ZooKeeper cannot have, such as one with an empty segment."""
        return normalize_root(root) or "/"

    def brokers(self, *, tls: bool = False) -> list[BrokerStatus]:
        """Every registered broker id, in order; with ``tls`` its replicas' TLS addresses (their registered
        ``sslPort``; a replica without one is left out). ConnectionClosedError when ZooKeeper cannot be reached
        within ``timeout_ms``."""
        if self._registry is None:
            from metaq.cluster.registry import RegistryError
            from metaq.cluster.zookeeper import ZooKeeperRegistry

            registry = ZooKeeperRegistry(self.zk_connect, self.zk_root, connection_timeout_ms=self.timeout_ms,
                                         read_only=True)
            try:
                self._registry = registry.start()
            except RegistryError as exc:
                raise ConnectionClosedError(str(exc)) from None
        snapshot = self._registry.snapshot()
        return registered_brokers(snapshot.over_tls() if tls else snapshot)

    def close(self) -> None:
        """Stop watching (a closed view reads ZooKeeper again when next asked)."""
        if self._registry is not None:
            self._registry.close()
            self._registry = None
