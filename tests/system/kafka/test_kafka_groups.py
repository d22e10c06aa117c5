"""Kafka consumer groups through the Kafka listener (docs/kafka.md), with real client processes: three
members of a group, one killed with kill -9 and a fourth added while messages keep coming. Checked on
the history: every message produced (and acknowledged) is consumed, in offset order per partition within
each member's run; duplicates only where a member died or a rebalance moved a partition between a record
and its commit (at-least-once, as Kafka's semantics allow)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from metaq.client.blocking import BlockingClient
from metaq.protocol import messages as m
from metaq.testing import BrokerProcess

ck = pytest.importorskip("confluent_kafka")
WORKER = Path(__file__).with_name("kafka_group_worker.py")
PARTITIONS = 6
ROUND = 1500


def produce(bs: str, topic: str, start: int, count: int) -> None:
    producer = ck.Producer({"bootstrap.servers": bs, "enable.idempotence": True, "compression.type": "lz4",
                            "linger.ms": 5})
    failed: list[str] = []
    for i in range(start, start + count):
        producer.produce(topic, value=str(i).encode(), key=str(i).encode(),
                         on_delivery=lambda err, _m: failed.append(str(err)) if err else None)
    assert producer.flush(60) == 0
    assert not failed, failed


def records(out: Path) -> list[tuple[int, int, int]]:
    if not out.exists():
        return []
    lines = out.read_text().splitlines()
    complete = lines if out.read_text().endswith("\n") else lines[:-1]
    return [(int(p), int(o), int(v)) for p, o, v in (line.split() for line in complete)]


def members(broker: BrokerProcess, group: str) -> int:
    """Members of the group's current generation, when it is stable (else -1), as the core tells."""
    with BlockingClient(broker.servers) as client:
        [d] = client.request_many([m.DescribeGroupRequest(group)], check=False)
    return len(d.members) if d.error_code == 0 and d.state == "Stable" else -1


def wait_for(predicate: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
@pytest.mark.parametrize("lib", ["confluent", "kafka-python", "aiokafka"])
def test_a_group_of_three_processes_one_killed_one_added(broker_factory: object, tmp_path: Path, lib: str) -> None:
    if lib != "confluent":
        pytest.importorskip({"kafka-python": "kafka"}.get(lib, lib))
    broker: BrokerProcess = broker_factory({"kafkaPort": 0, "numPartitions": PARTITIONS,  # type: ignore[operator]
                                            "unflushThreshold": 0})
    bs = f"127.0.0.1:{broker.kafka_port}"
    topic, group = "orders", f"group-{lib}"
    produce(bs, topic, 0, ROUND)
    outs = [tmp_path / f"member{i}.txt" for i in range(4)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = [subprocess.Popen([sys.executable, str(WORKER), lib, bs, topic, group, str(out)], env=env)
             for out in outs[:3]]
    try:
        wait_for(lambda: members(broker, group) == 3, 90, "three members in a stable group")
        produce(bs, topic, ROUND, ROUND)
        wait_for(lambda: all(records(out) for out in outs[:3]), 90, "each of three members to consume")
        procs[0].send_signal(signal.SIGKILL)  # kill -9: no leave, no commit; its session times out
        procs[0].wait(10)
        produce(bs, topic, 2 * ROUND, ROUND)
        wait_for(lambda: members(broker, group) == 2, 90, "the killed member to be dropped")
        procs.append(subprocess.Popen([sys.executable, str(WORKER), lib, bs, topic, group, str(outs[3])], env=env))
        wait_for(lambda: members(broker, group) == 3, 90, "the added member in a stable group")
        produce(bs, topic, 3 * ROUND, ROUND)
        expected = set(range(4 * ROUND))
        wait_for(lambda: expected <= {v for out in outs for _p, _o, v in records(out)}, 120,
                 "every message to be consumed")
        assert records(outs[3]), "the added member consumed nothing"
    finally:
        for proc in procs[1:]:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    history = [records(out) for out in outs]
    seen = [v for h in history for _p, _o, v in h]
    assert set(seen) == set(range(4 * ROUND)), "a message was lost or one never produced appeared"
    duplicates = len(seen) - len(set(seen))
    assert duplicates <= 2 * ROUND, f"{duplicates} duplicates"
    positions: dict[tuple[int, int], int] = {}
    for h in history:
        last: dict[int, int] = {}
        for p, o, v in h:
            assert o > last.get(p, -1), f"partition {p}: offset {o} after {last.get(p)} within one member"
            last[p] = o
            assert positions.setdefault((p, o), v) == v, f"offset {p}-{o} delivered two different messages"
    # committed offsets: the group's position covers everything (the surviving members committed last)
    consumer = ck.Consumer({"bootstrap.servers": bs, "group.id": group})
    committed = consumer.committed([ck.TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=30)
    consumer.close()
    ends = {p: max(o for (pp, o) in positions if pp == p) + 1 for p in range(PARTITIONS)}
    assert {tp.partition: tp.offset for tp in committed} == ends
