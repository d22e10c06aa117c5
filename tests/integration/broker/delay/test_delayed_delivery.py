"""Delayed delivery against a real broker process (docs/delayed.md).

What a user relies on: a delayed message is invisible until its due time and then readable, in due-time
order; a too-long delay is refused with a clear error; an acked delayed message survives kill -9 and is
delivered exactly once, never early; damaged timer-index or checkpoint files lose nothing.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_process import metaq
from http_client import request

from metaq.client import Message, MessageSessionFactory
from metaq.errors import DelayTooLongError
from metaq.protocol.delayed import DELAY_REF_HEADER, DELIVER_AT_HEADER, header_ms
from metaq.testing.broker import BrokerProcess, wait_until


def now_ms() -> int:
    return int(time.time() * 1000)


async def read_topic(servers: str, topic: str, partitions: int) -> list[Message]:
    async with await MessageSessionFactory.connect(servers) as session:
        consumer = session.create_pull_consumer()
        out: list[Message] = []
        for p in range(partitions):
            out.extend([m async for m in consumer.iterate(topic, p, "earliest", stop_at_end=True)])
        return out


def read(broker: BrokerProcess, topic: str, partitions: int = 1) -> list[Message]:
    return asyncio.run(read_topic(broker.servers, topic, partitions))


def delayed_stats(broker: BrokerProcess) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            stats: dict[str, Any] = await session.admin().stats()
            return stats["delayed"]  # type: ignore[no-any-return]
    return asyncio.run(main())


def check_never_early(messages: list[Message]) -> None:
    for m in messages:
        due = header_ms(m.headers, DELIVER_AT_HEADER)
        if due is not None:
            assert m.append_time_ms >= due, f"{m.data!r} appended at {m.append_time_ms}, due at {due}: early"


def test_delayed_messages_are_invisible_until_due_then_delivered_in_due_order(broker: BrokerProcess) -> None:
    delays = [1400, 300, 900, 600, 1200]  # sent out of due order, between immediate messages

    async def send() -> list[int]:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            producer = session.create_producer()
            dues = []
            for i, delay in enumerate(delays):
                plain = await producer.send(Message("dd", f"now-{i}".encode()))
                assert plain.success and plain.offset >= 0
                due = now_ms() + delay
                dues.append(due)
                result = await producer.send(Message("dd", f"later-{i}".encode(), deliver_at=due))
                assert result.success, result
                assert result.offset == -1 and result.message_id == -1  # it gets both when delivered
            return dues

    dues = asyncio.run(send())
    early = read(broker, "dd", 4)
    for m in early:  # whatever is visible already is an immediate message or a due one
        due = header_ms(m.headers, DELIVER_AT_HEADER)
        assert due is None or due <= m.append_time_ms
    assert sum(1 for m in early if m.data.startswith(b"now-")) == len(delays)
    if now_ms() < dues[0]:  # read before later-0 was due (1.4 s after its send): it cannot be there
        assert not any(m.data == b"later-0" for m in early)

    everything = wait_until(lambda: (ms := read(broker, "dd", 4)) and len(ms) == 2 * len(delays) and ms,
                            timeout_s=15, interval_s=0.05, message="every delayed message delivered")
    check_never_early(everything)
    delayed = [m for m in everything if m.data.startswith(b"later-")]
    for p in range(4):  # within each partition they were appended in due order
        dues_p = [header_ms(m.headers, DELIVER_AT_HEADER) or 0 for m in sorted(delayed, key=lambda m: m.offset)
                  if m.partition == p]
        assert dues_p == sorted(dues_p)
    assert sorted(header_ms(m.headers, DELIVER_AT_HEADER) for m in delayed) == sorted(dues)
    for m in delayed:
        assert header_ms(m.headers, DELAY_REF_HEADER) is not None


def test_one_partition_gets_delayed_messages_in_due_order(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 1, "unflushThreshold": 0})
    rng = random.Random(7)
    offsets_ms = [rng.randrange(0, 1500) for _ in range(200)]

    async def send() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            producer = session.create_producer()
            base = now_ms() + 200
            futures = [producer.send_async(Message("ord", f"{i}".encode(), deliver_at=base + d))
                       for i, d in enumerate(offsets_ms)]
            futures += [producer.send_async(Message("ord", f"plain-{i}".encode())) for i in range(50)]
            results = await asyncio.gather(*futures)
            assert all(r.success for r in results)

    asyncio.run(send())
    got = wait_until(lambda: (ms := read(broker, "ord")) and len(ms) == 250 and ms, timeout_s=20, interval_s=0.05,
                     message="all 250 messages")
    check_never_early(got)
    delayed = [m for m in got if not m.data.startswith(b"plain-")]
    dues = [header_ms(m.headers, DELIVER_AT_HEADER) for m in delayed]
    assert dues == sorted(dues), "a partition's delayed messages are appended in due order"  # type: ignore[type-var]
    assert Counter(m.data for m in got) == Counter([f"{i}".encode() for i in range(200)]
                                                    + [f"plain-{i}".encode() for i in range(50)])


def test_too_long_delay_is_refused_and_a_past_due_time_delivers_at_once(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 1, "unflushThreshold": 0, "maxDelayInSeconds": 60})

    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            producer = session.create_producer()
            refused = await producer.send(Message("lim", b"too far", delay_ms=120_000))
            assert not refused.success
            assert isinstance(refused.error, DelayTooLongError)
            assert "maxDelayInSeconds is 60 s" in str(refused.error)
            accepted = await producer.send(Message("lim", b"ok", delay_ms=50_000))
            assert accepted.success
            past = await producer.send(Message("lim", b"past", deliver_at=now_ms() - 3_600_000))
            assert past.success

    asyncio.run(main())
    got = wait_until(lambda: read(broker, "lim"), timeout_s=10, interval_s=0.02, message="the past-due message")
    assert [m.data for m in got] == [b"past"]
    assert delayed_stats(broker)["pending"] == 1


def _send_history(servers: str, topic: str, spec: list[int]) -> dict[bytes, int]:
    """Send one delayed message per delay in ``spec`` (ms from now); the acked payloads and their due times."""
    async def main() -> dict[bytes, int]:
        async with await MessageSessionFactory.connect(servers) as session:
            producer = session.create_producer()
            base = now_ms()
            msgs = [Message(topic, f"m{i}".encode(), deliver_at=base + d) for i, d in enumerate(spec)]
            results = await asyncio.gather(*(producer.send_async(m) for m in msgs))
            assert all(r.success for r in results), [r for r in results if not r.success][:3]
            return {m.data: m.deliver_at for m in msgs}  # type: ignore[misc]
    return asyncio.run(main())


def check_exactly_once(acked: dict[bytes, int], got: list[Message]) -> None:
    counts = Counter(m.data for m in got)
    assert set(counts) == set(acked), f"missing {sorted(set(acked) - set(counts))[:5]}, " \
                                      f"unknown {sorted(set(counts) - set(acked))[:5]}"
    dupes = {k: n for k, n in counts.items() if n > 1}
    assert not dupes, f"delivered more than once: {list(dupes.items())[:5]}"
    check_never_early(got)


def test_kill_9_with_pending_messages_delivers_each_once_and_none_early(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 2, "unflushThreshold": 0})
    rng = random.Random(12)
    # due while the broker runs, during the downtime, and well after the restart
    spec = [rng.randrange(0, 1500) for _ in range(1500)] + [rng.randrange(1500, 4000) for _ in range(1000)] \
        + [rng.randrange(6000, 9000) for _ in range(500)]
    acked = _send_history(broker.servers, "crash", spec)
    wait_until(lambda: delayed_stats(broker)["delivered"] >= 300, timeout_s=10, interval_s=0.01,
               message="some deliveries before the kill")
    broker.kill()
    killed_at = now_ms()
    broker.start()
    before = read(broker, "crash", 2)
    check_never_early(before)
    # what was not due before the kill and is not due yet is not there
    assert all(m.data in acked and acked[m.data] <= now_ms() for m in before)
    got = wait_until(lambda: (ms := read(broker, "crash", 2)) and len(ms) >= len(acked) and ms, timeout_s=30,
                     interval_s=0.1, message="every acked delayed message")
    check_exactly_once(acked, got)
    assert delayed_stats(broker)["pending"] == 0
    assert killed_at > 0


@pytest.mark.parametrize("damage", ["truncate-bucket", "flip-bucket", "flip-checkpoint", "truncate-checkpoint"])
def test_damaged_bucket_or_checkpoint_files_lose_nothing(broker_factory: Callable[..., BrokerProcess],
                                                         damage: str) -> None:
    broker = broker_factory({"numPartitions": 1, "unflushThreshold": 0})
    spec = [rng_delay for rng_delay in range(0, 3000, 10)] + [rng_delay for rng_delay in range(4000, 7000, 10)]
    acked = _send_history(broker.servers, "torn", spec)
    wait_until(lambda: delayed_stats(broker)["delivered"] >= 50, timeout_s=10, interval_s=0.01,
               message="some deliveries")
    broker.stop()
    root = Path(broker.data_dir) / ".delay"
    buckets = sorted((root / "buckets").glob("*.bkt"))
    assert buckets
    victim: Path
    if damage.endswith("bucket"):
        victim = buckets[-1]
    else:
        victim = max((root / name for name in ("checkpoint.0", "checkpoint.1")), key=lambda p: p.stat().st_mtime)
    size = victim.stat().st_size
    if damage.startswith("truncate"):
        os.truncate(victim, size - 7)
    else:
        with open(victim, "r+b") as f:
            f.seek(size // 2)
            byte = f.read(1)
            f.seek(size // 2)
            f.write(bytes([byte[0] ^ 0x40]))
    broker.allow_log("damaged|rebuilding")
    broker.start()
    got = wait_until(lambda: (ms := read(broker, "torn")) and len(ms) >= len(acked) and ms, timeout_s=30,
                     interval_s=0.1, message="every acked delayed message")
    check_exactly_once(acked, got)


def test_many_pending_messages_are_all_delivered_in_due_order(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 1, "unflushThreshold": 0})
    count = 100_000

    base = now_ms() + 10_000

    async def send() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            producer = session.create_producer()
            rng = random.Random(3)
            pending = []
            for i in range(count):
                pending.append(producer.send_async(Message("many", i.to_bytes(4, "big"),
                                                           deliver_at=base + rng.randrange(0, 5_000))))
                if len(pending) >= 5_000:
                    assert all(r.success for r in await asyncio.gather(*pending))
                    pending = []
            assert all(r.success for r in await asyncio.gather(*pending))

    asyncio.run(send())
    sent_ms = now_ms()  # a message due before this may have arrived late: it is due at its arrival then
    stats = delayed_stats(broker)
    assert stats["in_memory"] < count  # what is due later than the loaded buckets stays on disk
    assert stats["pending"] + stats["delivered"] == count
    wait_until(lambda: delayed_stats(broker)["pending"] == 0, timeout_s=120, interval_s=0.2,
               message="100k delayed messages delivered")
    got = read(broker, "many")
    assert len(got) == count and len({bytes(m.data) for m in got}) == count
    dues = [due for m in got if (due := header_ms(m.headers, DELIVER_AT_HEADER) or 0) > sent_ms]
    assert len(dues) > count // 2, "sending took most of the window: too slow a machine for this test"
    assert dues == sorted(dues)
    check_never_early(got)


def test_cli_produce_delay_and_deliver_at(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 1, "unflushThreshold": 0, "maxDelayInSeconds": 3600})
    sent_at = now_ms()
    done = metaq("produce", "cli-d", "-s", broker.servers, "--delay", "1s", "--print-ids", input="a\nb\n")
    assert done.returncode == 0, done.stderr
    assert "-1 (delayed" in done.stdout
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() + 2))
    assert metaq("produce", "cli-d", "-s", broker.servers, "--deliver-at", iso, input="c\n").returncode == 0
    too_far = metaq("produce", "cli-d", "-s", broker.servers, "--delay", "2h", input="x\n")
    assert too_far.returncode == 1 and "DELAY_TOO_LONG" in too_far.stderr
    bad = metaq("produce", "cli-d", "-s", broker.servers, "--delay", "soon", input="x\n")
    assert bad.returncode == 2 and "is not a duration" in bad.stderr
    got = wait_until(lambda: (ms := read(broker, "cli-d")) and len(ms) == 3 and ms, timeout_s=15, interval_s=0.05,
                     message="the three CLI messages")
    assert [m.data for m in got] == [b"a", b"b", b"c"]
    assert all(m.append_time_ms >= sent_at + 1000 for m in got)
    check_never_early(got)


def metrics_text(broker: BrokerProcess) -> str:
    urls = [m.group(1) for m in map(re.compile(r"metaq broker metrics (http://\S+)").search, broker.log_lines) if m]
    with urllib.request.urlopen(urls[-1], timeout=10) as reply:
        return str(reply.read().decode())


def test_http_produce_with_delay_ms_and_the_metrics(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 1, "unflushThreshold": 0, "httpPort": 0, "maxDelayInSeconds": 60,
                             "dashboardHttpPort": 0})
    assert broker.http_url is not None
    reply = request(broker.http_url, "POST", "/topics/http-d/messages",
                    {"messages": [{"payload": "later", "delay_ms": 800}, {"payload": "at", "deliver_at": 1}]})
    assert reply.status == 200, reply
    assert [r["offset"] for r in reply.json["messages"]] == [-1, -1]
    refused = request(broker.http_url, "POST", "/topics/http-d/messages", {"payload": "x", "delay_ms": 120_000})
    assert refused.status == 400 and refused.json["error"]["name"] == "DELAY_TOO_LONG"
    both = request(broker.http_url, "POST", "/topics/http-d/messages", {"payload": "x", "delay_ms": 1, "deliver_at": 1})
    assert both.status == 400
    got = wait_until(lambda: (ms := read(broker, "http-d")) and len(ms) == 2 and ms, timeout_s=15, interval_s=0.05,
                     message="both HTTP messages")
    assert [m.data for m in got] == [b"at", b"later"]
    check_never_early(got)
    text = wait_until(lambda: (t := metrics_text(broker)) and "metaq_delayed_pending 0.0" in t and t, timeout_s=10,
                      interval_s=0.05, message="metaq_delayed_pending 0")
    assert "metaq_delayed_lateness_duration_seconds_count 2.0" in text


def test_two_brokers_each_deliver_the_delayed_messages_sent_to_their_partitions(
        two_brokers: tuple[BrokerProcess, BrokerProcess]) -> None:
    servers = ",".join(b.servers for b in two_brokers)

    async def main() -> list[Message]:
        async with await MessageSessionFactory.connect(servers) as session:
            for broker_id in (1, 2):
                await session.admin().create_topic("spread", 2, broker_id=broker_id)
            producer = session.create_producer()
            base = now_ms() + 300
            results = await asyncio.gather(*(producer.send_async(Message("spread", f"{i}".encode(),
                                                                         deliver_at=base + 10 * i))
                                             for i in range(40)))
            assert all(r.success for r in results)
            assert {r.broker_id for r in results} == {1, 2}
            consumer = session.create_pull_consumer()
            got: list[Message] = []
            deadline = time.monotonic() + 15
            while len(got) < 40 and time.monotonic() < deadline:
                got = []
                for p in await session.partitions("spread"):
                    got.extend([m async for m in consumer.iterate("spread", p, "earliest", stop_at_end=True)])
                await asyncio.sleep(0.05)
            return got

    got = asyncio.run(main())
    assert sorted(int(m.data) for m in got) == list(range(40))
    assert {m.broker_id for m in got} == {1, 2}
    check_never_early(got)
