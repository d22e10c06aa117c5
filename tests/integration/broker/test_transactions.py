"""Local transactions against a real broker: nothing of an open or rolled-back transaction is ever read,
a commit shows every message at once in every partition, timeouts roll back and say so, and a kill -9 in
the middle of committing transactions leaves each one whole or absent (docs/transactions.md)."""

from __future__ import annotations

import signal
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from metaq.client import connect
from metaq.client.transaction import TransactionError, TransactionOutcomeError
from metaq.errors import InvalidTxnStateError, OutOfOrderSequenceError
from metaq.net.blocking import BlockingConnection
from metaq.net.codec import ConnectionSettings, raise_for_error
from metaq.protocol import messages as m
from metaq.protocol.records import ProducerStamp, encode_values, with_producer_stamp
from metaq.storage import LogConfig, PartitionLog
from metaq.storage.txlog import TransactionLog, TxState
from metaq.testing import BrokerProcess, wait_until
from metaq.types import Message

SETTINGS = ConnectionSettings("transactions-test", 5.0, 30.0, 16, 64 << 20)


def _read_all(broker: BrokerProcess, topic: str) -> list[bytes]:
    with connect(broker.servers) as session:
        consumer = session.create_pull_consumer()
        out: list[bytes] = []
        for p in session.partitions(topic):
            for batch in consumer.iterate_batches(topic, p, "earliest", stop_at_end=True):
                out.extend(bytes(msg.data) for msg in batch)
        return out


def _stats(broker: BrokerProcess) -> dict:  # type: ignore[type-arg]
    with connect(broker.servers) as session:
        return session.admin().stats()


def test_an_open_transaction_is_invisible_and_a_commit_shows_every_partition_at_once(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 3})
    with connect(broker.servers) as session:
        admin = session.admin()
        admin.create_topic("orders", 3)
        admin.create_topic("audit", 1)
        producer = session.create_producer()
        producer.send(Message("orders", b"before"))
        producer.begin_transaction()
        for i in range(30):
            producer.send(Message("orders", b"o%d" % i))
        producer.send(Message("audit", b"a0"))
        assert _read_all(broker, "orders") == [b"before"] and _read_all(broker, "audit") == []
        result = producer.commit()
    assert result.count == 31
    assert sorted({b.partition for b in result.batches if b.topic == "orders"}) == [0, 1, 2]
    assert sorted(_read_all(broker, "orders")) == sorted([b"before"] + [b"o%d" % i for i in range(30)])
    assert _read_all(broker, "audit") == [b"a0"]
    for batch in result.batches:  # the offsets the commit reports are where the messages are
        with connect(broker.servers) as session:
            got = session.create_pull_consumer().get(batch.topic, batch.partition, batch.base_offset)
            assert len(got) >= batch.record_count


def test_rollback_and_an_exception_leave_nothing_and_the_producer_goes_on(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 2})
    with connect(broker.servers) as session:
        session.admin().create_topic("t", 2)
        producer = session.create_producer()
        producer.begin_transaction()
        for i in range(10):
            producer.send(Message("t", b"gone%d" % i))
        producer.rollback()
        with pytest.raises(RuntimeError), producer.transaction():
            producer.send(Message("t", b"also-gone"))
            raise RuntimeError("the application failed")
        with producer.transaction():
            producer.send(Message("t", b"kept"))
        producer.send(Message("t", b"plain"))
        with pytest.raises(TransactionError):
            producer.commit()
    assert sorted(_read_all(broker, "t")) == [b"kept", b"plain"]
    tx = _stats(broker)["transactions"]
    assert (tx["committed"], tx["rolled_back"], tx["open"]) == (1, 2, 0)


def test_a_transaction_past_its_timeout_is_rolled_back_and_its_commit_says_why(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 1, "maxTxTimeoutInSeconds": 5})
    broker.allow_log(r"rolled back by the broker: timed out: open for longer than its timeout of 300 ms")
    with connect(broker.servers) as session:
        session.admin().create_topic("t", 1)
        producer = session.create_producer()
        producer.begin_transaction(timeout_s=0.3)
        producer.send(Message("t", b"late"))
        wait_until(lambda: _stats(broker)["transactions"]["timed_out"] == 1, timeout_s=10,
                   message="the broker to roll the transaction back")
        with pytest.raises(TransactionOutcomeError, match="timed out") as failed:
            producer.commit()
        assert isinstance(failed.value.cause, InvalidTxnStateError) and failed.value.outcome_known
        assert producer.transaction_status(failed.value.transaction_id).startswith("rolled back")
        with pytest.raises(Exception, match="maxTxTimeoutInSeconds"):
            producer.begin_transaction(timeout_s=60)
            producer.send(Message("t", b"x"))
    assert _read_all(broker, "t") == []


