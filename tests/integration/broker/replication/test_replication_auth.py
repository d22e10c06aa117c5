"""Replicas proven (issue 39, hole 2, and the slave stuck behind ``sslClientAuth=want``).

A Fetch with ``replica_id >= 0`` is a slave copying its master: it is not counted against a quota, and in HA
mode it is what the in-sync set and the high watermark are made of. Before, anyone could send one: bob read
far past his fetch quota, and a forged replica fetch could keep a dead slave "in sync" (acks then count a
copy that does not exist). Now a replica fetch is served only on a connection that said so at its handshake
and authenticated as a replication principal (replicationUser or a super-user); everything else is refused.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_process import metaq
from test_replication_ha import TOPIC, TOPICS, wait_isr

from metaq.client import Message, MessageSessionFactory
from metaq.client.blocking import BlockingClient
from metaq.errors import ClusterAuthorizationError
from metaq.net.blocking import BlockingConnection
from metaq.net.codec import ConnectionSettings
from metaq.net.tls import ClientTls
from metaq.protocol import messages as m
from metaq.protocol.records import decode_fetched, encode_values
from metaq.testing import BrokerProcess, wait_until
from metaq.testing.certs import Pki, make_pki

REPLICA_PASSWORD = "replica secret, long enough"
BOB_PASSWORD = "bob's password, long enough"
DENIED = ClusterAuthorizationError.code


def add_user(name: str, password: str, *where: str) -> None:
    import os

    done = metaq("acl", "user", "add", name, *where, env={**os.environ, "METAQ_PASSWORD": password})
    assert done.returncode == 0, done.stderr


def connection(proc: BrokerProcess, user: str, password: str, *, replica_id: int = -1) -> BlockingConnection:
    settings = ConnectionSettings("replica-auth-test", 10.0, 10.0, 4, 64 << 20, sasl_username=user,
                                  sasl_password=password, replica_id=replica_id)
    return BlockingConnection.open((proc.host, proc.port), settings)


def fetch(conn: BlockingConnection, offset: int = 0, replica_id: int = 0, partition: int = 0) -> m.FetchResponse:
    reply: m.FetchResponse = conn.call(m.FetchRequest(topic=TOPIC, partition=partition, offset=offset,
                                                      max_bytes=1 << 20, replica_id=replica_id))
    return reply


def test_a_replica_fetch_is_served_only_to_a_replication_principal_that_said_so(
        broker_factory: Callable[..., BrokerProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "broker"
    add_user("bob", BOB_PASSWORD, "--data-path", str(data))
    add_user("replicator", REPLICA_PASSWORD, "--data-path", str(data))
    monkeypatch.setenv("METAQ_REPLICATION_PASSWORD", REPLICA_PASSWORD)
    proc = broker_factory({"numPartitions": 1, "unflushThreshold": 0, "authRequired": True,
                           "replicationUser": "replicator", "quotaConsumerByteRate": "50k"})
    payload = [b"x" * 1000] * 200  # 200 KB: four seconds of bob's quota
    writer = connection(proc, "replicator", REPLICA_PASSWORD)
    writer.call(m.ProduceRequest(topic=TOPIC, partition=0, records=encode_values(payload, 1000)))
    writer.close()

    # bob, as a consumer: throttled once past his one-second burst
    bob = connection(proc, "bob", BOB_PASSWORD)
    as_consumer = fetch(bob, replica_id=-1)
    assert as_consumer.error_code == 0 and len(as_consumer.records) > 100_000
    assert as_consumer.throttle_time_ms > 0, "a consumer over its quota is throttled"
    bob.close()
    # bob claiming to be a replica: refused, whether or not he says so at the handshake
    for said in (-1, 0):
        forger = connection(proc, "bob", BOB_PASSWORD, replica_id=said)
        reply = fetch(forger, replica_id=0)
        assert reply.error_code == DENIED and not reply.records, reply
        assert "User:bob" in (reply.error_message or "") or "handshake" in (reply.error_message or "")
        forger.close()
    # the replication principal: served as a replica only on a connection that said so, and never throttled
    undeclared = connection(proc, "replicator", REPLICA_PASSWORD)
    assert fetch(undeclared, replica_id=0).error_code == DENIED
    undeclared.close()
    replica = connection(proc, "replicator", REPLICA_PASSWORD, replica_id=0)
    for _ in range(3):  # 600 KB, twelve times the quota in a moment
        reply = fetch(replica, replica_id=0)
        assert reply.error_code == 0 and len(reply.records) > 100_000 and reply.throttle_time_ms == 0
    replica.close()


@pytest.mark.slow
def test_a_forged_replica_fetch_cannot_keep_a_dead_slave_in_sync_nor_get_a_write_acked(
        cluster_factory: Callable[..., BrokerProcess], zookeeper: Any, zk_client: Any, zk_root: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    zk = ["-z", zookeeper.connect_string, "--zk-root", zk_root]
    add_user("replicator", REPLICA_PASSWORD, *zk)
    add_user("bob", BOB_PASSWORD, *zk)
    monkeypatch.setenv("METAQ_REPLICATION_PASSWORD", REPLICA_PASSWORD)
    ha = {"syncReplication": "true", "autoFailover": "false", "minInSyncSlaves": 1, "inSyncMaxLagMs": 1500,
          "degradeToAsync": "false", "authRequired": "true", "replicationUser": "replicator"}
    master = cluster_factory(1, topics=TOPICS, zk_session_timeout_ms=2000, name="replica-0",
                             args=["--slave-id", "0"], **ha)
    slave = cluster_factory(1, topics=TOPICS, zk_session_timeout_ms=2000, name="replica-1",
                            args=["--slave", "--slave-id", "1"], **ha)
    for proc in (master, slave):
        proc.allow_log(r"replica \S+: |cannot|may not fetch as replica|refused|out of sync|in-sync")
    wait_isr(zk_client, zk_root, {1})

    def produce(values: list[bytes], partition: int = 0) -> m.ProduceResponse:
        conn = connection(master, "replicator", REPLICA_PASSWORD)
        try:
            reply: m.ProduceResponse = conn.call(m.ProduceRequest(topic=TOPIC, partition=partition,
                                                                  records=encode_values(values, 1000)))
            return reply
        finally:
            conn.close()

    assert produce([b"before"]).error_code == 0
    slave.kill()

    stop = threading.Event()
    answers: list[int] = []

    def forge() -> None:
        """bob, posing as replica 1 (even saying so at the handshake), fetching at every log end, nonstop."""
        conn = connection(master, "bob", BOB_PASSWORD, replica_id=1)
        try:
            while not stop.is_set():
                for p in range(3):
                    end = fetch(conn, offset=0, replica_id=1, partition=p).log_end_offset
                    answers.append(fetch(conn, offset=max(end, 0), replica_id=1, partition=p).error_code)
                time.sleep(0.01)
        finally:
            conn.close()

    def consumer_sees(partition: int) -> bytes:
        consumer = connection(master, "bob", BOB_PASSWORD)
        try:
            seen = fetch(consumer, offset=0, replica_id=-1, partition=partition)
        finally:
            consumer.close()
        assert seen.error_code == 0, seen
        return bytes(seen.records)

    forger = threading.Thread(target=forge, daemon=True)
    forger.start()
    results: list[m.ProduceResponse] = []
    writer = threading.Thread(target=lambda: results.append(produce([b"while the slave is dead"], partition=1)),
                              daemon=True)
    try:
        wait_until(lambda: len(answers) >= 12, 10, message="bob's forged replica fetches")
        writer.start()
        seen_from = len(answers)
        wait_until(lambda: len(answers) >= seen_from + 24 or not writer.is_alive(), 10,
                   message="forged fetches at the log end after the write")
        if group_isr(zk_client, zk_root) == [1]:  # still inside the lag bound: the write waits for replica 1
            assert consumer_sees(1) == b"", "the high watermark passed a batch no live slave holds"
        writer.join(30)
        assert results and results[0].error_code != 0, "a write was acked with its only in-sync slave dead"
        wait_isr(zk_client, zk_root, set(), timeout_s=20)  # the dead slave leaves the in-sync set all the same
        assert produce([b"refused"], partition=2).error_code != 0
    finally:
        stop.set()
        forger.join(10)
    assert answers and set(answers) == {DENIED}, set(answers)


def group_isr(zk_client: Any, root: str) -> list[int] | None:
    import json

    try:
        return list(json.loads(zk_client.get(f"{root}/brokers/replica-groups/1")[0])["isr"])
    except Exception:
        return None


def test_a_slave_with_a_certificate_and_replication_user_replicates_from_a_want_master(
        cluster_factory: Callable[..., BrokerProcess], zookeeper: Any, zk_client: Any, zk_root: str,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The master at sslClientAuth=want first knew the slave by its certificate and then refused its SASL login
    as a second handshake: the slave retried forever at offset 0. Now the SASL principal replaces the
    certificate's."""
    pki: Pki = make_pki(tmp_path / "pki")
    zk = ["-z", zookeeper.connect_string, "--zk-root", zk_root]
    add_user("replicator", REPLICA_PASSWORD, *zk)
    monkeypatch.setenv("METAQ_REPLICATION_PASSWORD", REPLICA_PASSWORD)
    common = {"sslPort": 0, "sslCertFile": str(pki.server_cert), "sslKeyFile": str(pki.server_key),
              "sslCaFile": str(pki.ca), "sslClientAuth": "want", "sslReplication": True, "authRequired": True,
              "replicationUser": "replicator"}
    master = cluster_factory(1, topics="[topic=orders]\nnumPartitions=2\n", **common)
    slave = cluster_factory(1, topics="[topic=orders]\nnumPartitions=2\n", name="broker-1-slave-0",
                            args=["--slave", "--slave-id", "0"], **common)
    tls = ClientTls(str(pki.ca))

    async def produce() -> None:
        async with await MessageSessionFactory.connect(f"127.0.0.1:{master.tls_port}", tls_ca_file=str(pki.ca),
                                                       sasl_username="replicator",
                                                       sasl_password=REPLICA_PASSWORD) as session:
            producer = session.create_producer()
            for i in range(20):
                assert (await producer.send(Message("orders", f"m{i}".encode()))).success

    asyncio.run(produce())

    def on_slave() -> int:
        with BlockingClient(f"127.0.0.1:{slave.tls_port}", tls=tls, username="replicator",
                            password=REPLICA_PASSWORD) as client:
            return sum(len(decode_fetched(client.fetch("orders", f"1-{p}", 0, 1 << 20).records, "orders", p, 0)[0])
                       for p in (0, 1))

    wait_until(lambda: on_slave() == 20, 30, message="the slave to copy every message over TLS as replicationUser")
    assert any("authenticated as User:replicator" in line for line in master.log_lines)
