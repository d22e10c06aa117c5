"""`metaq cluster`: a 3-broker ZooKeeper-mode cluster (real ZooKeeper, real broker processes) as ZooKeeper
holds it, with a consumer group's members, owners and exact lag per partition; a broker that leaves, a
wrong root and an unreachable ZooKeeper."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from cli_process import metaq

from metaq.client import BrokerStatus, ZooKeeperBrokers
from metaq.client.blocking import BlockingClient
from metaq.cluster.zookeeper import ZooKeeperRegistry
from metaq.errors import ConnectionClosedError
from metaq.protocol.records import encode_values
from metaq.testing import BrokerProcess, unused_port, wait_until
from metaq.types import PartitionId as P

TOPICS = "[topic=orders]\nnumPartitions=2\n\n[topic=audit]\nnumPartitions=1\nacceptPublish=false\n"
ORDERS = [P(b, p) for b in (1, 2, 3) for p in (0, 1)]


def stored(pid: P) -> int:
    """How many messages the test puts into orders:pid (different for every partition)."""
    return 10 * pid.broker_id + pid.partition + 1


@pytest.fixture
def group_registry(zookeeper: Any, zk_root: str) -> Iterator[ZooKeeperRegistry]:
    """What a ZooKeeper-mode group consumer writes (its members, owners and offsets), through the registry."""
    registry = ZooKeeperRegistry(zookeeper.connect_string, zk_root, watch_cluster=False).start()
    yield registry
    registry.close()


def status(zookeeper: Any, zk_root: str, *args: str) -> Any:
    result = metaq("cluster", "--zk-connect", zookeeper.connect_string, "--zk-root", zk_root, *args)
    assert result.returncode == 0, result.stderr
    return result


def test_cluster_status_shows_brokers_topics_groups_and_exact_lag(
        cluster_factory: Callable[..., BrokerProcess], zookeeper: Any, zk_root: str,
        group_registry: ZooKeeperRegistry) -> None:
    brokers = {b: cluster_factory(b, topics=TOPICS) for b in (1, 2, 3)}
    with BlockingClient(brokers[1].servers) as client:  # one broker given: it routes to every partition's own
        wait_until(lambda: client.partitions_for("orders") == ORDERS, 10, message="every broker's partitions")
        for pid in ORDERS:
            client.produce("orders", pid, encode_values([b"x"] * stored(pid), 1_700_000_000_000))
    group = group_registry
    group.register_member("billing", "billing-a", ["orders"])
    group.register_member("billing", "billing-b", ["orders"])
    for pid in ORDERS:
        assert group.claim("billing", "orders", pid, "billing-a" if pid.broker_id < 3 else "billing-b")
    committed = {P(1, 0): 5, P(1, 1): 12, P(2, 1): 1, P(3, 0): 31}
    group.commit_offsets("billing", {("orders", p): o for p, o in committed.items()})

    doc = json.loads(status(zookeeper, zk_root, "--json").stdout)
    assert doc["brokers"] == [{"broker_id": b, "master": brokers[b].servers, "slaves": {}} for b in (1, 2, 3)]
    assert doc["topics"] == [
        {"topic": "audit", "partitions": 3, "publish": {}, "subscribe": {"1": 1, "2": 1, "3": 1}},
        {"topic": "orders", "partitions": 6, "publish": {"1": 2, "2": 2, "3": 2},
         "subscribe": {"1": 2, "2": 2, "3": 2}},
    ]
    (billing,) = doc["groups"]
    assert billing["members"] == {"billing-a": ["orders"], "billing-b": ["orders"]}
    expected = [{"topic": "orders", "partition": str(p), "owner": "billing-a" if p.broker_id < 3 else "billing-b",
                 "committed": committed.get(p), "log_end": stored(p),
                 "lag": stored(p) - committed[p] if p in committed else None} for p in ORDERS]
    assert billing["partitions"] == expected
    assert billing["lag"] == (11 - 5) + (12 - 12) + (22 - 1) + (31 - 31) == 27
    assert doc["problems"] == []

    text = status(zookeeper, zk_root).stdout.splitlines()
    assert "3 brokers" in text and "2 topics (partitions per broker: publish/subscribe)" in text
    fields = [line.split() for line in text]
    assert ["topic", "partitions", "broker", "1", "broker", "2", "broker", "3"] in fields
    assert ["audit", "3", "-/1", "-/1", "-/1"] in fields and ["orders", "6", "2/2", "2/2", "2/2"] in fields
    assert "group billing: 2 members, lag 27" in text
    assert ["topic", "partition", "owner", "committed", "log", "end", "lag"] in fields
    assert ["orders", "2-1", "billing-a", "1", "22", "21"] in fields
    assert ["orders", "3-1", "billing-b", "-", "32", "-"] in fields

    # broker 3 leaves: its registration and topics go, the group's nodes stay; its log ends are unknown
    assert brokers[3].stop() == 0
    left = metaq("cluster", "--zk-connect", zookeeper.connect_string, "--zk-root", zk_root, "--json")
    assert left.returncode == 0, left.stderr
    doc = json.loads(left.stdout)
    assert [b["broker_id"] for b in doc["brokers"]] == [1, 2]
    assert doc["topics"][1]["publish"] == {"1": 2, "2": 2}
    rows = {r["partition"]: r for r in doc["groups"][0]["partitions"]}
    assert rows["3-0"] == {"topic": "orders", "partition": "3-0", "owner": "billing-b", "committed": 31,
                           "log_end": None, "lag": None}
    assert rows["1-0"]["lag"] == 6
    assert "warning: broker 3 is not registered" in left.stderr


def test_zookeeper_brokers_lists_the_registered_brokers_and_follows_them(
        cluster_factory: Callable[..., BrokerProcess], zookeeper: Any, zk_root: str) -> None:
    brokers = {b: cluster_factory(b) for b in (1, 2)}
    view = ZooKeeperBrokers(zookeeper.connect_string, zk_root, timeout_ms=10_000)
    try:
        assert view.brokers() == [BrokerStatus(b, brokers[b].servers, {}) for b in (1, 2)]
        assert view.brokers(tls=True) == [BrokerStatus(b, None, {}) for b in (1, 2)]  # no sslPort registered
        assert brokers[2].stop() == 0
        wait_until(lambda: [b.broker_id for b in view.brokers()] == [1], 30, message="broker 2 leaves the view")
    finally:
        view.close()
    empty = ZooKeeperBrokers(zookeeper.connect_string, f"{zk_root}-nothing-here")
    try:
        assert empty.brokers() == []
    finally:
        empty.close()
    assert ZooKeeperBrokers.normalize_root("meta/") == "/meta" and ZooKeeperBrokers.normalize_root("/") == "/"
    with pytest.raises(ConnectionClosedError, match="ZooKeeper"):
        ZooKeeperBrokers(f"127.0.0.1:{unused_port()}", timeout_ms=1000).brokers()


def test_a_root_without_a_cluster_reads_as_empty_and_stays_empty(zookeeper: Any, zk_root: str) -> None:
    result = status(zookeeper, zk_root)
    assert f"no broker is registered under {zk_root}" in result.stdout
    assert "0 topics" in result.stdout and "0 consumer groups" in result.stdout
    registry = ZooKeeperRegistry(zookeeper.connect_string, "/", watch_cluster=False, read_only=True).start()
    try:
        assert registry.raw_client().exists(zk_root) is None, "a read leaves nothing behind"
    finally:
        registry.close()


def test_an_unreachable_zookeeper_is_one_line_and_exit_1() -> None:
    result = metaq("cluster", "--zk-connect", f"127.0.0.1:{unused_port()}", "--timeout", "2", timeout_s=120)
    assert result.returncode == 1
    assert result.stderr.startswith("Error: cannot reach ZooKeeper at 127.0.0.1:") and \
        len(result.stderr.splitlines()) == 1, result.stderr
