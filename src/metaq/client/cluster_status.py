"""What ``metaq cluster`` shows: a ZooKeeper-mode cluster as ZooKeeper holds it, with each group's lag.

Brokers, topics, group members, owners and committed offsets are read from ZooKeeper through
:class:`~metaq.cluster.zookeeper.ZooKeeperRegistry` (read-only: nothing is created, a wrong root just
reads as empty). The one thing ZooKeeper does not know is where each partition's log ends: that is
asked of the partitions' own brokers, one pipelined ListOffsets per broker. A broker that does not
answer leaves its partitions' ends (and lags) unknown and is named in :attr:`ClusterStatus.problems`;
the rest of the view is still complete.

**Replica groups.** A broker id with slaves (``brokers/ids/<id>/slave<n>``, docs/replication.md) is a
replica group: :attr:`ClusterStatus.replication` lists each one's master and, per slave, what the slave
says of its own replication in its Stats reply (one Stats request per slave, to the slave's registered
address): per partition its log end, the master's log end as of the slave's last reply from it, the
lag in messages and in milliseconds since the slave was last caught up, and whether it is stalled. A
slave whose master is not registered (stopped, killed and expired) is shown with ``master_registered``
False: it keeps serving what it has, and its lag is as of its last reply from the master.

**Lag** of a partition = its log end offset (the next offset to be written) minus the group's
committed offset in ``consumers/<group>/offsets/<topic>/<brokerId-partition>``: the messages stored
that the group has not consumed yet. A partition with no committed offset has no lag figure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from metaq.client.blocking import BlockingClient
from metaq.client.zk_brokers import BrokerStatus, registered_brokers
from metaq.cluster.layout import DEFAULT_ROOT, ReplicaGroupState
from metaq.cluster.registry import ClusterSnapshot
from metaq.cluster.zk_security import ZkSecurity
from metaq.cluster.zookeeper import ZooKeeperRegistry
from metaq.errors import MetaqError
from metaq.net.blocking import BlockingConnection
from metaq.net.codec import ConnectionSettings, raise_for_error
from metaq.net.tls import ClientTls
from metaq.protocol.messages import StatsRequest
from metaq.types import PartitionId

__all__ = ["BrokerStatus", "ClusterStatus", "GroupStatus", "PartitionLag", "ReplicaGroupStatus", "ReplicaLag",
           "SlaveStatus", "TopicStatus", "read_cluster_status"]

STATS_CLIENT_ID = "metaq-cluster-status"


@dataclass(frozen=True, slots=True)
class TopicStatus:
    topic: str
    publish: dict[int, int]
    """broker id -> partitions accepting producers (``topics-pub``)."""
    subscribe: dict[int, int]
    """broker id -> partitions serving consumers (``topics-sub``)."""

    @property
    def partitions(self) -> int:
        return sum(self.subscribe.values()) if self.subscribe else sum(self.publish.values())


@dataclass(frozen=True, slots=True)
class PartitionLag:
    topic: str
    partition: PartitionId
    owner: str | None
    committed: int | None
    log_end: int | None
    """None when the partition's broker did not answer."""

    @property
    def lag(self) -> int | None:
        if self.committed is None or self.log_end is None:
            return None
        return max(0, self.log_end - self.committed)


@dataclass(frozen=True, slots=True)
class GroupStatus:
    group: str
    members: dict[str, list[str]]
    """consumer id -> its subscribed topics."""
    partitions: list[PartitionLag]

    @property
    def lag(self) -> int:
        """The sum of the known lags."""
        return sum(p.lag for p in self.partitions if p.lag is not None)


@dataclass(frozen=True, slots=True)
class ReplicaLag:
    """One partition as a slave replicates it (the slave's Stats ``replication.partitions``)."""

    topic: str
    partition: PartitionId
    log_end: int
    """The slave's log end offset (the next offset it will store)."""
    master_end: int | None
    """The master's log end in the slave's last reply from it (None: no reply yet)."""
    lag_messages: int | None
    """``master_end`` minus ``log_end`` (None: no reply from the master yet)."""
    lag_ms: int | None
    """How long since the slave last held everything the master had (0: it does; None: no reply yet)."""
    stalled: str
    """Why the partition cannot continue without an operator ('' when it can)."""
    last_error: str

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": str(self.partition), "log_end": self.log_end,
                "master_end": self.master_end, "lag_messages": self.lag_messages, "lag_ms": self.lag_ms,
                "stalled": self.stalled, "last_error": self.last_error}


@dataclass(frozen=True, slots=True)
class SlaveStatus:
    slave_id: int
    address: str
    following: str | None = None
    """The master address the slave fetches from, as it says (None: unknown, or no master found yet)."""
    max_lag_messages: int | None = None
    max_lag_ms: int | None = None
    partitions: list[ReplicaLag] = field(default_factory=list)
    error: str | None = None
    """Set when the slave did not answer its Stats request: then nothing else is known."""

    def to_json(self) -> dict[str, Any]:
        return {"slave_id": self.slave_id, "address": self.address, "following": self.following,
                "max_lag_messages": self.max_lag_messages, "max_lag_ms": self.max_lag_ms, "error": self.error,
                "partitions": [p.to_json() for p in self.partitions]}


