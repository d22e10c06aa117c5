"""Half messages (RocketMQ's transactional messages) against a real broker: the local transaction decides,
or, when it cannot ("unknown", an exception, a dead producer), the producer group's checker is asked back
by the broker until it decides; no decision after transactionCheckMax checks rolls back. A half message
survives a kill -9 of the broker, and nothing undecided is ever read (docs/transactions.md)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from metaq.client import connect
from metaq.testing import BrokerProcess, wait_until
from metaq.types import Message

OPTIONS = {"numPartitions": 1, "transactionCheckInterval": 200, "transactionCheckMax": 3}


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


def test_without_a_checker_a_half_message_is_rolled_back_after_transaction_check_max(
        half_broker: BrokerProcess) -> None:
    with connect(half_broker.servers) as session:
        producer = session.create_producer()
        producer.send_in_transaction(Message("orders", b"orphan"), lambda m, t: "unknown", "nobody-checks")
    wait_until(lambda: _tx_stats(half_broker).get("rolled_back") == 1, timeout_s=20,
               message="the broker to give up after transactionCheckMax checks")
    assert _read(half_broker) == []


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
