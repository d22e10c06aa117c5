"""A confluent-kafka idempotent producer through a master kill -9 (sync replication, automatic failover;
docs/kafka.md, docs/replication.md): the Kafka listener of every replica sends clients to the master of the
broker id, the NOT_LEADER_OR_FOLLOWER after the failover makes the producer follow the new master, and
its retried batches are recognised by the producer ids and sequences the replicas share. Checked on the
history: every acknowledged message is read back at its acknowledged offset, in send order per partition,
and nothing is read twice or that was never sent."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from test_replication_ha import TOPIC, Replicas, group_state, wait_isr

from metaq.testing import BrokerProcess, wait_until

ck = pytest.importorskip("confluent_kafka")
MESSAGES = 6000


def test_an_idempotent_kafka_producer_through_a_master_kill_loses_nothing_acked(
        cluster_factory: Callable[..., BrokerProcess], zk_client: Any, zk_root: str) -> None:
    # three replicas: after the kill the new master still has an in-sync slave (minInSyncSlaves=1)
    replicas = Replicas(cluster_factory, 3, inSyncMaxLagMs=5000, kafkaPort=0)
    wait_isr(zk_client, zk_root, {1, 2})
    bootstrap = ",".join(f"127.0.0.1:{p.kafka_port}" for p in replicas.procs.values())
    producer = ck.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                            "linger.ms": 2, "message.timeout.ms": 60_000, "topic.metadata.refresh.interval.ms": 1000})
    # every replica is a node of the cluster (the slaves lead nothing): when the master dies the client still
    # knows nodes to ask who leads now (librdkafka forgets its bootstrap servers once it has the node list)
    nodes = producer.list_topics(timeout=20).brokers
    assert sorted(f"127.0.0.1:{b.port}" for b in nodes.values()) == sorted(bootstrap.split(","))
    assert 1 in nodes
    acked: dict[int, list[tuple[int, int]]] = {}
    failed: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            failed.append(err.name())
        else:
            acked.setdefault(msg.partition(), []).append((msg.offset(), int(msg.value())))

    state = group_state(zk_client, zk_root)
    assert state is not None
    old = state["master"]

    def send(first: int, count: int) -> None:
        for i in range(first, first + count):
            producer.produce(TOPIC, value=str(i).encode(), key=str(i % 7).encode(), on_delivery=delivered)
            producer.poll(0)
            if i % 50 == 0:
                time.sleep(0.005)  # spread over the failover, not all queued at once

    send(0, MESSAGES // 3)
    deadline = time.monotonic() + 30
    while sum(len(v) for v in acked.values()) < MESSAGES // 6 and time.monotonic() < deadline:
        producer.poll(0.05)
    replicas.procs[old].kill()  # kill -9 with batches in flight
    send(MESSAGES // 3, MESSAGES - MESSAGES // 3)
    assert producer.flush(90) == 0
    new = group_state(zk_client, zk_root)
    assert new is not None and new["master"] != old
    assert not failed, failed[:5]
    # read everything back through the new master's Kafka listener
    survivor = replicas.procs[new["master"]]
    consumer = ck.Consumer({"bootstrap.servers": f"127.0.0.1:{survivor.kafka_port}", "group.id": "check",
                            "enable.auto.commit": False})
    ends = {p: consumer.get_watermark_offsets(ck.TopicPartition(TOPIC, p), timeout=20)[1] for p in acked}
    consumer.assign([ck.TopicPartition(TOPIC, p, 0) for p in acked])
    read: dict[int, list[tuple[int, int]]] = {p: [] for p in acked}
    wait_until(lambda: _drain(consumer, read) and all(len(read[p]) >= ends[p] for p in acked), 60, 0.01,
               "every message to be read back")
    consumer.close()
    for p, history in acked.items():
        stored = dict(read[p])
        assert len(stored) == len(read[p]), f"partition {p}: an offset read twice"
        for offset, value in history:
            assert stored.get(offset) == value, f"partition {p}: acked {value} at {offset}, read {stored.get(offset)}"
        values = [v for _o, v in sorted(read[p])]
        assert values == sorted(values), f"partition {p}: not in send order"
        assert len(set(values)) == len(values), f"partition {p}: a message stored twice"
    assert {v for vs in read.values() for _o, v in vs} == set(range(MESSAGES))


def _drain(consumer: Any, read: dict[int, list[tuple[int, int]]]) -> bool:
    for msg in consumer.consume(1000, 0.2):
        if msg.error() is None:
            read[msg.partition()].append((msg.offset(), int(msg.value())))
    return True
