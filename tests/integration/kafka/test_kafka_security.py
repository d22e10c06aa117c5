"""The Kafka listener's TLS port with SASL SCRAM-SHA-256 and ACLs, driven by confluent-kafka (librdkafka):
the same users, the same ACLs and the same checks as the binary protocol, since every Kafka request is
answered by the broker core (docs/kafka.md, docs/security.md)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_process import metaq

from metaq.testing import BrokerProcess
from metaq.testing.certs import Pki, make_pki

ck = pytest.importorskip("confluent_kafka")
pytest.importorskip("cryptography")

PASSWORDS = {"alice": "alice pw", "root": "root pw"}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def secure_broker(broker_factory: Callable[..., BrokerProcess], tmp_path: Path, pki: Pki) -> BrokerProcess:
    where = ["--data-path", str(tmp_path / "broker")]
    for user, password in PASSWORDS.items():
        done = metaq("acl", "user", "add", user, *where, env={**os.environ, "METAQ_PASSWORD": password})
        assert done.returncode == 0, done.stderr
    for args in (["--topic", "a", "-o", "produce", "-o", "consume"], ["--group", "g", "-o", "consume"]):
        done = metaq("acl", "add", "--principal", "User:alice", *args, *where)
        assert done.returncode == 0, done.stderr
    return broker_factory({"numPartitions": 1, "unflushThreshold": 0, "authRequired": True, "aclEnabled": True,
                           "superUsers": "User:root", "kafkaSslPort": 0, "sslCertFile": str(pki.server_cert),
                           "sslKeyFile": str(pki.server_key)})


def config(proc: BrokerProcess, pki: Pki, user: str, password: str | None = None, **more: Any) -> dict[str, Any]:
    assert proc.kafka_tls_port is not None, "the broker printed no Kafka TLS ready line"
    return {"bootstrap.servers": f"127.0.0.1:{proc.kafka_tls_port}", "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": user,
            "sasl.password": PASSWORDS[user] if password is None else password, "ssl.ca.location": str(pki.ca),
            **more}


def produce(conf: dict[str, Any], topic: str, values: list[bytes]) -> list[str]:
    """The delivery outcome of each message: 'ok' or the error's name."""
    producer = ck.Producer({**conf, "message.timeout.ms": 15000})
    outcomes: list[str] = []
    for v in values:
        producer.produce(topic, v, on_delivery=lambda err, _msg: outcomes.append("ok" if err is None else err.name()))
    producer.flush(30)
    return outcomes


def test_scram_over_tls_with_acls_enforced(secure_broker: BrokerProcess, pki: Pki) -> None:
    root = config(secure_broker, pki, "root")
    assert produce(root, "a", [b"by root"]) == ["ok"]
    assert produce(root, "b", [b"secret"]) == ["ok"]
    alice = config(secure_broker, pki, "alice")
    assert produce(alice, "a", [b"by alice 1", b"by alice 2"]) == ["ok", "ok"]
    assert produce(alice, "b", [b"denied"]) == ["TOPIC_AUTHORIZATION_FAILED"]
    consumer = ck.Consumer({**alice, "group.id": "g", "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe(["a"])
    got: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(got) < 3 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None:
            assert msg.error() is None, msg.error()
            got.append(msg.value())
    consumer.commit(asynchronous=False)
    consumer.close()
    assert got == [b"by root", b"by alice 1", b"by alice 2"]
    # reading b: refused, never served
    reader = ck.Consumer({**alice, "group.id": "g", "auto.offset.reset": "earliest"})
    reader.subscribe(["b"])
    errors = []
    deadline = time.monotonic() + 30
    while not errors and time.monotonic() < deadline:
        msg = reader.poll(0.5)
        if msg is not None:
            assert msg.error() is not None, f"alice read {msg.value()!r} from b"
            errors.append(msg.error().name())
    reader.close()
    assert errors == ["TOPIC_AUTHORIZATION_FAILED"]


def test_a_wrong_password_is_refused(secure_broker: BrokerProcess, pki: Pki) -> None:
    errors: list[str] = []
    producer = ck.Producer(config(secure_broker, pki, "alice", password="not it",
                                  error_cb=lambda err: errors.append(err.name())))
    deadline = time.monotonic() + 30
    while "_AUTHENTICATION" not in errors and time.monotonic() < deadline:
        producer.poll(0.2)
    del producer
    assert "_AUTHENTICATION" in errors


QUOTA = 50_000
"""Produce bytes per second (quotaProducerByteRate) of the quota test."""


def test_a_kafka_producer_over_its_quota_is_slowed_to_about_it_and_loses_nothing(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 1, "unflushThreshold": 0, "quotaProducerByteRate": QUOTA,
                             "kafkaPort": 0})
    bs = f"127.0.0.1:{broker.kafka_port}"
    producer = ck.Producer({"bootstrap.servers": bs, "linger.ms": 5, "batch.size": 16_384})
    acked: list[bytes] = []
    purged: set[bytes] = set()  # failed (purged below): those that were in flight may be stored all the same
    payload = b"p" * 1000
    marks: list[tuple[float, int]] = []
    start = time.monotonic()
    n = 0
    while time.monotonic() - start < 10.0:  # offer far more than the quota, as fast as the client goes
        try:
            producer.produce("quota", b"%08d" % n + payload,
                             on_delivery=lambda err, msg: (purged.add if err else acked.append)(msg.value()))
            n += 1
        except BufferError:
            producer.poll(0.01)
        producer.poll(0)
        marks.append((time.monotonic() - start, len(acked)))
    producer.purge()  # what is still queued would take minutes at the quota: not sent
    producer.flush(30)
    # the rate is judged from 4 s to 10 s, after the first second's burst: neither above the quota nor starved
    # (the requests the client pipelined are served in order, each when the principal's debt is paid)
    at4 = next(count for t, count in marks if t >= 4.0)
    at10 = marks[-1][1]
    rate = (at10 - at4) * 1008 / (marks[-1][0] - 4.0)
    assert QUOTA / 3 < rate < 3 * QUOTA, f"{rate:.0f} B/s acknowledged with a quota of {QUOTA} B/s"
    consumer = ck.Consumer({"bootstrap.servers": bs, "group.id": "q", "auto.offset.reset": "earliest"})
    consumer.assign([ck.TopicPartition("quota", 0, 0)])
    read: list[bytes] = []
    acked_set = set(acked)
    unread = set(acked)
    deadline = time.monotonic() + 60
    while unread and time.monotonic() < deadline:  # (purged sends already read by the broker are still stored
        msg = consumer.poll(0.5)                    # at the quota's pace: they are not waited for)
        if msg is not None and msg.error() is None:
            read.append(msg.value())
            unread.discard(msg.value())
    consumer.close()
    assert len(set(read)) == len(read), "a message read twice"
    assert [v for v in read if v in acked_set] == acked, "every acked message is read back, in order"
    assert {v for v in read if v not in acked_set} <= purged, "read back although never sent"
