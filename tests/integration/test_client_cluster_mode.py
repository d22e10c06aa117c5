"""A session in cluster mode (``zk_connect``): brokers, topics and partitions come from ZooKeeper,
and what ZooKeeper reports (a broker joining or leaving) reaches the session's metadata at once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from metaq.client import Message, connect
from metaq.errors import ConfigError, ConnectionClosedError
from metaq.testing import BrokerProcess, wait_until
from metaq.types import PartitionId as P


def test_session_reads_the_cluster_from_zookeeper_and_follows_it(
        cluster_factory: Callable[..., BrokerProcess], zookeeper: Any, zk_root: str) -> None:
    topics = "[topic=orders]\nnumPartitions=2\n"
    b1 = cluster_factory(1, topics=topics)
    b2 = cluster_factory(2, topics=topics)
    with connect(zk_connect=zookeeper.connect_string, zk_root=zk_root) as session:
        assert [str(p) for p in session.partitions("orders")] == ["1-0", "1-1", "2-0", "2-1"]
        producer = session.create_producer()
        results = [producer.send(Message("orders", b"m%d" % i)) for i in range(8)]
        assert sorted({r.partition_id for r in results}) == [P(1, 0), P(1, 1), P(2, 0), P(2, 1)]

        def brokers_used() -> set[int]:
            return {producer.send(Message("orders", b"x")).broker_id for _ in range(6)}

        # The cached metadata is 30 s fresh (metadata_max_age_s): only the watch brings these changes sooner.
        b3 = cluster_factory(3, topics=topics)
        wait_until(lambda: brokers_used() == {1, 2, 3}, 10, message="the joining broker's partitions are produced to")
        b2.stop()
        wait_until(lambda: brokers_used() == {1, 3}, 10, message="the stopped broker is left out")
        assert all(b.proc is not None and b.proc.poll() is None for b in (b1, b3))


def test_cluster_mode_refusals_are_clear(zookeeper: Any, zk_root: str) -> None:
    with pytest.raises(ConfigError, match="not both"):
        connect("127.0.0.1:1", zk_connect=zookeeper.connect_string)
    with pytest.raises(ConnectionClosedError, match="no metaq broker is registered"):
        connect(zk_connect=zookeeper.connect_string, zk_root=zk_root + "-empty", zk_connection_timeout_ms=5000)
