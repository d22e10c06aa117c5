"""The embedded registry: the cluster is this one broker, held in memory (no external service).

A standalone broker registers itself and its topics here exactly as it would in ZooKeeper, so the code
that answers Metadata reads one interface in both modes; the snapshot simply never holds another
broker. Clients of a standalone broker learn the same facts from its Metadata answers.
"""

from __future__ import annotations

import threading
from types import MappingProxyType

from metaq.cluster.registry import (
    Address,
    BrokerEntry,
    ClusterRegistry,
    ClusterSnapshot,
    RegistryError,
    SnapshotListener,
    TopicEntry,
)


class EmbeddedRegistry(ClusterRegistry):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._broker_id = -1
        self._address: Address | None = None
        self._topics: dict[str, tuple[int, bool, bool]] = {}
        self._snapshot = ClusterSnapshot()
        self._listeners: list[SnapshotListener] = []

    def start(self) -> EmbeddedRegistry:
        return self

    def snapshot(self) -> ClusterSnapshot:
        return self._snapshot

    def add_listener(self, listener: SnapshotListener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def register_broker(self, broker_id: int, address: Address, *, slave_id: int = -1) -> None:
        if slave_id >= 0:
            raise RegistryError("a slave needs ZooKeeper mode (a [zookeeper] section) to find its master")
        with self._lock:
            self._broker_id, self._address = broker_id, address
        self._publish()

    def publish_topic(self, topic: str, num_partitions: int, *, accept_publish: bool, accept_subscribe: bool) -> None:
        with self._lock:
            self._topics[topic] = (num_partitions, accept_publish, accept_subscribe)
        self._publish()

    def withdraw_topic(self, topic: str) -> None:
        with self._lock:
            self._topics.pop(topic, None)
        self._publish()

    def deregister(self) -> None:
        with self._lock:
            self._address = None
            self._topics.clear()
        self._publish()

    def close(self) -> None:
        pass

    def _publish(self) -> None:
        with self._lock:
            b = self._broker_id
            tls = MappingProxyType({-1: self.tls_port} if self.tls_port is not None else {})
            ports = MappingProxyType({-1: MappingProxyType(dict(self.ports))})
            brokers = ({b: BrokerEntry(b, self._address, tls_ports=tls, ports=ports)}
                       if self._address is not None else {})
            topics = {name: TopicEntry(name, MappingProxyType({b: n} if pub else {}),
                                       MappingProxyType({b: n} if sub else {}))
                      for name, (n, pub, sub) in self._topics.items() if self._address is not None}
            self._snapshot = snapshot = ClusterSnapshot(MappingProxyType(brokers), MappingProxyType(topics),
                                                        self._snapshot.version + 1)
            listeners = list(self._listeners)
        for listener in listeners:
            listener(snapshot)
