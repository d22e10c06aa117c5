"""ACLs against a real broker (docs/security.md): what a user relies on is that a principal allowed on
topic A can neither read nor write topic B nor delete A; prefix ACLs cover every name they start; a deny
beats any allow; admin operations need admin; super-users may do everything; `metaq acl add` applies
without a restart; in cluster mode the ACLs live in ZooKeeper."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_process import metaq

from metaq.client import Message, MessageSessionFactory
from metaq.client.blocking import BlockingClient
from metaq.errors import (
    ClusterAuthorizationError,
    GroupAuthorizationError,
    TopicAuthorizationError,
)
from metaq.protocol import messages as m
from metaq.protocol.records import decode_fetched, encode_values
from metaq.testing import BrokerProcess, wait_until

PASSWORDS = {"alice": "alice pw", "bob": "bob pw", "root": "root pw"}


def add_user(name: str, *where: str) -> None:
    done = metaq("acl", "user", "add", name, *where, env={**os.environ, "METAQ_PASSWORD": PASSWORDS[name]})
    assert done.returncode == 0, done.stderr


def acl(*args: str) -> None:
    done = metaq("acl", *args)
    assert done.returncode == 0, done.stderr


def client(proc: BrokerProcess, user: str) -> BlockingClient:
    return BlockingClient(proc.servers, username=user, password=PASSWORDS[user])


def produce(c: BlockingClient, topic: str, value: bytes = b"x", partition: str = "0-0") -> None:
    c.produce(topic, partition, encode_values([value], 1))


def fetch(c: BlockingClient, topic: str) -> list[bytes]:
    return [bytes(r.data) for r in decode_fetched(c.fetch(topic, "0-0", 0, 1 << 20).records, topic, 0, 0)[0]]


@pytest.fixture
def acl_broker(broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> BrokerProcess:
    where = ["--data-path", str(tmp_path / "broker")]
    for user in PASSWORDS:
        add_user(user, *where)
    # create: alice's first produce to "a" creates it (autoCreateTopics)
    acl("add", "--principal", "User:alice", "--topic", "a", "-o", "produce", "-o", "consume", "-o", "create", *where)
    acl("add", "--principal", "User:alice", "--topic", "logs-", "--prefix", "-o", "consume", *where)
    acl("add", "--principal", "User:alice", "--topic", "logs-secret", "-o", "consume", "--deny", *where)
    acl("add", "--principal", "User:alice", "--group", "g", "-o", "consume", *where)
    return broker_factory({"numPartitions": 1, "unflushThreshold": 0, "authRequired": True, "aclEnabled": True,
                           "superUsers": "User:root"})


def test_a_user_allowed_topic_a_cannot_touch_b_nor_delete_a(acl_broker: BrokerProcess) -> None:
    with client(acl_broker, "root") as root:
        for topic in ("a", "b", "logs-web", "logs-secret"):
            produce(root, topic, topic.encode())
    with client(acl_broker, "alice") as alice:
        produce(alice, "a", b"mine")
        assert fetch(alice, "a") == [b"a", b"mine"]
        with pytest.raises(TopicAuthorizationError, match="User:alice may not produce topic 'b'"):
            produce(alice, "b")
        with pytest.raises(TopicAuthorizationError, match="may not consume topic 'b'"):
            fetch(alice, "b")
        with pytest.raises(TopicAuthorizationError, match="may not admin topic 'a'"):
            alice.request(m.DeleteTopicRequest(topic="a"))
        with pytest.raises(ClusterAuthorizationError):
            alice.request(m.ReloadRequest())
        # prefix: every topic starting with logs-; deny beats it for logs-secret
        assert fetch(alice, "logs-web") == [b"logs-web"]
        with pytest.raises(TopicAuthorizationError):
            fetch(alice, "logs-secret")
        with pytest.raises(TopicAuthorizationError):
            produce(alice, "logs-web")
        # the refusal does not close the connection: allowed requests go on
        assert fetch(alice, "a") == [b"a", b"mine"]
    with client(acl_broker, "bob") as bob, pytest.raises(TopicAuthorizationError):  # no ACL at all: nothing
        fetch(bob, "a")
    with client(acl_broker, "root") as root:  # a super-user may do everything
        root.request(m.DeleteTopicRequest(topic="b"))


def test_groups_need_their_own_acl(acl_broker: BrokerProcess) -> None:
    with client(acl_broker, "alice") as alice:
        alice.request(m.OffsetFetchRequest(group="g"))
        with pytest.raises(GroupAuthorizationError, match="group 'other'"):
            alice.request(m.OffsetFetchRequest(group="other"))
        with pytest.raises(GroupAuthorizationError):
            alice.request(m.JoinGroupRequest(group="other", client_id="c"))


def test_acl_changes_apply_without_restart_and_the_cli_lists_them(acl_broker: BrokerProcess) -> None:
    where = ["--data-path", str(acl_broker.data_dir)]
    with client(acl_broker, "root") as root:
        produce(root, "c", b"c")
    with client(acl_broker, "bob") as bob:
        with pytest.raises(TopicAuthorizationError):
            fetch(bob, "c")
        acl("add", "--principal", "User:bob", "--topic", "c", "-o", "consume", *where)
        wait_until(lambda: _can_fetch(bob, "c"), 10, message="the new ACL applied")
        acl("add", "--principal", "User:*", "--topic", "c", "-o", "all", "--deny", *where)
        wait_until(lambda: not _can_fetch(bob, "c"), 10, message="a deny for everyone applied")
    listed = metaq("acl", "list", *where).stdout.splitlines()
    assert "allow User:bob consume on topic literal 'c'" in listed
    assert "deny User:* all on topic literal 'c'" in listed
    assert "allow User:alice consume on topic prefix 'logs-'" in listed
    acl("remove", "--principal", "User:*", "--topic", "c", "-o", "all", "--deny", *where)
    with client(acl_broker, "bob") as bob:
        wait_until(lambda: _can_fetch(bob, "c"), 10, message="the deny removed")
    gone = metaq("acl", "remove", "--principal", "User:nobody", "--topic", "c", "-o", "all", *where)
    assert gone.returncode == 1 and "no such entry" in gone.stderr


def _can_fetch(c: BlockingClient, topic: str) -> bool:
    try:
        fetch(c, topic)
        return True
    except TopicAuthorizationError:
        return False


def test_acl_enabled_needs_auth_required(broker_factory: Callable[..., BrokerProcess]) -> None:
    proc = broker_factory({"aclEnabled": True}, start=False, name="no-auth")
    proc.expect_exit_code(2)
    with pytest.raises(Exception, match="aclEnabled needs authRequired"):
        proc.start()


@pytest.mark.slow
def test_cluster_mode_acls_in_zookeeper(cluster_factory: Callable[..., BrokerProcess], zookeeper: Any,
                                        zk_root: str) -> None:
    zk = ["-z", zookeeper.connect_string, "--zk-root", zk_root]
    for user in ("alice", "root"):
        add_user(user, *zk)
    acl("add", "--principal", "User:alice", "--topic", "a", "-o", "produce", "-o", "create", *zk)  # auto-created
    proc = cluster_factory(1, authRequired=True, aclEnabled=True, superUsers="User:root")
    with client(proc, "alice") as alice:
        produce(alice, "a", partition="1-0")
        with pytest.raises(TopicAuthorizationError):
            produce(alice, "b", partition="1-0")
        acl("add", "--principal", "User:alice", "--topic", "b", "-o", "produce", "-o", "create", *zk)
        wait_until(lambda: _can_produce(alice, "b"), 10, message="the ZooKeeper ACL applied")
    assert metaq("acl", "list", *zk).stdout.splitlines() == ["allow User:alice produce on topic literal 'a'",
                                                             "allow User:alice create on topic literal 'a'",
                                                             "allow User:alice produce on topic literal 'b'",
                                                             "allow User:alice create on topic literal 'b'"]


def _can_produce(c: BlockingClient, topic: str) -> bool:
    try:
        produce(c, topic, partition="1-0")
        return True
    except TopicAuthorizationError:
        return False


def test_async_producer_gets_the_authorization_error(acl_broker: BrokerProcess) -> None:
    async def main() -> Any:
        async with await MessageSessionFactory.connect(acl_broker.servers, sasl_username="alice",
                                                       sasl_password=PASSWORDS["alice"]) as session:
            producer = session.create_producer()
            ok = await producer.send(Message("a", b"fine"))
            refused = await producer.send(Message("b", b"no"))
            return ok, refused

    ok, refused = asyncio.run(main())
    assert ok.success
    assert not refused.success and "TOPIC_AUTHORIZATION_FAILED" in str(refused.error)


def test_metadata_shows_only_the_topics_a_principal_may_describe(acl_broker: BrokerProcess) -> None:
    with client(acl_broker, "root") as root:
        for topic in ("a", "b", "logs-web", "logs-secret"):
            produce(root, topic, topic.encode())
        assert {"a", "b", "logs-web", "logs-secret"} <= {t.name for t in root.request(m.MetadataRequest()).topics}
    with client(acl_broker, "alice") as alice:
        every = alice.request(m.MetadataRequest())
        # b: no allow; logs-secret: its deny is of consume, and the logs- prefix's consume implies describe
        assert sorted(t.name for t in every.topics) == ["a", "logs-secret", "logs-web"]
        named = {t.name: t for t in alice.request(m.MetadataRequest(topics=["a", "b", "nothing-here"])).topics}
        assert named["a"].error_code == 0 and named["a"].partitions
        for hidden in ("b", "nothing-here"):  # refused alike: whether it exists is not told
            assert named[hidden].error_code == TopicAuthorizationError.code and not named[hidden].partitions
    with client(acl_broker, "bob") as bob:
        assert bob.request(m.MetadataRequest()).topics == []


def test_a_multi_fetch_needs_consume_on_every_topic_it_names(acl_broker: BrokerProcess) -> None:
    with client(acl_broker, "root") as root:
        for topic in ("a", "b", "logs-web"):
            produce(root, topic, topic.encode())
    with client(acl_broker, "alice") as alice:
        allowed = alice.request(m.MultiFetchRequest(0, 1, 1 << 20, "", [
            m.FetchPartition("a", 0, 0, 1 << 16), m.FetchPartition("logs-web", 0, 0, 1 << 16)]))
        assert [bytes(r.data) for p in allowed.partitions
                for r in decode_fetched(p.records, p.topic, 0, 0)[0]] == [b"a", b"logs-web"]
        # one topic she may not read refuses the whole request, and nothing of "a" is sent either
        with pytest.raises(TopicAuthorizationError, match="may not consume topic 'b'"):
            alice.request(m.MultiFetchRequest(0, 1, 1 << 20, "", [
                m.FetchPartition("a", 0, 0, 1 << 16), m.FetchPartition("b", 0, 0, 1 << 16)]))


def test_a_multi_produce_needs_produce_on_every_topic_it_names(acl_broker: BrokerProcess) -> None:
    def request(*topics: str) -> m.MultiProduceRequest:
        return m.MultiProduceRequest(1, 5000, "", [m.ProducePartition(t, 0, encode_values([t.encode()], 1))
                                                   for t in topics])

    with client(acl_broker, "alice") as alice:
        allowed = alice.request(request("a", "a"))
        assert [(p.topic, p.error_code, p.base_offset) for p in allowed.partitions] == [("a", 0, 0), ("a", 0, 1)]
        # one topic she may not write (consume on logs-* is not produce) refuses the whole request:
        # nothing of "a" is stored either
        for refused in (request("a", "logs-web"), request("b", "a")):
            with pytest.raises(TopicAuthorizationError, match=r"may not produce topic '(logs-web|b)'"):
                alice.request(refused)
        assert fetch(alice, "a") == [b"a", b"a"]
    with client(acl_broker, "root") as root:  # a super-user may write anywhere
        assert [p.error_code for p in root.request(request("b", "logs-web")).partitions] == [0, 0]
