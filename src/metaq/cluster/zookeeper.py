"""The ZooKeeper registry: MetaQ's layout through kazoo (the only module of metaq that imports it).

Reads: every broker and client keeps a :class:`~metaq.cluster.registry.ClusterSnapshot` built from
watched znodes (kazoo's ChildrenWatch / DataWatch recipes): ``brokers/ids`` and each id's
``master``/``slave<n>``, ``brokers/topics-pub`` and ``topics-sub`` and each topic's ``<id>-m`` nodes.
A change of any of them swaps in a new snapshot and calls the listeners. Nothing reads ZooKeeper per
message; a znode holding garbage is logged once and left out, never a crash.

Writes: the ephemeral nodes this process owns (its broker registration, its topics, group members)
are remembered, and made again on the new session after a session expiry (kazoo's LOST then
CONNECTED). Group *owner* nodes are the exception: a claim dies with the session that made it, because
the rest of the group rebalances as soon as the session is gone and another member may already fetch
the partition; the consumer that lost it learns of the expiry (:meth:`ZooKeeperRegistry.add_session_listener`),
stops fetching and claims again after its own rebalance. While ZooKeeper is unreachable (SUSPENDED)
the last snapshot keeps serving.

Threads: kazoo calls watchers and state listeners on its own threads; blocking work they trigger
(re-registration after an expiry) runs on one worker thread of this registry. Listeners of snapshots
are called on kazoo's threads and must not block: broker and client hop to their event loop there.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.recipe.watchers import ChildrenWatch, DataWatch
from kazoo.retry import KazooRetry

from metaq.cluster import layout
from metaq.cluster.layout import LayoutError, Paths, ReplicaGroupState
from metaq.cluster.registry import (
    Address,
    BrokerEntry,
    BrokerIdTaken,
    ClusterRegistry,
    ClusterSnapshot,
    GroupRegistry,
    RegistryError,
    ReplicaGroupChanged,
    SnapshotListener,
    TopicEntry,
)
from metaq.errors import InvalidArgument
from metaq.types import PartitionId

log = logging.getLogger("metaq.cluster.zookeeper")

RECHECK_AFTER_DELETE_S = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0)
"""After a watched broker or topic node is deleted, when to look whether it is back (see _check_later)."""
OWNER_POLL_S = 0.2
"""While a node held by another session is waited for (a handover), how often it is looked at again."""
_PREVIOUS_SESSION_SLACK_S = 5.0
_WAKE: Callable[[], None] = lambda: None  # noqa: E731
"""Queued to wake the worker for its delayed jobs."""
"""After a kill -9, the old session's ephemeral nodes live until its timeout: wait that long plus this."""


def _disagreeing(listed: list[str], in_view: Mapping[str, object], parent: str,
                 watches: Mapping[str, int]) -> list[str]:
    """Watched children on which a children list and the view disagree (listed but not in the view, or in
    the view but not listed): each is read anew (a new data watch), which settles it either way. The read
    comes after the list's, so it is the newer word; normally the node's own watch has already said the same."""
    names = set(listed)
    odd = [n for n in listed if n not in in_view] + [n for n in in_view if n not in names]
    return sorted(n for n in odd if f"{parent}/{n}" in watches)


