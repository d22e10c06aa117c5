"""Long polling: a caught-up consumer waits at the broker and is woken by the next append."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from metaq.protocol import messages as m
from metaq.protocol.records import decode_fetched, encode_values
from metaq.testing import BrokerProcess, wait_until
from metaq.testing.raw import RawClient


def test_waiting_fetch_returns_on_append_not_at_max_wait(broker: BrokerProcess) -> None:
    producer, consumer = RawClient.to(broker), RawClient.to(broker)
    assert producer.call(m.ProduceRequest("lp", 0, 1, 5000, encode_values([b"first"], 1))).error_code == 0
    result: dict[str, object] = {}

    def wait_fetch() -> None:
        t0 = time.monotonic()
        result["response"] = consumer.call(m.FetchRequest("lp", 0, 1, 1 << 20, 20_000))
        result["elapsed"] = time.monotonic() - t0

    t = threading.Thread(target=wait_fetch)
    t.start()
    wait_until(lambda: _waiting(producer) >= 1, message="the fetch to be parked at the broker")
    appended_at = time.monotonic()
    assert producer.call(m.ProduceRequest("lp", 0, 1, 5000, encode_values([b"second"], 1))).error_code == 0
    t.join(30)
    response = result["response"]
    messages, _ = decode_fetched(response.records, "lp", 0, 1)  # type: ignore[attr-defined]
    assert [bytes(x.data) for x in messages] == [b"second"]
    # woken by the append, far before the 20 s max_wait (the exact delay is for `metaq bench e2e`)
    assert time.monotonic() - appended_at < 5.0


def test_waiting_fetch_returns_empty_at_max_wait_when_nothing_comes(broker: BrokerProcess) -> None:
    c = RawClient.to(broker)
    assert c.call(m.ProduceRequest("idle", 0, 1, 5000, encode_values([b"x"], 1))).error_code == 0
    t0 = time.monotonic()
    response = c.call(m.FetchRequest("idle", 0, 1, 1 << 20, 300))
    elapsed = time.monotonic() - t0
    assert response.error_code == 0 and response.records == b""  # type: ignore[attr-defined]
    assert elapsed >= 0.29


def _waiting(c: RawClient) -> int:
    import json

    stats = json.loads(c.call(m.StatsRequest(None)).stats_json)  # type: ignore[attr-defined]
    return int(stats.get("waiting_fetches", 0))


def test_out_of_range_fetch_names_the_valid_range_or_serves_the_nearest(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    strict = RawClient.to(broker_factory({"numPartitions": 1}, name="strict"))
    assert strict.call(m.ProduceRequest("r", 0, 1, 5000, encode_values([b"a", b"b"], 1))).error_code == 0
    reply = strict.call(m.FetchRequest("r", 0, 50, 1 << 20, 0))
    assert reply.error_code == 1 and "0..2" in reply.error_message
    assert (reply.log_start_offset, reply.log_end_offset) == (0, 2)

    lenient = RawClient.to(broker_factory({"numPartitions": 1, "updateConsumerOffsets": True}, name="lenient"))
    assert lenient.call(m.ProduceRequest("r", 0, 1, 5000, encode_values([b"a", b"b"], 1))).error_code == 0
    reply = lenient.call(m.FetchRequest("r", 0, 50, 1 << 20, 0))
    assert reply.error_code == 0 and reply.reset_offset == 2  # MetaQ: moved to the nearest valid offset
