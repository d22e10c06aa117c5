"""Quotas against real brokers (docs/security.md#quotas).

What a user relies on: a producer (or consumer) over its principal's byte rate is slowed to about that
rate, is told so (throttle_time_ms, counted by the client), is never dropped, and loses nothing it was
acked; a principal over its connection limit gets a clear TOO_MANY_CONNECTIONS, the broker goes on; the
limits change on reload without a restart; /metrics shows the throttling per principal.

The rates are measured over a few seconds and held to a generous band (below 2x the quota), never to a
tight time: the burst a principal may send at once (one second of quota) is inside that band.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_process import metaq

from metaq.client import Message, MessageSessionFactory
from metaq.client.group import ConsumerConfig, create_consumer
from metaq.errors import TooManyConnectionsError
from metaq.net.blocking import BlockingConnection
from metaq.net.codec import ConnectionSettings
from metaq.testing import BrokerProcess, wait_until

QUOTA = 100 * 1024
PAYLOAD = b"q" * 1000
PRODUCE_FOR_S = 3.0
PASSWORD = "correct horse battery staple"


def metrics_text(broker: BrokerProcess) -> str:
    urls = [line.split("metaq broker metrics ", 1)[1].split()[0] for line in broker.log_lines
            if "metaq broker metrics " in line]
    with urllib.request.urlopen(urls[-1], timeout=10) as reply:
        return str(reply.read().decode())


def sample(text: str, name: str, labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(f"{name}{{") and labels in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} {labels} not in /metrics")


def test_a_producer_over_its_quota_is_slowed_to_about_it_and_loses_nothing(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 1, "unflushThreshold": 0, "quotaProducerByteRate": QUOTA,
                             "dashboardHttpPort": 0})

    async def main() -> tuple[float, list[bytes], list[bytes], dict[str, int]]:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            producer = session.create_producer(linger_ms=0)
            acked: list[bytes] = []
            n = 0
            start = time.monotonic()
            while time.monotonic() - start < PRODUCE_FOR_S:
                sends = []
                for _ in range(20):
                    value = b"%08d" % n + PAYLOAD
                    n += 1
                    sends.append((value, producer.send(Message("quota", value))))
                for value, fut in sends:
                    result = await fut
                    assert result.success, [r for r in result if not r.success][:1]  # slowed, never refused
                    acked.append(value)
            elapsed = time.monotonic() - start
            rate = sum(len(v) for v in acked) / elapsed
            consumer = session.create_pull_consumer()
            read = [bytes(msg.data) async for msg in consumer.iterate("quota", 0, 0, max_wait_ms=100,
                                                                       max_messages=len(acked))]
            return rate, acked, read, session.throttle_stats()

    rate, acked, read, throttle = asyncio.run(main())
    assert rate < 2 * QUOTA, f"{rate:.0f} B/s with a quota of {QUOTA} B/s"
    assert rate > QUOTA / 4, f"{rate:.0f} B/s: throttled far below the quota of {QUOTA} B/s"
    assert read == acked, "every acked message is read back, in order"
    assert throttle["throttled_total"] > 0 and throttle["throttle_ms_total"] > 0, throttle
    text = metrics_text(broker)
    labels = 'direction="produce",principal="User:ANONYMOUS"'
    assert sample(text, "metaq_quota_throttle_seconds_total", labels) > 0
    assert sample(text, "metaq_quota_bytes_total", labels) >= sum(len(v) for v in acked)


def test_a_consumer_over_its_quota_is_slowed_to_about_it(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 1, "unflushThreshold": 0, "quotaConsumerByteRate": QUOTA})
    count = 400  # ~400 kB: about 3 s at the quota, after its one-second burst

    async def main() -> tuple[float, int, dict[str, int]]:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            producer = session.create_producer()
            results = await asyncio.gather(*(producer.send(Message("quota", b"%08d" % i + PAYLOAD))
                                             for i in range(count)))
            assert all(r.success for r in results)
            consumer = session.create_pull_consumer()
            start = time.monotonic()
            got = [msg.offset async for msg in consumer.iterate("quota", 0, 0, max_wait_ms=100, max_bytes=16 * 1024,
                                                                 max_messages=count)]
            elapsed = time.monotonic() - start
            return count * (8 + len(PAYLOAD)) / elapsed, len(got), session.throttle_stats()

    rate, got, throttle = asyncio.run(main())
    assert got == count
    assert rate < 2 * QUOTA, f"{rate:.0f} B/s fetched with a quota of {QUOTA} B/s"
    assert throttle["throttled_total"] > 0, throttle


def test_a_group_consumer_fetching_with_multi_fetch_is_slowed_and_told(
        broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    broker = broker_factory({"numPartitions": 4, "unflushThreshold": 0, "quotaConsumerByteRate": QUOTA})
    per_partition = 100  # ~400 kB over 4 partitions: about 3 s at the quota, after its one-second burst

    async def main() -> tuple[float, dict[int, list[int]], dict[str, int], int]:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            await session.admin().create_topic("quota", 4)
            producer = session.create_producer()
            for p in range(4):
                for first in range(0, per_partition, 20):
                    values = [b"%08d" % i + PAYLOAD for i in range(first, first + 20)]
                    result = await producer.send_batch("quota", values, partition=p)
                    assert result.success, [r for r in result if not r.success][:1]
            seen: dict[int, list[int]] = defaultdict(list)
            consumer = create_consumer(session, ConsumerConfig(
                group="slowed", recover_dir=tmp_path / "recover", max_delay_fetch_ms=100,
                commit_offset_period_ms=500, multi_fetch=True))
            consumer.subscribe("quota", 16 * 1024, lambda msg: seen[msg.partition].append(msg.offset))
            start = time.monotonic()
            await consumer.complete_subscribe()
            deadline = start + 60
            while sum(map(len, seen.values())) < 4 * per_partition:
                assert time.monotonic() < deadline, {p: len(v) for p, v in seen.items()}
                await asyncio.sleep(0.02)
            elapsed = time.monotonic() - start
            multi = len(consumer.broker_fetchers)
            await consumer.close()
            return 4 * per_partition * (8 + len(PAYLOAD)) / elapsed, dict(seen), session.throttle_stats(), multi

    rate, seen, throttle, multi = asyncio.run(main())
    assert multi == 1  # the partitions were fetched with MultiFetch, over one connection
    assert seen == {p: list(range(per_partition)) for p in range(4)}
    assert rate < 2 * QUOTA, f"{rate:.0f} B/s fetched with a quota of {QUOTA} B/s"
    # told: MultiFetch v1 replies carried throttle_time_ms and the client waited them out
    assert throttle["throttled_total"] > 0 and throttle["throttle_ms_total"] > 0, throttle


def _settings(user: str | None = None) -> ConnectionSettings:
    return ConnectionSettings("quota-test", 10.0, 10.0, 16, 64 << 20, sasl_username=user,
                              sasl_password=PASSWORD if user else None)


def test_connections_over_a_principals_limit_are_refused_clearly_and_reload_changes_it(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory(config_text="[system]\nquotaMaxConnections=2\n")
    address = (broker.host, broker.port)
    first, second = BlockingConnection.open(address, _settings()), BlockingConnection.open(address, _settings())
    with pytest.raises(TooManyConnectionsError, match="User:ANONYMOUS already has 2 connections"):
        BlockingConnection.open(address, _settings())
    first.close()
    third = wait_until(lambda: _open_or_none(address), message="a freed connection slot to be usable")
    broker.config_path.write_text("[system]\nquotaMaxConnections=2\nquotaOverrides=User:ANONYMOUS=connections:3\n")
    broker.signal(signal.SIGHUP)
    fourth = wait_until(lambda: _open_or_none(address), message="quotaOverrides to apply on reload")
    for conn in (second, third, fourth):
        conn.close()


def _open_or_none(address: tuple[str, int]) -> BlockingConnection | None:
    try:
        return BlockingConnection.open(address, _settings())
    except TooManyConnectionsError:
        return None


def test_an_authenticated_users_connection_limit(broker_factory: Callable[..., BrokerProcess],
                                                 tmp_path: Path) -> None:
    done = metaq("acl", "user", "add", "alice", "--data-path", str(tmp_path / "broker"),
                 env={**os.environ, "METAQ_PASSWORD": PASSWORD})
    assert done.returncode == 0, done.stderr
    broker = broker_factory({"authRequired": True, "quotaOverrides": "User:alice=connections:1"})
    broker.allow_log(r"refused User:alice")
    address = (broker.host, broker.port)
    kept = BlockingConnection.open(address, _settings("alice"))
    with pytest.raises(TooManyConnectionsError, match="User:alice already has 1 connection open"):
        BlockingConnection.open(address, _settings("alice"))
    kept.close()
    wait_until(lambda: _reopen(address), message="alice's slot to be given back")


def _reopen(address: tuple[str, int]) -> bool:
    try:
        BlockingConnection.open(address, _settings("alice")).close()
        return True
    except TooManyConnectionsError:
        return False
