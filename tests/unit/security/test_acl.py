"""ACL decisions: literal and prefix patterns, deny beats allow, super-users, describe implied, and what
each request needs."""

from __future__ import annotations

from pathlib import Path

import pytest

from metaq.broker.authorization import check, required
from metaq.errors import ClusterAuthorizationError, GroupAuthorizationError, TopicAuthorizationError
from metaq.protocol import messages as m
from metaq.security.acl import AclEntry, AclFile, Acls, decode_acls, encode_acls, parse_super_users

ALICE = "User:alice"


def test_literal_prefix_deny_and_super_users() -> None:
    acls = Acls([
        AclEntry(ALICE, "topic", "orders", "produce"),
        AclEntry(ALICE, "topic", "logs-", "consume", pattern_type="prefix"),
        AclEntry(ALICE, "topic", "logs-secret", "consume", permission="deny"),
        AclEntry("User:*", "topic", "public", "consume"),
    ], super_users=["User:root"])
    assert acls.allows(ALICE, "topic", "orders", "produce")
    assert not acls.allows(ALICE, "topic", "orders", "consume")
    assert not acls.allows(ALICE, "topic", "orders2", "produce"), "a literal pattern is the whole name"
    assert not acls.allows(ALICE, "topic", "orders", "admin")
    assert acls.allows(ALICE, "topic", "orders", "describe"), "produce implies describe"
    assert acls.allows(ALICE, "topic", "logs-web", "consume")
    assert not acls.allows(ALICE, "topic", "logs-secret", "consume"), "deny beats the prefix allow"
    assert acls.allows("User:bob", "topic", "public", "consume") and not acls.allows("User:bob", "topic", "orders",
                                                                                       "produce")
    assert acls.allows("User:root", "cluster", "cluster", "admin")
    assert not acls.allows(ALICE, "group", "orders", "produce"), "resource types do not mix"


def test_entries_are_checked_and_round_trip(tmp_path: Path) -> None:
    for bad in (dict(principal="alice"), dict(resource_type="queue"), dict(operation="write"),
                dict(permission="maybe"), dict(pattern_type="regex"), dict(pattern="")):
        with pytest.raises(ValueError):
            AclEntry(**{**dict(principal=ALICE, resource_type="topic", pattern="t", operation="produce"), **bad})
    with pytest.raises(ValueError, match="cluster"):
        AclEntry(ALICE, "cluster", "x", "admin")
    acls = Acls([AclEntry(ALICE, "topic", "t", "all", "deny", "prefix")])
    assert decode_acls(encode_acls(acls)).entries == acls.entries
    assert parse_super_users("User:a; User:b,User:c") == ("User:a", "User:b", "User:c")
    with pytest.raises(ValueError):
        parse_super_users("alice")
    store = AclFile(tmp_path / "acls.json")
    entry = AclEntry(ALICE, "group", "g", "consume")
    assert store.update("add", entry) and not store.update("add", entry)
    assert decode_acls(store.read_bytes()).entries == (entry,)
    assert store.update("remove", entry) and not store.update("remove", entry)


def test_what_each_request_needs() -> None:
    assert required(m.ProduceRequest(topic="a")) == [("topic", "a", "produce")]
    assert required(m.FetchRequest(topic="a")) == [("topic", "a", "consume")]
    assert required(m.DeleteTopicRequest(topic="a")) == [("topic", "a", "admin")]
    assert required(m.PartitionStateRequest(topic="a")) == [("topic", "a", "admin")]
    assert required(m.JoinGroupRequest(group="g")) == [("group", "g", "consume")]
    assert required(m.ReloadRequest()) == [("cluster", "cluster", "admin")]
    assert required(m.PromoteRequest()) == [("cluster", "cluster", "admin")]
    assert required(m.MetadataRequest()) == [] and required(m.SaslHandshakeRequest()) == []
    for spec in m.APIS.values():  # every API needs something or is deliberately free
        required(spec.request())
    acls = Acls([AclEntry(ALICE, "topic", "a", "produce")])
    check(acls, ALICE, m.ProduceRequest(topic="a"))
    with pytest.raises(TopicAuthorizationError, match="may not consume topic 'a'"):
        check(acls, ALICE, m.FetchRequest(topic="a"))
    with pytest.raises(GroupAuthorizationError):
        check(acls, ALICE, m.OffsetCommitRequest(group="g"))
    with pytest.raises(ClusterAuthorizationError):
        check(acls, ALICE, m.ReloadRequest())
