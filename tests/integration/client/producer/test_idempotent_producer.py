"""The idempotent producer against a real broker: a retried batch is stored once and answered with the
original offsets, also after a restart and a kill -9 (the table is rebuilt from the log), gaps and old
epochs are refused without storing anything, and a producer under load rides out a kill -9 of its broker
with every acknowledged message read back once, in the order it was sent."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from metaq.client import connect
from metaq.errors import InvalidProducerEpochError, OutOfOrderSequenceError, error_for_code
from metaq.net.blocking import BlockingConnection
from metaq.net.codec import ConnectionSettings
from metaq.protocol.messages import ProduceRequest, ProduceResponse
from metaq.protocol.records import ProducerStamp, encode_values, with_producer_stamp
from metaq.testing import BrokerProcess, wait_until
from metaq.testing.history import ProduceLoad, check_history, read_back
from metaq.testing.proxy import ReplyDroppingProxy

SETTINGS = ConnectionSettings("idempotence-test", 5.0, 30.0, 16, 64 << 20)
PID = 987654321


def _produce(broker: BrokerProcess, batch: bytes, partition: int = 0) -> ProduceResponse:
    conn = BlockingConnection.open(("127.0.0.1", broker.port), SETTINGS)
    try:
        return conn.call(ProduceRequest("idem", partition, 1, 10_000, batch))  # type: ignore[no-any-return]
    finally:
        conn.close()


def _ok(response: ProduceResponse) -> ProduceResponse:
    assert not response.error_code, error_for_code(response.error_code, response.error_message or "")
    return response


def _stored(broker: BrokerProcess) -> list[bytes]:
    with connect(broker.servers) as session:
        return [bytes(m.data) for batch in session.create_pull_consumer().iterate_batches(
            "idem", session.partitions("idem")[0], "earliest", stop_at_end=True) for m in batch]


def _batch(values: list[bytes], sequence: int, epoch: int = 0) -> bytes:
    return with_producer_stamp(encode_values(values, 1), ProducerStamp(PID, epoch, sequence))


def test_a_retried_batch_is_stored_once_with_its_original_offsets_also_after_restart_and_kill(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 1})
    first = _batch([b"a", b"b"], 0)
    original = _ok(_produce(broker, first))
    _ok(_produce(broker, encode_values([b"plain"], 1)))  # a plain producer in between
    again = _ok(_produce(broker, first))
    assert (again.base_offset, again.base_message_id, again.append_time_ms) == (
        original.base_offset, original.base_message_id, original.append_time_ms)
    second = _batch([b"c"], 2)
    _ok(_produce(broker, second))
    assert _stored(broker) == [b"a", b"b", b"plain", b"c"]

    assert broker.stop() == 0
    broker.start()
    assert _ok(_produce(broker, first)).base_offset == original.base_offset

    third = _batch([b"d"], 3)
    third_offset = _ok(_produce(broker, third)).base_offset
    broker.kill()  # the snapshot of a clean close is older than ``third``: the log tells
    broker.start()
    assert _ok(_produce(broker, third)).base_offset == third_offset
    assert _ok(_produce(broker, second)).base_offset == 3
    assert _stored(broker) == [b"a", b"b", b"plain", b"c", b"d"]


def test_gaps_and_old_epochs_are_refused_and_nothing_is_stored(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 1})
    _ok(_produce(broker, _batch([b"a"], 0)))
    gap = _produce(broker, _batch([b"x"], 5))
    assert isinstance(error_for_code(gap.error_code), OutOfOrderSequenceError)
    _ok(_produce(broker, _batch([b"b"], 0, epoch=1)))  # the producer restarted its sequence
    old = _produce(broker, _batch([b"y"], 1, epoch=0))
    assert isinstance(error_for_code(old.error_code), InvalidProducerEpochError)
    assert _stored(broker) == [b"a", b"b"]


@pytest.mark.slow
def test_an_idempotent_producer_rides_out_a_kill_9_without_duplicates_or_reordering(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 3})
    with connect(broker.servers) as session:
        session.admin().create_topic("idem", 3)
    load = ProduceLoad({"servers": broker.servers, "request_timeout_s": 10, "reconnect_attempts": 50},
                       "idem", window=2000, time_limit_s=90, limit=400_000,
                       producer_config={"enable_idempotence": True, "linger_ms": 2}).start()
    for _round in range(2):
        before = len(load.acked)
        wait_until(lambda before=before: len(load.acked) >= before + 20_000, timeout_s=60,  # type: ignore[misc]
                   message="20,000 more acknowledged messages")
        broker.kill()
        broker.start()
    before = len(load.acked)
    wait_until(lambda: len(load.acked) >= before + 20_000, timeout_s=60, message="acks after the last restart")
    load.stop()
    with connect(broker.servers) as session:
        read = read_back(session, "idem")
    problems = check_history(read, load.acked, load.failed)
    assert not problems, problems[:10]
    for pid, messages in read.items():  # within a partition, in the order sent
        numbers = [int(data[1:]) for _, data in messages]
        assert numbers == sorted(numbers), f"{pid}: messages stored out of send order"
    assert len(load.acked) + len(load.failed) == load.sent
    assert len(load.failed) < load.sent // 10, f"{len(load.failed)} of {load.sent} sends failed"


@pytest.mark.parametrize("idempotent", [False, True], ids=["plain-retries", "idempotent"])
def test_lost_acknowledgements_duplicate_plain_retries_but_not_idempotent_ones(
        broker_factory: Callable[..., BrokerProcess], idempotent: bool) -> None:
    """Replies lost with their connections (the batch stored, its answer never delivered): a producer that
    retries sends the batch again. Plain retries store it twice; the idempotent producer's are dropped by
    the broker and answered with the original offsets, so every message is stored once, in send order."""
    broker = broker_factory({"numPartitions": 2})
    with connect(broker.servers) as session:
        session.admin().create_topic("idem", 2)
    config = {"enable_idempotence": True} if idempotent else {"retries": 30}
    # drop_every counts reply chunks: the broker writes the acks of one read together, so chunks are few
    with ReplyDroppingProxy(("127.0.0.1", broker.port), drop_every=8) as proxy:
        load = ProduceLoad({"servers": proxy.address, "request_timeout_s": 10, "reconnect_attempts": 50,
                            "reconnect_backoff_s": 0.01}, "idem", window=500, time_limit_s=60, limit=30_000,
                           producer_config={**config, "linger_ms": 1, "retry_backoff_ms": 5}).start()
        wait_until(lambda: not load.running, timeout_s=90, message="the load to finish")
        load.stop()
        assert proxy.dropped >= 5
    with connect(broker.servers) as session:
        read = read_back(session, "idem")
    problems = check_history(read, load.acked, load.failed)
    if not idempotent:
        assert any("read twice" in p for p in problems), "lost acks should have made plain retries duplicate"
        return
    assert not problems, problems[:10]
    assert not load.failed, list(load.failed.values())[:3]
    for pid, messages in read.items():
        numbers = [int(data[1:]) for _, data in messages]
        assert numbers == sorted(numbers), f"{pid}: messages stored out of send order"
