"""ZooKeeper trouble, seen from the brokers (real ZooKeeper, real broker processes):

* a broker paused (SIGSTOP) longer than its session timeout loses its session and its ephemeral nodes;
  resumed, it registers again on a new session by itself and serves as before;
* ZooKeeper stopped and started again under load: the brokers keep serving produce and fetch while it is
  down, nothing acknowledged is lost, and the registrations are there once it is back.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException

from metaq.client import connect
from metaq.testing import BrokerProcess, wait_until
from metaq.testing.zookeeper import ZooKeeperServer, cluster_config, unique_root

pytestmark = pytest.mark.slow


def owner_of(zk: Any, path: str) -> int:
    """The session owning an ephemeral node (0 if the node is missing or ZooKeeper is unreachable)."""
    try:
        stat = zk.exists(path)
    except KazooException:
        return 0
    return int(stat.ephemeralOwner) if stat is not None else 0


def test_a_paused_broker_loses_its_session_and_registers_again_when_resumed(
        cluster_factory: Callable[..., BrokerProcess], zk_client: Any, zk_root: str) -> None:
    b1 = cluster_factory(1, zk_session_timeout_ms=2000, topics="[topic=t]\nnumPartitions=2\n")
    b2 = cluster_factory(2, zk_session_timeout_ms=2000, topics="[topic=t]\nnumPartitions=2\n")
    path = f"{zk_root}/brokers/ids/2/master"
    first_session = owner_of(zk_client, path)
    assert first_session
    b2.signal(signal.SIGSTOP)
    try:
        wait_until(lambda: owner_of(zk_client, path) == 0, 30, message="the paused broker's session to expire")
        assert zk_client.exists(f"{zk_root}/brokers/topics-pub/t/2-m") is None
    finally:
        b2.signal(signal.SIGCONT)
    wait_until(lambda: owner_of(zk_client, path) not in (0, first_session)
               and owner_of(zk_client, f"{zk_root}/brokers/topics-pub/t/2-m") == owner_of(zk_client, path), 30,
               message="the resumed broker to register again on a new session")
    with connect(f"{b1.servers},{b2.servers}") as session:
        result = session.create_producer().send_batch("t", [b"after"], partition="2-1")
        assert result.success
        got = session.create_pull_consumer().get("t", "2-1", result[0].offset)
        assert [bytes(m.data) for m in got] == [b"after"]
    assert any("session expired" in line for line in b2.log_lines)


def test_zookeeper_restarted_under_load_loses_nothing(tmp_path: Path,
                                                      broker_factory: Callable[..., BrokerProcess]) -> None:
    with ZooKeeperServer(tmp_path / "zk") as zk:
        root = unique_root()
        brokers = [broker_factory(config_text=cluster_config(b, zk.connect_string, root, 10_000, {},
                                                             "[topic=load]\nnumPartitions=2\n"), name=f"b{b}")
                   for b in (1, 2)]
        servers = ",".join(b.servers for b in brokers)
        acked: dict[tuple[str, int], bytes] = {}
        stop = threading.Event()
        failures: list[BaseException] = []

        def produce() -> None:
            n = 0
            with connect(servers, request_timeout_s=10) as session:
                producer = session.create_producer()
                while not stop.is_set() and n < 200_000:
                    payloads = [b"m%08d" % (n + i) for i in range(100)]
                    n += 100
                    result = producer.send_batch("load", payloads)
                    for r, data in zip(result, payloads, strict=True):
                        if r.success:
                            acked[(str(r.partition_id), r.offset)] = data
                        else:
                            failures.append(r.error)

        loader = threading.Thread(target=produce)
        loader.start()
        try:
            wait_until(lambda: len(acked) > 2000, 30, message="load before the ZooKeeper stop")
            zk.stop()
            before = len(acked)
            wait_until(lambda: len(acked) > before + 2000, 30, message="the brokers to keep serving without ZooKeeper")
            zk.start()
            probe = KazooClient(hosts=zk.connect_string)
            probe.start(30)
            try:
                wait_until(lambda: all(owner_of(probe, f"{root}/brokers/ids/{b}/master") for b in (1, 2)), 60,
                           message="both brokers registered once ZooKeeper is back")
            finally:
                probe.stop()
                probe.close()
            before = len(acked)
            wait_until(lambda: len(acked) > before + 2000, 30, message="load after the restart")
        finally:
            stop.set()
            loader.join(60)
        assert not failures, f"sends failed while ZooKeeper was away: {failures[:3]}"
        with connect(servers) as session:
            consumer = session.create_pull_consumer()
            stored = {}
            for partition in ("1-0", "1-1", "2-0", "2-1"):
                for m in consumer.iterate("load", partition, 0, stop_at_end=True, max_wait_ms=0):
                    stored[(partition, m.offset)] = bytes(m.data)
        missing = [k for k, v in acked.items() if stored.get(k) != v]
        assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {missing[:3]}"
