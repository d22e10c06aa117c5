"""ZooKeeper locked down (issue 39, hole 4), against Debian's ZooKeeper with SASL (DIGEST-MD5) and TLS on.

The attack this answers: with metaq's znodes open, an anonymous ZooKeeper client wrote admin's SCRAM
credential, logged in to the brokers as admin and deleted a topic, and edited the ACL document. With
``zk.zkSaslUser`` and ``zk.zkSetAcl`` the brokers log in to ZooKeeper and make every node with ACLs: only
their identity may change metaq's nodes, only it may read credentials and ACLs; anyone may still read the
layout (clients find brokers there). ``metaq cluster secure`` puts the same ACLs on a tree made without them.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_process import metaq
from kazoo.client import KazooClient
from kazoo.exceptions import AuthFailedError, NoAuthError, SessionClosedRequireSaslError
from kazoo.security import OPEN_ACL_UNSAFE

from metaq.client import Message, MessageSessionFactory
from metaq.client.group import ConsumerConfig, create_consumer
from metaq.errors import ConnectionClosedError, SaslAuthenticationError
from metaq.security.scram import make_credential
from metaq.testing import BrokerProcess, wait_until
from metaq.testing.certs import Pki, make_pki
from metaq.testing.zookeeper import ZooKeeperServer, ZooKeeperTls, cluster_config, unique_root

BROKER_ZK_PASSWORD = "brokers-zk-secret"
APP_ZK_PASSWORD = "app-zk-secret"
MALLORY_ZK_PASSWORD = "mallory-zk-secret"
ADMIN_PASSWORD = "admin password, long enough"
BOB_PASSWORD = "bob's password, long enough"
ZK_USERS = {"metaq": BROKER_ZK_PASSWORD, "app": APP_ZK_PASSWORD, "mallory": MALLORY_ZK_PASSWORD}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secure_zk(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[ZooKeeperServer]:
    """SASL users (the brokers' ``metaq``, an application's ``app``, an intruder's ``mallory``), anonymous
    sessions allowed (what the ACLs must then hold against), and a TLS client port."""
    with ZooKeeperServer(tmp_path_factory.mktemp("zk-secure"), sasl_users=ZK_USERS,
                         tls=ZooKeeperTls(pki.server_cert, pki.server_key, pki.ca)) as server:
        yield server


def kazoo(zk: ZooKeeperServer, user: str | None = None) -> KazooClient:
    sasl = {"mechanism": "DIGEST-MD5", "username": user, "password": ZK_USERS[user]} if user else None
    client = KazooClient(hosts=zk.connect_string, sasl_options=sasl)
    client.start(20)
    return client


@pytest.fixture
def anonymous(secure_zk: ZooKeeperServer) -> Iterator[KazooClient]:
    client = kazoo(secure_zk)
    yield client
    client.stop()
    client.close()


@pytest.fixture
def mallory(secure_zk: ZooKeeperServer) -> Iterator[KazooClient]:
    client = kazoo(secure_zk, "mallory")
    yield client
    client.stop()
    client.close()


@pytest.fixture
def zk_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The brokers' ZooKeeper password where brokers and the CLI look for it."""
    monkeypatch.setenv("METAQ_ZK_PASSWORD", BROKER_ZK_PASSWORD)
    return {**os.environ, "METAQ_ZK_PASSWORD": BROKER_ZK_PASSWORD, "METAQ_ZK_USER": "metaq"}


SECURE_ZK = {"zk.zkSaslUser": "metaq", "zk.zkSetAcl": True}


def start_broker(broker_factory: Callable[..., BrokerProcess], zk: ZooKeeperServer, root: str, broker_id: int = 1,
                 zookeeper: dict[str, Any] | None = None, name: str | None = None, topics: str = "",
                 **system: Any) -> BrokerProcess:
    text = cluster_config(broker_id, zk.connect_string, root,
                          system={"authRequired": True, "aclEnabled": True, "superUsers": "User:admin", **system},
                          zookeeper=SECURE_ZK if zookeeper is None else zookeeper, topics=topics)
    return broker_factory(config_text=text, name=name or f"broker-{broker_id}")


def cli(env: dict[str, str], *args: str, password: str | None = None) -> subprocess.CompletedProcess[str]:
    run_env = {**env, **({"METAQ_PASSWORD": password} if password else {})}
    return metaq(*args, env=run_env)


def forged_admin_credential() -> bytes:
    """What the attacker wrote: a valid credential for ``admin`` with a password of their own."""
    return json.dumps(make_credential("attacker's own password", iterations=4096).to_json()).encode()


async def _login(broker: BrokerProcess, user: str, password: str) -> str:
    async with await MessageSessionFactory.connect(broker.servers, sasl_username=user, sasl_password=password,
                                                   connect_timeout_s=10):
        return "in"


async def _roundtrip(payload: bytes, servers: str | None = None, **options: Any) -> list[bytes]:
    """Send ``payload`` to ``orders`` and read it back (pull consumer) on one session."""
    async with await MessageSessionFactory.connect(servers, **options) as session:
        result = await session.create_producer().send(Message("orders", payload))
        assert result.success, result
        got = await session.create_pull_consumer().get("orders", result.partition_id, result.offset)
        return [bytes(m.data) for m in got][:1]


ORDERS = "[topic=orders]\nnumPartitions=1\n"


def test_an_anonymous_or_foreign_zookeeper_client_can_change_nothing_of_a_secured_cluster(
        broker_factory, secure_zk, anonymous, mallory, zk_env) -> None:
    root = unique_root()
    assert cli(zk_env, "acl", "user", "add", "admin", "-z", secure_zk.connect_string, "--zk-root", root,
               password=ADMIN_PASSWORD).returncode == 0
    broker = start_broker(broker_factory, secure_zk, root, topics=ORDERS)
    broker.allow_log(r"authentication of .* failed")
    wait_until(lambda: anonymous.exists(f"{root}/brokers/topics-pub/orders/1-m") is not None, 20,
               message="the topic's registration")

    admin_node = f"{root}/metaq-security/users/admin"
    targets = {
        "write admin's credential": lambda c: c.set(admin_node, forged_admin_credential()),
        "add a user": lambda c: c.create(f"{root}/metaq-security/users/mallory", forged_admin_credential()),
        "delete admin": lambda c: c.delete(admin_node),
        "read admin's credential": lambda c: c.get(admin_node),
        "write the ACLs": lambda c: c.create(f"{root}/metaq-security/acls", b'{"acls": []}'),
        "list the users": lambda c: c.get_children(f"{root}/metaq-security/users"),
        "delete the topic's registration": lambda c: c.delete(f"{root}/brokers/topics-pub/orders/1-m"),
        "overwrite the broker's address": lambda c: c.set(f"{root}/brokers/ids/1/master", b"meta://10.9.9.9:1"),
        "register a broker": lambda c: c.create(f"{root}/brokers/ids/7", b""),
        "open a node's ACL": lambda c: c.set_acls(f"{root}/brokers/ids", OPEN_ACL_UNSAFE),
        "delete the root": lambda c: c.delete(root, recursive=True),
    }
    for who, client in (("anonymous", anonymous), ("sasl:mallory", mallory)):
        for what, attempt in targets.items():
            with pytest.raises(NoAuthError):
                attempt(client)
                pytest.fail(f"{who} could {what}")
    # what anyone may do: read the layout clients find brokers in
    assert anonymous.get(f"{root}/brokers/ids/1/master")[0].decode() == f"meta://{broker.servers}"
    # the forged credential never landed: the attacker cannot log in as admin, the real admin can
    with pytest.raises((SaslAuthenticationError, ConnectionClosedError)):
        asyncio.run(_login(broker, "admin", "attacker's own password"))
    assert asyncio.run(_login(broker, "admin", ADMIN_PASSWORD)) == "in"
    # the brokers' own identity (the admin CLI with the brokers' ZooKeeper user) still manages users and ACLs
    assert cli(zk_env, "acl", "user", "add", "bob", "-z", secure_zk.connect_string, "--zk-root", root,
               password=BOB_PASSWORD).returncode == 0
    added = cli(zk_env, "acl", "add", "--principal", "User:bob", "--topic", "orders", "-o", "consume", "-z",
                secure_zk.connect_string, "--zk-root", root)
    assert added.returncode == 0, added.stderr
    listed = cli(zk_env, "acl", "user", "list", "-z", secure_zk.connect_string, "--zk-root", root)
    assert listed.stdout.split() == ["admin", "bob"]
    # without the brokers' ZooKeeper user the same command is refused by ZooKeeper, not silently done
    anon_env = {k: v for k, v in zk_env.items() if k not in ("METAQ_ZK_USER", "METAQ_ZK_PASSWORD")}
    refused = cli(anon_env, "acl", "user", "add", "mallory", "-z", secure_zk.connect_string, "--zk-root", root,
                  password=BOB_PASSWORD)
    assert refused.returncode != 0 and "NoAuth" in refused.stderr + refused.stdout, refused
    brokers_identity = kazoo(secure_zk, "metaq")
    try:
        assert [(a.id.scheme, a.id.id, a.perms) for a in brokers_identity.get_acls(admin_node)[0]] == \
            [("sasl", "metaq", 31)]
    finally:
        brokers_identity.stop()
        brokers_identity.close()


def test_consumer_groups_nodes_belong_to_their_consumers_identity(broker_factory, secure_zk, anonymous, zk_env,
                                                                   tmp_path: Path) -> None:
    root = unique_root()
    assert cli(zk_env, "acl", "user", "add", "admin", "-z", secure_zk.connect_string, "--zk-root", root,
               password=ADMIN_PASSWORD).returncode == 0
    start_broker(broker_factory, secure_zk, root, topics=ORDERS)

    async def produce_and_consume() -> list[bytes]:
        options: dict[str, Any] = dict(zk_connect=secure_zk.connect_string, zk_root=root, sasl_username="admin",
                                       sasl_password=ADMIN_PASSWORD, zk_sasl_username="app",
                                       zk_sasl_password=APP_ZK_PASSWORD)
        async with await MessageSessionFactory.connect(**options) as session:
            producer = session.create_producer()
            for i in range(3):
                assert (await producer.send(Message("orders", f"m{i}".encode()))).success
            got: list[bytes] = []
            consumer = create_consumer(session, ConsumerConfig(group="billing", recover_dir=tmp_path / "recover",
                                                               commit_offset_period_ms=100))
            consumer.subscribe("orders", 1 << 16, lambda msg: got.append(bytes(msg.data)))
            await consumer.complete_subscribe()
            deadline = time.monotonic() + 30
            while len(got) < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await consumer.close()  # commits
            return got

    assert asyncio.run(produce_and_consume()) == [b"m0", b"m1", b"m2"]
    offsets = f"{root}/consumers/billing/offsets/orders"
    wait_until(lambda: anonymous.exists(offsets) is not None and anonymous.get_children(offsets), 20,
               message="the group's committed offset")
    node = f"{offsets}/{anonymous.get_children(offsets)[0]}"
    assert sorted(f"{a.id.scheme}:{a.id.id}={a.perms}" for a in anonymous.get_acls(node)[0]) == \
        ["sasl:app=31", "world:anyone=1"]
    with pytest.raises(NoAuthError):
        anonymous.set(node, b"0")  # rewinding (or skipping) the group's offsets
    with pytest.raises(NoAuthError):
        anonymous.delete(f"{root}/consumers/billing", recursive=True)
    assert anonymous.get(node)[0]  # readable: `metaq cluster` shows lags without a ZooKeeper user


def test_cluster_secure_puts_the_acls_on_a_tree_made_without_them(broker_factory, secure_zk, anonymous,
                                                                   zk_env) -> None:
    root = unique_root()
    env_args = ("-z", secure_zk.connect_string, "--zk-root", root)
    open_env = {k: v for k, v in zk_env.items() if k not in ("METAQ_ZK_USER", "METAQ_ZK_PASSWORD")}
    assert cli(open_env, "acl", "user", "add", "admin", *env_args, password=ADMIN_PASSWORD).returncode == 0
    first = start_broker(broker_factory, secure_zk, root, zookeeper={}, topics=ORDERS)  # as it ran before: open
    admin_node = f"{root}/metaq-security/users/admin"
    anonymous.set(admin_node, anonymous.get(admin_node)[0])  # open: anyone may write it
    first.stop()

    dry = cli(zk_env, "cluster", *env_args, "secure", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert any(line.startswith(f"{admin_node}\tworld:anyone=all -> sasl:metaq=all") for line in dry.stdout.splitlines())
    anonymous.set(admin_node, anonymous.get(admin_node)[0])  # a dry run changes nothing

    done = cli(zk_env, "cluster", *env_args, "secure")
    assert done.returncode == 0, done.stderr
    assert "set the ACL of" in done.stderr
    with pytest.raises(NoAuthError):
        anonymous.set(admin_node, forged_admin_credential())
    with pytest.raises(NoAuthError):
        anonymous.create(f"{root}/brokers/ids/9", b"")
    again = cli(zk_env, "cluster", *env_args, "secure")
    assert again.returncode == 0 and again.stdout == "", again  # nothing left to change
    # the brokers, now with their ZooKeeper user and ACLs, register and serve on the secured tree
    broker = start_broker(broker_factory, secure_zk, root, name="broker-1-secured", topics=ORDERS)
    assert asyncio.run(_roundtrip(b"x", broker.servers, sasl_username="admin", sasl_password=ADMIN_PASSWORD)) == \
        [b"x"]
    # run anonymously it cannot do anything to a secured tree, and says so
    refused = cli(open_env, "cluster", *env_args, "secure")
    assert refused.returncode == 2 and "--zk-user" in refused.stderr


def test_zookeeper_over_tls_with_sasl(broker_factory, secure_zk, pki, anonymous, zk_env) -> None:
    root = unique_root()
    tls_options = {**SECURE_ZK, "zk.zkSslCaFile": str(pki.ca)}
    text = cluster_config(1, secure_zk.secure_connect_string, root, zookeeper=tls_options, topics=ORDERS)
    broker = broker_factory(config_text=text, name="broker-tls")
    wait_until(lambda: anonymous.exists(f"{root}/brokers/ids/1/master") is not None, 20,
               message="the broker registered through ZooKeeper's TLS port")

    def roundtrip(ca_file: Path) -> list[bytes]:
        return asyncio.run(_roundtrip(b"over tls", zk_connect=secure_zk.secure_connect_string, zk_root=root,
                                      zk_connection_timeout_ms=5000, zk_sasl_username="app",
                                      zk_sasl_password=APP_ZK_PASSWORD, zk_tls_ca_file=str(ca_file)))

    assert roundtrip(pki.ca) == [b"over tls"]
    with pytest.raises(ConnectionClosedError, match="secureClientPort"):
        roundtrip(pki.rogue_ca)  # a ZooKeeper its CA did not sign
    shown = cli(zk_env, "cluster", "-z", secure_zk.secure_connect_string, "--zk-root", root, "--zk-ca-file",
                str(pki.ca))
    assert shown.returncode == 0, shown.stderr
    assert f"1   master  {broker.servers}" in shown.stdout


def test_a_wrong_zookeeper_password_stops_the_broker_with_one_line(secure_zk, tmp_path: Path) -> None:
    ini = tmp_path / "server.ini"
    ini.write_text(cluster_config(1, secure_zk.connect_string, unique_root(), zookeeper=SECURE_ZK))
    base = [sys.executable, "-m", "metaq.broker", "-f", str(ini), "--serverPort", "0", "--dataPath",
            str(tmp_path / "data")]

    def run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(base, capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL,
                              env={**os.environ, "PYTHONUNBUFFERED": "1", **env})

    wrong = run({"METAQ_ZK_PASSWORD": "not it"})
    assert wrong.returncode == 1, wrong.stderr
    errors = [line for line in wrong.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and "refused SASL DIGEST-MD5 user 'metaq'" in errors[0], wrong.stderr
    assert "Traceback" not in wrong.stderr
    env = {k: v for k, v in os.environ.items() if k != "METAQ_ZK_PASSWORD"}
    missing = subprocess.run(base, capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL, env=env)
    assert missing.returncode == 2 and "METAQ_ZK_PASSWORD" in missing.stderr, missing.stderr


def test_a_zookeeper_that_requires_sasl_serves_the_brokers_and_refuses_anonymous_sessions(
        broker_factory, tmp_path: Path, zk_env) -> None:
    with ZooKeeperServer(tmp_path / "zk-required", sasl_users=ZK_USERS, require_sasl=True) as zk:
        root = unique_root()
        broker = broker_factory(config_text=cluster_config(1, zk.connect_string, root, zookeeper=SECURE_ZK,
                                                           topics=ORDERS))
        shown = cli(zk_env, "cluster", "-z", zk.connect_string, "--zk-root", root)
        assert shown.returncode == 0 and f"1   master  {broker.servers}" in shown.stdout, shown
        client = KazooClient(hosts=zk.connect_string)
        client.start(20)
        try:
            with pytest.raises((NoAuthError, AuthFailedError, SessionClosedRequireSaslError)):
                client.get(f"{root}/brokers/ids/1/master")
        finally:
            client.stop()
            client.close()
        anon_env = {k: v for k, v in zk_env.items() if k not in ("METAQ_ZK_USER", "METAQ_ZK_PASSWORD")}
        refused = cli(anon_env, "cluster", "-z", zk.connect_string, "--zk-root", root)
        assert refused.returncode == 1
        broker.stop()