@dataclass(frozen=True, slots=True)
class ReplicaGroupStatus:
    """A broker id with at least one slave: its master (if registered) and its slaves."""

    broker_id: int
    master: str | None
    """``host:port`` of the registered master; None when it is gone (the slaves keep serving reads)."""
    slaves: list[SlaveStatus]
    ha: ReplicaGroupState | None = None
    """HA mode's state in ZooKeeper (``brokers/replica-groups/<id>``): epoch, master replica, in-sync
    slaves; None for a MetaQ async replica group."""

    @property
    def master_registered(self) -> bool:
        return self.master is not None

    def to_json(self) -> dict[str, Any]:
        ha = None if self.ha is None else {"epoch": self.ha.epoch, "master_replica": self.ha.master,
                                            "in_sync": sorted(self.ha.isr)}
        return {"broker_id": self.broker_id, "master": self.master, "master_registered": self.master_registered,
                "ha": ha, "slaves": [s.to_json() for s in self.slaves]}


@dataclass
class ClusterStatus:
    zk_connect: str
    zk_root: str
    brokers: list[BrokerStatus]
    topics: list[TopicStatus]
    groups: list[GroupStatus]
    problems: list[str] = field(default_factory=list)
    replication: list[ReplicaGroupStatus] = field(default_factory=list)
    """The broker ids with slaves, by broker id."""

    def to_json(self) -> dict[str, Any]:
        return {
            "zookeeper": self.zk_connect, "root": self.zk_root,
            "brokers": [{"broker_id": b.broker_id, "master": b.master,
                         "slaves": {str(s): a for s, a in sorted(b.slaves.items())}} for b in self.brokers],
            "topics": [{"topic": t.topic, "partitions": t.partitions,
                        "publish": {str(b): n for b, n in sorted(t.publish.items())},
                        "subscribe": {str(b): n for b, n in sorted(t.subscribe.items())}} for t in self.topics],
            "groups": [{"group": g.group, "members": g.members, "lag": g.lag,
                        "partitions": [{"topic": p.topic, "partition": str(p.partition), "owner": p.owner,
                                        "committed": p.committed, "log_end": p.log_end, "lag": p.lag}
                                       for p in g.partitions]} for g in self.groups],
            "replication": [r.to_json() for r in self.replication],
            "problems": self.problems,
        }


def read_cluster_status(zk_connect: str, zk_root: str = DEFAULT_ROOT, *, timeout_s: float = 10.0,
                        username: str | None = None, password: str | None = None, tls: ClientTls | None = None,
                        zk_security: ZkSecurity | None = None) -> ClusterStatus:
    """Read the cluster from ZooKeeper and the log ends from its brokers (RegistryError if ZooKeeper
    cannot be reached within ``timeout_s``); ``username``/``password``: authenticate to the brokers;
    ``tls``: reach them at their TLS ports (registered as sslPort); ``zk_security``: how to reach ZooKeeper."""
    credentials = _Credentials(username, password, tls)
    registry = ZooKeeperRegistry(zk_connect, zk_root, connection_timeout_ms=int(timeout_s * 1000),
                                 read_only=True, security=zk_security).start()
    try:
        snapshot = registry.snapshot()
        if tls is not None:
            snapshot = snapshot.over_tls()
        brokers = registered_brokers(snapshot)
        topics = [TopicStatus(name, dict(t.publish), dict(t.subscribe)) for name, t in sorted(snapshot.topics.items())]
        groups = [_group(registry, snapshot, g) for g in registry.groups()]
        ha_states = {b.broker_id: _ha_state(registry, b.broker_id) for b in brokers if b.slaves}
    finally:
        registry.close()
    status = ClusterStatus(zk_connect, registry.paths.root or "/", brokers, topics, groups)
    _fill_log_ends(status, snapshot, timeout_s, credentials)
    status.replication = [_replica_group(b, status.problems, timeout_s, ha_states.get(b.broker_id), credentials)
                          for b in brokers if b.slaves]
    return status


def _ha_state(registry: ZooKeeperRegistry, broker_id: int) -> ReplicaGroupState | None:
    try:
        return registry.read_replica_group(broker_id)[0]
    except MetaqError:  # unreadable or garbage: the rest of the view stands without it
        return None


@dataclass(frozen=True)
class _Credentials:
    """How the brokers are reached: as a user (SCRAM), over TLS."""

    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: ClientTls | None = None


