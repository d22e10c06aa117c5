"""Which copy a consumer reads (``read_from``): the choice rules users rely on, on plain snapshots."""

from __future__ import annotations

import random
from types import MappingProxyType

import pytest

from metaq.client.config import ClientConfig
from metaq.client.replicas import ReadReplica, ReplicaChooser, live_slaves
from metaq.cluster.registry import Address, BrokerEntry, ClusterSnapshot, TopicEntry
from metaq.errors import ConfigError
from metaq.testing import FakeClock
from metaq.types import PartitionId

MASTER = ("10.0.0.1", 8123)
S0, S1 = Address("10.0.0.2", 8123), Address("10.0.0.3", 8123)
P = PartitionId(1, 0)


def snapshot(slaves: dict[int, Address], serving: set[int]) -> ClusterSnapshot:
    broker = BrokerEntry(1, Address(*MASTER), MappingProxyType(dict(slaves)))
    topic = TopicEntry("orders", MappingProxyType({1: 2}), MappingProxyType({1: 2}),
                       MappingProxyType({(1, s): 2 for s in serving}))
    return ClusterSnapshot(MappingProxyType({1: broker}), MappingProxyType({"orders": topic}))


def test_a_slave_is_live_for_a_topic_only_when_registered_and_serving_it() -> None:
    snap = snapshot({0: S0, 1: S1}, serving={1, 7})
    assert live_slaves(snap, "orders", 1) == {1: ("10.0.0.3", 8123)}
    assert live_slaves(snap, "other", 1) == {} and live_slaves(snap, "orders", 2) == {}


def test_master_mode_reads_the_master_only() -> None:
    chooser = ReplicaChooser("master", 2.0)
    assert chooser.choose(snapshot({0: S0}, {0}), "orders", P, MASTER) == ReadReplica(1, -1, MASTER)
    assert chooser.choose(snapshot({0: S0}, {0}), "orders", P, None) is None


def test_prefer_slave_reads_a_slave_falls_back_to_the_master_and_returns() -> None:
    clock = FakeClock()
    chooser = ReplicaChooser("prefer-slave", 2.0, clock=clock)
    snap = snapshot({0: S0}, {0})
    slave = chooser.choose(snap, "orders", P, MASTER)
    assert slave == ReadReplica(1, 0, ("10.0.0.2", 8123)) and slave.is_slave
    assert chooser.choose(snapshot({}, set()), "orders", P, MASTER) == ReadReplica(1, -1, MASTER)  # none live
    chooser.failed(slave)  # unreachable: passed over for avoid_s, the master meanwhile
    assert chooser.choose(snap, "orders", P, MASTER) == ReadReplica(1, -1, MASTER)
    clock.advance_s(2.0)
    assert chooser.choose(snap, "orders", P, MASTER) == slave
    assert chooser.choose(snapshot({}, set()), "orders", P, None) is None  # neither: nothing to read


def test_slave_mode_never_reads_the_master() -> None:
    chooser = ReplicaChooser("slave", 2.0)
    assert chooser.choose(snapshot({}, set()), "orders", P, MASTER) is None
    only = chooser.choose(snapshot({0: S0}, {0}), "orders", P, MASTER)
    assert only is not None
    chooser.failed(only)  # the only slave failed lately: it is tried again rather than the master
    assert chooser.choose(snapshot({0: S0}, {0}), "orders", P, MASTER) == only


def test_each_partition_keeps_its_slave_while_it_is_live_and_partitions_spread() -> None:
    chooser = ReplicaChooser("slave", 2.0, rand=random.Random(7))
    snap = snapshot({0: S0, 1: S1}, {0, 1})
    picks = {p: chooser.choose(snap, "orders", PartitionId(1, p), MASTER) for p in range(40)}
    assert {r.slave_id for r in picks.values() if r is not None} == {0, 1}
    for _ in range(5):  # sticky
        assert all(chooser.choose(snap, "orders", PartitionId(1, p), MASTER) == r for p, r in picks.items())
    moved = {p: chooser.choose(snapshot({1: S1}, {1}), "orders", PartitionId(1, p), MASTER) for p in range(40)}
    assert {r.slave_id for r in moved.values() if r is not None} == {1}  # slave0 left: everyone on slave1


def test_read_from_is_checked_and_needs_cluster_mode() -> None:
    assert ClientConfig().read_from == "master"
    assert ClientConfig(read_from="prefer-slave", zk_connect="zk:2181").read_from == "prefer-slave"
    with pytest.raises(ConfigError, match="read_from must be one of master, slave, prefer-slave"):
        ClientConfig(read_from="slaves", zk_connect="zk:2181")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="needs cluster mode"):
        ClientConfig(read_from="slave")
