"""What ``metaq cluster`` shows: a ZooKeeper-mode cluster as ZooKeeper holds it, with each group's lag.

Brokers, topics, group members, owners and committed offsets are read from ZooKeeper through
:class:`~metaq.cluster.zookeeper.ZooKeeperRegistry` (read-only: nothing is created, a wrong root just
reads as empty). The one thing ZooKeeper does not know is where each partition's log ends: that is
asked of the partitions' own brokers, one pipelined ListOffsets per broker. A broker that does not
answer leaves its partitions' ends (and lags) unknown and is named in :attr:`ClusterStatus.problems`;
the rest of the view is still complete.

**Lag** of a partition = its log end offset (the next offset to be written) minus the group's
committed offset in ``consumers/<group>/offsets/<topic>/<brokerId-partition>``: the messages stored
that the group has not consumed yet. A partition with no committed offset has no lag figure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from metaq.client.blocking import BlockingClient
from metaq.cluster.layout import DEFAULT_ROOT
from metaq.cluster.registry import ClusterSnapshot
from metaq.cluster.zookeeper import ZooKeeperRegistry
from metaq.errors import MetaqError
from metaq.types import PartitionId

__all__ = ["BrokerStatus", "ClusterStatus", "GroupStatus", "PartitionLag", "TopicStatus", "read_cluster_status"]


@dataclass(frozen=True, slots=True)
class BrokerStatus:
    broker_id: int
    master: str | None
    """``host:port``, None while only slaves are registered."""
    slaves: dict[int, str] = field(default_factory=dict)


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


@dataclass
class ClusterStatus:
    zk_connect: str
    zk_root: str
    brokers: list[BrokerStatus]
    topics: list[TopicStatus]
    groups: list[GroupStatus]
    problems: list[str] = field(default_factory=list)

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
            "problems": self.problems,
        }


def read_cluster_status(zk_connect: str, zk_root: str = DEFAULT_ROOT, *, timeout_s: float = 10.0) -> ClusterStatus:
    """Read the cluster from ZooKeeper and the log ends from its brokers (RegistryError if ZooKeeper
    cannot be reached within ``timeout_s``)."""
    registry = ZooKeeperRegistry(zk_connect, zk_root, connection_timeout_ms=int(timeout_s * 1000),
                                 read_only=True).start()
    try:
        snapshot = registry.snapshot()
        brokers = [BrokerStatus(b, str(e.master) if e.master else None,
                                {s: str(a) for s, a in sorted(e.slaves.items())})
                   for b, e in sorted(snapshot.brokers.items())]
        topics = [TopicStatus(name, dict(t.publish), dict(t.subscribe)) for name, t in sorted(snapshot.topics.items())]
        groups = [_group(registry, snapshot, g) for g in registry.groups()]
    finally:
        registry.close()
    status = ClusterStatus(zk_connect, registry.paths.root or "/", brokers, topics, groups)
    _fill_log_ends(status, snapshot, timeout_s)
    return status


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


def _fill_log_ends(status: ClusterStatus, snapshot: ClusterSnapshot, timeout_s: float) -> None:
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
        client = BlockingClient(servers, client_id="metaq-cluster-status", timeout_s=timeout_s)
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
