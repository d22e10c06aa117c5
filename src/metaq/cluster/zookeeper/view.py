"""The cluster view: brokers and topics as every broker and client sees them, from watched znodes.

Every broker and client keeps a :class:`~metaq.cluster.registry.ClusterSnapshot` built from watched
znodes (kazoo's ChildrenWatch / DataWatch recipes): ``brokers/ids`` and each id's ``master``/``slave<n>``,
``brokers/topics-pub`` and ``topics-sub`` and each topic's ``<id>-m`` nodes. A change of any of them
swaps in a new snapshot and calls the listeners. Nothing reads ZooKeeper per message; a znode holding
garbage is logged once and left out, never a crash. While ZooKeeper is unreachable (SUSPENDED) the last
snapshot keeps serving.

Listeners of snapshots are called on kazoo's threads and must not block: broker and client hop to their
event loop there.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from kazoo.exceptions import KazooException
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from metaq.cluster import layout
from metaq.cluster.layout import LayoutError
from metaq.cluster.registry import Address, BrokerEntry, ClusterSnapshot, SnapshotListener, TopicEntry
from metaq.cluster.zookeeper.session import ZooKeeperSession
from metaq.types import PartitionId

log = logging.getLogger("metaq.cluster.zookeeper")

RECHECK_AFTER_DELETE_S = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0)
"""After a watched broker or topic node is deleted, when to look whether it is back (see _check_later)."""


def _disagreeing(listed: list[str], in_view: Mapping[str, object], parent: str,
                 watches: Mapping[str, int]) -> list[str]:
    """Watched children on which a children list and the view disagree (listed but not in the view, or in
    the view but not listed): each is read anew (a new data watch), which settles it either way. The read
    comes after the list's, so it is the newer word; normally the node's own watch has already said the same."""
    names = set(listed)
    odd = [n for n in listed if n not in in_view] + [n for n in in_view if n not in names]
    return sorted(n for n in odd if f"{parent}/{n}" in watches)


class ClusterView:
    """The watched state of brokers and topics, and the snapshots built from it."""

    def __init__(self, session: ZooKeeperSession) -> None:
        self._session = session
        self.paths = session.paths
        self._lock = session.lock
        self._brokers: dict[int, dict[str, Address]] = {}
        self._tls_ports: dict[tuple[int, str], int] = {}
        """(broker id, node name) -> the sslPort its URL carries."""
        self._ports: dict[tuple[int, str], dict[str, int]] = {}
        """(broker id, node name) -> the other named ports its URL carries (kafkaPort...)."""
        self._topics: dict[bool, dict[str, dict[str, int]]] = {True: {}, False: {}}
        """publish? -> topic -> registration node name (``<id>-m``) -> partition count."""
        self._watches: dict[str, int] = {}
        """Path -> generation of the live watch on it (a stale watcher sees another number and stops)."""
        self._generation = 0
        self._snapshot = ClusterSnapshot()
        self._listeners: list[SnapshotListener] = []
        self._delivery_lock = threading.RLock()
        """Held while listeners are called (they must not block): one thread at a time, in version order."""
        self._delivered_version = 0

    def start(self) -> None:
        """Read and watch the brokers and topics."""
        self._watch_children(self.paths.broker_ids, self._on_broker_ids)
        self._watch_children(self.paths.topics_pub, lambda topics: self._on_topics(True, topics))
        self._watch_children(self.paths.topics_sub, lambda topics: self._on_topics(False, topics))

    def snapshot(self) -> ClusterSnapshot:
        return self._snapshot

    def add_listener(self, listener: SnapshotListener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def watch_topic_partitions(self, topic: str, listener: Callable[[], None]) -> None:
        """Call ``listener`` when the brokers serving ``topic`` to consumers change (a rebalance cue)."""
        last: list[list[PartitionId]] = [self._snapshot.partitions(topic, publish=False)]

        def on_snapshot(snapshot: ClusterSnapshot) -> None:
            now = snapshot.partitions(topic, publish=False)
            if now != last[0]:
                last[0] = now
                listener()

        self.add_listener(on_snapshot)

    def _watch_children(self, path: str, func: Callable[[list[str]], None]) -> None:
        gen = self._next_generation(path)

        def watcher(children: list[str]) -> bool:
            if self._session.closed or self._watches.get(path) != gen:
                return False
            func(children)
            return True

        ChildrenWatch(self._session.client, path, watcher)

    def _watch_data(self, path: str, func: Callable[[bytes | None], bool]) -> None:
        """Watch one child node for good: ``func(data)`` (None: the node is gone) applies each change to the
        watched state, under the lock, and returns False when its parent left the view (the watch stops).
        A newer watch of the same path (:meth:`_rewatch`) silences this one at once: the generation is checked
        under the lock with the change, so an older watch can never apply a change after a newer one."""
        gen = self._next_generation(path)

        def watcher(data: bytes | None, stat: Any) -> bool:
            with self._lock:
                if self._session.closed or self._watches.get(path) != gen:
                    return False
                keep = func(data)
                if not keep:
                    del self._watches[path]
            self._publish()
            return keep

        DataWatch(self._session.client, path, watcher)

    def _rewatch(self, path: str, func: Callable[[bytes | None], bool]) -> None:
        """A new data watch of ``path`` (it reads the node now and applies what is there); the old one stops."""
        if not self._session.closed:
            self._watch_data(path, func)

    def _check_later(self, path: str, func: Callable[[bytes | None], bool], present: Callable[[], bool]) -> None:
        """After a watched node was deleted: look again a few times whether it is back while the view still
        lacks it, and watch it anew if so. A master handing over deletes its nodes and its successor makes
        them again at once; were the watch's event for the new node ever missed, the view would lack it until
        the next change (seen once in a test, tens of seconds without a publishable partition)."""
        def check() -> None:
            if self._session.closed or path not in self._watches or present():
                return
            try:
                there = self._session.client.exists(path) is not None
            except KazooException:
                return  # the session's own recovery reads everything again
            if there and not present():
                log.info("ZooKeeper node %s is back but its watch has not said so: watching it anew", path)
                self._rewatch(path, func)

        self._session.call_later(RECHECK_AFTER_DELETE_S, check)

    def _next_generation(self, path: str) -> int:
        with self._lock:
            self._generation += 1
            self._watches[path] = self._generation
            return self._generation

    def _forget_tree(self, path: str) -> None:
        """Stop the watches on ``path`` and its children (each stops at its next event): the parent left."""
        with self._lock:
            for watched in [p for p in self._watches if p == path or p.startswith(path + "/")]:
                del self._watches[watched]

    def _unwatched(self, parent: str, names: Iterable[str]) -> list[str]:
        """Those of ``names`` (children of ``parent``) without a live data watch, sorted."""
        with self._lock:
            return sorted(n for n in names if f"{parent}/{n}" not in self._watches)

    # Presence of a child node (a broker's master/slave node, a topic's <id>-m node) is decided by its own data
    # watch alone, never by a children list: kazoo may run a node's data callback on a thread of its own (a node
    # deleted and made again between two reads), so a children list read before the node came back can be
    # applied after its data was. The children watches only make sure that each child has a data watch.

    def _on_broker_ids(self, children: list[str]) -> None:
        ids = set()
        for name in children:
            try:
                ids.add(int(name))
            except ValueError:
                self._session.bad(f"{self.paths.broker_ids}/{name}", "not a broker id")
        with self._lock:
            known = set(self._brokers)
            for gone in known - ids:
                del self._brokers[gone]
                self._forget_tree(self.paths.broker(gone))
            for new in ids - known:
                self._brokers[new] = {}
        for new in sorted(ids - known):
            self._watch_children(self.paths.broker(new), functools.partial(self._on_broker_nodes, new))
        if ids != known:
            self._publish()

    def _on_broker_nodes(self, broker_id: int, names: list[str]) -> None:
        wanted = [n for n in names if n == "master" or layout.parse_slave_node(n) is not None]
        parent = self.paths.broker(broker_id)
        with self._lock:
            nodes = self._brokers.get(broker_id)
            if nodes is None:
                return
            disagree = _disagreeing(wanted, nodes, parent, self._watches)
        for name in self._unwatched(parent, wanted) + disagree:
            path = f"{parent}/{name}"
            self._watch_data(path, functools.partial(self._on_broker_node, broker_id, name, path))

    def _on_broker_node(self, broker_id: int, name: str, path: str, data: bytes | None) -> bool:
        """Apply a broker node's data (None: deleted) to the watched state; called under the lock."""
        address: Address | None = None
        tls_port: int | None = None
        if data is not None:
            try:
                address = Address(*layout.parse_broker_url(data))
                tls_port = layout.parse_broker_tls_port(data)
                self._ports[(broker_id, name)] = layout.parse_broker_ports(data)
            except LayoutError as exc:
                self._session.bad(path, str(exc))
        nodes = self._brokers.get(broker_id)
        if nodes is None:
            return False  # the broker id left; a watch is made again if it comes back
        if address is None:
            if nodes.pop(name, None) is not None and data is None:
                self._check_later(path, functools.partial(self._on_broker_node, broker_id, name, path),
                                  lambda: name in self._brokers.get(broker_id, {}))
        else:
            nodes[name] = address
        if address is None or tls_port is None:
            self._tls_ports.pop((broker_id, name), None)
        else:
            self._tls_ports[(broker_id, name)] = tls_port
        return True

    def _on_topics(self, publish: bool, topics: list[str]) -> None:
        parent = self.paths.topics_pub if publish else self.paths.topics_sub
        with self._lock:
            known = set(self._topics[publish])
            for gone in known - set(topics):
                del self._topics[publish][gone]
                self._forget_tree(f"{parent}/{gone}")
            for new in set(topics) - known:
                self._topics[publish][new] = {}
        for new in sorted(set(topics) - known):
            self._watch_children(f"{parent}/{new}", functools.partial(self._on_topic_nodes, publish, new))
        if set(topics) != known:
            self._publish()

    def _on_topic_nodes(self, publish: bool, topic: str, names: list[str]) -> None:
        parent = f"{self.paths.topics_pub if publish else self.paths.topics_sub}/{topic}"
        valid = []
        for name in names:
            try:
                layout.parse_topic_broker_name(name)
                valid.append(name)
            except LayoutError as exc:
                self._session.bad(f"{parent}/{name}", str(exc))
        with self._lock:
            nodes = self._topics[publish].get(topic)
            if nodes is None:
                return
            disagree = _disagreeing(valid, nodes, parent, self._watches)
        for name in self._unwatched(parent, valid) + disagree:
            path = f"{parent}/{name}"
            self._watch_data(path, functools.partial(self._on_topic_node, publish, topic, name, path))

    def _on_topic_node(self, publish: bool, topic: str, name: str, path: str, data: bytes | None) -> bool:
        """Apply a topic node's data (None: deleted) to the watched state; called under the lock."""
        count: int | None = None
        if data is not None:
            try:
                count = layout.parse_topic_broker_data(data)
            except LayoutError as exc:
                self._session.bad(path, str(exc))
        nodes = self._topics[publish].get(topic)
        if nodes is None:
            return False  # the topic left; a watch is made again if it comes back
        if count is None:
            if nodes.pop(name, None) is not None and data is None:
                self._check_later(path, functools.partial(self._on_topic_node, publish, topic, name, path),
                                  lambda: name in self._topics[publish].get(topic, {}))
        else:
            nodes[name] = count
        return True

    def _publish(self) -> None:
        """Build a new snapshot from the watched state and tell the listeners."""
        with self._lock:
            brokers = {}
            for broker_id, nodes in self._brokers.items():
                slaves = {}
                for name, address in nodes.items():
                    slave = layout.parse_slave_node(name)
                    if slave is not None:
                        slaves[slave] = address
                if nodes:  # an id whose master and slaves are all gone is no broker (its parent node stays)
                    tls = {-1 if name == "master" else layout.parse_slave_node(name): port
                           for (b, name), port in self._tls_ports.items() if b == broker_id and name in nodes}
                    tls_ports = {r: port for r, port in tls.items() if r is not None}
                    named = {-1 if name == "master" else layout.parse_slave_node(name): MappingProxyType(ports)
                             for (b, name), ports in self._ports.items() if b == broker_id and name in nodes}
                    named_ports = MappingProxyType({r: p for r, p in named.items() if r is not None})
                    brokers[broker_id] = BrokerEntry(broker_id, nodes.get("master"), MappingProxyType(slaves),
                                                     MappingProxyType(tls_ports), named_ports)
            topics = {}
            for topic in set(self._topics[True]) | set(self._topics[False]):
                pub: dict[int, int] = {}
                sub: dict[int, int] = {}
                sub_slaves: dict[tuple[int, int], int] = {}
                for publish, target in ((True, pub), (False, sub)):
                    for name, count in self._topics[publish].get(topic, {}).items():
                        broker_id, slave_id = layout.parse_topic_broker_name(name)
                        if slave_id < 0:
                            target[broker_id] = count
                        elif not publish:
                            sub_slaves[(broker_id, slave_id)] = count
                if pub or sub or sub_slaves:
                    topics[topic] = TopicEntry(topic, MappingProxyType(pub), MappingProxyType(sub),
                                               MappingProxyType(sub_slaves))
            snapshot = ClusterSnapshot(MappingProxyType(brokers), MappingProxyType(topics),
                                       self._snapshot.version + 1)
            if snapshot.brokers == self._snapshot.brokers and snapshot.topics == self._snapshot.topics:
                return
            self._snapshot = snapshot
        self._deliver()

    def _deliver(self) -> None:
        """Call the listeners with the newest snapshot, in version order and never an older one after a
        newer one. Watch callbacks run on more than one thread (kazoo spawns a thread for a node deleted
        and made again between its reads): two threads that each built a snapshot could otherwise call
        the listeners in the reverse order, and a listener keeping the last snapshot it was given (the
        client's metadata) would keep the older one until the next change."""
        with self._delivery_lock:
            snapshot = self._snapshot  # the newest: another thread may have built one since ours
            if snapshot.version <= self._delivered_version:
                return  # a newer one was delivered (it includes this change)
            self._delivered_version = snapshot.version
            for listener in tuple(self._listeners):  # not under _lock: a caller may hold it (lock order)
                try:
                    listener(snapshot)
                except Exception:  # a listener's bug must not stop the watches
                    log.exception("cluster snapshot listener failed")
