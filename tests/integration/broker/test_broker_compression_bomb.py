"""Compression bombs: a batch that inflates to more than the broker takes is refused with CORRUPT_MESSAGE, and
its check runs in a worker thread, so other clients are served meanwhile (the check used to run on the event
loop: one 300 KB lz4 bomb stalled every other client 0.56 s, four in one request 1.8 s). A connection's own
requests still take effect in the order they came: a compressed batch checked off the loop is appended before
the plain batch pipelined behind it."""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable

import lz4.frame

from metaq.client import connect
from metaq.errors import CorruptMessageError
from metaq.net.blocking import BlockingConnection
from metaq.net.codec import ConnectionSettings, raise_for_error
from metaq.protocol import messages as m
from metaq.protocol.records import Compression, encode, encode_values
from metaq.testing import BrokerProcess

SETTINGS = ConnectionSettings("bomb-test", 5.0, 120.0, 64, 256 << 20)


def _lz4_without_size(values: list[bytes]) -> bytes:
    """A valid lz4 batch whose frame does not declare its inflated size (so only inflating it tells)."""
    keep = encode.compress
    encode.compress = lambda codec, data: lz4.frame.compress(data, store_size=False)  # type: ignore[assignment]
    try:
        return encode_values(values, 1, Compression.LZ4)
    finally:
        encode.compress = keep  # type: ignore[assignment]


def test_a_bomb_is_refused_and_other_clients_are_served_while_it_is_checked(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 1})
    bomb = _lz4_without_size([b"\0" * (70 << 20)])  # ~300 KB inflating past 4 x maxBatchSize (64 MiB)
    assert len(bomb) < 1 << 20
    attacker = BlockingConnection.open(("127.0.0.1", broker.port), SETTINGS)
    other = BlockingConnection.open(("127.0.0.1", broker.port), SETTINGS)
    raise_for_error(other.call(m.ProduceRequest("t", 0, 1, 10_000, records=encode_values([b"first"], 1))))
    answer: list[tuple[float, object]] = []
    request = m.MultiProduceRequest(1, 60_000, "", [m.ProducePartition("t", 0, bomb) for _ in range(4)])

    def attack() -> None:
        response = attacker.call(request)
        answer.append((time.perf_counter(), response))

    started = time.perf_counter()
    thread = threading.Thread(target=attack)
    thread.start()
    replies: list[float] = [started]
    while not answer:  # another client produces one message after another meanwhile
        raise_for_error(other.call(m.ProduceRequest("t", 0, 1, 10_000, records=encode_values([b"meanwhile"], 1))))
        replies.append(time.perf_counter())
    thread.join()
    answered_at, response = answer[0]
    assert [p.error_code for p in response.partitions] == [CorruptMessageError.code] * 4  # type: ignore[attr-defined]
    assert all("more than" in (p.error_message or "") for p in response.partitions)  # type: ignore[attr-defined]
    # Event-based: the other client's replies kept coming while the bomb was checked. With the check on the loop
    # its longest wait was the whole check (the bomb's answer time); now it is a small part of it.
    longest_wait = max(b - a for a, b in itertools.pairwise(replies))
    print(f"bomb answered after {answered_at - started:.3f} s; the other client's longest wait {longest_wait:.3f} s, "
          f"{len(replies) - 1} produces answered meanwhile")  # the figures of docs/reliability.md (pytest -s)
    assert longest_wait < (answered_at - started) / 2, (longest_wait, answered_at - started, len(replies))
    attacker.close()
    other.close()
    with connect(broker.servers) as session:
        got = [bytes(msg.data) for batch in session.create_pull_consumer().iterate_batches(
            "t", 0, "earliest", stop_at_end=True) for msg in batch]
    assert got == [b"first"] + [b"meanwhile"] * (len(replies) - 1), "nothing of the bomb is stored"


def test_a_connection_s_batches_are_appended_in_the_order_they_came(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 1})
    conn = BlockingConnection.open(("127.0.0.1", broker.port), SETTINGS)
    sent = []
    for n in range(30):  # pipelined: compressed ones over 16 KiB (checked off the loop) and plain ones interleaved
        values = [b"%03d-%d " % (n, i) + os.urandom(8000) for i in range(3)]
        batch = encode_values(values, 1, Compression.LZ4 if n % 3 else Compression.NONE)
        conn.send(m.ProduceRequest("t", 0, 1, 10_000, records=batch))
        sent.extend(values)
    offsets = [raise_for_error(conn.receive()).base_offset for _ in range(30)]  # type: ignore[attr-defined]
    assert offsets == [3 * n for n in range(30)]
    conn.close()
    with connect(broker.servers) as session:
        got = [bytes(msg.data) for batch in session.create_pull_consumer().iterate_batches(
            "t", 0, "earliest", stop_at_end=True) for msg in batch]
    assert got == sent