def _replica_group(broker: BrokerStatus, problems: list[str], timeout_s: float,
                   ha: ReplicaGroupState | None = None,
                   credentials: _Credentials = _Credentials()) -> ReplicaGroupStatus:
    if broker.master is None:
        problems.append(f"broker {broker.broker_id} has no registered master: its slaves "
                        f"({', '.join(f'slave{s}' for s in broker.slaves)}) serve reads, and replicate nothing "
                        "until a master registers")
    slaves = []
    for slave_id, address in sorted(broker.slaves.items()):
        try:
            doc = _stats(address, timeout_s, credentials)
        except (MetaqError, OSError, ValueError) as exc:
            problems.append(f"broker {broker.broker_id} slave{slave_id} at {address}: replication lag unknown ({exc})")
            slaves.append(SlaveStatus(slave_id, address, error=str(exc)))
            continue
        slaves.append(_slave_status(broker.broker_id, slave_id, address, doc.get("replication")))
    return ReplicaGroupStatus(broker.broker_id, broker.master, slaves, ha)


def _stats(address: str, timeout_s: float, credentials: _Credentials = _Credentials()) -> dict[str, Any]:
    host, _, port = address.rpartition(":")
    settings = ConnectionSettings(STATS_CLIENT_ID, timeout_s, timeout_s, 1, 64 << 20,
                                  ssl_context=credentials.tls.context() if credentials.tls is not None else None,
                                  sasl_username=credentials.username, sasl_password=credentials.password)
    conn = BlockingConnection.open((host.strip("[]"), int(port)), settings)
    try:
        reply = raise_for_error(conn.call(StatsRequest()))
    finally:
        conn.close()
    doc = json.loads(reply.stats_json)
    if not isinstance(doc, dict):
        raise ValueError("its Stats reply is not a JSON object")
    return doc


def _slave_status(broker_id: int, slave_id: int, address: str, section: Any) -> SlaveStatus:
    """What a slave's Stats ``replication`` section says (read leniently: a field it lacks is unknown)."""
    if not isinstance(section, dict):
        return SlaveStatus(slave_id, address, error="its Stats reply has no replication section (not a slave?)")
    rows = []
    for topic, partitions in sorted((section.get("partitions") or {}).items()):
        for number, entry in sorted(partitions.items(), key=lambda kv: int(kv[0])):
            master_end = _known(entry.get("master_end_offset"))
            rows.append(ReplicaLag(topic, PartitionId(broker_id, int(number)), int(entry.get("log_end_offset", -1)),
                                   master_end, _known(entry.get("lag_messages")), _known(entry.get("lag_ms")),
                                   str(entry.get("stalled") or ""), str(entry.get("last_error") or "")))
    return SlaveStatus(slave_id, address, section.get("master") or None,
                       max((r.lag_messages for r in rows if r.lag_messages is not None), default=None),
                       max((r.lag_ms for r in rows if r.lag_ms is not None), default=None), rows)


def _known(value: Any) -> int | None:
    """A Stats figure, None for the broker's "not known yet" (-1) or a missing one."""
    return int(value) if isinstance(value, int) and value >= 0 else None


def _group(registry: ZooKeeperRegistry, snapshot: ClusterSnapshot, group: str) -> GroupStatus:
    members = {m: topics for m, topics in sorted(registry.members(group).items())}
    topics = sorted({t for subscribed in members.values() for t in subscribed} | set(registry.group_topics(group)))
    rows = []
    for topic in topics:
        owners = registry.owners(group, topic)
        committed = registry.offsets(group, topic)
        known = set(snapshot.partitions(topic, publish=False)) | set(owners) | set(committed)
        rows += [PartitionLag(topic, p, owners.get(p), committed.get(p), None) for p in sorted(known)]
    return GroupStatus(group, members, rows)


def _fill_log_ends(status: ClusterStatus, snapshot: ClusterSnapshot, timeout_s: float,
                   credentials: _Credentials = _Credentials()) -> None:
    """Ask each partition's broker for its log end: per broker, so that one broker down costs only its own."""
    wanted: dict[tuple[str, int], set[PartitionId]] = {}
    for g in status.groups:
        for row in g.partitions:
            wanted.setdefault((row.topic, row.partition.broker_id), set()).add(row.partition)
    if not wanted:
        return
    ends: dict[tuple[str, PartitionId], int] = {}
    servers = snapshot.servers()
    if not servers:
        status.problems.append("no broker is registered: log end offsets, hence lags, unknown")
        return
    try:
        client = BlockingClient(servers, client_id="metaq-cluster-status", timeout_s=timeout_s, tls=credentials.tls,
                                username=credentials.username, password=credentials.password)
    except MetaqError as exc:
        status.problems.append(f"log end offsets, hence lags, unknown: {exc}")
        return
    with client:
        for (topic, broker_id), partitions in sorted(wanted.items()):
            if snapshot.address(broker_id) is None:
                status.problems.append(f"broker {broker_id} is not registered: log ends of {topic} on it unknown")
                continue
            try:
                replies = client.list_offsets_many(topic, sorted(partitions), -1)
            except (MetaqError, OSError) as exc:
                status.problems.append(f"broker {broker_id}: log ends of {topic} unknown ({exc})")
                continue
            ends.update({(topic, PartitionId.parse(str(p))): r.log_end_offset for p, r in replies.items()})
    for g in status.groups:
        g.partitions[:] = [PartitionLag(r.topic, r.partition, r.owner, r.committed, ends.get((r.topic, r.partition)))
                           for r in g.partitions]
