"""The ``dead-letter`` rejection policy and ``metaq group redrive`` against real brokers."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import uvloop
from cli_process import metaq

from metaq.client import Message, MessageSessionFactory
from metaq.client.group import ConsumerConfig, PartitionContext, create_consumer
from metaq.client.group.admin import describe_group
from metaq.client.group.dead_letter import DeadLetter, dead_letters, redrive
from metaq.client.selectors import KeyHashSelector
from metaq.errors import ConfigError, InvalidArgument, InvalidTopicError
from metaq.testing import BrokerProcess, until
from metaq.types import format_message_id, validate_topic

FAST = {"session_timeout_ms": 1500, "rebalance_timeout_ms": 6000, "commit_offset_period_ms": 200,
        "max_delay_fetch_ms": 500, "fetch_runner_count": 2}


def run(coro: Coroutine[Any, Any, None]) -> None:
    uvloop.run(coro)


def config(group: str, tmp: Path, **kw: Any) -> ConsumerConfig:
    return ConsumerConfig(group=group, recover_dir=tmp / "recover", rejection_policy="dead-letter",
                          **{**FAST, **kw})


async def letters(session: MessageSessionFactory, group: str, **kw: Any) -> list[DeadLetter]:
    return [d async for d in dead_letters(session, group, **kw)]


async def committed(session: MessageSessionFactory, group: str, topic: str) -> dict[str, int]:
    desc = await describe_group(session, group, [topic])
    return {str(p.partition): p.committed for p in desc.partitions}


def test_failing_messages_go_to_the_dead_letter_topic_with_their_headers_after_all_retries(
        broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    broker = broker_factory({"numPartitions": 1, "autoCreateTopics": "false"})

    async def main() -> None:
        session = await MessageSessionFactory.connect(broker.servers)
        await session.admin().create_topic("orders", 2)
        producer = session.create_producer()
        sent = {}
        for i in range(20):
            r = await producer.send(Message("orders", b"m%d" % i, attribute="vip" if i % 2 else None,
                                            key=b"k%d" % i, headers=[("trace", b"t%d" % i)]), )
            assert r.success
            sent[b"m%d" % i] = r
        calls: Counter[bytes] = Counter()
        order: dict[str, list[int]] = {}
        poison = {b"m3", b"m8", b"m15"}

        def listener(msg: Message, ctx: PartitionContext) -> None:
            calls.update([bytes(msg.data)])
            if msg.data == b"m8":
                ctx.set_rollback_only()
                return
            if msg.data in poison:
                raise ValueError("cannot bill " + msg.data.decode() + " " + "x" * 5000)
            order.setdefault(str(msg.partition_id), []).append(msg.offset)

        before_ms = int(time.time() * 1000)
        c = create_consumer(session, config("billing", tmp_path, max_fetch_retries=2)).subscribe(
            "orders", 64 * 1024, listener)
        await c.complete_subscribe()
        await until(lambda: sum(calls.values()) == 17 + 3 * 3, message="every delivery")
        assert c.dead_letters is not None
        await until(lambda: c.dead_letters.sent == 3 if c.dead_letters else False, message="three dead letters")
        # exactly 1 + max_fetch_retries deliveries of each poison message, one of every other, in order
        assert {k: v for k, v in calls.items() if v != 1} == {m: 3 for m in poison}
        assert all(offsets == sorted(offsets) for offsets in order.values())
        assert sum(len(v) for v in order.values()) == 17
        # the DLQ topic was created (autoCreateTopics is off) with one partition
        assert [str(p) for p in await session.partitions("%DLQ%billing")] == ["0-0"]
        dead = await letters(session, "billing")
        assert sorted(bytes(d.message.data) for d in dead) == sorted(poison)
        for d in dead:
            msg = d.message
            original = sent[bytes(msg.data)]
            i = int(msg.data[1:])
            assert msg.key == b"k%d" % i and msg.attribute == ("vip" if i % 2 else None)
            h = {k: bytes(v).decode() for k, v in msg.headers or ()}
            assert h["trace"] == f"t{i}"
            assert h["dlq-original-topic"] == "orders"
            assert h["dlq-original-partition"] == str(original.partition_id)
            assert h["dlq-original-offset"] == str(original.offset)
            assert h["dlq-original-message-id"] == format_message_id(original.message_id)
            assert h["dlq-deliveries"] == "3"
            if msg.data == b"m8":
                assert h["dlq-error-type"] == "RollbackOnly"
            else:
                assert h["dlq-error-type"] == "ValueError"
                assert h["dlq-error-message"].startswith(f"cannot bill {msg.data.decode()} xxx")
                assert len(h["dlq-error-message"]) == 1024
            assert before_ms <= int(h["dlq-time-ms"]) <= int(time.time() * 1000)
        # and the group's offsets pass everything
        await until(lambda: c.positions() and all(v[2] == v[0] for v in c.positions().values()),
                    message="everything committed")
        ends = {str(tp.partition): pos[0] for tp, pos in c.positions().items()}
        assert sum(ends.values()) == 20
        await c.close()
        await session.close()

    run(main())


def test_topic_names_accept_the_dead_letter_prefix_and_refuse_other_percent_signs(broker: BrokerProcess) -> None:
    assert validate_topic("%DLQ%g") == "%DLQ%g"
    assert validate_topic("%DLQ%team@billing.v2") == "%DLQ%team@billing.v2"
    for bad in ("%DLQ%", "%DLQ%..", "%DLQ%a/b", "%DLQ%a%b", "a%b", "%dlq%g", "%DLQ", "x%DLQ%g", "a@b"):
        with pytest.raises(InvalidArgument):
            validate_topic(bad)
    with pytest.raises(ConfigError, match="dead-letter"):
        ConsumerConfig(group="g" * 246, rejection_policy="dead-letter")

    async def main() -> None:
        session = await MessageSessionFactory.connect(broker.servers)
        admin = session.admin()
        assert await admin.create_topic("%DLQ%g", 2) == 2
        producer = session.create_producer()
        # a dead-letter topic takes only dead letters: a message that names no original is refused
        # (docs/consumers.md#dead-letters)
        refused = await producer.send(Message("%DLQ%g", b"x"))
        assert not refused.success and "does not name where it came from" in str(refused.error)
        # the broker checks names itself (a raw request, past the client's own check)
        from metaq.protocol import messages as m
        for bad in ("a%b", "%DLQ%a%b"):
            with pytest.raises(InvalidTopicError):
                await session._core.request(m.CreateTopicRequest(bad, 1, []))
        await session.close()

    run(main())


async def _dead_letter_some(session: MessageSessionFactory, tmp_path: Path, group: str, topic: str,
                            poison: set[bytes], n: int) -> dict[bytes, Any]:
    """Produce ``n`` keyed messages (key-hash selector) to ``topic``; a group whose listener fails the
    ``poison`` ones consumes them all: returns the send results by payload."""
    producer = session.create_producer(KeyHashSelector())
    sent = {}
    for i in range(n):
        r = await producer.send(Message(topic, b"m%d" % i, key=b"key-%d" % i, headers=[("origin", b"shop")]))
        assert r.success
        sent[b"m%d" % i] = r
    seen: Counter[bytes] = Counter()

    def listener(msg: Message) -> None:
        seen.update([bytes(msg.data)])
        if msg.data in poison:
            raise RuntimeError("poison")

    c = create_consumer(session, config(group, tmp_path, max_fetch_retries=1)).subscribe(topic, 64 * 1024, listener)
    await c.complete_subscribe()
    await until(lambda: c.dead_letters is not None and c.dead_letters.sent == len(poison)
                and len(seen) == n, message="the poison messages dead-lettered")
    await c.close()
    return sent


def test_redrive_sends_dead_letters_back_once_with_their_key_and_headers(
        broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    broker = broker_factory({"numPartitions": 1})

    async def main() -> None:
        session = await MessageSessionFactory.connect(broker.servers)
        await session.admin().create_topic("orders", 3)
        await session.admin().create_topic("refunds", 1)
        poison = {b"m1", b"m4", b"m6"}
        sent = await _dead_letter_some(session, tmp_path, "billing", "orders", poison, 10)
        await _dead_letter_some(session, tmp_path, "billing", "refunds", {b"m0"}, 2)
        assert len(await letters(session, "billing")) == 4
        assert [bytes(d.message.data) for d in await letters(session, "billing", topic="refunds")] == [b"m0"]
        ends = {str(p): (await session.admin().list_offsets("orders", p)) for p in await session.partitions("orders")}

        dry = await redrive(session, "billing", dry_run=True)
        assert (dry.redriven, dry.errors) == ({"orders": 3, "refunds": 1}, [])
        assert {str(p): (await session.admin().list_offsets("orders", p))
                for p in await session.partitions("orders")} == ends  # a dry run sends nothing

        shown: list[tuple[int, int]] = []
        done = await redrive(session, "billing", topic="orders", progress=lambda d, t: shown.append((d, t)))
        assert (done.redriven, done.skipped, done.errors, done.remaining) == ({"orders": 3}, 1, [], 0)
        assert shown[-1] == (4, 4)
        back = []
        for p in await session.partitions("orders"):
            async for msg in session.create_pull_consumer().iterate("orders", p, ends[str(p)], stop_at_end=True):
                back.append(msg)
        assert sorted(bytes(m.data) for m in back) == sorted(poison)
        for msg in back:
            original = sent[bytes(msg.data)]
            assert msg.partition_id == original.partition_id  # same key, same partition
            assert msg.key == b"key-" + msg.data[1:]
            assert msg.headers == [("origin", b"shop"), ("metaq-redrive-count", b"1")]
        # the second run sends nothing new; refunds was passed over by --topic orders, and stays so
        again = await redrive(session, "billing")
        assert (again.total, again.remaining, again.errors) == (0, 0, [])
        await session.close()

    run(main())


def test_cli_lists_dead_letters_and_redrives_them(broker_factory: Callable[..., BrokerProcess],
                                                  tmp_path: Path) -> None:
    broker = broker_factory({"numPartitions": 1})

    async def setup() -> None:
        session = await MessageSessionFactory.connect(broker.servers)
        await session.admin().create_topic("orders", 2)
        await _dead_letter_some(session, tmp_path, "billing", "orders", {b"m2", b"m5"}, 8)
        await session.close()

    run(setup())
    s = ["-s", broker.servers]
    listed = metaq("group", "dlq", "billing", *s)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split("\t")[:6] == ["partition", "offset", "topic", "from", "deliveries", "dead_lettered"]
    rows = [line.split("\t") for line in lines[1:]]
    assert len(rows) == 2 and all(r[2] == "orders" and r[4] == "2" for r in rows)
    assert all(r[6] == "RuntimeError: poison" and r[8] == "origin=shop" for r in rows)
    as_json = metaq("group", "dlq", "billing", "--json", *s)
    docs = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert sorted(d["data"] for d in docs) == ["m2", "m5"]
    assert all(d["headers"]["dlq-original-topic"] == "orders" and d["headers"]["origin"] == "shop" for d in docs)
    assert metaq("group", "dlq", "nobody", *s).stderr.strip() == "no dead letters in %DLQ%nobody"

    dry = metaq("group", "redrive", "billing", "--dry-run", *s)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines() == ["orders\t2"]
    assert "would send back 2 messages from %DLQ%billing" in dry.stderr
    first = metaq("group", "redrive", "billing", "--limit", "1", *s)
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == ["orders\t1"]
    assert "1 left for the next run" in first.stderr and "billing@dlq-redrive" in first.stderr
    rest = metaq("group", "redrive", "billing", "--json", *s)
    assert json.loads(rest.stdout)["redriven"] == {"orders": 1}
    none = metaq("group", "redrive", "billing", *s)
    assert none.returncode == 0 and none.stdout == "" and "sent back 0 messages" in none.stderr
    assert metaq("group", "redrive", "no%pe", *s).returncode == 1


def test_the_dead_letter_topic_broker_down_holds_the_partition_and_skips_nothing(
        two_brokers: tuple[BrokerProcess, BrokerProcess], tmp_path: Path) -> None:
    b1, b2 = two_brokers

    async def main() -> None:
        session = await MessageSessionFactory.connect(f"{b1.servers},{b2.servers}")
        await session.admin().create_topic("orders", 1, broker_id=1)
        await session.admin().create_topic("%DLQ%g", 1, broker_id=2)  # the operator put the DLQ on broker 2
        producer = session.create_producer()

        async def send(*values: bytes) -> None:
            for v in values:
                assert (await producer.send(Message("orders", v))).success

        got: list[bytes] = []

        def listener(msg: Message) -> None:
            if msg.data.startswith(b"poison"):
                raise RuntimeError("poison")
            got.append(bytes(msg.data))

        c = create_consumer(session, config("g", tmp_path, max_fetch_retries=1)).subscribe("orders", 4096, listener)
        await c.complete_subscribe()
        dlq = c.dead_letters
        assert dlq is not None
        await send(b"poison-0", b"a")
        await until(lambda: dlq.sent == 1 and got == [b"a"], message="the first dead letter")
        await asyncio.to_thread(b2.stop)  # off the loop: a stop or start blocking it outlasts the session timeout
        await send(b"poison-2", b"b", b"c")
        await until(lambda: dlq.failures >= 3, message="dead-letter produces failing")
        await until(lambda: sum(v[2] for v in c.positions().values()) == 2, message="offsets before poison-2 committed")
        assert got == [b"a"]  # nothing after poison-2 is delivered while it cannot be dead-lettered
        assert (await committed(session, "g", "orders")) == {"1-0": 2}  # the broker's view agrees: not skipped
        await asyncio.to_thread(b2.start)
        await until(lambda: dlq.sent == 2 and got == [b"a", b"b", b"c"], message="poison-2 dead-lettered, b and c")
        await until(lambda: sum(v[2] for v in c.positions().values()) == 5, message="everything committed")
        await c.close()
        assert sorted(bytes(d.message.data) for d in await letters(session, "g")) == [b"poison-0", b"poison-2"]
        assert {str(p) for p in await session.partitions("%DLQ%g")} == {"2-0"}  # never re-created elsewhere
        await session.close()

    run(main())


CONSUMER = """
import asyncio, sys, threading
from pathlib import Path
from metaq.client import MessageSessionFactory
from metaq.client.group import ConsumerConfig, create_consumer

