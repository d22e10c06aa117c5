"""What a session's producers, consumers and admin share: config, connections, metadata, routing.

Several servers: standalone brokers (no ZooKeeper) each answer only for their own partitions, so
metadata is asked of every server and merged (:func:`metaq.client.metadata.merge_metadata`), and each
partition is then reached at its own broker. Each broker coordinates consumer groups for its own
partitions (a member joins every server: :mod:`metaq.client.group.standalone`); what needs one broker
for all (where a group's dead-letter topic is created) asks :meth:`ClientCore.coordinator`, the lowest
broker id among the servers, a rule every client given the same brokers computes alike.

Cluster mode (``zk_connect``): the session keeps a watched
:class:`~metaq.cluster.zookeeper.ZooKeeperRegistry` (:attr:`ClientCore.registry`). Metadata is then
built from its snapshot (:func:`metaq.cluster.metadata.metadata_from_snapshot`, no request to a
broker), the servers are the registered masters, and every change ZooKeeper reports (a broker joins or
leaves, a topic changes) is applied to the cached metadata at once, on the event loop. While ZooKeeper
is unreachable the last snapshot keeps serving. Consumer groups then coordinate through the registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from metaq.client.config import ClientConfig
from metaq.client.metadata import Metadata, Partition, TopicMetadata, merge_metadata
from metaq.client.replicas import ReadReplica, ReplicaChooser
from metaq.client.routing import Unavailable
from metaq.errors import (
    BrokerError,
    ConnectionClosedError,
    RequestTimeoutError,
    UnknownPartitionError,
    UnknownServerError,
)
from metaq.net.codec import raise_for_error
from metaq.net.connection import BrokerConnection
from metaq.net.discovery import WALK_ERRORS, ServerBook
from metaq.net.pool import ConnectionPool
from metaq.net.servers import Address, format_address
from metaq.protocol.messages import MetadataRequest, MetadataResponse
from metaq.types import PartitionId, PartitionKey

if TYPE_CHECKING:
    from metaq.cluster.registry import ClusterSnapshot
    from metaq.cluster.zookeeper import ZooKeeperRegistry


log = logging.getLogger("metaq.client")

DEPOSED_ANSWER_S = 0.5
"""How long requests in flight to a master that ZooKeeper has replaced may go unanswered before they are given
up (a deposed master that runs answers them at once)."""


def _from_snapshot(snapshot: ClusterSnapshot, topics: list[str] | None) -> MetadataResponse:
    from metaq.cluster.metadata import metadata_from_snapshot

    return metadata_from_snapshot(snapshot, topics)


def registered_masters(snapshot: ClusterSnapshot) -> dict[int, Address]:
    """broker id -> its master's (host, port), for every broker with a registered master."""
    return {b: (e.master.host, e.master.port) for b, e in sorted(snapshot.brokers.items()) if e.master is not None}