class ZooKeeperRegistry(ClusterRegistry, GroupRegistry):
    """MetaQ's znodes under ``root`` on the ZooKeeper ensemble ``connect`` (``host:port[,host:port]``)."""

    def __init__(self, connect: str, root: str = layout.DEFAULT_ROOT, *, session_timeout_ms: int = 30_000,
                 connection_timeout_ms: int = 30_000, watch_cluster: bool = True, read_only: bool = False) -> None:
        """``watch_cluster``: keep the snapshot of brokers and topics; ``read_only``: a reader (``metaq
        cluster``, the Spark driver) that creates nothing, not even the layout's parent nodes, so that a
        mistyped root leaves no trace (nodes that do not exist read as empty)."""
        self.connect = connect
        self.read_only = read_only
        self.paths = Paths(root)
        self.session_timeout_s = session_timeout_ms / 1000
        self.connection_timeout_s = connection_timeout_ms / 1000
        self._watch_cluster = watch_cluster
        self._client = KazooClient(
            hosts=connect, timeout=self.session_timeout_s,
            connection_retry=KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=2.0, ignore_expire=False),
            command_retry=KazooRetry(max_tries=5, delay=0.1, backoff=2, max_delay=2.0))
        self._lock = threading.RLock()
        self._owned: dict[str, bytes] = {}
        self._own_slave_id = -1
        """The slave id this process registered as (-1: a master)."""
        """Ephemeral nodes this process keeps registered: path -> data (made again after an expiry)."""
        self._brokers: dict[int, dict[str, Address]] = {}
        self._tls_ports: dict[tuple[int, str], int] = {}
        self._ports: dict[tuple[int, str], dict[str, int]] = {}
        """(broker id, node name) -> the other named ports its URL carries (kafkaPort...)."""
        """(broker id, node name) -> the sslPort its URL carries."""
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
        self._bad_znodes: set[str] = set()
        self._session_lost = False
        self._session_listeners: list[Callable[[str], None]] = []
        self._member_listeners: dict[str, list[Callable[[], None]]] = {}
        """group ids path -> the listeners of its one watch"""
        self._closed = False
        self._work: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._later: list[tuple[float, int, Callable[[], None]]] = []
        """Delayed jobs (due time.monotonic(), sequence, job), a heap the worker runs them from."""
        self._seq = 0
        self._worker = threading.Thread(target=self._run_worker, name="metaq-zk-worker", daemon=True)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> ZooKeeperRegistry:
        """Connect (RegistryError if ZooKeeper cannot be reached in the connection timeout) and, for a
        cluster watcher, read and watch the brokers and topics."""
        try:
            self._client.start(timeout=self.connection_timeout_s)
        except (KazooTimeoutError, KazooException, OSError) as exc:
            with contextlib.suppress(Exception):
                self._client.stop()
                self._client.close()
            raise RegistryError(f"cannot reach ZooKeeper at {self.connect} within "
                                f"{self.connection_timeout_s:g}s ({exc or type(exc).__name__})") from None
        self._client.add_listener(self._on_state)
        self._worker.start()
        if not self.read_only:
            for path in (self.paths.broker_ids, self.paths.topics_pub, self.paths.topics_sub, self.paths.consumers):
                self._client.ensure_path(path)
        if self._watch_cluster:
            self._watch_children(self.paths.broker_ids, self._on_broker_ids)
            self._watch_children(self.paths.topics_pub, lambda topics: self._on_topics(True, topics))
            self._watch_children(self.paths.topics_sub, lambda topics: self._on_topics(False, topics))
        return self

    def close(self) -> None:
        """Drop the session (its ephemeral nodes vanish at once) and stop the threads."""
        if self._closed:
            return
        self._closed = True
        self._work.put(None)
        with contextlib.suppress(Exception):
            self._client.stop()
            self._client.close()
        if self._worker.is_alive():
            self._worker.join(5)

    @property
    def connected(self) -> bool:
        return bool(self._client.connected)

    def registered_at(self, broker_id: int) -> float | None:
        """When broker ``broker_id``'s master registered, by ZooKeeper's clock (its node's ctime, seconds
        since the epoch); None if it is not registered. One read (benchmarks, not per message)."""
        try:
            stat = self._client.exists(self.paths.broker_node(broker_id, -1))
        except KazooException as exc:
            raise RegistryError(f"cannot read broker {broker_id}'s registration: {exc}") from None
        return None if stat is None else stat.ctime / 1000

    @property
    def session_id(self) -> int:
        client_id = self._client.client_id
        return int(client_id[0]) if client_id else 0

    # ------------------------------------------------------------------ cluster view (reads)

    def snapshot(self) -> ClusterSnapshot:
        return self._snapshot

    def add_listener(self, listener: SnapshotListener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def _watch_children(self, path: str, func: Callable[[list[str]], None]) -> None:
        gen = self._next_generation(path)

        def watcher(children: list[str]) -> bool:
            if self._closed or self._watches.get(path) != gen:
                return False
            func(children)
            return True

        ChildrenWatch(self._client, path, watcher)

    def _watch_data(self, path: str, func: Callable[[bytes | None], bool]) -> None:
        """Watch one child node for good: ``func(data)`` (None: the node is gone) applies each change to the
        watched state, under the lock, and returns False when its parent left the view (the watch stops).
        A newer watch of the same path (:meth:`_rewatch`) silences this one at once: the generation is checked
        under the lock with the change, so an older watch can never apply a change after a newer one."""
        gen = self._next_generation(path)

        def watcher(data: bytes | None, stat: Any) -> bool:
            with self._lock:
                if self._closed or self._watches.get(path) != gen:
                    return False
                keep = func(data)
                if not keep:
                    del self._watches[path]
            self._publish()
            return keep

        DataWatch(self._client, path, watcher)

    def _rewatch(self, path: str, func: Callable[[bytes | None], bool]) -> None:
        """A new data watch of ``path`` (it reads the node now and applies what is there); the old one stops."""
        if not self._closed:
            self._watch_data(path, func)

    def _check_later(self, path: str, func: Callable[[bytes | None], bool], present: Callable[[], bool]) -> None:
        """After a watched node was deleted: look again a few times whether it is back while the view still
        lacks it, and watch it anew if so. A master handing over deletes its nodes and its successor makes
        them again at once; were the watch's event for the new node ever missed, the view would lack it until
        the next change (seen once in a test, tens of seconds without a publishable partition)."""
        def check() -> None:
            if self._closed or path not in self._watches or present():
                return
            try:
                there = self._client.exists(path) is not None
            except KazooException:
                return  # the session's own recovery reads everything again
            if there and not present():
                log.info("ZooKeeper node %s is back but its watch has not said so: watching it anew", path)
                self._rewatch(path, func)

        now = time.monotonic()
        with self._lock:
            for delay in RECHECK_AFTER_DELETE_S:
                self._seq += 1
                heapq.heappush(self._later, (now + delay, self._seq, check))
        self._work.put(_WAKE)  # the worker runs them when due (one thread for all: a broker leaving with
        # a thousand topics must not start thousands of timers in every client)

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
                self._bad(f"{self.paths.broker_ids}/{name}", "not a broker id")
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
                self._bad(path, str(exc))
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
                self._bad(f"{parent}/{name}", str(exc))
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
                self._bad(path, str(exc))
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

    def _bad(self, path: str, problem: str) -> None:
        with self._lock:
            if path in self._bad_znodes:
                return
            self._bad_znodes.add(path)
        log.error("ZooKeeper node %s is not in MetaQ's layout and is ignored: %s", path, problem)

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

    # ------------------------------------------------------------------ sessions

    def _on_state(self, state: str) -> None:
        """kazoo's state listener (its thread; must not block)."""
        if self._closed:
            return
        if state == KazooState.LOST:
            self._session_lost = True
            with self._lock:
                # A claim dies with its session: the group has moved on (see the module docstring).
                for path in [p for p in self._owned if self._is_owner_path(p)]:
                    del self._owned[path]
            log.warning("ZooKeeper session expired: its ephemeral nodes are gone; registering again on reconnect")
        elif state == KazooState.SUSPENDED:
            log.warning("ZooKeeper connection lost: serving with what is known until it is back")
        elif state == KazooState.CONNECTED and self._session_lost:
            self._session_lost = False
            self._work.put(self._restore_registrations)
        name = {KazooState.LOST: "lost", KazooState.SUSPENDED: "suspended", KazooState.CONNECTED: "connected"}.get(
            state)
        with self._lock:
            listeners = list(self._session_listeners)
        for listener in listeners:
            try:
                listener(name or str(state).lower())
            except Exception:  # a listener's bug must not stop the others
                log.exception("ZooKeeper session listener failed")

    def add_session_listener(self, listener: Callable[[str], None]) -> None:
        """Call ``listener("suspended" | "connected" | "lost")`` on kazoo's thread (must not block):
        "lost" means the session expired, and with it every claim made on it."""
        with self._lock:
            self._session_listeners.append(listener)

    def remove_session_listener(self, listener: Callable[[str], None]) -> None:
        with self._lock, contextlib.suppress(ValueError):
            self._session_listeners.remove(listener)

    def _is_owner_path(self, path: str) -> bool:
        return path.startswith(self.paths.consumers + "/") and "/owners/" in path

    def _run_worker(self) -> None:
        """Run the queued jobs, and the delayed ones (:meth:`_check_later`) when they are due."""
        while True:
            with self._lock:
                wait = max(0.0, self._later[0][0] - time.monotonic()) if self._later else None
            try:
                job = self._work.get(timeout=wait)
            except queue.Empty:
                job = _WAKE
            if job is None:
                return
            jobs = [job] if job is not _WAKE else []
            with self._lock:
                now = time.monotonic()
                while self._later and self._later[0][0] <= now:
                    jobs.append(heapq.heappop(self._later)[2])
            for run in jobs:
                try:
                    run()
                except Exception:
                    log.exception("ZooKeeper registry job failed")

    def _restore_registrations(self) -> None:
        with self._lock:
            owned = dict(self._owned)
        for path, data in owned.items():
            try:
                self._create_ephemeral(path, data)
            except KazooException as exc:
                log.error("cannot register %s again after the session expiry: %s", path, exc)
        if owned:
            log.info("registered %d ZooKeeper nodes again on the new session", len(owned))

    def _create_ephemeral(self, path: str, data: bytes, *, wait_for_owner_s: float = 0.0) -> None:
        """Create (or take over, if this session already owns it) an ephemeral node holding ``data``.

        A node another session holds raises NodeExistsError, after waiting up to ``wait_for_owner_s``
        for it to go: a master handing over deletes its topic nodes a moment after its successor
        registers, and a killed broker's nodes go with its session."""
        deadline = time.monotonic() + wait_for_owner_s
        while True:
            try:
                self._client.create(path, data, ephemeral=True, makepath=True)
                return
            except NodeExistsError:
                try:
                    _, stat = self._client.get(path)
                except NoNodeError:
                    continue  # it just went: create it again
                if stat.ephemeralOwner == self.session_id:
                    self._client.set(path, data)
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise
                gone = threading.Event()
                if self._client.exists(path, watch=lambda _e, g=gone: g.set()) is not None:
                    # woken by the watch, and looking again every OWNER_POLL_S anyway: a handover must not
                    # hang on one watch event (a missed one cost seconds of "every partition closed")
                    gone.wait(min(remaining, OWNER_POLL_S))

    def _keep(self, path: str, data: bytes, *, wait_for_owner_s: float = 0.0) -> None:
        self._create_ephemeral(path, data, wait_for_owner_s=wait_for_owner_s)
        with self._lock:
            self._owned[path] = data

    @property
    def _handover_wait_s(self) -> float:
        """How long a node of this broker id held by another session is waited for (see _create_ephemeral)."""
        return self.session_timeout_s + _PREVIOUS_SESSION_SLACK_S

    def _drop(self, path: str) -> None:
        with self._lock:
            self._owned.pop(path, None)
        with contextlib.suppress(NoNodeError):
            _, stat = self._client.get(path)
            if stat.ephemeralOwner == self.session_id:
                self._client.delete(path)

    # ------------------------------------------------------------------ broker side (writes)

    def register_broker(self, broker_id: int, address: Address, *, slave_id: int = -1) -> None:
        path = self.paths.broker_node(broker_id, slave_id)
        data = layout.broker_url(address.host, address.port, self.tls_port, self.ports).encode()
        self._own_slave_id = slave_id
        deadline = time.monotonic() + self.session_timeout_s + _PREVIOUS_SESSION_SLACK_S
        while True:
            try:
                self._keep(path, data)
                break
            except NodeExistsError:
                try:
                    held, _ = self._client.get(path)
                except NoNodeError:
                    continue  # it just went away: try again
                if held != data:
                    raise BrokerIdTaken(
                        f"broker id {broker_id} is already registered in ZooKeeper ({path} = "
                        f"{held.decode(errors='replace')}) by another live broker; give this one another "
                        "brokerId") from None
                if time.monotonic() > deadline:
                    raise BrokerIdTaken(
                        f"{path} still names this address ({data.decode()}) after the session timeout: another "
                        "live broker with the same brokerId and address?") from None
                log.info("%s is held by a previous session of this broker (killed?); waiting for it to expire "
                         "(up to %.0fs)", path, self.session_timeout_s)
                gone = threading.Event()
                if self._client.exists(path, watch=lambda _e, g=gone: g.set()) is not None:
                    gone.wait(max(0.1, deadline - time.monotonic()))
        log.info("registered %s = %s", path, data.decode())

    def publish_topic(self, topic: str, num_partitions: int, *, accept_publish: bool, accept_subscribe: bool,
                      broker_id: int | None = None, slave_id: int | None = None) -> None:
        """As the registry's; ``broker_id`` / ``slave_id`` default to this process's registration, so a
        slave announces ``topics-sub/<topic>/<id>-s<slaveId>`` (and never a topics-pub node)."""
        broker_id = self._own_broker_id() if broker_id is None else broker_id
        if slave_id is None:
            slave_id = self._own_slave_id
        data = layout.topic_broker_data(num_partitions, broker_id, slave_id)
        for publish, wanted in ((True, accept_publish and slave_id < 0), (False, accept_subscribe)):
            path = self.paths.topic_broker(topic, broker_id, slave_id, publish=publish)
            if wanted:
                self._keep(path, data, wait_for_owner_s=self._handover_wait_s)
            else:
                self._drop(path)

    def withdraw_topic(self, topic: str) -> None:
        with self._lock:
            mine = [p for p in self._owned if p.startswith((f"{self.paths.topics_pub}/{topic}/",
                                                            f"{self.paths.topics_sub}/{topic}/"))]
        for path in mine:
            self._drop(path)

    def deregister(self, timeout_s: float = 5.0) -> None:
        """Delete this process's broker and topic nodes, spending at most ``timeout_s``. Without a
        connection nothing is tried: closing the session (or its expiry) removes them anyway."""
        with self._lock:
            mine = [p for p in self._owned if p.startswith(f"{self.paths.root}/brokers/")]
            for path in mine:
                self._owned.pop(path, None)
        if not self._client.connected:
            return
        session = self.session_id
        deadline = time.monotonic() + timeout_s
        for path in sorted(mine, key=lambda p: "/ids/" in p):  # topics first, the broker node last
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:  # async calls with a timeout: no retry loop may hold a stopping broker
                _, stat = self._client.get_async(path).get(timeout=remaining)
                if stat.ephemeralOwner == session:
                    self._client.delete_async(path).get(timeout=max(0.1, deadline - time.monotonic()))
            except (KazooException, KazooTimeoutError):
                continue

    # ------------------------------------------------------------------ replica groups (HA)

    def read_replica_group(self, broker_id: int) -> tuple[ReplicaGroupState | None, int]:
        path = self.paths.replica_group(broker_id)
        try:
            data, stat = self._client.get(path)
        except NoNodeError:
            return None, -1
        except KazooException as exc:
            raise RegistryError(f"cannot read {path}: {exc}") from None
        try:
            return ReplicaGroupState.from_bytes(data), stat.version
        except LayoutError as exc:
            raise RegistryError(f"{path}: {exc}") from None

    def write_replica_group(self, broker_id: int, state: ReplicaGroupState, version: int) -> int:
        path = self.paths.replica_group(broker_id)
        try:
            if version < 0:
                self._client.ensure_path(self.paths.replica_groups)
                self._client.create(path, state.to_bytes())
                return 0
            return int(self._client.set(path, state.to_bytes(), version=version).version)
        except (BadVersionError, NodeExistsError, NoNodeError):
            raise ReplicaGroupChanged(f"{path} changed since version {version} (another master or a failover)") \
                from None
        except KazooException as exc:
            raise RegistryError(f"cannot write {path}: {exc}") from None

    def take_mastership(self, broker_id: int, address: Address, state: ReplicaGroupState, version: int) -> int:
        path = self.paths.replica_group(broker_id)
        master = self.paths.broker_node(broker_id, -1)
        url = layout.broker_url(address.host, address.port, self.tls_port, self.ports).encode()
        try:
            self._client.ensure_path(self.paths.replica_groups)
            self._client.ensure_path(self.paths.broker(broker_id))
            tx = self._client.transaction()
            if version < 0:
                tx.create(path, state.to_bytes())
            else:
                tx.set_data(path, state.to_bytes(), version=version)
            tx.create(master, url, ephemeral=True)
            results = tx.commit()
        except KazooException as exc:
            raise RegistryError(f"cannot take the mastership of broker {broker_id}: {exc}") from None
        failed = [r for r in results if isinstance(r, Exception)]
        if failed:
            raise ReplicaGroupChanged(f"broker {broker_id}: the replica group moved or a master is registered "
                                      f"({', '.join(type(r).__name__ for r in failed)})")
        new_version = next((r.version for r in results if hasattr(r, "version")), version + 1)
        with self._lock:
            mine = [p for p in self._owned if p.startswith(f"{self.paths.root}/brokers/")]
            for p in mine:
                self._owned.pop(p, None)
            self._owned[master] = url
            self._own_slave_id = -1
        for p in mine:
            if p != master:
                with contextlib.suppress(KazooException):
                    _, stat = self._client.get(p)
                    if stat.ephemeralOwner == self.session_id:
                        self._client.delete(p)
        log.info("took the mastership of broker %d (epoch %d): %s = %s", broker_id, state.epoch, master,
                 url.decode())
        return int(new_version)

    def become_slave(self, broker_id: int, address: Address, slave_id: int) -> None:
        with self._lock:
            mine = [p for p in self._owned if p.startswith(f"{self.paths.root}/brokers/")]
        for p in mine:
            self._drop(p)
        self.register_broker(broker_id, address, slave_id=slave_id)

    def publish_master_config(self, broker_id: int, document: dict[str, object]) -> None:
        path, data = self.paths.master_config(broker_id), json.dumps(document, sort_keys=True).encode()
        with self._lock:  # owned first: if the session is lost now, the next session writes it
            self._owned[path] = data
        self._create_ephemeral(path, data, wait_for_owner_s=self._handover_wait_s)

    def watch_master_config(self, broker_id: int, listener: Callable[[dict[str, object] | None], None]) -> None:
        path = self.paths.master_config(broker_id)

        def on_data(data: bytes | None, _stat: Any) -> bool:
            if self._closed:
                return False
            document: dict[str, object] | None = None
            if data:
                try:
                    parsed = json.loads(data.decode("utf-8"))
                except (UnicodeDecodeError, ValueError):
                    parsed = None
                if isinstance(parsed, dict):
                    document = parsed
                else:
                    self._bad(path, "not a JSON object")
            listener(document)
            return True

        DataWatch(self._client, path, on_data)

    def master_session_ok(self, broker_id: int) -> bool:
        try:
            stat = self._client.exists(self.paths.broker_node(broker_id, -1))
        except KazooException as exc:
            raise RegistryError(f"cannot read broker {broker_id}'s registration: {exc}") from None
        return stat is not None and stat.ephemeralOwner == self.session_id

    def _own_broker_id(self) -> int:
        with self._lock:
            for path in self._owned:
                if path.startswith(self.paths.broker_ids + "/"):
                    return int(path[len(self.paths.broker_ids) + 1:].split("/", 1)[0])
        raise RegistryError("register_broker() must come before publish_topic()")

    # ------------------------------------------------------------------ groups

    def register_member(self, group: str, consumer_id: str, topics: Iterable[str]) -> None:
        self._keep(self.paths.group_member(group, consumer_id), layout.member_data(sorted(topics)))

    def unregister_member(self, group: str, consumer_id: str) -> None:
        self._drop(self.paths.group_member(group, consumer_id))

    def members(self, group: str) -> dict[str, list[str]]:
        path = self.paths.group_ids(group)
        try:
            names = self._client.get_children(path)
        except NoNodeError:
            return {}
        out = {}
        for name in names:
            try:
                data, _ = self._client.get(f"{path}/{name}")
            except NoNodeError:
                continue
            try:
                out[name] = layout.parse_member_data(data)
            except LayoutError as exc:
                self._bad(f"{path}/{name}", str(exc))
        return out

    def watch_members(self, group: str, listener: Callable[[], None]) -> None:
        """One watch per group, however many consumers of it share this session: each gets every change."""
        path = self.paths.group_ids(group)
        with self._lock:
            listeners = self._member_listeners.setdefault(path, [])
            first = not listeners
            listeners.append(listener)
        if not first:
            listener()
            return
        self._client.ensure_path(path)

        def on_children(_children: list[str]) -> None:
            with self._lock:
                current = list(self._member_listeners.get(path, ()))
            for each in current:
                try:
                    each()
                except Exception:  # one consumer's bug must not starve the others
                    log.exception("group member listener failed")

        self._watch_children(path, on_children)

    def watch_topic_partitions(self, topic: str, listener: Callable[[], None]) -> None:
        """Call ``listener`` when the brokers serving ``topic`` to consumers change (a rebalance cue)."""
        last: list[list[PartitionId]] = [self._snapshot.partitions(topic, publish=False)]

        def on_snapshot(snapshot: ClusterSnapshot) -> None:
            now = snapshot.partitions(topic, publish=False)
            if now != last[0]:
                last[0] = now
                listener()

        self.add_listener(on_snapshot)

    def claim(self, group: str, topic: str, partition: PartitionId, owner: str) -> bool:
        path = self.paths.group_owner(group, topic, str(partition))
        data = owner.encode()
        try:
            self._client.create(path, data, ephemeral=True, makepath=True)
        except NodeExistsError:
            # Ours already only if this session made it *for this owner* (two consumers of one group
            # may share a session).
            try:
                held, stat = self._client.get(path)
            except NoNodeError:
                return False  # released just now: the caller retries
            if held != data or stat.ephemeralOwner != self.session_id:
                return False
        with self._lock:
            self._owned[path] = data
        return True

    def alive(self, group: str, consumer_id: str) -> bool:
        """A round trip to ZooKeeper on this session: True while the member is registered on it (a
        consumer renews its fetch lease with it)."""
        try:
            _, stat = self._client.get(self.paths.group_member(group, consumer_id))
        except NoNodeError:
            return False
        return bool(stat.ephemeralOwner == self.session_id)

    def release(self, group: str, topic: str, partition: PartitionId, owner: str) -> None:
        path = self.paths.group_owner(group, topic, str(partition))
        with self._lock:
            self._owned.pop(path, None)
        try:
            data, stat = self._client.get(path)
            if data == owner.encode():
                self._client.delete(path, version=stat.version)
        except (NoNodeError, BadVersionError, NotEmptyError):
            pass

    def release_all(self, group: str, owner: str) -> None:
        prefix = self.paths.group(group) + "/owners/"
        data = owner.encode()
        with self._lock:
            mine = [p for p, d in self._owned.items() if p.startswith(prefix) and d == data]
        for path in mine:
            topic, name = path[len(prefix):].split("/", 1)
            self.release(group, topic, PartitionId.parse(name), owner)

    def owners(self, group: str, topic: str) -> dict[PartitionId, str]:
        path = self.paths.group_owners(group, topic)
        try:
            names = self._client.get_children(path)
        except NoNodeError:
            return {}
        out = {}
        for name in names:
            try:
                partition = PartitionId.parse(name)
            except InvalidArgument as exc:
                self._bad(f"{path}/{name}", str(exc))
                continue
            with contextlib.suppress(NoNodeError):
                out[partition] = self._client.get(f"{path}/{name}")[0].decode(errors="replace")
        return out

    def load_offset(self, group: str, topic: str, partition: PartitionId) -> int | None:
        path = self.paths.group_offset(group, topic, str(partition))
        try:
            data, _ = self._client.get(path)
        except NoNodeError:
            return None
        try:
            return layout.parse_offset_data(data)[0]
        except LayoutError as exc:
            self._bad(path, str(exc))
            return None

    def commit_offsets(self, group: str, offsets: Mapping[tuple[str, PartitionId], int]) -> None:
        for (topic, partition), offset in offsets.items():
            path = self.paths.group_offset(group, topic, str(partition))
            data = layout.offset_data(offset)
            try:
                self._client.set(path, data)
            except NoNodeError:
                try:
                    self._client.create(path, data, makepath=True)
                except NodeExistsError:
                    self._client.set(path, data)

    # ------------------------------------------------------------------ reading groups (tools)

    def _children(self, path: str) -> list[str]:
        try:
            return sorted(self._client.get_children(path))
        except NoNodeError:
            return []

    def groups(self) -> list[str]:
        """Every consumer group with a node under ``consumers/`` (members, owners or offsets)."""
        return self._children(self.paths.consumers)

    def group_topics(self, group: str) -> list[str]:
        """The topics a group owns partitions of or has offsets for."""
        return sorted(set(self._children(f"{self.paths.group(group)}/owners"))
                      | set(self._children(f"{self.paths.group(group)}/offsets")))

    def offsets(self, group: str, topic: str) -> dict[PartitionId, int]:
        """Every committed offset of ``group`` in ``topic`` (partition -> next offset to read)."""
        path = self.paths.group_offsets(group, topic)
        out = {}
        for name in self._children(path):
            try:
                partition = PartitionId.parse(name)
                data, _ = self._client.get(f"{path}/{name}")
                out[partition] = layout.parse_offset_data(data)[0]
            except NoNodeError:
                continue
            except (InvalidArgument, LayoutError) as exc:
                self._bad(f"{path}/{name}", str(exc))
        return dict(sorted(out.items()))

    # ------------------------------------------------------------------ users (SASL/SCRAM credentials)

    def read_user(self, name: str) -> bytes | None:
        """The stored credential of user ``name`` (JSON bytes, metaq.security), None if there is none."""
        try:
            return bytes(self._client.get(self.paths.user(name))[0])
        except NoNodeError:
            return None
        except KazooException as exc:
            raise RegistryError(f"cannot read user {name!r} from ZooKeeper: {exc}") from None

    def write_user(self, name: str, data: bytes) -> bool:
        """Store user ``name``'s credential (persistent); True if the user is new."""
        path = self.paths.user(name)
        try:
            try:
                self._client.create(path, data, makepath=True)
                return True
            except NodeExistsError:
                self._client.set(path, data)
                return False
        except KazooException as exc:
            raise RegistryError(f"cannot write user {name!r} to ZooKeeper: {exc}") from None

    def delete_user(self, name: str) -> bool:
        try:
            self._client.delete(self.paths.user(name))
            return True
        except NoNodeError:
            return False
        except KazooException as exc:
            raise RegistryError(f"cannot delete user {name!r} in ZooKeeper: {exc}") from None

    def list_users(self) -> list[str]:
        return self._children(self.paths.users)

    def read_acls(self) -> tuple[bytes | None, int]:
        """The ACL document (JSON bytes, metaq.security.acl) and its version (-1: there is none)."""
        try:
            data, stat = self._client.get(self.paths.acls)
            return bytes(data), int(stat.version)
        except NoNodeError:
            return None, -1
        except KazooException as exc:
            raise RegistryError(f"cannot read the ACLs from ZooKeeper: {exc}") from None

    def write_acls(self, data: bytes, version: int) -> bool:
        """Replace the ACL document if it is still at ``version`` (-1: create it); False when it moved."""
        try:
            if version < 0:
                self._client.create(self.paths.acls, data, makepath=True)
            else:
                self._client.set(self.paths.acls, data, version=version)
            return True
        except (NodeExistsError, BadVersionError):
            return False
        except KazooException as exc:
            raise RegistryError(f"cannot write the ACLs to ZooKeeper: {exc}") from None

    # ------------------------------------------------------------------ tools

    def raw_client(self) -> Any:
        """The kazoo client, for tools that read more of the tree (``metaq cluster``) and for tests."""
        return self._client
