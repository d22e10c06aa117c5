"""The synchronous facade of the group consumer: what a script using MetaQ's API shape relies on."""

from __future__ import annotations

import threading
from collections import Counter

from metaq.client import connect
from metaq.client.group import ConsumerConfig
from metaq.testing import BrokerProcess, wait_until


def test_two_sync_group_members_share_partitions_and_get_every_message_once(broker: BrokerProcess) -> None:
    seen: Counter[tuple[int, int]] = Counter()
    lock = threading.Lock()

    def listener(message: object) -> None:
        with lock:
            seen[(message.partition, message.offset)] += 1  # type: ignore[attr-defined]

    with connect(broker.servers) as session:
        session.admin().create_topic("jobs", 4)
        assert session.create_producer().send_batch("jobs", [f"job {i}".encode() for i in range(400)]).success
        config = ConsumerConfig(group="workers", session_timeout_ms=3000, fetch_runner_count=2)
        with session.create_consumer(config) as first, session.create_consumer(config) as second:
            first.subscribe("jobs", 64 * 1024, listener)
            second.subscribe("jobs", 64 * 1024, listener)
            first.complete_subscribe()
            second.complete_subscribe()

            def balanced() -> bool:
                a, b = first.assignment(), second.assignment()
                return len(a) == 2 and len(b) == 2 and not set(a) & set(b)

            wait_until(balanced, timeout_s=30, message="the two members to own two partitions each")
            wait_until(lambda: len(seen) == 400, timeout_s=30, message="all 400 messages")
    assert set(seen.values()) == {1}
