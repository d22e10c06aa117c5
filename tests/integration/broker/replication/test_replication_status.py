"""What an operator sees of replication: `metaq cluster` (each replica group, its master, its slaves and
their lag per partition, read from each slave's Stats) and `metaq stats` against a slave (a readable
replication section; --json keeps the raw document). A real master, a real slave, real ZooKeeper.

The sequence walks the states an operator meets: a slave caught up, a slave stalled because its master
came back with less than the slave holds, and a slave whose master is gone.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cli_process import metaq

from metaq.net.blocking import BlockingConnection
from metaq.net.codec import ConnectionSettings, raise_for_error
from metaq.protocol import messages as m
from metaq.protocol.records import encode_values
from metaq.testing import BrokerProcess, wait_until

TOPIC = "orders"
TOPICS = f"[topic={TOPIC}]\nnumPartitions=2\n"
COUNTS = {0: 7, 1: 12}
"""Messages produced to each partition of broker 1."""
SETTINGS = ConnectionSettings("replication-status-test", 5.0, 30.0, 16, 64 << 20)


def broker_stats(proc: BrokerProcess) -> dict[str, Any]:
    conn = BlockingConnection.open((proc.host, proc.port), SETTINGS)
    try:
        return dict(json.loads(raise_for_error(conn.call(m.StatsRequest())).stats_json))
    finally:
        conn.close()


def produce(master: BrokerProcess, counts: dict[int, int]) -> None:
    conn = BlockingConnection.open((master.host, master.port), SETTINGS)
    try:
        for partition, n in counts.items():
            raise_for_error(conn.call(m.ProduceRequest(topic=TOPIC, partition=partition,
                                                       records=encode_values([b"x"] * n, 1_700_000_000_000))))
    finally:
        conn.close()


def replicated(slave: BrokerProcess) -> dict[str, Any]:
    return dict(broker_stats(slave)["replication"]["partitions"][TOPIC])


def cluster(zookeeper: Any, zk_root: str, *args: str) -> Any:
    result = metaq("cluster", "--zk-connect", zookeeper.connect_string, "--zk-root", zk_root, *args)
    assert result.returncode == 0, result.stderr
    return result


def test_cluster_and_stats_show_replica_groups_their_lag_a_stalled_slave_and_a_gone_master(
        cluster_factory: Callable[..., BrokerProcess], zookeeper: Any, zk_root: str) -> None:
    master = cluster_factory(1, topics=TOPICS)
    slave = cluster_factory(1, topics=TOPICS, name="broker-1-slave-0", args=["--slave", "--slave-id", "0"])
    produce(master, COUNTS)
    wait_until(lambda: {int(p): e["log_end_offset"] for p, e in replicated(slave).items()} == COUNTS
               and all(e["lag_messages"] == 0 for e in replicated(slave).values()), 30, 0.05,
               "the slave to catch up")

    # -- caught up: metaq cluster --json --------------------------------------------------------
    doc = json.loads(cluster(zookeeper, zk_root, "--json").stdout)
    assert doc["brokers"] == [{"broker_id": 1, "master": master.servers, "slaves": {"0": slave.servers}}]
    assert doc["replication"] == [{
        "broker_id": 1, "master": master.servers, "master_registered": True, "ha": None,
        "slaves": [{"slave_id": 0, "address": slave.servers, "following": master.servers, "max_lag_messages": 0,
                    "max_lag_ms": 0, "error": None,
                    "partitions": [{"topic": TOPIC, "partition": f"1-{p}", "log_end": n, "master_end": n,
                                    "lag_messages": 0, "lag_ms": 0, "stalled": "", "last_error": ""}
                                   for p, n in COUNTS.items()]}]}]
    assert doc["problems"] == []

    # -- the same as text -----------------------------------------------------------------------
    text = cluster(zookeeper, zk_root).stdout.splitlines()
    assert "1 replica group (lag as each slave last heard from its master)" in text
    assert f"  broker 1: master {master.servers}, 1 slave" in text
    assert f"    slave0 {slave.servers}: follows {master.servers}, max lag 0 messages, 0 ms" in text
    rows = [line.split() for line in text]
    assert ["topic", "partition", "slave", "end", "master", "end", "lag", "lag", "ms", "state"] in rows
    for p, n in COUNTS.items():
        assert [TOPIC, f"1-{p}", str(n), str(n), "0", "0", "caught", "up"] in rows

    # -- metaq stats against the slave ----------------------------------------------------------
    result = metaq("stats", "-s", slave.servers)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert f"# replication: slave 0 of broker 1 (async), master {master.servers}, max lag 0 messages, 0 ms" in lines
    assert "topic\tpartition\tslave_end\tmaster_end\tlag_messages\tlag_ms\tstalled" in lines
    for p, n in COUNTS.items():
        assert f"{TOPIC}\t1-{p}\t{n}\t{n}\t0\t0\tno" in lines
    raw = json.loads(metaq("stats", "-s", slave.servers, "--json").stdout)
    (slave_doc,) = raw
    assert slave_doc["replication"]["slave_id"] == 0 and slave_doc["replication"]["master"] == master.servers
    assert slave_doc["replication"]["partitions"][TOPIC]["1"]["log_end_offset"] == COUNTS[1]
    master_stats = metaq("stats", "-s", master.servers)
    assert "# replication" not in master_stats.stdout  # a master has no such section

    # -- the master comes back with less than the slave holds: the slave stalls, and says so ----
    master.stop()
    for path in Path(master.data_dir).glob(f"{TOPIC}-*/*"):
        path.unlink()
    slave.allow_log(r"replica orders-\d cannot continue")
    master.start()
    wait_until(lambda: all(e["stalled"] for e in replicated(slave).values()), 30, 0.05, "both partitions to stall")
    doc = json.loads(cluster(zookeeper, zk_root, "--json").stdout)
    (entry,) = doc["replication"][0]["slaves"]
    assert [(r["partition"], r["log_end"]) for r in entry["partitions"]] == [(f"1-{p}", n) for p, n in COUNTS.items()]
    assert all("nothing is truncated automatically" in r["stalled"] for r in entry["partitions"])
    text = cluster(zookeeper, zk_root).stdout
    assert ", 2 stalled" in text
    lines = metaq("stats", "-s", slave.servers).stdout.splitlines()
    assert any(line.startswith(f"{TOPIC}\t1-0\t{COUNTS[0]}\t") and line.endswith("\tyes") for line in lines)
    assert any(line.startswith(f"# stalled {TOPIC} 1-0: ") for line in lines)

    # -- the master is gone: the slave is still shown, with what it holds -----------------------
    master.stop()
    result = cluster(zookeeper, zk_root, "--json")
    doc = json.loads(result.stdout)
    (group,) = doc["replication"]
    assert group["master"] is None and group["master_registered"] is False
    assert [r["log_end"] for r in group["slaves"][0]["partitions"]] == list(COUNTS.values())
    assert any("broker 1 has no registered master" in p for p in doc["problems"])
    text = cluster(zookeeper, zk_root).stdout.splitlines()
    assert "  broker 1: master (none: the master is gone; its slaves serve reads only), 1 slave" in text
    assert any(line.startswith(f"    slave0 {slave.servers}: follows no master (it is gone), ") for line in text)