def test_a_commit_whose_reply_is_lost_names_its_transaction_and_its_status_tells_how_it_ended(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    """The retry-safe pattern (docs/transactions.md): a commit that fails with its outcome unknown raises
    TransactionOutcomeError with the transaction's id and broker; transaction_status says how it ended, so the
    application finishes it (or sends again) without storing it twice."""
    broker = broker_factory({"numPartitions": 1})
    with connect(broker.servers, request_timeout_s=1.0) as session:
        session.admin().create_topic("t", 1)
        producer = session.create_producer()
        producer.tpc_begin("in-doubt-1")
        producer.send(Message("t", b"in-doubt"))
        producer.tpc_prepare()  # every put is on the broker: only the commit is left
        broker.signal(signal.SIGSTOP)
        try:
            with pytest.raises(TransactionOutcomeError) as failed:
                producer.tpc_commit()  # no reply within the request timeout
        finally:
            broker.signal(signal.SIGCONT)
        error = failed.value
        assert error.transaction_id == "0:in-doubt-1:" and error.broker_id is not None
        assert not error.outcome_known and "transaction_status" in str(error)
        seen: list[str] = []
        wait_until(lambda: seen.append(producer.transaction_status(error.transaction_id, error.broker_id))
                   or seen[-1] != "committing", 30, 0.05, "the commit under way to be applied")
        status = seen[-1]
        assert status in ("committed", "prepared"), status
        if status == "prepared":  # the commit never reached it: finish it (a local transaction would send again)
            producer.tpc_commit(error.transaction_id)
        assert producer.transaction_status(error.transaction_id) == "committed"
    assert _read_all(broker, "t") == [b"in-doubt"]


def test_the_sync_send_async_is_refused_inside_a_transaction(broker_factory: Callable[..., BrokerProcess]) -> None:
    """As the asyncio producer's (and docs/transactions.md say): not silently added to the transaction."""
    broker = broker_factory({"numPartitions": 1})
    with connect(broker.servers) as session:
        session.admin().create_topic("t", 1)
        producer = session.create_producer()
        with producer.transaction():
            producer.send(Message("t", b"in"))
            with pytest.raises(TransactionError, match="send_async cannot be used inside a transaction"):
                producer.send_async(Message("t", b"not-in"))
        assert producer.send_async(Message("t", b"after")).result(30).success
    assert _read_all(broker, "t") == [b"in", b"after"]


def _call(broker: BrokerProcess, *requests: object) -> list[object]:
    conn = BlockingConnection.open(("127.0.0.1", broker.port), SETTINGS)
    try:
        return [raise_for_error(conn.call(r)) for r in requests]
    finally:
        conn.close()


def _stamped(values: list[bytes], pid: int, sequence: int = 0) -> bytes:
    return with_producer_stamp(encode_values(values, 1), ProducerStamp(pid, 0, sequence))


def test_after_kill_9_open_transactions_are_rolled_back_and_prepared_ones_survive(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 1})
    _call(broker, m.TransactionRequest(m.TX_BEGIN, "open-1"),
          m.ProduceRequest("t", 0, 1, 10_000, transaction_id="open-1", records=_stamped([b"open"], 76)),
          m.TransactionRequest(m.TX_BEGIN, "xa-1"),
          m.ProduceRequest("t", 0, 1, 10_000, transaction_id="xa-1", records=_stamped([b"p1", b"p2"], 77)),
          m.TransactionRequest(m.TX_PREPARE, "xa-1", xid="gtrid-1"))
    broker.kill()
    broker.start()
    assert _read_all(broker, "t") == []
    (recovered,) = _call(broker, m.TransactionRequest(m.TX_RECOVER))
    assert recovered.xids == ["gtrid-1"]  # type: ignore[attr-defined]
    with pytest.raises(InvalidTxnStateError, match="restarted"):
        _call(broker, m.TransactionRequest(m.TX_COMMIT, "open-1"))
    _call(broker, m.TransactionRequest(m.TX_COMMIT, "xa-1"))
    assert _read_all(broker, "t") == [b"p1", b"p2"]


def test_a_retried_put_is_taken_once_and_a_gap_is_refused(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 1})
    put = m.ProduceRequest("t", 0, 1, 10_000, transaction_id="r-1", records=_stamped([b"a"], 9))
    _call(broker, m.TransactionRequest(m.TX_BEGIN, "r-1"), put, put)
    with pytest.raises(OutOfOrderSequenceError):
        _call(broker, m.ProduceRequest("t", 0, 1, 10_000, transaction_id="r-1", records=_stamped([b"c"], 9, 5)))
    _call(broker, m.TransactionRequest(m.TX_COMMIT, "r-1"))
    assert _read_all(broker, "t") == [b"a"]


def test_a_commit_logged_but_not_applied_is_applied_once_at_start(tmp_path: Path,
                                                                  broker_factory: Callable[..., BrokerProcess]) -> None:
    """The crash between COMMIT and APPLIED, built on disk: the transaction log says committed, and the first of
    its two batches already reached the partition. The broker appends the second, and only the second."""
    broker = broker_factory({"numPartitions": 1}, start=False)
    data = broker.data_dir
    first, second = _stamped([b"c1", b"c2"], 55), _stamped([b"c3"], 55, 2)
    plog = PartitionLog.open(data / "t-0", "t", 0, LogConfig(), 0)
    plog.append(first)
    plog.close()
    txlog = TransactionLog(data / ".txlog")
    txlog.open()
    state = TxState("tx-crashed", 60_000, 0)
    txlog.begin(state)
    txlog.put(state, "t", 0, first)
    txlog.put(state, "t", 0, second)
    txlog.commit(state)
    txlog.close()
    broker.start()
    assert _read_all(broker, "t") == [b"c1", b"c2", b"c3"]
    broker.kill()  # and again: APPLIED was logged, nothing more is appended
    broker.start()
    assert _read_all(broker, "t") == [b"c1", b"c2", b"c3"]


