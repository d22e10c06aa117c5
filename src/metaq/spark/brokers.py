"""Where the driver finds the brokers: the ``servers`` option, or ZooKeeper (``zkConnect``, ``zkRoot``).

With ``zkConnect`` the driver reads the registered brokers from ZooKeeper through
:class:`~metaq.cluster.zookeeper.ZooKeeperRegistry` (read-only, watched: a stream sees brokers come and
go without asking ZooKeeper again) and hands every task a ``servers`` list, its partition's own broker
first. Executors never talk to ZooKeeper (nor need kazoo): they get plain addresses, as with
``servers``. Errors name the option, as every error of the source does.
"""

from __future__ import annotations

from typing import Any

from metaq.errors import ConnectionClosedError
from metaq.spark.options import ReadOptions, WriteOptions


class DriverBrokers:
    """The brokers of one query or job, for its driver. Not picklable state: keep it off executors."""

    def __init__(self, opts: ReadOptions | WriteOptions) -> None:
        self.opts = opts
        self._registry: Any = None

    @property
    def option(self) -> str:
        """The option the brokers come from, for error messages."""
        return "servers" if self.opts.zk_connect is None else "zkConnect"

    def _snapshot(self) -> Any:
        opts = self.opts
        if self._registry is None:
            from metaq.cluster.registry import RegistryError
            from metaq.cluster.zookeeper import ZooKeeperRegistry  # kazoo only on the driver, only with zkConnect

            assert opts.zk_connect is not None
            registry = ZooKeeperRegistry(opts.zk_connect, opts.zk_root, connection_timeout_ms=opts.timeout_ms,
                                         read_only=True)
            try:
                self._registry = registry.start()
            except RegistryError as exc:
                raise ConnectionClosedError(f"option 'zkConnect': {exc}") from None
        return self._registry.snapshot()

    def servers(self, first_broker: int | None = None) -> str:
        """``host:port,...`` of every broker (with ``first_broker``'s first, when it is registered): its master,
        or while it has none, one of its slaves (reads only)."""
        opts = self.opts
        if opts.zk_connect is None:
            return opts.servers
        snapshot = self._snapshot()
        if opts.tls is not None:
            snapshot = snapshot.over_tls()  # the brokers' TLS ports (sslPort), as registered
        # a replica group whose master is gone is read from a slave (it answers as its broker id); the topic's
        # partitions on it come from any broker's Metadata (docs/replication.md)
        brokers = sorted((b, str(e.master if e.master is not None else e.slaves[min(e.slaves)]))
                         for b, e in snapshot.brokers.items() if e.master is not None or e.slaves)
        if not any(e.master is not None for e in snapshot.brokers.values()):
            raise ConnectionClosedError(f"option 'zkConnect': no metaq broker is registered in ZooKeeper at "
                                        f"{opts.zk_connect} under {opts.zk_root}")
        brokers.sort(key=lambda item: item[0] != first_broker)
        return ",".join(address for _, address in brokers)

    def close(self) -> None:
        if self._registry is not None:
            self._registry.close()
            self._registry = None
