"""Issue 39's pieces that need no broker: mock SCRAM credentials, the audit line, a dead letter's provenance,
and what each request needs of the ACLs (create, transaction ids, group APIs)."""

from __future__ import annotations

import hashlib

import pytest

from metaq.broker.audit import line
from metaq.broker.authorization import allowed, check, required
from metaq.errors import TopicAuthorizationError, TransactionAuthorizationError
from metaq.protocol import messages as m
from metaq.protocol.dead_letters import Provenance
from metaq.security.acl import AclEntry, Acls
from metaq.security.scram import MockCredentials, ScramServer


def test_mock_credentials_are_stable_secret_and_drawn_from_the_stored_counts() -> None:
    counts = [4096, 4096, 100_000]
    mock = MockCredentials(b"k" * 32, lambda: counts)
    other = MockCredentials(b"j" * 32, lambda: counts)
    a = mock.credential("mallory")
    assert a == mock.credential("mallory"), "the same answer each time, as for a real user"
    assert a.salt != hashlib.sha256(b"mallory").digest()[:16] and a.salt != other.credential("mallory").salt
    assert {mock.credential(f"u{i}").iterations for i in range(200)} == {4096, 100_000}
    server = ScramServer()
    server.parse_first(b"n,,n=mallory,r=abc")
    first = server.first(None, mock=a).decode()
    assert f"i={a.iterations}" in first and server.stored_key is None


def test_an_audit_line_keeps_its_fields_in_order_and_quotes_what_needs_it() -> None:
    text = line("User:bob", "produce", "topic:orders", "denied", "10.0.0.9:5", 'Produce "x" y')
    assert text == ('principal=User:bob operation=produce resource=topic:orders result=denied client=10.0.0.9:5 '
                    'detail="Produce \\"x\\" y"')
    assert line(None, "acl-add", "acl", "done", None) == ("principal=- operation=acl-add resource=acl result=done "
                                                          "client=-")


def test_a_provenance_round_trips_and_says_what_a_redrive_may_do() -> None:
    p = Provenance("User:bob", "audit", "0-0", 17, "exact", False)
    assert Provenance.parse(p.header_value()) == p and p.redrivable
    assert not Provenance("User:bob", "audit", "0-0", 17, "unverified", False).redrivable
    assert Provenance("User:bob", "audit", "0-0", 17, "unverified", True).redrivable
    assert Provenance.parse(b"v2;whatever") is None and Provenance.parse(b"v1;writer=x") is None


def test_create_transactions_and_group_topics_in_what_requests_need() -> None:
    alice = "User:alice"
    acls = Acls([AclEntry(alice, "topic", "tmp-", "produce", pattern_type="prefix"),
                 AclEntry(alice, "transaction", "alice-", "produce", pattern_type="prefix")])
    produce = m.ProduceRequest(topic="tmp-1")
    assert required(produce, missing=lambda t: True) == [("topic", "tmp-1", "produce"), ("topic", "tmp-1", "create")]
    check(acls, alice, produce)  # exists: produce is enough
    with pytest.raises(TopicAuthorizationError, match="may not create topic 'tmp-1'"):
        check(acls, alice, produce, missing=lambda t: True)
    assert allowed(Acls([AclEntry(alice, "cluster", "cluster", "create")]), alice, "topic", "x", "create")
    assert allowed(Acls([AclEntry(alice, "topic", "x", "admin")]), alice, "topic", "x", "create")
    check(acls, alice, m.TransactionRequest(op=m.TX_BEGIN, transaction_id="alice-7"))
    with pytest.raises(TransactionAuthorizationError):
        check(acls, alice, m.TransactionRequest(op=m.TX_ROLLBACK, transaction_id="bob-1"))
    assert required(m.TransactionRequest(op=m.TX_RECOVER)) == []
    join = m.JoinGroupRequest(group="g", topics=["a"], partitions=[m.TopicAssignment("b", [])])
    assert required(join) == [("group", "g", "consume"), ("topic", "a", "consume"), ("topic", "b", "consume")]
    assert ("group", "f", "consume") in required(m.MultiFetchRequest(group="f"))
    assert required(m.ListGroupsRequest()) == []