@pytest.mark.slow
def test_kill_9_while_transactions_commit_leaves_each_whole_or_absent(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 3, "flushTxLogAtCommit": 1})
    with connect(broker.servers) as session:
        session.admin().create_topic("tx", 3)
    committed: list[bytes] = []
    stop = threading.Event()

    def run(round_: int) -> None:
        n = 0
        with connect(broker.servers, reconnect_attempts=1, request_timeout_s=5) as session:
            producer = session.create_producer()
            while not stop.is_set() and n < 100_000:
                try:
                    with producer.transaction():
                        for i in range(7):
                            producer.send(Message("tx", b"%d.%d-%d" % (round_, n, i)))
                    committed.append(b"%d.%d" % (round_, n))
                except Exception:
                    return
                n += 1

    for round_ in range(2):
        stop.clear()
        before = len(committed)
        loader = threading.Thread(target=run, args=(round_,))
        loader.start()
        wait_until(lambda before=before: len(committed) >= before + 50, timeout_s=60,  # type: ignore[misc]
                   message="50 more committed transactions")
        broker.kill()
        stop.set()
        loader.join(30)
        assert not loader.is_alive()
        broker.start()
    counts = Counter(data.split(b"-")[0] for data in _read_all(broker, "tx"))
    broken = {n: c for n, c in counts.items() if c != 7}
    assert not broken, f"transactions stored in part or twice: {list(broken.items())[:5]}"
    missing = [n for n in committed if n not in counts]
    assert not missing, f"acknowledged commits lost: {missing[:5]}"


def _status(broker: BrokerProcess, txid: str) -> str:
    (response,) = _call(broker, m.TransactionRequest(m.TX_STATUS, txid))
    return str(response.xids[0])  # type: ignore[attr-defined]


def test_how_a_transaction_ended_survives_kill_9_and_checkpoints(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    """The exactly-once Spark sink asks "was X committed?" after a driver or broker restart: the answer
    must not change with a kill -9, nor when a checkpoint has dropped the records it came from."""
    broker = broker_factory({"numPartitions": 1, "checkpointInterval": 200})
    put = {txid: m.ProduceRequest("t", 0, 1, 10_000, transaction_id=txid, records=_stamped([txid.encode()], 5 + i))
           for i, txid in enumerate(("c-1", "r-1", "o-1", "p-1"))}
    _call(broker, m.TransactionRequest(m.TX_BEGIN, "c-1"), put["c-1"], m.TransactionRequest(m.TX_COMMIT, "c-1"),
          m.TransactionRequest(m.TX_BEGIN, "r-1"), put["r-1"], m.TransactionRequest(m.TX_ROLLBACK, "r-1"),
          m.TransactionRequest(m.TX_BEGIN, "o-1"), put["o-1"],
          m.TransactionRequest(m.TX_BEGIN, "p-1"), put["p-1"], m.TransactionRequest(m.TX_PREPARE, "p-1", xid="p-1"))
    expected = {"c-1": "committed", "r-1": "rolled back (rolled back by the client)", "o-1": "open",
                "p-1": "prepared", "never": "unknown"}
    assert {txid: _status(broker, txid) for txid in expected} == expected
    broker.kill()
    broker.start()
    expected["o-1"] = "rolled back (the broker restarted before it was prepared or committed)"
    assert {txid: _status(broker, txid) for txid in expected} == expected
    # a checkpoint starts a log generation without those records: the outcomes go along (DONE records)
    checkpoints = _stats(broker)["transactions"]["checkpoints"]
    wait_until(lambda: _stats(broker)["transactions"]["checkpoints"] >= checkpoints + 2, timeout_s=10,
               message="two transaction log checkpoints")
    broker.kill()
    broker.start()
    assert {txid: _status(broker, txid) for txid in expected} == expected
    with pytest.raises(InvalidTxnStateError, match="committed"):  # a committed id is never begun again
        _call(broker, m.TransactionRequest(m.TX_BEGIN, "c-1"))
    _call(broker, m.TransactionRequest(m.TX_BEGIN, "r-1"),  # a rolled-back one may be
          m.ProduceRequest("t", 0, 1, 10_000, transaction_id="r-1", records=_stamped([b"r-1 again"], 99)),
          m.TransactionRequest(m.TX_COMMIT, "r-1"), m.TransactionRequest(m.TX_COMMIT, "p-1"))
    assert _status(broker, "r-1") == "committed"
    assert _read_all(broker, "t") == [b"c-1", b"r-1 again", b"p-1"]
