"""The stores beside the segments on a full disk (a real, small tmpfs): SIGTERM exits 0 with a WARNING (the
clean-shutdown checkpoint cannot be written: the next start checks the partitions as after a crash, nothing
lost); the first delayed produce to a partition answers DISK_FULL (it was UNKNOWN_SERVER_ERROR with a
traceback from writing .delay/targets.json; the producer resends it until its delivery deadline); a transaction
commit answers DISK_FULL (it was "short write to the transaction log")."""

from __future__ import annotations

import time

import pytest

from metaq.client import connect
from metaq.errors import DeliveryTimeoutError, DiskFullError
from metaq.net.blocking import BlockingConnection
from metaq.net.codec import ConnectionSettings
from metaq.protocol import messages as m
from metaq.protocol.records import ProducerStamp, encode_values, with_producer_stamp
from metaq.testing.fs import small_disk
from metaq.types import Message

pytestmark = pytest.mark.slow
SETTINGS = ConnectionSettings("disk-full-test", 5.0, 30.0, 16, 64 << 20)
PAGE = 4096


def _read(servers: str, topic: str) -> list[bytes]:
    with connect(servers) as session:
        consumer = session.create_pull_consumer()
        return [bytes(msg.data) for p in session.partitions(topic)
                for msg in consumer.iterate(topic, p, 0, stop_at_end=True, max_wait_ms=0)]


def test_sigterm_on_a_full_disk_exits_cleanly_and_the_next_start_recovers(tmp_path, broker_factory) -> None:
    with small_disk(tmp_path / "disk", 8 << 20) as disk:
        broker = broker_factory({"unflushThreshold": 1}, name="disk/data")
        with connect(broker.servers) as session:
            session.admin().create_topic("full", 2)
            producer = session.create_producer()
            sent = [b"message %d" % i for i in range(50)]
            for i, payload in enumerate(sent):
                assert producer.send(Message("full", payload, partition=i % 2)).success
        disk.fill(leave_bytes=0)
        assert broker.stop() == 0, "SIGTERM on a full disk is a clean exit"  # was 1, with a traceback
        warnings = [line for line in broker.log_lines if "cannot write the clean-shutdown checkpoint" in line]
        assert warnings and " WARNING " in warnings[0]
        broker.start()
        assert sorted(_read(broker.servers, "full")) == sorted(sent)
        assert any("recovered from an unclean stop" in line for line in broker.log_lines)
        disk.free()
        assert broker.stop() == 0


def test_the_first_delayed_produce_to_a_partition_on_a_full_disk_answers_disk_full(tmp_path, broker_factory) -> None:
    with small_disk(tmp_path / "disk", 8 << 20) as disk:
        broker = broker_factory({"unflushThreshold": 1}, name="disk/data")
        with connect(broker.servers) as session:
            session.admin().create_topic("later", 1)
            # DISK_FULL is retriable (space may be freed): the producer resends until its delivery deadline, then
            # fails with DeliveryTimeoutError naming it (docs/producer.md)
            producer = session.create_producer(delivery_timeout_ms=2000)
            disk.fill(leave_bytes=0)
            result = producer.send(Message("later", b"in a minute", partition=0, delay_ms=60_000))
            error = result.error
            assert not result.success and isinstance(error, DeliveryTimeoutError), repr(error)
            assert isinstance(error.cause, DiskFullError) and not error.maybe_stored, repr(error)
            disk.free()
            again = producer.send(Message("later", b"in a second", partition=0, delay_ms=1_000))
            assert again.success, repr(again.error)
        deadline = time.monotonic() + 30
        while _read(broker.servers, "later") != [b"in a second"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _read(broker.servers, "later") == [b"in a second"]
        assert broker.stop() == 0


def _call(conn: BlockingConnection, request: object) -> object:
    return conn.call(request)


def _log_bytes(servers: str) -> int:
    with connect(servers) as session:
        return int(session.admin().stats()["transactions"]["log_bytes"])


def test_a_transaction_commit_on_a_full_disk_answers_disk_full(tmp_path, broker_factory) -> None:
    with small_disk(tmp_path / "disk", 8 << 20) as disk:
        broker = broker_factory({"numPartitions": 1}, name="disk/data")
        conn = BlockingConnection.open(("127.0.0.1", broker.port), SETTINGS)
        txid = "t" * 100  # its COMMIT record takes 123 bytes
        batch = with_producer_stamp(encode_values([b"a", b"b"], 1), ProducerStamp(7, 0, 0))
        for request in (m.TransactionRequest(m.TX_BEGIN, txid),
                        m.ProduceRequest("t", 0, 1, 10_000, transaction_id=txid, records=batch)):
            assert _call(conn, request).error_code == 0  # type: ignore[attr-defined]
        disk.fill(leave_bytes=0)
        # leave fewer bytes than the COMMIT needs in the transaction log's last page (a full disk still takes
        # writes into the page a file already has): pad it with BEGIN records of dummy transactions
        room = -_log_bytes(broker.servers) % PAGE
        n = 0
        while room >= 123:
            size = min(169, room - 5)  # a BEGIN record is 41 bytes and its txid (1-128 characters)
            answer = _call(conn, m.TransactionRequest(m.TX_BEGIN, f"{n:03d}" + "p" * (size - 44)))
            assert answer.error_code == 0, answer  # type: ignore[attr-defined]
            n += 1
            room = -_log_bytes(broker.servers) % PAGE
        commit = _call(conn, m.TransactionRequest(m.TX_COMMIT, txid))
        assert commit.error_code == DiskFullError.code, commit  # type: ignore[attr-defined]
        assert "disk is full" in (commit.error_message or "")  # type: ignore[attr-defined]
        (status,) = _call(conn, m.TransactionRequest(m.TX_STATUS, txid)).xids  # type: ignore[attr-defined]
        assert status == "open", "nothing of the commit took effect: it can be retried"
        disk.free()
        assert _call(conn, m.TransactionRequest(m.TX_COMMIT, txid)).error_code == 0  # type: ignore[attr-defined]
        conn.close()
        assert _read(broker.servers, "t") == [b"a", b"b"]
        assert broker.stop() == 0
