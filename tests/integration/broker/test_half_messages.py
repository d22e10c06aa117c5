"""Half messages (RocketMQ's transactional messages) against a real broker: the local transaction decides,
or, when it cannot ("unknown", an exception, a dead producer), the producer group's checker is asked back
by the broker, with the half message itself, until it decides. Only checks handed to a connected checker
count: with no checker a half message waits (maxTxTimeoutInSeconds does not apply once it is prepared);
no decision after transactionCheckMax checks rolls it back, visibly (an ERROR naming it, a metric,
`metaq admin transactions`). A half message survives a kill -9 of the broker, and nothing undecided is
ever read (docs/transactions.md)."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from collections.abc import Callable

import pytest
from cli_process import metaq

from metaq.client import connect
from metaq.errors import InvalidRequestError
from metaq.protocol import messages as m
from metaq.testing import BrokerProcess, wait_until
from metaq.types import Message

OPTIONS = {"numPartitions": 1, "transactionTimeOut": 100, "transactionCheckInterval": 200, "transactionCheckMax": 3}


def _read(broker: BrokerProcess) -> list[bytes]:
    with connect(broker.servers) as session:
        consumer = session.create_pull_consumer()
        return [bytes(m.data) for p in session.partitions("orders")
                for batch in consumer.iterate_batches("orders", p, "earliest", stop_at_end=True) for m in batch]


def _tx_stats(broker: BrokerProcess) -> dict:  # type: ignore[type-arg]
    with connect(broker.servers) as session:
        return session.admin().stats().get("transactions", {})


@pytest.fixture
def half_broker(broker_factory: Callable[..., BrokerProcess]) -> BrokerProcess:
    broker = broker_factory(OPTIONS)
    with connect(broker.servers) as session:
        session.admin().create_topic("orders", 1)
    return broker


def test_the_local_transaction_decides_commit_or_rollback(half_broker: BrokerProcess) -> None:
    seen: list[str] = []
    with connect(half_broker.servers) as session:
        producer = session.create_producer()

        def execute(message: Message, txid: str) -> str:
            seen.append(txid)
            assert message.data not in _read(half_broker)  # stored, not visible, while the local work runs
            return "commit" if message.data == b"yes" else "rollback"

        _, first = producer.send_in_transaction(Message("orders", b"yes"), execute, "shop")
        _, second = producer.send_in_transaction(Message("orders", b"no"), execute, "shop")
    assert (first, second) == ("commit", "rollback") and len(seen) == 2
    assert _read(half_broker) == [b"yes"]


def test_an_undecided_half_message_is_decided_by_the_groups_checker(half_broker: BrokerProcess) -> None:
    with connect(half_broker.servers) as session:
        producer = session.create_producer()

        def unsure(message: Message, txid: str) -> str:
            raise ConnectionError("the database did not answer")  # -> unknown

        commit_id, _ = producer.send_in_transaction(Message("orders", b"commit-me"), unsure, "shop")
        rollback_id, _ = producer.send_in_transaction(Message("orders", b"drop-me"), lambda m, t: "unknown", "shop")
        assert _read(half_broker) == []
        answers = {commit_id: ["unknown", "commit"], rollback_id: ["rollback"]}
        asked: list[str] = []

        def check(txid: str) -> str:
            asked.append(txid)
            return answers[txid].pop(0) if len(answers[txid]) > 1 else answers[txid][0]

        checker = producer.start_transaction_checker("shop", check)
        wait_until(lambda: _read(half_broker) == [b"commit-me"], timeout_s=20, message="the checker's commit")
        wait_until(lambda: checker.decisions.get(rollback_id) == "rollback", timeout_s=20)
        producer.stop_transaction_checker(checker)
    assert asked.count(commit_id) == 2  # "unknown" once: asked again after transactionCheckInterval
    stats = _tx_stats(half_broker)
    assert (stats["open"], stats["prepared"]) == (0, 0)
    assert _read(half_broker) == [b"commit-me"]


def _listing(broker: BrokerProcess, group: str = "") -> dict:  # type: ignore[type-arg]
    done = metaq("admin", "transactions", "--json", "-g", group, "-s", broker.servers)
    assert done.returncode == 0, done.stderr
    (doc,) = json.loads(done.stdout)
    return dict(doc)


def test_with_no_checker_a_half_message_waits_past_every_timeout_and_a_later_checker_gets_the_message(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    """Offers to a group with no checker connected are not checks, and maxTxTimeoutInSeconds does not roll
    back a prepared half message: the local transaction may have committed, and only a checker knows."""
    broker = broker_factory({**OPTIONS, "maxTxTimeoutInSeconds": 1})
    with connect(broker.servers) as session:
        session.admin().create_topic("orders", 1)
        txid, decision = session.create_producer().send_in_transaction(
            Message("orders", b"late", key=b"order-7"), lambda msg, t: "unknown", "shop")
    assert decision == "unknown"
    begun = time.time()
    # past the 1 s maxTxTimeoutInSeconds and transactionCheckMax (3) check intervals of 200 ms, several times
    wait_until(lambda: time.time() - begun > 3.0 and _listing(broker, "shop")["live"], timeout_s=30,
               message="three seconds with the half message still live")
    (live,) = _listing(broker, "shop")["live"]
    assert (live["transaction_id"], live["state"], live["checks"], live["deadline_ms"]) == (txid, "prepared", 0, -1)
    assert _read(broker) == []
    shown: list[tuple[Message | None, str]] = []

    def check(message: Message | None, transaction_id: str) -> str:  # RocketMQ's checkLocalTransaction(msg)
        shown.append((message, transaction_id))
        return "commit"

    with connect(broker.servers) as session:
        producer = session.create_producer()
        checker = producer.start_transaction_checker("shop", check)
        wait_until(lambda: _read(broker) == [b"late"], timeout_s=20, message="the checker's commit")
        producer.stop_transaction_checker(checker)
    ((message, asked),) = shown
    assert asked == txid and message is not None
    assert (message.topic, bytes(message.data), message.key, message.offset) == ("orders", b"late", b"order-7", -1)


def test_a_half_message_out_of_checks_is_rolled_back_loudly(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({**OPTIONS, "dashboardHttpPort": 0})
    broker.allow_log(r"rolled back by the broker: no decision after 3 checks")
    with connect(broker.servers) as session:
        session.admin().create_topic("orders", 1)
        producer = session.create_producer()
        txid, _ = producer.send_in_transaction(Message("orders", b"doubtful", key=b"order-9"),
                                               lambda msg, t: "unknown", "shop")
        asked: list[str] = []
        checker = producer.start_transaction_checker("shop", lambda t: asked.append(t) or "unknown")
        wait_until(lambda: _tx_stats(broker).get("timed_out") == 1, timeout_s=30,
                   message="the broker to give up after transactionCheckMax checks")
        producer.stop_transaction_checker(checker)
    assert asked == [txid] * 3  # the old one-argument checker still works
    assert _read(broker) == []
    (error,) = [line for line in broker.log_lines if "rolled back by the broker" in line]
    assert "ERROR" in error and txid in error and "'shop'" in error and "orders-0" in error and "order-9" in error
    listing = _listing(broker)
    assert listing["live"] == [] and [t["transaction_id"] for t in listing["timed_out"]] == [txid]
    assert "no decision after 3 checks" in listing["timed_out"][0]["state"]
    text = metaq("admin", "transactions", "-s", broker.servers)
    assert text.returncode == 0 and txid in text.stdout and "rolled back by the broker" in text.stdout, text.stdout
    (url,) = {match.group(1) for line in broker.log_lines if (match := re.search(r"metrics (http://\S+)", line))}
    with urllib.request.urlopen(url, timeout=10) as reply:
        metrics = reply.read().decode()
    assert re.search(r"^metaq_transactions_timed_out_total 1\.0$", metrics, re.M), metrics[-3000:]
    assert re.search(r"^metaq_transaction_checks_total 3\.0$", metrics, re.M)


def test_a_prepared_transaction_past_its_timeout_is_listed_and_logged(half_broker: BrokerProcess) -> None:
    """An XA branch whose coordinator stayed away past its timeout: the broker's rollback names it."""
    half_broker.allow_log(r"rolled back by the broker: timed out")
    with connect(half_broker.servers) as session:
        producer = session.create_producer()
        producer.tpc_begin("7:forgotten:mq", timeout_s=0.3)
        producer.send(Message("orders", b"forgotten", key=b"order-11"))
        producer.send(Message("orders", b"forgotten-too"))
        producer.tpc_prepare()
        wait_until(lambda: _tx_stats(half_broker).get("timed_out") == 1, timeout_s=20)
        with pytest.raises(Exception, match="timed out: prepared"):
            producer.tpc_commit()
    (gone,) = _listing(half_broker)["timed_out"]
    assert (gone["transaction_id"], gone["messages"], gone["partitions"]) == ("7:forgotten:mq", 2, ["orders-0"])
    (error,) = [line for line in half_broker.log_lines if "rolled back by the broker" in line]
    assert "7:forgotten:mq" in error and "timed out: prepared" in error and "order-11" in error


