"""Issue 39's hole 1: a dead-letter redrive is no confused deputy (docs/consumers.md#dead-letters), against a
broker locked down as docs/security.md says (tests/integration/security/lockdown.py).

bob may read ``audit``, use group ``bob-group`` and write ``%DLQ%bob-group`` (as every dead-lettering consumer
must); the operator (root) redrives that group's dead letters. What a user relies on: bob cannot have the
redrive write into ``orders`` (where he may not write), nor put into ``audit`` anything that was not there: only
what the broker proved was a copy of a message of ``audit`` is sent back, to ``audit``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from lockdown import PASSWORDS, LockedDown, start_locked_down

from metaq.client import Message, MessageSessionFactory
from metaq.client.group import ConsumerConfig, PartitionContext, create_consumer
from metaq.client.group.dead_letter import dead_letters, redrive
from metaq.errors import InvalidRequestError, TopicAuthorizationError
from metaq.protocol import messages as m
from metaq.protocol.dead_letters import PROVENANCE, Provenance
from metaq.protocol.records import decode_fetched, encode_messages
from metaq.testing import BrokerProcess, until

DLQ = "%DLQ%bob-group"


def letter(payload: bytes, topic: str, offset: int, **headers: str) -> bytes:
    """A batch of one message dressed as a dead letter of ``topic`` 0-0@``offset``."""
    h = [("dlq-original-topic", topic.encode()), ("dlq-original-partition", b"0-0"),
         ("dlq-original-offset", str(offset).encode()), *((k, v.encode()) for k, v in headers.items())]
    return encode_messages([Message(DLQ, payload, headers=h)], now_ms=1)


async def session_of(locked: LockedDown, user: str) -> MessageSessionFactory:
    return await MessageSessionFactory.connect(locked.servers, tls_ca_file=str(locked.pki.ca), sasl_username=user,
                                               sasl_password=PASSWORDS[user])


def read_all(locked: LockedDown, topic: str) -> list[Message]:
    with locked.client("root") as root:
        reply = root.fetch(topic, "0-0", 0, 1 << 20)
    return decode_fetched(reply.records, topic, 0, 0)[0]


def test_bob_cannot_redrive_into_orders_nor_inject_into_audit(broker_factory: Callable[..., BrokerProcess],
                                                             tmp_path: Path) -> None:
    locked = start_locked_down(broker_factory, tmp_path, topics=("orders", "audit", DLQ))
    with locked.client("root") as root:
        root.produce("audit", "0-0", encode_messages([Message("audit", b"a%d" % i, key=b"k%d" % i)
                                                     for i in range(3)], now_ms=1))
    with locked.client("bob") as bob:
        # the attack: a dead letter "of orders", written by hand
        with pytest.raises(TopicAuthorizationError, match="may not consume topic 'orders'"):
            bob.produce(DLQ, "0-0", letter(b"to orders", "orders", 0))
        # a forged copy of a message of audit that is here to compare with
        with pytest.raises(InvalidRequestError, match="is not a copy of the message at audit 0-0@1"):
            bob.produce(DLQ, "0-0", letter(b"forged", "audit", 1))
        # not here to compare with (past the end): stored, but unverified; its own provenance header is replaced
        bob.produce(DLQ, "0-0", letter(b"injected", "audit", 999, **{
            PROVENANCE: "v1;writer=User:root;topic=orders;partition=0-0;offset=0;copy=exact;may-produce=yes"}))

    async def dead_letter_one() -> None:  # the consumer library, acting for bob's group, dead-letters a2
        session = await session_of(locked, "bob")
        calls: list[bytes] = []

        def listener(msg: Message, ctx: PartitionContext) -> None:
            calls.append(bytes(msg.data))
            if msg.data == b"a2":
                raise ValueError("poison")

        consumer = create_consumer(session, ConsumerConfig(
            group="bob-group", recover_dir=tmp_path / "recover", rejection_policy="dead-letter", max_fetch_retries=0,
            session_timeout_ms=6000, rebalance_timeout_ms=12000, commit_offset_period_ms=200,
            max_delay_fetch_ms=200)).subscribe("audit", 64 * 1024, listener)
        await consumer.complete_subscribe()
        await until(lambda: consumer.dead_letters is not None and consumer.dead_letters.sent == 1,
                    timeout_s=60, message="a2 dead-lettered")
        await consumer.close()
        await session.close()

    asyncio.run(dead_letter_one())

    async def operator() -> tuple[Any, list[Any]]:
        session = await session_of(locked, "root")
        try:
            listed = [d async for d in dead_letters(session, "bob-group")]
            return await redrive(session, "bob-group"), listed
        finally:
            await session.close()

    result, listed = asyncio.run(operator())
    provenances = [d.provenance for d in listed]
    assert [(p.writer, p.topic, p.copy, p.may_produce) for p in provenances if p is not None] == [
        ("User:bob", "audit", "unverified", False), ("User:bob", "audit", "exact", False)], provenances
    assert result.redriven == {"audit": 1} and result.refused == 1, result
    assert "User:bob, who may not produce to audit" in result.refusals[0]
    assert read_all(locked, "orders") == [], "nothing reached orders"
    audit = [bytes(msg.data) for msg in read_all(locked, "audit")]
    assert audit == [b"a0", b"a1", b"a2", b"a2"], "only the proven copy of a2 came back"
    redriven = read_all(locked, "audit")[-1]
    assert not any(k == PROVENANCE or k.startswith("dlq-") for k, _v in redriven.headers or ())
    lines = locked.audit_lines()
    assert any("principal=User:bob operation=consume resource=topic:orders result=denied" in line
               or ("User:bob" in line and "orders" in line and "denied" in line) for line in lines), lines


def test_a_provenance_header_is_the_brokers_own(broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    locked = start_locked_down(broker_factory, tmp_path, topics=("audit", DLQ))
    with locked.client("root") as root:
        root.produce("audit", "0-0", encode_messages([Message("audit", b"a0", key=b"k")], now_ms=1))
        stored = decode_fetched(root.fetch("audit", "0-0", 0, 1 << 20).records, "audit", 0, 0)[0][0]
        with locked.client("bob") as bob:
            bob.produce(DLQ, "0-0", encode_messages([Message(DLQ, b"a0", key=b"k", headers=[
                ("dlq-original-topic", b"audit"), ("dlq-original-partition", b"0-0"), ("dlq-original-offset", b"0"),
                ("dlq-original-message-id", b"%032x" % stored.id),
                (PROVENANCE, b"v1;writer=User:root;topic=audit;partition=0-0;offset=0;copy=exact;may-produce=yes")])],
                now_ms=1))
            with pytest.raises(InvalidRequestError, match="does not name where it came from"):
                bob.produce(DLQ, "0-0", encode_messages([Message(DLQ, b"plain")], now_ms=1))
            with pytest.raises(InvalidRequestError, match="not a copy"):  # the right payload, a wrong message id
                bob.produce(DLQ, "0-0", encode_messages([Message(DLQ, b"a0", key=b"k", headers=[
                    ("dlq-original-topic", b"audit"), ("dlq-original-partition", b"0-0"),
                    ("dlq-original-offset", b"0"), ("dlq-original-message-id", b"%032x" % (stored.id + 1))])],
                    now_ms=1))
        dead = decode_fetched(root.fetch(DLQ, "0-0", 0, 1 << 20).records, DLQ, 0, 0)[0]
    assert len(dead) == 1
    values = [bytes(v) for k, v in dead[0].headers or () if k == PROVENANCE]
    assert len(values) == 1
    assert Provenance.parse(values[0]) == Provenance("User:bob", "audit", "0-0", 0, "exact", False)
    with locked.client("root") as root:
        assert root.request(m.MetadataRequest(topics=[DLQ])).topics[0].error_code == 0
