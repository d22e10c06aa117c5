"""Metadata answers built from a :class:`~metaq.cluster.registry.ClusterSnapshot` (pure, no I/O).

Two users say the same thing about the cluster, so they share this: a broker answering a Metadata
request for the partitions of *other* brokers (its own come from its live state), and a ZooKeeper-mode
client, which reads the whole cluster from the registry instead of asking a broker.

ZooKeeper says, per topic and broker, how many partitions it publishes (``topics-pub``) and serves
to consumers (``topics-sub``): a partition accepts publishing when ``p < numParts`` of the pub node,
subscribing when ``p < numParts`` of the sub node. A partition closed one by one (``metaq topic
close``) is not in ZooKeeper; only its broker knows, and says so with PARTITION_CLOSED.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from metaq.cluster.registry import ClusterSnapshot, TopicEntry
from metaq.errors import UnknownTopicError
from metaq.protocol.messages import BrokerInfo, MetadataResponse, PartitionInfo, TopicInfo


def registered_partitions(entry: TopicEntry | None, brokers: Collection[int],
                          slave_served: Mapping[int, int] | None = None) -> list[PartitionInfo]:
    """The topic's partitions on ``brokers`` (the ones to report), in (broker id, partition) order, and those
    of replica groups without a master that only slaves serve (``slave_served``: broker id -> count, from
    :meth:`ClusterSnapshot.slave_served`): readable, not publishable."""
    if entry is None:
        return []
    parts: list[PartitionInfo] = []
    served = {b: c for b, c in (slave_served or {}).items() if b not in brokers}
    for b in sorted(((set(entry.publish) | set(entry.subscribe)) & set(brokers)) | set(served)):
        if b in served:
            parts += [PartitionInfo(p, b, 0, False, True) for p in range(served[b])]
            continue
        pub, sub = entry.publish.get(b, 0), entry.subscribe.get(b, 0)
        parts += [PartitionInfo(p, b, 0, p < pub, p < sub) for p in range(max(pub, sub))]
    return parts


def metadata_from_snapshot(snapshot: ClusterSnapshot, topics: Iterable[str] | None) -> MetadataResponse:
    """The Metadata answer for ``topics`` (None: every topic with a registered broker) from the
    registry alone: every registered master, and each topic's partitions on them, plus the partitions of
    replica groups whose master is gone but whose slaves serve the topic (readable only); a topic no
    registered broker holds is UNKNOWN_TOPIC."""
    brokers = [BrokerInfo(b, e.master.host, e.master.port)
               for b, e in sorted(snapshot.brokers.items()) if e.master is not None]
    live = {b.broker_id for b in brokers}
    if topics is None:
        names = sorted(t for t, e in snapshot.topics.items()
                       if (set(e.publish) | set(e.subscribe)) & live or snapshot.slave_served(t))
    else:
        names = list(topics)
    out = []
    for name in names:
        parts = registered_partitions(snapshot.topics.get(name), live, snapshot.slave_served(name))
        out.append(TopicInfo(name, 0 if parts else UnknownTopicError.code, parts))
    return MetadataResponse(brokers=brokers, topics=out)
