"""Long polling: a caught-up consumer waits at the broker and is woken by the next append."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from metaq.broker.session import Session
from metaq.protocol import messages as m
from metaq.protocol.records import decode_fetched, encode_messages, encode_values
from metaq.testing import BrokerProcess, wait_until
from metaq.testing.inprocess import InProcessBroker
from metaq.testing.raw import RawClient
from metaq.types import Message


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


def test_a_waiting_fetch_is_answered_inside_the_append_that_wakes_it(tmp_path: Path) -> None:
    """The reply of a woken long poll (Fetch and MultiFetch) is decided in the append's own loop step:
    by the time the produce handler returns, the waiting fetches hold their records and gave their
    waiting slots back (docs/benchmarks-history.md, "End-to-end latency": the wake path)."""
    with InProcessBroker(tmp_path / "b", {"numPartitions": 2, "unflushThreshold": 1000}) as b:
        core = b.broker

        def produce(partition: int, value: bytes) -> None:
            assert core.handle(m.ProduceRequest("wake", partition, 1, 5000, encode_values([value], 1))).error_code == 0

        def scenario() -> tuple[Any, ...]:
            produce(0, b"a")
            produce(1, b"b")
            single, multi = Session(), Session()
            fetch = core.handle(m.FetchRequest("wake", 0, 1, 1 << 20, 60_000), single, deferred=True)
            many = core.handle(m.MultiFetchRequest(60_000, 1, 1 << 20, "", [m.FetchPartition("wake", 0, 1),
                                                                           m.FetchPartition("wake", 1, 1)]),
                               multi, deferred=True)
            parked = (fetch.done, many.done, core.waiters.waiting, single.waiting_fetches, multi.waiting_fetches)
            produce(1, b"to partition 1")  # wakes the MultiFetch only
            after_one = (fetch.done, many.done, core.waiters.waiting)
            produce(0, b"to partition 0")
            return parked, after_one, fetch.result, many.result, core.waiters.waiting, single.waiting_fetches

        parked, after_one, fetched, many, waiting, slots = b.call(scenario)
        assert parked == (False, False, 2, 1, 1)
        assert after_one == (False, True, 1)
        assert (waiting, slots) == (0, 0)
        messages, _ = decode_fetched(fetched.records, "wake", 0, 1)
        assert [bytes(x.data) for x in messages] == [b"to partition 0"]
        assert [len(p.records) > 0 for p in many.partitions] == [False, True]
        messages, _ = decode_fetched(many.partitions[1].records, "wake", 1, 1)
        assert [bytes(x.data) for x in messages] == [b"to partition 1"]


def test_a_waiting_fetch_of_a_closed_connection_gives_its_slot_back_and_is_never_answered(tmp_path: Path) -> None:
    with InProcessBroker(tmp_path / "b", {"numPartitions": 1, "unflushThreshold": 1000}) as b:
        core = b.broker

        def scenario() -> tuple[Any, ...]:
            assert core.handle(m.ProduceRequest("gone", 0, 1, 5000, encode_values([b"x"], 1))).error_code == 0
            session = Session()
            fetch = core.handle(m.FetchRequest("gone", 0, 1, 1 << 20, 60_000), session, deferred=True)
            answered: list[Any] = []
            fetch.on_done(answered.append)
            before = (core.waiters.waiting, session.waiting_fetches)
            fetch.cancel()  # what the transport does when the connection closes
            assert core.handle(m.ProduceRequest("gone", 0, 1, 5000, encode_values([b"y"], 1))).error_code == 0
            return before, (core.waiters.waiting, session.waiting_fetches), answered

        before, after, answered = b.call(scenario)
        assert before == (1, 1) and after == (0, 0) and answered == []


def test_woken_long_polls_answer_with_the_bytes_the_log_holds_and_keep_no_batch_after(tmp_path: Path) -> None:
    """A woken Fetch and a MultiFetch (held to the end of the read, as the transport does) answer with the
    batch just appended from memory: the same bytes a later Fetch of the same offset reads from the file,
    keys, headers and the broker's stamp included; once answered, the log keeps no batch in memory."""
    with InProcessBroker(tmp_path / "b", {"numPartitions": 2, "unflushThreshold": 1000}) as b:
        core = b.broker

        def produce(partition: int, batch: bytes) -> None:
            assert core.handle(m.ProduceRequest("tail", partition, 1, 5000, batch)).error_code == 0

        def scenario() -> tuple[Any, ...]:
            produce(0, encode_values([b"before"], 1))
            produce(1, encode_values([b"before"], 1))
            fetch = core.handle(m.FetchRequest("tail", 0, 1, 1 << 20, 60_000), Session(), deferred=True)
            many = core.handle(m.MultiFetchRequest(60_000, 1, 1 << 20, "", [m.FetchPartition("tail", 0, 1),
                                                                           m.FetchPartition("tail", 1, 1)]),
                               Session(), deferred=True)
            core.waiters.hold()  # one read of the transport: a producer's burst to both partitions
            produce(0, encode_messages([Message("tail", b"v0", key=b"k0", headers=[("h", b"x")])]))
            produce(1, encode_messages([Message("tail", b"v1", key=b"k1"), Message("tail", b"v2")]))
            held = (fetch.done, many.done)
            core.waiters.release()
            logs = [core.logs.get("tail", p) for p in (0, 1)]
            kept = [log.appended_tail(1) if log is not None else "no log" for log in logs]
            again = [core.handle(m.FetchRequest("tail", p, 1, 1 << 20, 0)) for p in (0, 1)]
            return held, fetch.result, many.result, kept, again

        held, fetched, many, kept, again = b.call(scenario)
        assert held == (True, False)  # the Fetch inside the append, the MultiFetch at the end of the read
        assert kept == [None, None]
        assert fetched.records == again[0].records and len(fetched.records) > 0
        assert [p.records for p in many.partitions] == [again[0].records, again[1].records]
        assert fetched.log_end_offset == again[0].log_end_offset == 2
        (message,), _ = decode_fetched(fetched.records, "tail", 0, 1)
        assert (bytes(message.data), message.key, message.headers, message.offset) == (b"v0", b"k0", [("h", b"x")], 1)
        assert [bytes(x.data) for x in decode_fetched(many.partitions[1].records, "tail", 1, 1)[0]] == [b"v1", b"v2"]
