"""Issue 39's holes 5, 7 and 8 against a broker locked down as docs/security.md says
(tests/integration/security/lockdown.py).

What a user relies on: a principal sees the offsets, partitions and lag of the topics it may read only, over
every group API (binary and HTTP) and the dashboard, and a forbidden topic is answered the same whether it
exists or not; creating a topic, also by producing to it, needs the ``create`` right; a transaction needs a
right on its transaction id, not cluster ``admin``, and one principal cannot end another's transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from lockdown import LockedDown, acl, start_locked_down

from metaq.errors import (
    ClusterAuthorizationError,
    GroupAuthorizationError,
    TopicAuthorizationError,
    TransactionAuthorizationError,
)
from metaq.protocol import messages as m
from metaq.protocol.records import encode_values
from metaq.testing import BrokerProcess, wait_until

TOPIC_AUTH = TopicAuthorizationError.code


@pytest.fixture
def locked(broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> LockedDown:
    return start_locked_down(broker_factory, tmp_path)


def commit(client: object, group: str, *entries: tuple[str, int]) -> m.OffsetCommitResponse:
    offsets = [m.OffsetEntry(topic, 0, 0, offset) for topic, offset in entries]
    return client.request(m.OffsetCommitRequest(group=group, offsets=offsets))  # type: ignore[attr-defined]


def test_group_offsets_show_and_take_only_readable_topics(locked: LockedDown) -> None:
    with locked.client("root") as root:
        for topic in ("orders", "audit", "payroll"):
            root.produce(topic, "0-0", encode_values([b"x"] * 10, 1))
        commit(root, "bob-group", ("orders", 5), ("audit", 3))
    with locked.client("bob") as bob:
        every = bob.request(m.OffsetFetchRequest(group="bob-group"))
        assert [(o.topic, o.offset) for o in every.offsets] == [("audit", 3)], "only the topics bob may read"
        named = bob.request(m.OffsetFetchRequest(group="bob-group", partitions=[
            m.TopicPartitionRef("orders", 0, 0), m.TopicPartitionRef("no-such-topic", 0, 0),
            m.TopicPartitionRef("audit", 0, 0)]))
        assert [(o.topic, o.offset, o.error_code) for o in named.offsets] == [
            ("orders", -1, TOPIC_AUTH), ("no-such-topic", -1, TOPIC_AUTH), ("audit", 3, 0)], \
            "forbidden and missing topics answered alike"
        reply = bob.request(m.OffsetCommitRequest(group="bob-group", offsets=[
            m.OffsetEntry("orders", 0, 0, 9), m.OffsetEntry("no-such-topic", 0, 0, 9),
            m.OffsetEntry("audit", 0, 0, 7)]))
        assert [(r.topic, r.error_code) for r in reply.results] == [
            ("orders", TOPIC_AUTH), ("no-such-topic", TOPIC_AUTH), ("audit", 0)]
    with locked.client("root") as root:
        offsets = {o.topic: o.offset for o in root.request(m.OffsetFetchRequest(group="bob-group")).offsets}
        assert offsets == {"orders": 5, "audit": 7}, "bob's commit for orders was not taken"
    # the HTTP group routes go through the same requests
    reply = locked.http("GET", "/groups/bob-group/offsets", "bob")
    assert reply.status == 200 and [o["topic"] for o in reply.json["offsets"]] == ["audit"], reply
    reply = locked.http("POST", "/groups/bob-group/offsets", "bob",
                        {"offsets": [{"topic": "orders", "partition": 0, "offset": 1}]})
    assert reply.status == 403 and reply.json["error"]["name"] == "TOPIC_AUTHORIZATION_FAILED", reply
    locked.documented("POST", "/groups/{group}/offsets", reply)


def test_join_group_lists_and_describes_only_readable_topics(locked: LockedDown) -> None:
    with locked.client("bob") as bob:
        for topics in (["orders", "payroll"], ["audit", "payroll"], ["no-such-topic"]):
            with pytest.raises(TopicAuthorizationError, match="may not consume topic"):
                bob.request(m.JoinGroupRequest(group="bob-group", client_id="c", topics=topics))
        joined = bob.request(m.JoinGroupRequest(group="bob-group", client_id="c", topics=["audit"]))
        assert [a.topic for a in joined.assignment] == ["audit"]
        bob.request(m.LeaveGroupRequest(group="bob-group", member_id=joined.member_id))
        with pytest.raises(GroupAuthorizationError):
            bob.request(m.MultiFetchRequest(group="payroll-team", partitions=[m.FetchPartition("audit", 0, 0)]))
        with pytest.raises(GroupAuthorizationError):
            bob.request(m.FetchRequest(topic="audit", partition=0, offset=0, group="payroll-team"))
    with locked.client("root") as root:  # a member of bob's group (root) reads orders
        commit(root, "payroll-team", ("payroll", 0))
        root.request(m.JoinGroupRequest(group="bob-group", client_id="root", topics=["orders"],
                                        session_timeout_ms=60_000, rebalance_timeout_ms=60_000))
        with locked.client("bob") as bob:
            described = bob.request(m.DescribeGroupRequest(group="bob-group"))
            assert described.members and all(not mb.assignment for mb in described.members), described
            assert bob.request(m.ListGroupsRequest()).groups == ["bob-group"]
        assert set(root.request(m.ListGroupsRequest()).groups) >= {"bob-group", "payroll-team"}
    reply = locked.http("GET", "/groups", "bob")
    assert reply.status == 200 and reply.json["groups"] == ["bob-group"], reply


def test_the_dashboard_shows_only_what_the_principal_may_describe(locked: LockedDown) -> None:
    with locked.client("root") as root:
        root.produce("payroll", "0-0", encode_values([b"x"] * 10, 1))
        root.produce("audit", "0-0", encode_values([b"x"] * 10, 1))
        commit(root, "payroll-team", ("payroll", 1))
        commit(root, "bob-group", ("audit", 2), ("payroll", 3))

    def history_lag(user: str) -> dict[str, int]:
        reply = locked.http("GET", "/api/history", user, base=locked.dashboard)
        assert reply.status == 200, reply
        samples = reply.json["samples"]
        return samples[-1]["lag"] if samples else {}

    wait_until(lambda: "payroll-team" in history_lag("root"), 30, message="a history sample with the groups' lag")
    assert set(history_lag("bob")) == {"bob-group"}
    groups = locked.http("GET", "/api/groups", "bob", base=locked.dashboard).json["groups"]
    assert [g["name"] for g in groups] == ["bob-group"]
    assert [p["topic"] for p in groups[0]["partitions"]] == ["audit"] and groups[0]["lag"] == 8
    topics = locked.http("GET", "/api/topics", "bob", base=locked.dashboard).json["topics"]
    assert [t["name"] for t in topics] == ["audit"]


def test_creating_a_topic_needs_the_create_right_also_by_producing(locked: LockedDown, tmp_path: Path) -> None:
    where = ["--data-path", str(tmp_path / "broker")]
    acl(where, "add", "--principal", "User:alice", "--topic", "tmp-", "--prefix", "-o", "produce")
    with locked.client("alice") as alice:
        def refusal() -> str:
            try:
                alice.produce("tmp-0", "0-0", encode_values([b"x"], 1))
            except TopicAuthorizationError as exc:
                return str(exc)
            return "stored"

        wait_until(lambda: "may not produce" not in refusal(), 10, message="alice's produce ACL on tmp-")
        for n in range(3):  # auto-create is on (the default), but alice may not create
            with pytest.raises(TopicAuthorizationError, match="may not create topic 'tmp-"):
                alice.produce(f"tmp-{n}", "0-0", encode_values([b"x"], 1))
            with pytest.raises(TopicAuthorizationError, match="may not create"):
                alice.request(m.MultiProduceRequest(acks=1, partitions=[
                    m.ProducePartition(f"tmp-{n}", 0, encode_values([b"x"], 1))]))
            with pytest.raises(TopicAuthorizationError, match="may not create"):
                alice.request(m.CreateTopicRequest(f"tmp-{n}", 1, []))
        reply = locked.http("POST", "/topics/tmp-http/messages", "alice", {"payload": "x"})
        assert reply.status == 403 and "may not create" in reply.json["error"]["message"], reply
        locked.documented("POST", "/topics/{topic}/messages", reply)
        with locked.client("root") as root:
            names = {t.name for t in root.request(m.MetadataRequest()).topics}
        assert not {n for n in names if n.startswith("tmp-")}, names
        acl(where, "add", "--principal", "User:alice", "--topic", "tmp-", "--prefix", "-o", "create")

        def created() -> bool:
            try:
                alice.produce("tmp-0", "0-0", encode_values([b"x"], 1))
                return True
            except TopicAuthorizationError:
                return False

        wait_until(created, 10, message="the create ACL to apply")
        alice.request(m.CreateTopicRequest("tmp-1", 1, []))
        with pytest.raises(TopicAuthorizationError, match="may not create topic 'other'"):
            alice.request(m.CreateTopicRequest("other", 1, []))
    lines = locked.audit_lines()
    assert any("operation=create resource=topic:tmp-2 result=denied" in line and "principal=User:alice" in line
               for line in lines), lines
    assert any("operation=create-topic resource=topic:tmp-0 result=done" in line for line in lines), lines


def test_transactions_need_a_transaction_right_and_are_their_owners(locked: LockedDown, tmp_path: Path) -> None:
    where = ["--data-path", str(tmp_path / "broker")]
    with locked.client("alice") as alice, pytest.raises(TransactionAuthorizationError,
                                                        match="may not produce transaction id 'alice-1'"):
        alice.request(m.TransactionRequest(op=m.TX_BEGIN, transaction_id="alice-1"))
    acl(where, "add", "--principal", "User:alice", "--transaction", "alice-", "--prefix", "-o", "produce")
    acl(where, "add", "--principal", "User:bob", "--transaction", "a", "--prefix", "-o", "produce")
    with locked.client("alice") as alice, locked.client("bob") as bob:
        def began() -> bool:
            try:
                alice.request(m.TransactionRequest(op=m.TX_BEGIN, transaction_id="alice-1"))
                return True
            except TransactionAuthorizationError:
                return False

        wait_until(began, 10, message="alice's transaction ACL")  # no cluster admin needed

        def bob_may() -> bool:
            try:
                bob.request(m.TransactionRequest(op=m.TX_STATUS, transaction_id="a-probe"))
                return True
            except TransactionAuthorizationError:
                return False

        wait_until(bob_may, 10, message="bob's transaction ACL")
        alice.request(m.TransactionRequest(op=m.TX_PREPARE, transaction_id="alice-1", xid="xa-1"))
        # bob may use transaction ids starting with "a" too, but not alice's transaction
        for op in (m.TX_ROLLBACK, m.TX_COMMIT, m.TX_STATUS, m.TX_PREPARE):
            with pytest.raises(TransactionAuthorizationError, match="begun by another principal"):
                bob.request(m.TransactionRequest(op=op, transaction_id="alice-1", xid="xa-1"))
        assert bob.request(m.TransactionRequest(op=m.TX_RECOVER)).xids == []
        assert alice.request(m.TransactionRequest(op=m.TX_RECOVER)).xids == ["xa-1"]
        with pytest.raises(ClusterAuthorizationError):  # Reload and Verify still need cluster admin
            alice.request(m.ReloadRequest())
        alice.request(m.TransactionRequest(op=m.TX_ROLLBACK, transaction_id="alice-1"))
        status = alice.request(m.TransactionRequest(op=m.TX_STATUS, transaction_id="alice-1")).xids
        assert status[0].startswith("rolled back")
    with locked.client("root") as root:  # a super-user sees every prepared transaction
        assert root.request(m.TransactionRequest(op=m.TX_RECOVER)).xids == []


def test_a_produce_to_a_missing_topic_it_may_not_describe_says_no_more(locked: LockedDown) -> None:
    with locked.client("carol") as carol:
        for topic in ("orders", "no-such-topic"):
            with pytest.raises(TopicAuthorizationError, match="may not produce"):
                carol.produce(topic, "0-0", encode_values([b"x"], 1))