class ClientCore:
    def __init__(self, config: ClientConfig, servers: list[Address]) -> None:
        self.config = config
        self.servers = servers
        self.registry: ZooKeeperRegistry | None = None
        """Cluster mode's registry (None in standalone mode): started by :meth:`start`."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self.pool = ConnectionPool(config.connection_settings(), config.reconnect_retry(), servers)
        self.metadata = Metadata(self._fetch_metadata, max_age_s=config.metadata_max_age_s,
                                 min_interval_s=config.metadata_min_interval_s)
        self.default_broker_id = -1
        """The broker first reached: it answers metadata and gets produce requests for topics with no
        known partitions (partition -1, the broker picks)."""
        self._default_address: Address | None = None
        self.unavailable = Unavailable(config.unreachable_avoid_s)
        """Brokers and partitions producers leave out for a while (metaq.client.routing)."""
        self._registered: dict[int, Address] = {}
        """Cluster mode: each registered master's address in the last snapshot applied."""
        self.snapshot_applied_at = 0.0
        """Cluster mode: time.monotonic() of the last snapshot applied to the metadata (benchmarks)."""
        self._snapshot_waiters: set[asyncio.Future[None]] = set()
        self.snapshots_applied = 0
        """Cluster mode: how many ZooKeeper snapshots were applied (a waiter compares it to its own count)."""
        self.replicas = ReplicaChooser(config.read_from, config.unreachable_avoid_s)
        """Which copy (master or slave) consumers read each partition from (``read_from``)."""

    @property
    def server_ids(self) -> dict[Address, int]:
        """Each server address -> the broker id it answered with (once it has answered)."""
        return self.pool.servers.ids

    async def start(self) -> None:
        """Reach the first bootstrap server that answers; ConnectionClosedError naming each if none does
        (TooManyConnectionsError when every one refused for being full). In cluster mode, first connect
        to ZooKeeper: the bootstrap servers are the registered brokers."""
        if self.config.zk_connect is not None:
            await self._start_registry(self.config.zk_connect)
        self._adopt(*await self.pool.first_answering())

    @property
    def cluster_mode(self) -> bool:
        return self.registry is not None

    async def _start_registry(self, zk_connect: str) -> None:
        # metaq.cluster (and kazoo) only in cluster mode: a standalone client (the logging handler
        # inside an application, say) never loads them.
        from metaq.cluster.registry import RegistryError
        from metaq.cluster.zookeeper import ZooKeeperRegistry

        cfg = self.config
        registry = ZooKeeperRegistry(zk_connect, cfg.zk_root, session_timeout_ms=cfg.zk_session_timeout_ms,
                                     connection_timeout_ms=cfg.zk_connection_timeout_ms, security=cfg.zk_security(),
                                     layout_owner=False)
        try:
            await asyncio.to_thread(registry.start)
        except RegistryError as exc:
            raise ConnectionClosedError(f"zk_connect={zk_connect!r}: {exc}") from None
        self.registry = registry  # closed by close() from here on, whatever happens next
        self._loop = asyncio.get_running_loop()
        snapshot = self._view(registry.snapshot())
        servers = [(e.master.host, e.master.port) for _, e in sorted(snapshot.brokers.items()) if e.master is not None]
        if not servers:
            raise ConnectionClosedError(f"no metaq broker is registered in ZooKeeper at {zk_connect} under "
                                        f"{cfg.zk_root} (are the brokers started with zk.zkEnable=true "
                                        "and this zkRoot?)")
        self._set_servers(servers)
        self._registered = registered_masters(snapshot)
        self.metadata.cache.update(_from_snapshot(snapshot, None))
        registry.add_listener(self._on_snapshot)

    def _view(self, snapshot: ClusterSnapshot) -> ClusterSnapshot:
        """The cluster as this session reaches it: at the brokers' TLS ports (registered as sslPort) when TLS is on."""
        return snapshot.over_tls() if self.config.tls else snapshot

    def _set_servers(self, servers: list[Address]) -> None:
        self.servers = servers
        self.pool.servers = ServerBook(servers)

    def _on_snapshot(self, snapshot: ClusterSnapshot) -> None:
        """On the registry's thread: hop to the loop (never block here)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop is closing
                loop.call_soon_threadsafe(self._apply_snapshot, self._view(snapshot))

    def _apply_snapshot(self, snapshot: ClusterSnapshot) -> None:
        """The cluster changed: every cached topic's metadata is replaced from the snapshot now.

        A broker that registered (again, or at a new address) is taken back by the producers at once,
        and its address is the registered one from now on (a restart may have moved its port)."""
        if self.registry is None:
            return  # closed meanwhile
        registered = registered_masters(snapshot)
        cache = self.metadata.cache
        for broker_id, address in registered.items():
            if self._registered.get(broker_id) != address:
                previous = self._registered.get(broker_id)
                if previous is not None and self._loop is not None:  # a new master: give the old one a moment
                    self._loop.call_later(DEPOSED_ANSWER_S, self._give_up_on, broker_id, previous, address)
                self.unavailable.forget_broker(broker_id)
                if cache.known_addresses.get(broker_id, address) != address:
                    del cache.known_addresses[broker_id]
                if broker_id == self.default_broker_id:
                    self._default_address = address
        for broker_id in set(self._registered) - set(registered):
            cache.known_addresses.pop(broker_id, None)
        self._registered = registered
        if registered:
            self._set_servers(list(registered.values()))  # in broker id order
        cache.brokers = {}  # only the registered brokers from now on (filled by update)
        cache.update(_from_snapshot(snapshot, list(cache.topics)), list(cache.topics))
        self.snapshot_applied_at = time.monotonic()
        self.snapshots_applied += 1
        waiters, self._snapshot_waiters = self._snapshot_waiters, set()
        for w in waiters:
            if not w.done():
                w.set_result(None)

    def _give_up_on(self, broker_id: int, old: Address, new: Address) -> None:
        """Broker id ``broker_id``'s master moved from ``old`` to ``new`` a moment ago: requests still in flight
        to ``old`` are given up (a deposed master answers at once, NOT_MASTER or its last acks; one that has not
        answered by now is paused or cut off). They fail as may-have-been-applied, and what follows goes to
        the new master instead of waiting out the request timeout behind them."""
        if self._registered.get(broker_id) == old or self.registry is None:
            return  # it came back at the same address
        dropped = self.pool.drop_stuck(old, f"broker {broker_id}'s master moved to {format_address(new)} and "
                                            f"{format_address(old)} did not answer within {DEPOSED_ANSWER_S:g}s")
        if dropped:
            log.info("broker %d: gave up %d connection(s) to the old master %s (its successor is at %s)", broker_id,
                     dropped, format_address(old), format_address(new))

    async def cluster_changed(self, timeout_s: float, since: int | None = None) -> None:
        """Sleep ``timeout_s``, or less when a ZooKeeper change is applied meanwhile (cluster mode); at once
        when one was applied after ``since`` (a :attr:`snapshots_applied` taken before the failed attempt)."""
        if self.registry is None:
            await asyncio.sleep(timeout_s)
            return
        if since is not None and self.snapshots_applied != since:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._snapshot_waiters.add(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout_s)
        except TimeoutError:
            pass
        finally:
            self._snapshot_waiters.discard(waiter)

    def _adopt(self, address: Address, conn: BrokerConnection) -> None:
        self.default_broker_id = conn.broker_id
        self._default_address = address
        self._learn(address, conn)

    def _learn(self, address: Address, conn: BrokerConnection) -> None:
        """The metadata cache reaches a broker where it answered (the pool's ServerBook knows it too)."""
        if conn.broker_id >= 0:
            self.metadata.cache.known_addresses[conn.broker_id] = address

    async def connection_at(self, address: Address, channel: str = "default") -> BrokerConnection:
        """The shared connection to the server at ``address``, and never to another one: a consumer group's
        requests for a broker must reach that broker (no failover to the next bootstrap server)."""
        conn = await self.pool.get(address, channel)
        self._learn(address, conn)
        return conn

    async def _server_connection(self, address: Address, channel: str = "default") -> BrokerConnection:
        if address == self._default_address:
            return await self._default_connection(channel)
        conn = await self.pool.get(address, channel)
        self._learn(address, conn)
        return conn

    async def coordinator(self) -> int | None:
        """The broker that coordinates consumer groups: None (the default broker) with one server, else
        the lowest broker id among the servers. Every server must have answered once, so that members
        listing the same brokers agree; ConnectionClosedError names the ones that have not."""
        if len(self.servers) == 1:
            return None
        missing = self.pool.servers.unreached()
        if missing:
            results = await self._reach(missing)
            failed = [f"{format_address(a)} ({r})" for a, r in zip(missing, results, strict=True)
                      if isinstance(r, BaseException)]
            if failed:
                raise ConnectionClosedError(
                    "cannot tell which broker coordinates consumer groups (the lowest broker id among the "
                    f"servers) until every server has answered once; not yet: {'; '.join(failed)}")
        return min(self.server_ids[a] for a in self.servers)

    def address(self, broker_id: int) -> Address:
        addr = self.metadata.cache.address(broker_id)
        if addr is None:
            if broker_id == self.default_broker_id and self._default_address is not None:
                return self._default_address
            raise UnknownServerError(f"broker {broker_id} is not in the metadata this client has")
        return addr

    def cached_connection(self, broker_id: int, channel: str = "default") -> BrokerConnection | None:
        """The open shared connection to a broker if there is one (no I/O, no reconnect); never one to another
        broker (an address that answers as another broker id now), as :meth:`connection`."""
        if broker_id == self.default_broker_id:
            address = self._default_address
        else:
            address = self.metadata.cache.address(broker_id)
        conn = self.pool.cached(address, channel) if address is not None else None
        if conn is not None and conn.broker_id >= 0 and conn.broker_id != broker_id:
            return None
        return conn

    async def connection(self, broker_id: int | None = None, channel: str = "default") -> BrokerConnection:
        """The shared connection to a broker, reconnecting if needed. None: the default broker, or another
        bootstrap server when it cannot be reached (any broker answers what is asked of "a" broker).

        A broker id is that broker or an error (the connection's, or ConnectionClosedError when its address
        answers as another broker now), never another server: a request about a partition (a produce, a fetch,
        a partition's state or offsets) names only its number, and another broker would act on its own
        partition of that number. A broker id not yet known is looked for among the servers that have not
        answered yet (each standalone broker is known only by the address it was given at)."""
        if broker_id is None or broker_id < 0:
            return await self._default_connection(channel)  # in cluster mode: where ZooKeeper says it is
        if self.metadata.cache.address(broker_id) is None and broker_id != self.default_broker_id:
            await self._reach(self.pool.servers.unreached())  # failures are left for later
        address = self.address(broker_id)  # the default broker's: where ZooKeeper says it is, in cluster mode
        conn = await self.pool.get(address, channel)
        if conn.broker_id >= 0 and conn.broker_id != broker_id:
            raise ConnectionClosedError(f"{format_address(address)} answers as broker {conn.broker_id} now, not as "
                                        f"broker {broker_id}: nothing was sent; waiting for broker {broker_id}")
        return conn

    # -- reading from masters or slaves (read_from, metaq.client.replicas) --------------------------

    @property
    def reads_slaves(self) -> bool:
        """Consumers may read slaves (``read_from`` other than "master", in cluster mode)."""
        return self.registry is not None and self.config.read_from != "master"

    def reads_slaves_of(self, broker_id: int) -> bool:
        """Consumers may read ``broker_id``'s slaves: ``read_from`` says so, or (cluster mode) the replica group
        has no master registered now and its slaves hold the only copies left."""
        return self.registry is not None and (self.config.read_from != "master" or broker_id not in self._registered)

    def read_replica(self, topic: str, partition: PartitionId) -> ReadReplica:
        """The copy of ``partition`` to fetch from now (no I/O). ConnectionClosedError (retriable: a
        consumer waits and asks again) when ``read_from`` allows none: neither the master nor a live slave
        is registered, or no slave is live with ``read_from="slave"``. In cluster mode a replica group
        without a master is read from a live slave whatever ``read_from`` says."""
        broker_id = partition.broker_id
        master: Address | None = None
        with contextlib.suppress(UnknownServerError):
            master = self.address(broker_id)
        if self.registry is None or (self.config.read_from == "master" and master is not None):
            if master is None:
                raise ConnectionClosedError(f"broker {broker_id} is not in the metadata this client has")
            return ReadReplica(broker_id, -1, master)
        snapshot = self._view(self.registry.snapshot())
        entry = snapshot.brokers.get(broker_id)
        if entry is None or entry.master is None:
            master = None  # not registered now: its slaves are the copies left
        chosen = self.replicas.choose(snapshot, topic, partition, master)
        if chosen is None:
            if self.config.read_from == "slave":
                raise ConnectionClosedError(f"no live slave of broker {broker_id} serves {topic} "
                                            "(read_from='slave' never reads the master): waiting for one")
            raise ConnectionClosedError(f"broker {broker_id} has neither a registered master nor a live slave "
                                        f"serving {topic}")
        return chosen

    async def read_connection(self, replica: ReadReplica, *, own: bool = False) -> BrokerConnection:
        """A connection to ``replica``: the shared one, or (``own``, for long polls) a new one the caller
        closes. A slave that cannot be reached is passed over for a while (:meth:`replica_failed`)."""
        try:
            if own:
                return await self.pool.connect(replica.address)
            if not replica.is_slave:
                return await self.connection(replica.broker_id)
            return await self.pool.get(replica.address)
        except (ConnectionClosedError, RequestTimeoutError, BrokerError):
            self.replica_failed(replica)
            raise

    def replica_failed(self, replica: ReadReplica) -> None:
        """``replica`` failed a fetch or a connection: a slave is avoided for ``unreachable_avoid_s``."""
        self.replicas.failed(replica)

    async def _reach(self, addresses: list[Address]) -> list[BrokerConnection | BaseException]:
        """Connect to each server at once, learning its broker id; failures are returned in their place."""
        results = await self.pool.reach(addresses) if addresses else []
        for address, result in zip(addresses, results, strict=True):
            if isinstance(result, BrokerConnection):
                self._learn(address, result)
        return results

    async def _default_connection(self, channel: str) -> BrokerConnection:
        assert self._default_address is not None, "ClientCore.start() was not called"
        try:
            conn = await self.pool.get(self._default_address, channel)
        except WALK_ERRORS as exc:
            # The default broker is gone (or full): another bootstrap server may answer.
            others = [a for a in self.servers if a != self._default_address]
            if not others:
                raise
            address, conn = await self.pool.first_answering(others, channel, failed=[exc])
            self._adopt(address, conn)
            return conn
        if conn.broker_id != self.default_broker_id and conn.broker_id >= 0:
            self._adopt(self._default_address, conn)  # restarted with another broker id
        return conn

    async def request(self, request: Any, broker_id: int | None = None, *, channel: str = "default",
                      timeout_s: float | None = None) -> Any:
        """One request to a broker; raises the broker's error (with ``exc.response``)."""
        conn = await self.connection(broker_id, channel)
        return await conn.request(request, timeout_s)

    async def _fetch_metadata(self, request: MetadataRequest) -> MetadataResponse:
        """Metadata from every server, merged; the servers that fail are left out unless all do. In
        cluster mode, from the registry's snapshot (no request)."""
        if self.registry is not None:
            return _from_snapshot(self._view(self.registry.snapshot()), request.topics)
        if len(self.servers) == 1:
            conn = await self.connection(None)
            return raise_for_error(await conn.request(request))
        results = await asyncio.gather(*(self._ask(a, request) for a in self.servers), return_exceptions=True)
        answers: dict[int, MetadataResponse] = {}
        errors: list[BaseException] = []
        for result in results:
            if isinstance(result, (ConnectionClosedError, RequestTimeoutError, BrokerError)):
                errors.append(result)
            elif isinstance(result, BaseException):
                raise result
            else:
                answers.setdefault(result[0], result[1])
        if not answers:
            raise errors[0]
        return merge_metadata(sorted(answers.items()))

    async def _ask(self, address: Address, request: MetadataRequest) -> tuple[int, MetadataResponse]:
        conn = await self._server_connection(address)
        response: MetadataResponse = raise_for_error(await conn.request(request))
        return conn.broker_id, response

    async def topic(self, topic: str) -> TopicMetadata:
        return await self.metadata.topic(topic)

    async def partition(self, topic: str, partition: PartitionKey) -> Partition:
        """The Partition (with its broker) named by a PartitionId, ``"b-p"`` text or a bare number (which
        must be unambiguous: InvalidArgument naming the candidates otherwise); UnknownPartitionError if
        the topic has no such partition."""
        if isinstance(partition, Partition):
            return partition
        tm = await self.metadata.topic(topic)
        found = tm.find(partition)
        if found is None:
            tm = await self.metadata.refresh_topic(topic)
            found = tm.find(partition)
        if found is None:
            if tm.error is not None:
                raise type(tm.error)(tm.error.message)
            raise UnknownPartitionError(
                f"topic {topic!r} has no partition {partition} (it has {[str(p) for p in tm.partitions]})")
        return found

    async def close(self) -> None:
        self.metadata.close()
        self.pool.close()
        registry, self.registry = self.registry, None
        if registry is not None:
            await asyncio.to_thread(registry.close)
        await asyncio.sleep(0)  # let transports run their connection_lost callbacks

