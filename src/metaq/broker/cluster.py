"""How a broker takes part in its cluster: it registers, announces its topics, and reads the cluster view.

Embedded mode (no ``[zookeeper]`` section) uses :class:`metaq.cluster.embedded.EmbeddedRegistry`: the
cluster is this broker. ZooKeeper mode uses :class:`metaq.cluster.zookeeper.ZooKeeperRegistry` with
MetaQ's layout. Either way the broker core sees only :class:`ClusterLink`:

* :meth:`join` (blocking, at start once the port is bound and the data is open): connect, register
  ``brokers/ids/<id>/master``, announce every topic. A second live broker with the same id, or a
  ZooKeeper that cannot be reached, stops the start with one clear line.
* :meth:`publish` / :meth:`withdraw` (non-blocking, whenever a topic is created, grown, reconfigured,
  closed or deleted): queued to one worker thread, so the event loop never waits on ZooKeeper and
  announcements keep their order.
* :meth:`snapshot`: the cached cluster view Metadata answers from; no ZooKeeper call per request.
* :meth:`leave` (blocking, first thing at a clean stop): deregister, so clients route away before the
  broker drains; :meth:`close` ends the session.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from metaq.cluster.embedded import EmbeddedRegistry
from metaq.cluster.registry import Address, ClusterRegistry, ClusterSnapshot, RegistryError

if TYPE_CHECKING:
    from metaq.broker.config import BrokerConfig

log = logging.getLogger("metaq.broker.cluster")


class ClusterLink:
    def __init__(self, registry: ClusterRegistry, broker_id: int, *, mode: str, where: str = "",
                 slave_id: int = -1) -> None:
        self.registry = registry
        self.broker_id = broker_id
        self.slave_id = slave_id
        """>= 0: this broker is slave ``slave_id`` of ``broker_id``'s master (docs/replication.md)."""
        self.mode = mode
        """``embedded`` or ``zookeeper``."""
        self.where = where
        """For ZooKeeper mode: ``connect`` string and root, for logs and stats."""
        self._joined = False
        self._announcer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="metaq-cluster")
        self._topics: dict[str, tuple[int, bool, bool] | None] = {}
        """What was last announced per topic (None: withdrawn), to skip repeats."""

    @classmethod
    def for_config(cls, config: BrokerConfig, *, slave_id: int = -1) -> ClusterLink:
        zk = config.zookeeper
        if zk is None or not zk.enable:
            return cls(EmbeddedRegistry(), config.broker_id, mode="standalone", slave_id=slave_id)
        from metaq.cluster.zookeeper import ZooKeeperRegistry  # kazoo only when ZooKeeper mode is on

        registry = ZooKeeperRegistry(zk.connect, zk.root, session_timeout_ms=zk.session_timeout_ms,
                                     connection_timeout_ms=zk.connection_timeout_ms, security=zk.security())
        return cls(registry, config.broker_id, mode="zookeeper", where=f"{zk.connect}{registry.paths.root}",
                   slave_id=slave_id)

    # ------------------------------------------------------------------ start and stop (blocking)

    def connect(self) -> None:
        """Reach the registry (ZooKeeper); RegistryError saying why when it cannot."""
        self.registry.start()

    def join(self, host: str, port: int, topics: dict[str, tuple[int, bool, bool]], *,
             tls_port: int | None = None, ports: dict[str, int] | None = None) -> None:
        """Register this broker at ``host:port`` (and its TLS port, sslPort) and announce ``topics`` (name ->
        (partitions, publish?, subscribe?)). RegistryError (BrokerIdTaken) when another live broker has this id."""
        self.registry.tls_port = tls_port
        self.registry.ports = dict(ports or {})
        self.registry.register_broker(self.broker_id, Address(host, port), slave_id=self.slave_id)
        for topic, (count, pub, sub) in sorted(topics.items()):
            self.registry.publish_topic(topic, count, accept_publish=pub, accept_subscribe=sub)
            self._topics[topic] = (count, pub, sub)
        self._joined = True
        if self.mode == "zookeeper":
            if self.slave_id >= 0:
                log.info("broker %d joined the cluster at %s as slave %d with %d topics", self.broker_id,
                         self.where, self.slave_id, len(topics))
                return
            log.info("broker %d joined the cluster at %s with %d topics", self.broker_id, self.where, len(topics))

    def leave(self) -> None:
        """Deregister (the broker's node and its topics) and stop announcing."""
        if not self._joined:
            return
        self._joined = False
        self._announcer.shutdown(wait=True)
        try:
            self.registry.deregister()
        except Exception as exc:  # ZooKeeper gone: the session's expiry removes the nodes anyway
            log.warning("cannot deregister from the cluster (%s); the session's expiry will", exc)

    def close(self) -> None:
        self._announcer.shutdown(wait=False)
        self.registry.close()

    # ------------------------------------------------------------------ topics (non-blocking)

    def publish(self, topic: str, num_partitions: int, *, accept_publish: bool, accept_subscribe: bool,
                force: bool = False) -> None:
        self._queue(topic, (num_partitions, accept_publish, accept_subscribe), force=force)

    def withdraw(self, topic: str) -> None:
        self._queue(topic, None)

    def _queue(self, topic: str, what: tuple[int, bool, bool] | None, *, force: bool = False) -> None:
        if not self._joined or (self._topics.get(topic, ...) == what and not force):
            return
        self._topics[topic] = what
        try:
            self._announcer.submit(self._announce, topic, what)
        except RuntimeError:  # shutting down
            pass

    def _announce(self, topic: str, what: tuple[int, bool, bool] | None) -> None:
        try:
            if what is None:
                self.registry.withdraw_topic(topic)
            else:
                count, pub, sub = what
                self.registry.publish_topic(topic, count, accept_publish=pub, accept_subscribe=sub)
        except Exception as exc:  # kept: a lost session's re-registration carries the latest state
            log.error("cannot announce topic %s to the cluster: %s", topic, exc or type(exc).__name__)

    def publish_config(self, document: dict[str, Any]) -> None:
        """A master's topic options for autoSyncMasterConfig slaves, written in the background (the
        newest wins: the announcer runs jobs in order)."""
        if not self._joined:
            return
        try:
            self._announcer.submit(self._publish_config, document)
        except RuntimeError:  # shutting down
            pass

    def _publish_config(self, document: dict[str, Any]) -> None:
        try:
            self.registry.publish_master_config(self.broker_id, document)
        except Exception as exc:  # kept (an owned node): a new session's re-registration carries the latest
            log.warning("cannot publish the topic options to the cluster now (%s); they are published again "
                        "when the ZooKeeper session is back", exc or type(exc).__name__)

    # ------------------------------------------------------------------ a change of role (HA)

    def switch_to_slave(self, address: Address, slave_id: int) -> None:
        """Blocking: a deposed master registers as slave ``slave_id`` (its master and topic nodes go);
        the broker then announces its topics again, as a slave."""
        self.registry.become_slave(self.broker_id, address, slave_id)
        self.slave_id = slave_id
        self._topics.clear()

    def switched_to_master(self) -> None:
        """The registry made this process the master (take_mastership): announce topics as master."""
        self.slave_id = -1
        self._topics.clear()

    # ------------------------------------------------------------------ reads

    def snapshot(self) -> ClusterSnapshot:
        return self.registry.snapshot()

    def master_address(self) -> Address | None:
        """Where this broker id's master is registered now (a slave follows it); None while it is not."""
        return self.snapshot().address(self.broker_id)

    def master_tls_address(self) -> Address | None:
        """The master's TLS address (sslReplication); None while it is not registered with an sslPort."""
        return self.snapshot().over_tls().address(self.broker_id)

    def master_topics(self) -> dict[str, int]:
        """Topic -> partition count the master of this broker id announces (publish or subscribe)."""
        out: dict[str, int] = {}
        for name, entry in self.snapshot().topics.items():
            count = max(entry.publish.get(self.broker_id, 0), entry.subscribe.get(self.broker_id, 0))
            if count > 0:
                out[name] = count
        return out

    def describe(self) -> dict[str, Any]:
        """For stats: the mode, and in ZooKeeper mode where and whether connected."""
        out: dict[str, Any] = {"mode": self.mode}
        if self.mode == "zookeeper":
            out["zookeeper"] = self.where
            out["connected"] = bool(getattr(self.registry, "connected", False))
            out["brokers"] = sorted(self.snapshot().brokers)
            if self.slave_id >= 0:
                out["role"] = f"slave {self.slave_id} of broker {self.broker_id}"
        return out


__all__ = ["ClusterLink", "RegistryError"]