def test_check_transactions_takes_1_to_10000_transactions(half_broker: BrokerProcess) -> None:
    with connect(half_broker.servers) as session:
        core = session.session._core
        for bad in (0, -1, 10_001):
            with pytest.raises(InvalidRequestError, match=r"max_transactions must be 1\.\.10000"):
                session._lt.run(core.request(m.CheckTransactionsRequest("shop", 0, bad)))
        for good in (1, 10_000):
            assert session._lt.run(core.request(m.CheckTransactionsRequest("shop", 0, good))).transaction_ids == []


def test_a_half_message_survives_kill_9_and_a_new_producer_process_decides_it(half_broker: BrokerProcess) -> None:
    with connect(half_broker.servers) as session:
        txid, decision = session.create_producer().send_in_transaction(
            Message("orders", b"survivor"), lambda m, t: "unknown", "shop")
    assert decision == "unknown"
    half_broker.kill()
    half_broker.start()
    assert _read(half_broker) == []
    decided = threading.Event()

    def check(asked: str) -> str:
        if asked == txid:
            decided.set()
            return "commit"
        return "unknown"

    with connect(half_broker.servers) as session:
        producer = session.create_producer()
        checker = producer.start_transaction_checker("shop", check)
        wait_until(decided.is_set, timeout_s=20, message="the broker to ask the new checker")
        wait_until(lambda: _read(half_broker) == [b"survivor"], timeout_s=20)
        producer.stop_transaction_checker(checker)
