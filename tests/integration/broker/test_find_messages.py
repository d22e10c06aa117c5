"""Find messages by key and time range (FindMessages, docs/storage.md#key-index) against a real broker:
the Python admin API, `metaq admin find` and GET /topics/{topic}/find, before and after a kill -9."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from http_client import check_reply, request

from metaq.client import connect
from metaq.testing.broker import BrokerProcess
from metaq.types import Message, PartitionId

T0 = 1_700_000_000_000
KEYS = 9


Sent = tuple[PartitionId, int, bytes | None, int, int]
"""(partition, offset, key, timestamp, message id)"""


def produce(broker: BrokerProcess, topic: str, start: int, count: int) -> list[Sent]:
    """Messages start..start+count-1 to partitions 0 and 1 alternately in batches of 10: message i has
    key ``k<i % KEYS>`` (every 5th none) and timestamp T0 + i."""
    sent = []
    with connect(broker.servers) as session:
        producer = session.create_producer()
        for b in range(start, start + count, 10):
            msgs = [Message(topic, b"value %d" % i, key=None if i % 5 == 4 else b"k%d" % (i % KEYS),
                            timestamp_ms=T0 + i) for i in range(b, min(b + 10, start + count))]
            result = producer.send_batch(topic, msgs, partition=(b // 10) % 2)
            assert result.success
            for r, msg in zip(result, msgs, strict=True):
                sent.append((r.partition_id, r.offset, msg.key, msg.timestamp_ms, r.message_id))
    return sent


def found(result: Any) -> list[Sent]:
    return [(f.partition_id, f.offset, f.key, f.timestamp_ms, f.message_id) for f in result.messages]


def expect(sent: list[Any], key: bytes | None = None, lo: int = -1, hi: int = -1) -> list[Any]:
    rows = [s for s in sent if (key is None or s[2] == key) and (lo < 0 or s[3] >= lo) and (hi < 0 or s[3] <= hi)]
    return sorted(rows, key=lambda s: (s[0].broker_id, s[0].partition, s[1]))


def test_find_by_key_and_time_survives_kill_and_restart(broker_factory) -> None:
    broker = broker_factory({"numPartitions": 2, "unflushThreshold": 0, "maxSegmentSize": 4096, "httpPort": 0})
    with connect(broker.servers) as session:
        session.admin().create_topic("orders", 2)
    sent = produce(broker, "orders", 0, 600)
    with connect(broker.servers) as session:
        admin = session.admin()
        assert found(admin.find("orders", key=b"k3", limit=10_000)) == expect(sent, b"k3")  # builds the indexes
    sent += produce(broker, "orders", 600, 200)  # past what the key indexes cover
    segments = list((broker.data_dir / "orders-0").glob("*.log"))
    assert len(segments) > 3 and list((broker.data_dir / "orders-0").glob("*.keyindex"))
    broker.kill()
    broker.start()
    with connect(broker.servers) as session:
        admin = session.admin()
        for key in (b"k0", b"k3", b"k8"):
            result = admin.find("orders", key=key, limit=10_000)
            assert found(result) == expect(sent, key) and not result.truncated and not result.problems
        assert found(admin.find("orders", key="nope")) == []
        in_range = admin.find("orders", from_ms=T0 + 250, to_ms=T0 + 649, limit=10_000)
        assert found(in_range) == expect(sent, None, T0 + 250, T0 + 649) and len(in_range.messages) == 400
        both = admin.find("orders", key=b"k2", from_ms=T0 + 100, to_ms=T0 + 700, limit=10_000)
        assert found(both) == expect(sent, b"k2", T0 + 100, T0 + 700)
        limited = admin.find("orders", key=b"k1", limit=5)
        assert found(limited) == expect(sent, b"k1")[:5] and limited.truncated
        one = admin.find("orders", key=b"k1", partition=1, limit=10_000)
        assert found(one) == [s for s in expect(sent, b"k1") if s[0].partition == 1]

    cli = subprocess.run([sys.executable, "-m", "metaq.cli.main", "admin", "find", "-s", broker.servers,
                          "--topic", "orders", "--key", "k4", "--from", "2023-11-14T22:13:20.100", "--to",
                          str(T0 + 500), "-n", "1000", "--json"], capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    doc = json.loads(cli.stdout)
    assert [(m["partition"], m["offset"]) for m in doc["messages"]] == \
        [(str(s[0]), s[1]) for s in expect(sent, b"k4", T0 + 100, T0 + 500)]
    text = subprocess.run([sys.executable, "-m", "metaq.cli.main", "admin", "find", "-s", broker.servers,
                           "--topic", "orders", "--key", "k4", "-n", "3"], capture_output=True, text=True, timeout=60)
    assert text.returncode == 0 and len(text.stdout.splitlines()) == 3 and "more match" in text.stderr
    bad = subprocess.run([sys.executable, "-m", "metaq.cli.main", "admin", "find", "-s", broker.servers,
                          "--topic", "orders", "--from", "yesterday"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "ISO 8601" in bad.stderr

    base = broker.http_url
    assert base is not None
    openapi = request(base, "GET", "/openapi.json").json
    reply = request(base, "GET", f"/topics/orders/find?key=k5&from={T0 + 200}&limit=10000")
    assert reply.status == 200, reply
    check_reply(openapi, "GET", "/topics/{topic}/find", reply)
    assert [(m["partition_id"], m["offset"]) for m in reply.json["messages"]] == \
        [(str(s[0]), s[1]) for s in expect(sent, b"k5", T0 + 200)]
    for query, status in (("", 400), ("?key=k1&limit=0", 400), ("?from=x", 400), ("?from=5&to=4", 400),
                          ("?key=k1&partition=9", 404)):
        reply = request(base, "GET", f"/topics/orders/find{query}")
        assert reply.status == status, (query, reply)
        assert "error" in reply.json or "message" in reply.json
    assert request(base, "GET", "/topics/no-such/find?key=a").status == 404


def test_admin_find_asks_every_broker_holding_the_topic(two_brokers) -> None:
    b1, b2 = two_brokers
    servers = f"{b1.servers},{b2.servers}"
    sent = []
    with connect(servers) as session:
        for broker_id in (1, 2):
            session.admin().create_topic("spread", 2, broker_id=broker_id)
        producer = session.create_producer()
        for i in range(40):
            target = PartitionId(1 + i % 2, (i // 2) % 2)
            result = producer.send_batch("spread", [Message("spread", b"v%d" % i, key=b"k%d" % (i % 3),
                                                            timestamp_ms=T0 + i)], partition=target)
            assert result.success, result
            [r] = list(result)
            sent.append((r.partition_id, r.offset, b"k%d" % (i % 3), T0 + i, r.message_id))
        admin = session.admin()
        assert found(admin.find("spread", key=b"k1", limit=1000)) == expect(sent, b"k1")
        assert {f.broker_id for f in admin.find("spread", key=b"k1").messages} == {1, 2}
        assert found(admin.find("spread", from_ms=T0 + 10, to_ms=T0 + 19)) == expect(sent, None, T0 + 10, T0 + 19)
        one = admin.find("spread", key=b"k2", partition=PartitionId(2, 1), limit=1000)
        assert found(one) == [s for s in expect(sent, b"k2") if s[0] == PartitionId(2, 1)]
