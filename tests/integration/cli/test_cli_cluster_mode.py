"""The client commands on a ZooKeeper-mode cluster: --zk-connect/--zk-root (or METAQ_ZK_CONNECT and
METAQ_ZK_ROOT) instead of --servers; errors are one line."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
from cli_process import metaq

from metaq.testing import BrokerProcess

TOPIC = "[topic=t]\nnumPartitions=2\n"


def test_produce_consume_topic_and_stats_through_zookeeper(
        cluster_factory: Callable[..., BrokerProcess], zookeeper: Any, zk_root: str) -> None:
    for b in (1, 2):
        cluster_factory(b, topics=TOPIC)
    zk = ["--zk-connect", zookeeper.connect_string, "--zk-root", zk_root]
    done = metaq("produce", "t", *zk, input="".join(f"line {i}\n" for i in range(40)))
    assert done.returncode == 0, done.stderr
    assert "sent 40 messages to t" in done.stdout + done.stderr

    described = metaq("topic", "describe", "t", *zk)
    assert described.returncode == 0, described.stderr
    for name in ("1-0", "1-1", "2-0", "2-1"):
        assert name in described.stdout

    env = {**os.environ, "METAQ_ZK_CONNECT": zookeeper.connect_string, "METAQ_ZK_ROOT": zk_root}
    consumed = metaq("consume", "t", "-p", "2-1", env=env)
    assert consumed.returncode == 0, consumed.stderr
    assert len(consumed.stdout.splitlines()) == 10  # round robin: a quarter of the lines

    stats = metaq("stats", "-t", "t", "-z", zookeeper.connect_string, "--zk-root", zk_root)
    assert stats.returncode == 0, stats.stderr
    assert "# broker 1" in stats.stdout and "# broker 2" in stats.stdout


@pytest.mark.slow  # an unreachable ZooKeeper is given up after its 10 s connection timeout
def test_cluster_mode_errors_are_one_line(zookeeper: Any, zk_root: str) -> None:
    both = metaq("topic", "list", "-s", "127.0.0.1:1", "-z", zookeeper.connect_string)
    assert both.returncode == 2 and "give --servers or --zk-connect, not both" in both.stderr

    empty = metaq("topic", "list", "-z", zookeeper.connect_string, "--zk-root", zk_root + "-none")
    assert empty.returncode == 1
    assert empty.stderr.strip().count("\n") == 0 and "no metaq broker is registered" in empty.stderr

    unreachable = metaq("consume", "t", "-z", "127.0.0.1:1", timeout_s=60)
    assert unreachable.returncode == 1
    assert unreachable.stderr.strip().count("\n") == 0 and "cannot reach ZooKeeper" in unreachable.stderr


def test_a_zookeeper_root_with_an_empty_segment_is_a_one_line_error() -> None:
    # refused before anything is reached (no ZooKeeper is needed); it was a traceback
    for command in (("topic", "list"), ("cluster",), ("acl", "list")):
        done = metaq(*command, "-z", "127.0.0.1:1", "--zk-root", "/meta//x", timeout_s=60)
        assert done.returncode == 1, (command, done.stderr)
        assert done.stderr == "Error: ZooKeeper root '/meta//x' has an empty path segment\n", command
