"""`metaq bench` against a cluster: a running 3-broker ZooKeeper-mode cluster found through --zk (real
ZooKeeper, real broker processes), and a cluster the bench starts itself (--brokers) and stops after."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from typing import Any

from cli_process import metaq

from metaq.client import connect
from metaq.testing import BrokerProcess


def test_bench_over_a_running_cluster_found_in_zookeeper(cluster_factory: Callable[..., BrokerProcess],
                                                         zookeeper: Any, zk_root: str) -> None:
    brokers = [cluster_factory(b) for b in (1, 2, 3)]
    zk = ["--zk", zookeeper.connect_string, "--zk-root", zk_root]
    produced = metaq("bench", "produce", *zk, "-n", "30000", "--partitions", "2", "--batch", "500", "--json",
                     timeout_s=180)
    assert produced.returncode == 0, produced.stderr
    result = json.loads(produced.stdout)
    assert (result["messages"], result["failures"]) == (30_000, 0)
    assert result["broker"] == ",".join(b.servers for b in brokers)
    with connect(brokers[0].servers) as session:
        stored = {d.partition.id: d.latest for d in session.admin().describe_topic(result["spec"]["topic"]).partitions}
    assert {(p.broker_id, p.partition) for p in stored} == {(b, p) for b in (1, 2, 3) for p in (0, 1)}
    assert sum(stored.values()) == 30_001 and min(stored.values()) > 0  # and the warm-up message

    consumed = metaq("bench", "consume", *zk, "-n", "20000", "--partitions", "2", "--processes", "2", "--json",
                     timeout_s=180)
    assert consumed.returncode == 0, consumed.stderr
    result = json.loads(consumed.stdout)
    assert result["messages"] == 20_001, "every message of the six partitions, read from their own brokers"


def test_bench_starts_a_cluster_of_its_own_and_stops_it() -> None:
    produced = metaq("bench", "produce", "--brokers", "2", "-n", "20000", "--partitions", "1", "--json",
                     timeout_s=180)
    assert produced.returncode == 0, produced.stderr
    result = json.loads(produced.stdout)
    assert (result["messages"], result["failures"], result["spec"]["brokers"]) == (20_000, 0, 2)
    servers = result["broker"].split(",")
    assert len(servers) == 2
    for server in servers:  # stopped with the run
        host, port = server.rsplit(":", 1)
        with socket.socket() as probe:
            assert probe.connect_ex((host, int(port))) != 0, f"{server} still accepts connections"


def test_servers_brokers_and_zk_exclude_each_other() -> None:
    result = metaq("bench", "produce", "--brokers", "2", "--zk", "127.0.0.1:1")
    assert result.returncode == 2 and "give at most one of --servers, --brokers and --zk" in result.stderr
