"""SASL/SCRAM-SHA-256 authentication against real brokers (docs/security.md).

What a user relies on: with authRequired, a connection that has not authenticated can do nothing but
ApiVersions and the handshake (every other API of the table is refused with SASL_AUTHENTICATION_FAILED
and the connection closed); a wrong password or an unknown user is refused the same way; the async
client, the blocking client and the CLI authenticate with the user's credentials; users added with
`metaq acl user add` work without a restart; a client certificate's CN authenticates on the TLS port; a
fuzzed handshake never crashes the broker; in cluster mode users live in ZooKeeper and a slave
authenticates to its master as replicationUser.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import socket
import struct
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_process import metaq

from metaq.client import Message, MessageSessionFactory
from metaq.client.blocking import BlockingClient
from metaq.errors import ConnectionClosedError, SaslAuthenticationError
from metaq.net.blocking import BlockingConnection
from metaq.net.codec import ConnectionSettings
from metaq.protocol import messages as m
from metaq.protocol.codec import ClientConnection
from metaq.protocol.records import decode_fetched, encode_values
from metaq.testing import BrokerProcess, wait_until

PASSWORD = "correct horse battery staple"
ALLOWED_BEFORE_AUTH = {m.ApiVersionsRequest.API_KEY, m.SaslHandshakeRequest.API_KEY, m.SaslAuthenticateRequest.API_KEY}
AUTH_FAILED = SaslAuthenticationError.code


def add_user(name: str, password: str, *where: str) -> None:
    done = metaq("acl", "user", "add", name, *where, env={**os.environ, "METAQ_PASSWORD": password})
    assert done.returncode == 0, done.stderr


@pytest.fixture
def auth_broker(broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> BrokerProcess:
    data = tmp_path / "broker"
    add_user("alice", PASSWORD, "--data-path", str(data))
    proc = broker_factory({"numPartitions": 2, "unflushThreshold": 0, "authRequired": True})
    proc.allow_log(r"authentication of .* failed")
    return proc


def settings(user: str | None = None, password: str | None = None) -> ConnectionSettings:
    return ConnectionSettings("auth-test", 10.0, 10.0, 16, 64 << 20, sasl_username=user, sasl_password=password)


def closed_by_broker(conn: BlockingConnection) -> bool:
    try:
        conn.sock.settimeout(10)
        return conn.sock.recv(1) == b""
    except OSError:
        return True


def test_every_api_is_refused_before_authentication_and_the_connection_closed(auth_broker: BrokerProcess) -> None:
    address = (auth_broker.host, auth_broker.port)
    refused = []
    for key, spec in sorted(m.APIS.items()):
        if key in ALLOWED_BEFORE_AUTH:
            continue
        conn = BlockingConnection.open(address, settings())  # ApiVersions is allowed: the open succeeds
        try:
            reply = conn.call(spec.request())
            assert reply.error_code == AUTH_FAILED, (spec.name, reply)
            assert "requires authentication" in (reply.error_message or ""), spec.name
            assert closed_by_broker(conn), f"{spec.name}: the connection stays open after the refusal"
            refused.append(spec.name)
        finally:
            conn.close()
    assert "Produce" in refused and "Fetch" in refused and "DeleteTopic" in refused and "Reload" in refused
    assert len(refused) == len(m.APIS) - len(ALLOWED_BEFORE_AUTH)
    # a one-way produce (no reply expected) is dropped and its connection closed too, a MultiProduce's as well
    for oneway in (m.ProduceRequest(topic="t", partition=0, acks=0, records=encode_values([b"x"], 1)),
                   m.MultiProduceRequest(acks=0, partitions=[m.ProducePartition("t", 0, encode_values([b"x"], 1))])):
        conn = BlockingConnection.open(address, settings())
        try:
            conn.send(oneway, expect_response=False)
            assert closed_by_broker(conn)
        finally:
            conn.close()
    # and nothing was written by any of them
    with BlockingClient(auth_broker.servers, username="alice", password=PASSWORD) as client:
        assert "t" not in {t.name for t in client.metadata().topics}


def test_clients_authenticate_and_work(auth_broker: BrokerProcess) -> None:
    async def main() -> list[bytes]:
        async with await MessageSessionFactory.connect(auth_broker.servers, sasl_username="alice",
                                                       sasl_password=PASSWORD) as session:
            await session.admin().create_topic("secure", 1)
            producer = session.create_producer()
            for i in range(10):
                assert (await producer.send(Message("secure", f"m{i}".encode()))).success
            consumer = session.create_pull_consumer()
            out = []
            async for msg in consumer.iterate("secure", 0, 0, max_wait_ms=100):
                out.append(bytes(msg.data))
                if len(out) == 10:
                    return out
        return []

    assert asyncio.run(main()) == [f"m{i}".encode() for i in range(10)]
    conn = BlockingConnection.open((auth_broker.host, auth_broker.port), settings("alice", PASSWORD))
    assert conn.principal == "User:alice"
    conn.close()
    with BlockingClient(auth_broker.servers, username="alice", password=PASSWORD) as client:
        client.produce("secure", "0-0", encode_values([b"blocking"], 1))
        got = decode_fetched(client.fetch("secure", "0-0", 10, 1 << 20).records, "secure", 0, 10)[0]
        assert [bytes(r.data) for r in got] == [b"blocking"]
    env = {**os.environ, "METAQ_USER": "alice", "METAQ_PASSWORD": PASSWORD}
    cli = metaq("consume", "secure", "-s", auth_broker.servers, env=env)
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.splitlines()[-1] == "blocking"
    assert PASSWORD not in " ".join(cli.args), "the password is never an argument"
    # the CLI without credentials is refused with the reason
    anonymous = metaq("consume", "secure", "-s", auth_broker.servers)
    assert anonymous.returncode == 1 and "SASL_AUTHENTICATION_FAILED" in anonymous.stderr
    missing = metaq("consume", "secure", "-s", auth_broker.servers, env={**os.environ, "METAQ_USER": "alice"})
    assert missing.returncode != 0 and "METAQ_PASSWORD" in missing.stderr


def test_wrong_password_and_unknown_user_are_refused(auth_broker: BrokerProcess) -> None:
    address = (auth_broker.host, auth_broker.port)
    for user, password in (("alice", "wrong"), ("mallory", PASSWORD)):
        with pytest.raises(SaslAuthenticationError, match="wrong user name or password"):
            BlockingConnection.open(address, settings(user, password))
        with pytest.raises((SaslAuthenticationError, ConnectionClosedError),
                           match=r"SASL_AUTHENTICATION_FAILED.*wrong user name or password"):
            asyncio.run(MessageSessionFactory.connect(auth_broker.servers, sasl_username=user,
                                                      sasl_password=password, reconnect_attempts=1))
    env = {**os.environ, "METAQ_USER": "alice", "METAQ_PASSWORD": "wrong"}
    cli = metaq("topic", "list", "-s", auth_broker.servers, env=env)
    assert cli.returncode == 1 and "wrong user name or password" in cli.stderr


def test_users_added_and_removed_take_effect_without_restart(auth_broker: BrokerProcess) -> None:
    address = (auth_broker.host, auth_broker.port)
    with pytest.raises(SaslAuthenticationError):
        BlockingConnection.open(address, settings("bob", "bobs password"))
    add_user("bob", "bobs password", "--data-path", str(auth_broker.data_dir))
    BlockingConnection.open(address, settings("bob", "bobs password")).close()
    listed = metaq("acl", "user", "list", "--data-path", str(auth_broker.data_dir))
    assert listed.stdout.split() == ["alice", "bob"]
    assert "bobs password" not in (auth_broker.data_dir / "users.json").read_text()
    assert metaq("acl", "user", "remove", "bob", "--data-path", str(auth_broker.data_dir)).returncode == 0
    with pytest.raises(SaslAuthenticationError):
        BlockingConnection.open(address, settings("bob", "bobs password"))


def test_out_of_order_handshake_is_an_illegal_state_and_closes(auth_broker: BrokerProcess) -> None:
    address = (auth_broker.host, auth_broker.port)
    conn = BlockingConnection.open(address, settings())
    reply = conn.call(m.SaslAuthenticateRequest(auth_bytes=b"n,,n=alice,r=abc"))
    assert reply.error_code == 34 and closed_by_broker(conn)
    conn.close()
    conn = BlockingConnection.open(address, settings())
    reply = conn.call(m.SaslHandshakeRequest(mechanism="PLAIN"))
    assert reply.error_code == 33 and "SCRAM-SHA-256" in (reply.error_message or "") and closed_by_broker(conn)
    conn.close()


def _frame(request: Any) -> bytes:
    return ClientConnection("fuzz").send(request)[1]


def test_a_fuzzed_handshake_never_crashes_the_broker(auth_broker: BrokerProcess) -> None:
    rng = random.Random(14)
    hello = _frame(m.ApiVersionsRequest())
    good_first = b"n,,n=alice,r=" + b"x" * 24
    for i in range(300):
        kind = i % 5
        if kind == 0:  # random SASL bytes after a proper handshake
            payload = _frame(m.SaslHandshakeRequest()) + _frame(
                m.SaslAuthenticateRequest(auth_bytes=bytes(rng.randrange(256) for _ in range(rng.randrange(300)))))
        elif kind == 1:  # a valid first message, then a random final one
            payload = _frame(m.SaslHandshakeRequest()) + _frame(m.SaslAuthenticateRequest(auth_bytes=good_first)) \
                + _frame(m.SaslAuthenticateRequest(auth_bytes=bytes(rng.randrange(256) for _ in range(64))))
        elif kind == 2:  # a truncated SASL frame, then the connection dropped
            frame = _frame(m.SaslAuthenticateRequest(auth_bytes=good_first))
            payload = _frame(m.SaslHandshakeRequest()) + frame[: rng.randrange(1, len(frame))]
        elif kind == 3:  # a SASL frame with its body bytes flipped
            frame = bytearray(_frame(m.SaslHandshakeRequest(mechanism="SCRAM-SHA-256")))
            for _ in range(3):
                frame[rng.randrange(4, len(frame))] = rng.randrange(256)
            payload = bytes(frame)
        else:  # a frame length that lies
            payload = struct.pack(">i", rng.randrange(-5, 1 << 20)) + bytes(rng.randrange(256) for _ in range(20))
        with socket.create_connection((auth_broker.host, auth_broker.port), timeout=10) as sock:
            sock.sendall(hello + payload)
            sock.shutdown(socket.SHUT_WR)
            try:
                while sock.recv(65536):
                    pass
            except OSError:
                pass
    assert auth_broker.running
    conn = BlockingConnection.open((auth_broker.host, auth_broker.port), settings("alice", PASSWORD))
    assert conn.principal == "User:alice"
    conn.close()


def _http(url: str, user: str | None = None, password: str = PASSWORD, context: Any = None,
          body: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    headers = {"Content-Type": "application/json"}
    if user is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    req = urllib.request.Request(url, data=body, headers=headers, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_http_api_takes_basic_credentials_over_https_and_applies_the_acls(
        broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    pytest.importorskip("cryptography")
    import ssl

    from metaq.testing.certs import make_pki

    pki = make_pki(tmp_path / "pki")
    data = tmp_path / "broker"
    for user in ("alice", "bob"):
        add_user(user, PASSWORD, "--data-path", str(data))
    done = metaq("acl", "add", "--principal", "User:alice", "--topic", "orders", "-o", "produce", "-o", "consume",
                 "-o", "create", "--data-path", str(data))  # create: her first produce creates it
    assert done.returncode == 0, done.stderr
    proc = broker_factory({"authRequired": True, "aclEnabled": True, "httpPort": 0, "sslPort": 0,
                           "sslCertFile": str(pki.server_cert), "sslKeyFile": str(pki.server_key)})
    proc.allow_log(r"HTTP authentication from .* failed")
    assert proc.http_url is not None and proc.http_url.startswith("https://")
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    url = proc.http_url
    status, headers, body = _http(f"{url}/topics", context=ctx)
    assert status == 401 and headers.get("WWW-Authenticate", "").startswith("Basic")
    assert b"SASL_AUTHENTICATION_FAILED" in body
    assert _http(f"{url}/topics", "alice", "wrong", context=ctx)[0] == 401
    assert _http(f"{url}/topics", "nobody", context=ctx)[0] == 401
    message = json.dumps({"payload": "hi over https"}).encode()
    status, _, body = _http(f"{url}/topics/orders/partitions/0/messages", "alice", context=ctx, body=message)
    assert status == 200, body
    status, _, body = _http(f"{url}/topics/orders/partitions/0/messages?offset=0", "alice", context=ctx)
    assert status == 200 and b"hi over https" in body, body
    status, _, body = _http(f"{url}/topics/orders/partitions/0/messages", "bob", context=ctx, body=message)
    assert status == 403 and b"TOPIC_AUTHORIZATION_FAILED" in body  # the same ACLs as on TCP
    assert json.loads(_http(f"{url}/topics", "bob", context=ctx)[2])["topics"] == []  # filtered metadata
    names = [t["name"] for t in json.loads(_http(f"{url}/topics", "alice", context=ctx)[2])["topics"]]
    assert names == ["orders"]


def test_http_basic_credentials_are_refused_on_plain_http_unless_allowed(
        broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    add_user("alice", PASSWORD, "--data-path", str(tmp_path / "plain"))
    add_user("alice", PASSWORD, "--data-path", str(tmp_path / "allowed"))
    plain = broker_factory({"authRequired": True, "httpPort": 0}, name="plain")
    status, _, body = _http(f"{plain.http_url}/topics", "alice")
    assert status == 403 and b"plain HTTP" in body
    allowed = broker_factory({"authRequired": True, "httpPort": 0, "httpBasicAuthOverPlaintext": True},
                             name="allowed")
    assert _http(f"{allowed.http_url}/topics", "alice")[0] == 200
    assert _http(f"{allowed.http_url}/topics")[0] == 401


def test_a_client_certificate_authenticates_on_the_tls_port(broker_factory: Callable[..., BrokerProcess],
                                                            tmp_path: Path) -> None:
    pytest.importorskip("cryptography")
    from metaq.net.tls import ClientTls
    from metaq.testing.certs import make_pki

    pki = make_pki(tmp_path / "pki")
    proc = broker_factory({"authRequired": True, "sslPort": 0, "sslCertFile": str(pki.server_cert),
                           "sslKeyFile": str(pki.server_key), "sslCaFile": str(pki.ca), "sslClientAuth": "want"})
    tls = ClientTls(str(pki.ca), str(pki.client_cert), str(pki.client_key))
    with BlockingClient(f"127.0.0.1:{proc.tls_port}", tls=tls) as client:  # CN=alice, no password
        client.produce("by-cert", "0-0", encode_values([b"x"], 1))
    with pytest.raises((SaslAuthenticationError, ConnectionClosedError)), \
            BlockingClient(f"127.0.0.1:{proc.tls_port}", tls=ClientTls(str(pki.ca))) as client:
        client.produce("by-cert", "0-0", encode_values([b"y"], 1))


@pytest.mark.slow
def test_cluster_mode_users_in_zookeeper_and_a_slave_authenticating_as_replication_user(
        zookeeper: Any, zk_client: Any, zk_root: str, tmp_path: Path) -> None:
    from metaq.testing.zookeeper import cluster_config

    zk = ["-z", zookeeper.connect_string, "--zk-root", zk_root]
    add_user("alice", PASSWORD, *zk)
    add_user("replicator", "replica secret", *zk)
    assert metaq("acl", "user", "list", *zk).stdout.split() == ["alice", "replicator"]
    assert zk_client.exists(f"{zk_root}/metaq-security/users/alice")
    assert PASSWORD.encode() not in zk_client.get(f"{zk_root}/metaq-security/users/alice")[0]
    system = {"authRequired": True, "replicationUser": "replicator"}
    env = {"METAQ_REPLICATION_PASSWORD": "replica secret"}
    topics = "[topic=orders]\nnumPartitions=2\n"
    master = BrokerProcess(tmp_path / "master",
                           config_text=cluster_config(1, zookeeper.connect_string, zk_root, system=system,
                                                      topics=topics), env=env)
    slave = BrokerProcess(tmp_path / "slave",
                          config_text=cluster_config(1, zookeeper.connect_string, zk_root, system=system,
                                                     topics=topics), env=env, args=["--slave", "--slave-id", "0"])
    master.start()
    try:
        slave.start()
        try:
            async def produce() -> None:
                async with await MessageSessionFactory.connect(zk_connect=zookeeper.connect_string, zk_root=zk_root,
                                                               sasl_username="alice",
                                                               sasl_password=PASSWORD) as session:
                    producer = session.create_producer()
                    for i in range(20):
                        assert (await producer.send(Message("orders", f"m{i}".encode()))).success

            asyncio.run(produce())

            def on_slave() -> int:
                with BlockingClient(slave.servers, username="alice", password=PASSWORD) as client:
                    return sum(len(decode_fetched(client.fetch("orders", f"1-{p}", 0, 1 << 20).records, "orders",
                                                  p, 0)[0]) for p in (0, 1))

            wait_until(lambda: on_slave() == 20, 30, message="the slave replicated as replicationUser")
            assert any("authenticated as User:replicator" in line for line in master.log_lines)
        finally:
            slave.stop_or_kill()
    finally:
        master.stop_or_kill()
