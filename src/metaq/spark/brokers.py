"""Where the driver finds the brokers: the ``servers`` option, or ZooKeeper (``zkConnect``, ``zkRoot``).

With ``zkConnect`` the driver reads the registered brokers from ZooKeeper through the client's
:class:`~metaq.client.ZooKeeperBrokers` (read-only, watched: a stream sees brokers come and go without
asking ZooKeeper again) and hands every task a ``servers`` list, its partition's own broker
first. Executors never talk to ZooKeeper (nor need kazoo): they get plain addresses, as with
``servers``. Errors name the option, as every error of the source does.
"""

from __future__ import annotations

from metaq.client import BrokerStatus, ZooKeeperBrokers
from metaq.errors import ConnectionClosedError
from metaq.spark.options import ReadOptions, WriteOptions


class DriverBrokers:
    """The brokers of one query or job, for its driver. Not picklable state: keep it off executors."""

    def __init__(self, opts: ReadOptions | WriteOptions) -> None:
        self.opts = opts
        self._zookeeper: ZooKeeperBrokers | None = None

    @property
    def option(self) -> str:
        """The option the brokers come from, for error messages."""
        return "servers" if self.opts.zk_connect is None else "zkConnect"

    def _registered(self) -> list[BrokerStatus]:
        opts = self.opts
        if self._zookeeper is None:  # kazoo only on the driver, only with zkConnect (imported at the first read)
            assert opts.zk_connect is not None
            self._zookeeper = ZooKeeperBrokers(opts.zk_connect, opts.zk_root, timeout_ms=opts.timeout_ms)
        try:
            return self._zookeeper.brokers(tls=opts.tls is not None)  # TLS: the brokers' sslPort, as registered
        except ConnectionClosedError as exc:
            raise ConnectionClosedError(f"option 'zkConnect': {exc}") from None

    def servers(self, first_broker: int | None = None) -> str:
        """``host:port,...`` of every broker (with ``first_broker``'s first, when it is registered): its master,
        or while it has none, one of its slaves (reads only)."""
        opts = self.opts
        if opts.zk_connect is None:
            return opts.servers
        registered = self._registered()
        # a replica group whose master is gone is read from a slave (it answers as its broker id); the topic's
        # partitions on it come from any broker's Metadata (docs/replication.md)
        brokers = [(b.broker_id, b.master if b.master is not None else b.slaves[min(b.slaves)])
                   for b in registered if b.master is not None or b.slaves]
        if not any(b.master is not None for b in registered):
            raise ConnectionClosedError(f"option 'zkConnect': no metaq broker is registered in ZooKeeper at "
                                        f"{opts.zk_connect} under {opts.zk_root}")
        brokers.sort(key=lambda item: item[0] != first_broker)
        return ",".join(address for _, address in brokers)

    def close(self) -> None:
        if self._zookeeper is not None:
            self._zookeeper.close()
            self._zookeeper = None