servers, out, block = sys.argv[1], Path(sys.argv[2]), sys.argv[3]

async def main():
    session = await MessageSessionFactory.connect(servers)
    poison_deliveries = 0

    def listener(msg):
        nonlocal poison_deliveries
        data = bytes(msg.data)
        if data == b"poison":
            poison_deliveries += 1
            if block == "before-dlq" and poison_deliveries == 2:  # the last delivery: next comes the DLQ
                (out / "blocked").write_text(str(msg.offset))
                threading.Event().wait()
            raise RuntimeError("poison")
        if block == "after-dlq" and data == b"after":  # delivered only once the DLQ acknowledged poison
            (out / "blocked").write_text(str(msg.offset))
            threading.Event().wait()
        with open(out / "consumed", "a") as f:
            f.write(data.decode() + "\\n")

    config = ConsumerConfig(group="g", rejection_policy="dead-letter", max_fetch_retries=1,
                            commit_offset_period_ms=100, session_timeout_ms=1500, rebalance_timeout_ms=3000,
                            max_delay_fetch_ms=500, recover_dir=out / "recover")
    consumer = create_consumer(session, config).subscribe("orders", 65536, listener)
    await consumer.complete_subscribe()
    await asyncio.Event().wait()

asyncio.run(main())
"""


@pytest.mark.parametrize("moment", ["before-dlq", "after-dlq"])
def test_a_consumer_killed_around_the_dead_letter_loses_nothing(broker: BrokerProcess, tmp_path: Path,
                                                               moment: str) -> None:
    script = tmp_path / "consumer.py"
    script.write_text(CONSUMER)

    def start(block: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, str(script), broker.servers, str(tmp_path), block],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    async def check() -> None:
        session = await MessageSessionFactory.connect(broker.servers)
        await session.admin().create_topic("orders", 1)
        producer = session.create_producer()
        for v in (b"a", b"poison", b"after", b"b"):
            assert (await producer.send(Message("orders", v))).success
        ours = (await session.admin().stats())["connections"]
        proc = start(moment)
        try:
            await until(lambda: (tmp_path / "blocked").exists(), message="the listener blocked")
            dead = [bytes(d.message.data) for d in await letters(session, "g")]
            if moment == "before-dlq":
                assert dead == []
                # "a" is committed; then, over several commit periods, nothing past poison is
                deadline = time.monotonic() + 20
                while (await committed(session, "g", "orders"))["0-0"] != 1:
                    assert time.monotonic() < deadline, "offset 1 (after 'a') was never committed"
                    await asyncio.sleep(0.05)
                window = time.monotonic() + 0.5
                while time.monotonic() < window:
                    assert (await committed(session, "g", "orders"))["0-0"] == 1
                    await asyncio.sleep(0.05)
            else:
                assert dead == [b"poison"]  # "after" is delivered only once the DLQ has poison
            os.kill(proc.pid, signal.SIGKILL)  # right away: maybe before the commit that passes poison
            proc.wait(10)
            # a commit the process sent just before the kill may still be in the broker's socket: once the broker
            # has counted the dead connections out it has served everything they sent, and the offset is final
            deadline = time.monotonic() + 30
            while (await session.admin().stats())["connections"] > ours:
                assert time.monotonic() < deadline, "the killed consumer's connections were never closed"
                await asyncio.sleep(0.02)
            at_kill = (await committed(session, "g", "orders"))["0-0"]
            assert at_kill <= 2
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        (tmp_path / "blocked").unlink()
        proc = start("none")
        try:
            def consumed() -> list[str]:
                path = tmp_path / "consumed"
                return path.read_text().split() if path.exists() else []
            await until(lambda: "b" in consumed(), message="the restarted consumer catching up")
            await until(lambda: len(consumed()) >= 3, message="a, after, b")
            dead = [bytes(d.message.data) for d in await letters(session, "g")]
            if at_kill <= 1 and moment == "after-dlq":
                # in the DLQ, but the commit past it was lost with the process: delivered again, and
                # dead-lettered again (at-least-once into the DLQ)
                assert dead == [b"poison", b"poison"]
            else:
                assert dead == [b"poison"]
            assert sorted(set(consumed())) == ["a", "after", "b"]
        finally:
            proc.kill()
            proc.wait(10)
        await session.close()

    run(check())


def test_cluster_mode_dead_letters_go_to_the_lowest_broker_and_redrive_commits_in_zookeeper(
        cluster_factory: Callable[..., BrokerProcess], zookeeper: Any, zk_root: str, tmp_path: Path) -> None:
    for b in (2, 1):
        cluster_factory(b, topics="[topic=orders]\nnumPartitions=2\n")

    async def main() -> None:
        session = await MessageSessionFactory.connect(zk_connect=zookeeper.connect_string, zk_root=zk_root,
                                                      zk_session_timeout_ms=3000)
        await until(lambda: len(session._core.registry.snapshot().partitions("orders", publish=True)) == 4
                    if session._core.registry else False, message="both brokers' partitions registered")
        await _dead_letter_some(session, tmp_path, "g", "orders", {b"m1", b"m6"}, 12)
        # the coordinator, the lowest registered broker id, holds the dead-letter topic, registered in ZooKeeper
        assert [str(p) for p in await session.partitions("%DLQ%g")] == ["1-0"]
        assert sorted(bytes(d.message.data) for d in await letters(session, "g")) == [b"m1", b"m6"]
        first = await redrive(session, "g")
        assert (first.redriven, first.errors) == ({"orders": 2}, [])
        again = await redrive(session, "g")  # progress read back from ZooKeeper
        assert again.total == 0
        registry = session._core.registry
        assert registry is not None
        assert "g@dlq-redrive" in await asyncio.to_thread(registry.groups)
        await session.close()

    run(main())
