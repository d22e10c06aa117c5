"""Operating a broker: close/open partitions, live reload, stats, dynamic topics, the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable

import pytest
from cli_process import metaq

from metaq.client import Message, connect
from metaq.errors import PartitionClosedError, TopicExistsError
from metaq.testing import BrokerProcess, wait_until


def test_closed_partition_refuses_publishing_until_opened(broker: BrokerProcess) -> None:
    with connect(broker.servers) as session:
        admin = session.admin()
        admin.create_topic("pay", 2)
        admin.close_partition("pay", 1)
        producer = session.create_producer()
        refused = producer.send_batch("pay", [b"a"], partition=1)
        assert not refused.success and isinstance(refused.errors[0], PartitionClosedError)
        assert producer.send_batch("pay", [b"b"], partition=0).success
        admin.open_partition("pay", 1)
        assert producer.send_batch("pay", [b"c"], partition=1).success


@pytest.mark.parametrize(("where", "change"), [
    ("file", "server.ini's [topic=audit] section sets acceptPublish=false: set it to true, then reload the broker"),
    ("flag", "the broker was started with --acceptPublish false: restart it without the flag"),
])
def test_an_accept_publish_false_topic_is_not_opened_by_topic_open_and_its_refusal_says_what_to_change(
        broker_factory: Callable[..., BrokerProcess], where: str, change: str) -> None:
    if where == "file":
        broker = broker_factory(config_text="[system]\nnumPartitions=2\n\n[topic=audit]\nacceptPublish=false\n")
    else:
        broker = broker_factory({"numPartitions": 2, "acceptPublish": False})
        with connect(broker.servers) as session:
            session.admin().create_topic("audit", 2)
    opened = metaq("topic", "open", "audit", "-s", broker.servers)
    assert opened.returncode == 1 and opened.stdout == "", opened.stdout
    assert change in opened.stderr and "nothing was changed" in opened.stderr, opened.stderr

    produced = metaq("produce", "audit", "-s", broker.servers, input="x\n")
    assert produced.returncode == 1 and change in produced.stderr, produced.stderr
    assert "topic open" not in produced.stderr  # it cannot help here
    with connect(broker.servers) as session:
        result = session.create_producer().send(Message("audit", b"x"))
        assert isinstance(result.error, PartitionClosedError) and change in str(result.error)
        # partitions closed with `metaq topic close` are still the ones `metaq topic open` reopens
        if where == "file":
            session.admin().create_topic("other", 1)
            session.admin().close_partition("other", -1)
            closed = session.create_producer().send(Message("other", b"x"))
            assert isinstance(closed.error, PartitionClosedError) and "metaq topic open" in str(closed.error)


def test_sighup_reload_applies_topic_sections_live(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory(config_text="[system]\nnumPartitions=1\n\n[topic=audit]\nacceptPublish=true\n")
    with connect(broker.servers) as session:
        producer = session.create_producer()
        assert producer.send(Message("audit", b"before")).success
        broker.config_path.write_text("[system]\nnumPartitions=1\n\n[topic=audit]\nacceptPublish=false\n")
        broker.signal(signal.SIGHUP)

        def refused() -> bool:
            r = producer.send(Message("audit", b"after"))
            return not r.success and isinstance(r.error, PartitionClosedError)

        wait_until(refused, message="acceptPublish=false to take effect after SIGHUP")
        broker.config_path.write_text("[system]\nnumPartitions=1\n\n[topic=audit]\nacceptPublish=true\n")
        assert session.admin().reload() == ["audit"]
        assert producer.send(Message("audit", b"again")).success


def test_stats_count_puts_and_gets_per_partition(broker: BrokerProcess) -> None:
    with connect(broker.servers) as session:
        session.admin().create_topic("st", 1)
        session.create_producer().send_batch("st", [b"x" * 10] * 50)
        session.create_pull_consumer().get("st", 0, 0)
        doc = session.admin().stats("st")
    part = doc["topics"]["st"]["partitions"]["0"]
    assert part["put_messages"] == 50 and part["get_requests"] >= 1 and part["log_end_offset"] == 50
    with connect(broker.servers) as session, pytest.raises(TopicExistsError):
        session.admin().create_topic("st", 1)


def _metaq(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "metaq.cli.main", *args], input=stdin, capture_output=True,
                          timeout=60, env={**os.environ, "METAQ_SERVERS": ""})


def test_cli_produce_consume_describe_and_exit_codes(broker: BrokerProcess) -> None:
    s = ["-s", broker.servers]
    assert _metaq("topic", "create", "cli", "-p", "2", *s).returncode == 0
    produced = _metaq("produce", "cli", "-p", "1", "--attribute", "a1", *s, stdin=b"one\ntwo\nthree\n")
    assert produced.returncode == 0, produced.stderr
    consumed = _metaq("consume", "cli", "-p", "1", "--format", "json", *s)
    assert consumed.returncode == 0, consumed.stderr
    rows = [json.loads(line) for line in consumed.stdout.splitlines()]
    assert [(r["value"], r["partition"], r["offset"], r["attribute"]) for r in rows] == [
        ("one", "0-1", 0, "a1"), ("two", "0-1", 1, "a1"), ("three", "0-1", 2, "a1")]
    described = json.loads(_metaq("topic", "describe", "cli", "--json", *s).stdout)
    assert [(p["partition"], p["latest"]) for p in described["partitions"]] == [("0-0", 0), ("0-1", 3)]
    limited = _metaq("consume", "cli", "--max", "2", *s)
    assert limited.stdout.splitlines() == [b"one", b"two"]
    # errors: 1 for a failed operation with a message, 2 for bad usage
    missing = _metaq("topic", "describe", "no-such-topic", *s)
    assert missing.returncode == 1 and b"no-such-topic" in missing.stderr
    assert _metaq("consume", "cli", "--offset", "soon", *s).returncode == 2
    assert _metaq("topic", "frobnicate").returncode == 2


def test_a_thousand_connections_held_at_once(broker: BrokerProcess) -> None:
    import socket

    from metaq.protocol import messages as m
    from metaq.protocol.codec import NEED_DATA, ClientConnection

    socks = []
    try:
        for _ in range(1000):
            socks.append(socket.create_connection((broker.host, broker.port), timeout=30))
        codecs = [ClientConnection() for _ in socks]
        for sock, codec in zip(socks, codecs, strict=True):
            sock.sendall(codec.send(m.ApiVersionsRequest())[1])
        answered = 0
        for sock, codec in zip(socks, codecs, strict=True):
            while (event := codec.next_event()) is NEED_DATA:
                codec.receive_data(sock.recv(65536))
            answered += event.response.error_code == 0  # type: ignore[union-attr]
        assert answered == 1000
        with connect(broker.servers) as session:
            assert session.admin().stats()["connections"] >= 1000
    finally:
        for sock in socks:
            sock.close()


def test_retention_runs_on_each_topics_own_delete_when(broker_factory: Callable[..., BrokerProcess]) -> None:
    config = ("[system]\nnumPartitions=1\nmaxSegmentSize=4096\ndeletePolicy=delete,1s\n\n"
              "[topic=short]\ndeleteWhen=* * * * * ?\n\n"   # every second, this topic only
              "[topic=kept]\n")                              # [system]'s deleteWhen: 06:00 and 18:00
    broker = broker_factory(config_text=config)
    with connect(broker.servers) as session:
        producer = session.create_producer()
        for topic in ("short", "kept"):
            for _ in range(20):  # 20 batches of ~1 KiB: several 4 KiB segments
                assert producer.send_batch(topic, [b"x" * 100] * 8).success
        consumer = session.create_pull_consumer()
        wait_until(lambda: consumer.offsets("short", 0)[0] > 0, timeout_s=30,
                   message="old segments of 'short' to be deleted by its per-topic deleteWhen")
        assert consumer.offsets("kept", 0)[0] == 0
