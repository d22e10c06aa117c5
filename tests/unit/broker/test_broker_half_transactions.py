"""The broker's half messages (RocketMQ's check-back) on a fake clock: a check counts only when a checker
takes it, maxTxTimeoutInSeconds leaves a prepared half message alone, the first check comes
transactionTimeOut after the prepare and the next ones every transactionCheckInterval, and a transaction
the broker rolls back by itself (checks used up, or a timeout) is logged at ERROR with what it held, counted
and listed."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from metaq.broker.transactions import TransactionCoordinator
from metaq.protocol.records import ProducerStamp, encode_messages, with_producer_stamp
from metaq.storage.txlog import TransactionLog
from metaq.testing import FakeClock
from metaq.types import Message


def _coordinator(tmp_path: Path, clock: FakeClock) -> TransactionCoordinator:
    coordinator = TransactionCoordinator(
        TransactionLog(tmp_path, sync=lambda fd: None), max_timeout_s=1, capacity=100, flush_at_commit=0,
        checkpoint_interval_ms=10**9, check_first_ms=100, check_interval_ms=60_000, check_max=2, clock=clock)
    coordinator.open()
    return coordinator


def _half(coordinator: TransactionCoordinator, txid: str, group: str = "shop", *, prepare: bool = True) -> None:
    coordinator.begin(txid, 0, group)
    batch = with_producer_stamp(encode_messages([Message("orders", b"x", key=b"order-" + txid.encode())]),
                                ProducerStamp(7, 0, 0))
    coordinator.put(txid, "orders", 0, batch, ProducerStamp(7, 0, 0), 1)
    if prepare:
        coordinator.prepare(txid, txid)


def _tick(coordinator: TransactionCoordinator, clock: FakeClock, seconds: float) -> None:
    clock.advance_s(seconds)
    coordinator.expire()
    coordinator.offer_checks()


def test_with_no_checker_a_half_message_uses_up_no_check_and_never_times_out(tmp_path: Path) -> None:
    clock = FakeClock(1000.0)
    coordinator = _coordinator(tmp_path, clock)
    _half(coordinator, "h1")
    for _ in range(24 * 60):  # a day, a minute at a time: far past maxTxTimeoutInSeconds and 2 check intervals
        _tick(coordinator, clock, 60)
    tx = coordinator.live["h1"]
    assert (coordinator.status("h1"), tx.checks, coordinator.timed_out) == ("prepared", 0, 0)
    assert [t.txid for t in coordinator.take_checks("shop", 10)] == ["h1"]  # a checker comes: the first check
    assert coordinator.live["h1"].checks == 1


def test_checks_come_at_transaction_timeout_then_every_interval_and_the_last_rolls_back_loudly(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock(1000.0)
    coordinator = _coordinator(tmp_path, clock)
    _half(coordinator, "h1")
    _tick(coordinator, clock, 0.05)
    assert coordinator.take_checks("shop", 10) == []  # before transactionTimeOut (100 ms)
    _tick(coordinator, clock, 0.06)
    assert [t.checks for t in coordinator.take_checks("shop", 10)] == [1]
    _tick(coordinator, clock, 59.0)
    assert coordinator.take_checks("shop", 10) == []  # the interval is 60 s
    _tick(coordinator, clock, 1.001)  # just past the interval (exactly on it is a float's rounding away)
    assert [t.checks for t in coordinator.take_checks("shop", 10)] == [2]
    with caplog.at_level(logging.ERROR, logger="metaq.broker.transactions"):
        _tick(coordinator, clock, 60.001)  # due again with transactionCheckMax (2) checks used: rolled back
    assert coordinator.status("h1").startswith("rolled back (no decision after 2 checks")
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    text = record.getMessage()
    assert "h1" in text and "'shop'" in text and "orders-0" in text and "'order-h1'" in text
    assert coordinator.timed_out == 1 and coordinator.checks_offered == 2
    (gone,) = coordinator.timed_out_recent
    assert (gone.txid, gone.producer_group, gone.messages, gone.partitions) == ("h1", "shop", 1, ("orders-0",))


def test_a_check_taken_by_one_group_is_not_anothers(tmp_path: Path) -> None:
    clock = FakeClock(1000.0)
    coordinator = _coordinator(tmp_path, clock)
    _half(coordinator, "a", "shop")
    _half(coordinator, "b", "billing")
    _tick(coordinator, clock, 1.0)
    assert [t.txid for t in coordinator.take_checks("billing", 10)] == ["b"]
    assert coordinator.live["a"].checks == 0


def test_an_open_half_transaction_and_a_plain_one_still_time_out(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock(1000.0)
    coordinator = _coordinator(tmp_path, clock)
    _half(coordinator, "never-prepared", prepare=False)  # its producer died before the prepare
    coordinator.begin("plain", 500, "")
    with caplog.at_level(logging.ERROR, logger="metaq.broker.transactions"):
        _tick(coordinator, clock, 1.5)
    assert coordinator.status("never-prepared").startswith("rolled back (timed out: open")
    assert coordinator.status("plain").startswith("rolled back (timed out: open for longer than its timeout of 500")
    assert coordinator.timed_out == 2 and len([r for r in caplog.records if r.levelno == logging.ERROR]) == 2
