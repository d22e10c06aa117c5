"""Brokers in ZooKeeper mode (real ZooKeeper, real broker processes): MetaQ's layout checked znode by
znode, kept up to date as topics are created, grown, closed and deleted, removed at a clean stop; any
broker answers metadata for the whole cluster; start-up refusals are one clear line."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from metaq.broker.launcher import BrokerLaunchError
from metaq.client import connect
from metaq.testing import BrokerProcess, unused_port, wait_until
from metaq.types import PartitionId as P


@pytest.fixture
def zk_client(zookeeper: Any) -> Any:
    client = KazooClient(hosts=zookeeper.connect_string)
    client.start(10)
    yield client
    client.stop()
    client.close()


def node(zk: Any, path: str) -> bytes | None:
    try:
        return zk.get(path)[0]  # one read: an exists() then get() races the node's deletion
    except NoNodeError:
        return None


def test_brokers_register_in_metaqs_layout_and_keep_it_current(cluster_factory: Callable[..., BrokerProcess],
                                                               zk_client: Any, zk_root: str) -> None:
    topics = "[topic=orders]\nnumPartitions=3\n\n[topic=audit]\nacceptPublish=false\n"
    b1 = cluster_factory(1, topics=topics)
    b2 = cluster_factory(2, topics=topics)
    for broker_id, b in ((1, b1), (2, b2)):
        assert node(zk_client, f"{zk_root}/brokers/ids/{broker_id}/master") == f"meta://127.0.0.1:{b.port}".encode()
        owner = zk_client.get(f"{zk_root}/brokers/ids/{broker_id}/master")[1].ephemeralOwner
        assert owner != 0, "the registration is ephemeral"
    for b in (1, 2):
        orders = {"numParts": 3, "broker": f"{b}-m"}
        assert json.loads(node(zk_client, f"{zk_root}/brokers/topics-pub/orders/{b}-m")) == orders
        assert json.loads(node(zk_client, f"{zk_root}/brokers/topics-sub/orders/{b}-m")) == orders
        # acceptPublish=false: subscribed only
        assert node(zk_client, f"{zk_root}/brokers/topics-pub/audit/{b}-m") is None
        assert json.loads(node(zk_client, f"{zk_root}/brokers/topics-sub/audit/{b}-m")) == \
            {"numParts": 2, "broker": f"{b}-m"}

    with connect(b1.servers) as session:  # one broker given: metadata covers the cluster
        admin = session.admin()
        admin.create_topic("fresh", 4, broker_id=1)
        wait_until(lambda: node(zk_client, f"{zk_root}/brokers/topics-pub/fresh/1-m") is not None
                   and node(zk_client, f"{zk_root}/brokers/topics-sub/fresh/1-m") is not None, 10,
                   message="a created topic to be announced")
        assert json.loads(node(zk_client, f"{zk_root}/brokers/topics-sub/fresh/1-m")) == \
            {"numParts": 4, "broker": "1-m"}
        admin.close_partition("orders", -1, broker_id=1)  # every partition of it closed for publishing
        wait_until(lambda: node(zk_client, f"{zk_root}/brokers/topics-pub/orders/1-m") is None, 10,
                   message="a fully closed topic to leave topics-pub")
        assert node(zk_client, f"{zk_root}/brokers/topics-sub/orders/1-m") is not None
        admin.open_partition("orders", -1, broker_id=1)
        wait_until(lambda: node(zk_client, f"{zk_root}/brokers/topics-pub/orders/1-m") is not None, 10,
                   message="the reopened topic to be back")
        admin.delete_topic("fresh", broker_id=1)
        wait_until(lambda: node(zk_client, f"{zk_root}/brokers/topics-sub/fresh/1-m") is None, 10,
                   message="a deleted topic to be withdrawn")

    # a reload that grows a topic updates its registration
    b2.config_path.write_text(b2.config_path.read_text().replace("[topic=orders]\nnumPartitions=3",
                                                                 "[topic=orders]\nnumPartitions=5"))
    b2.signal(signal.SIGHUP)
    wait_until(lambda: json.loads(node(zk_client, f"{zk_root}/brokers/topics-pub/orders/2-m") or b"{}")
               == {"numParts": 5, "broker": "2-m"}, 10, message="the grown topic's registration")

    # a clean stop deregisters at once (not after the session timeout)
    assert b1.stop() == 0
    assert node(zk_client, f"{zk_root}/brokers/ids/1/master") is None
    assert node(zk_client, f"{zk_root}/brokers/topics-pub/orders/1-m") is None


def test_any_broker_answers_metadata_for_the_whole_cluster(cluster_factory: Callable[..., BrokerProcess]) -> None:
    brokers = [cluster_factory(b, topics="[topic=spread]\nnumPartitions=2\n") for b in (1, 2, 3)]
    expected = [P(b, p) for b in (1, 2, 3) for p in (0, 1)]
    for b in brokers:
        with connect(b.servers) as session:
            admin = session.admin()
            wait_until(lambda a=admin: sorted(a.list_topics().get("spread", [])) == expected, 10,
                       message=f"broker {b.servers} to know every broker's partitions")


def test_a_second_live_broker_with_the_same_id_refuses_to_start(cluster_factory: Callable[..., BrokerProcess]
                                                               ) -> None:
    cluster_factory(4)
    twin = cluster_factory(4, start=False, name="twin-4")
    twin.expect_exit_code(1)
    with pytest.raises(BrokerLaunchError):  # it exited instead of getting ready
        twin.start()
    assert twin.wait(30) == 1
    errors = [line for line in twin.log_lines if line.startswith("Error:")]
    assert len(errors) == 1 and "broker id 4 is already registered" in errors[0]
    assert not any("Traceback" in line for line in twin.log_lines)


def test_a_broker_that_cannot_reach_zookeeper_says_so_and_exits(tmp_path) -> None:
    config = tmp_path / "server.ini"
    config.write_text(f"[system]\nbrokerId=1\n\n[zookeeper]\nzk.zkConnect=127.0.0.1:{unused_port()}\n"
                      "zk.zkConnectionTimeoutMs=1500\n")
    result = subprocess.run([sys.executable, "-m", "metaq.broker", "-f", str(config), "--dataPath",
                             str(tmp_path / "data"), "--serverPort", "0"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "Error: cannot reach ZooKeeper at 127.0.0.1:" in result.stderr and "within 1.5s" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    # one line saying what it waits for, one saying it gave up: none of kazoo's attempts (a dozen a second)
    lines = result.stderr.splitlines()
    assert len(lines) == 2 and "connecting to ZooKeeper at 127.0.0.1:" in lines[0], result.stderr
    assert "kazoo" not in result.stderr
