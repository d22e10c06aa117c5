"""Issue 39's hole 3: quotas hold per principal across connections and protocols (docs/security.md#quotas),
against a broker locked down as docs/security.md says (tests/integration/security/lockdown.py).

What a user relies on: a principal gets about its byte rate however it asks, over one connection or five, with
1 MiB fetches, over HTTP with parallel requests, with big batches over several connections; and its connection
quota bounds its HTTP requests in progress too. A rate is counted up to the moment the principal may send again
(a last small request waits for its debt: stopping right after an oversized request hides nothing). The bound
asserted (1.5x over a few seconds) is the documented factor with room for a loaded machine; before this round the
same runs gave 5x and more.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from http_client import Reply
from lockdown import LockedDown, start_locked_down

from metaq.protocol import messages as m
from metaq.protocol.records import encode_values

KIB = 1024
FETCH_QUOTA = 50 * KIB
PRODUCE_QUOTA = 100 * KIB
RUN_S = 5.0
FACTOR = 1.5


@pytest.fixture
def locked(broker_factory: Callable[..., object], tmp_path: Path) -> LockedDown:
    locked = start_locked_down(broker_factory, tmp_path, {  # type: ignore[arg-type]
        "quotaConsumerByteRate": FETCH_QUOTA, "quotaProducerByteRate": PRODUCE_QUOTA, "quotaMaxConnections": 6,
        "quotaOverrides": "User:root=produce:0,fetch:0,connections:0"})
    with locked.client("root") as root:
        for _ in range(300):  # ~3 MiB in batches of ~10 KiB
            root.produce("audit", "0-0", encode_values([b"a" * 1000] * 10, 1))
    return locked


def fetch_rate(locked: LockedDown, connections: int) -> float:
    got = [0]
    lock = threading.Lock()
    start = time.monotonic()

    def one(i: int) -> None:
        with locked.connection("bob") as conn:
            offset = i * 500
            while time.monotonic() - start < RUN_S:
                reply = conn.call(m.FetchRequest(topic="audit", partition=0, offset=offset, max_bytes=1 << 20))
                assert not reply.error_code, reply.error_message
                with lock:
                    got[0] += len(reply.records)
                offset = (offset + max(1, len(reply.records) // 1030)) % 2500

    with ThreadPoolExecutor(connections) as pool:
        list(pool.map(one, range(connections)))
    with locked.connection("bob") as conn:  # answered once bob's debt is paid
        conn.call(m.FetchRequest(topic="audit", partition=0, offset=0, max_bytes=1))
    return got[0] / (time.monotonic() - start)


def test_fetch_quota_holds_over_many_connections_and_http(locked: LockedDown) -> None:
    one = fetch_rate(locked, 1)
    assert one < FACTOR * FETCH_QUOTA, f"{one / KIB:.0f} KiB/s on one connection, quota {FETCH_QUOTA // KIB}"
    five = fetch_rate(locked, 5)
    assert five < FACTOR * FETCH_QUOTA, f"{five / KIB:.0f} KiB/s on five connections, quota {FETCH_QUOTA // KIB}"
    got = [0]
    lock = threading.Lock()
    start = time.monotonic()

    def http(i: int) -> None:
        offset = i * 300
        while time.monotonic() - start < RUN_S:
            reply = locked.http("GET", f"/topics/audit/partitions/0/messages?offset={offset}&max_bytes=1048576",
                                "bob")
            assert reply.status == 200, reply
            doc = reply.json
            with lock:
                got[0] += sum(len(msg["payload"]) for msg in doc["messages"])
            offset = doc["next_offset"] % 2500

    with ThreadPoolExecutor(4) as pool:  # within bob's connection quota of six (his other connections closing)
        list(pool.map(http, range(4)))
    with locked.connection("bob") as conn:
        conn.call(m.FetchRequest(topic="audit", partition=0, offset=0, max_bytes=1))
    rate = got[0] / (time.monotonic() - start)
    assert rate < FACTOR * FETCH_QUOTA, f"{rate / KIB:.0f} KiB/s over HTTP, quota {FETCH_QUOTA // KIB}"
    assert rate > FETCH_QUOTA / 4, "slowed, not stopped"


def test_the_connection_quota_bounds_http_requests_in_progress(locked: LockedDown) -> None:
    def long_poll(i: int) -> Reply:
        return locked.http("GET", "/topics/audit/partitions/0/messages?offset=3000&max_wait_ms=3000", "bob")

    with ThreadPoolExecutor(12) as pool:
        replies = list(pool.map(long_poll, range(12)))
    statuses = [r.status for r in replies]
    assert statuses.count(200) <= 6 and statuses.count(503) >= 6, statuses
    refused = next(r for r in replies if r.status == 503)
    assert refused.json["error"]["name"] == "TOO_MANY_CONNECTIONS" and refused.headers["Retry-After"]
    locked.documented("GET", "/topics/{topic}/partitions/{partition}/messages", refused)
    reply = locked.http("GET", "/topics/audit/partitions/0/messages?offset=0", "bob")
    assert reply.status == 200


def test_produce_quota_holds_with_big_batches_on_several_connections(locked: LockedDown) -> None:
    batch = encode_values([b"p" * 1000] * 400, 1)  # ~400 KB: four seconds of alice's quota each
    sent = [0]
    lock = threading.Lock()
    start = time.monotonic()

    def one(i: int) -> None:
        with locked.connection("alice") as conn:
            while time.monotonic() - start < 2.0:
                reply = conn.call(m.ProduceRequest(topic="orders", partition=0, acks=1, records=batch))
                assert not reply.error_code, reply.error_message
                with lock:
                    sent[0] += len(batch)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, range(4)))
    with locked.connection("alice") as conn:  # acknowledged once alice's debt is paid
        reply = conn.call(m.ProduceRequest(topic="orders", partition=0, acks=1, records=encode_values([b"x"], 1)))
        assert not reply.error_code
    rate = sent[0] / (time.monotonic() - start)
    assert rate < FACTOR * PRODUCE_QUOTA, f"{rate / KIB:.0f} KiB/s produced, quota {PRODUCE_QUOTA // KIB}"
