"""Quota arithmetic and the quota options (metaq.broker.quotas): a fake clock drives the rates."""

from __future__ import annotations

import dataclasses

import pytest

from metaq.broker.config import BrokerConfig
from metaq.broker.ini import parse_config
from metaq.broker.quotas import ANONYMOUS, FETCH, PRODUCE, THROTTLE_MAX_MS, Quotas, limits_for
from metaq.broker.session import Session
from metaq.errors import ConfigError
from metaq.testing import FakeClock


def config(text: str = "") -> BrokerConfig:
    return parse_config("[system]\n" + text, "server.ini")


def test_overrides_sit_over_the_defaults_per_principal() -> None:
    c = config("quotaProducerByteRate=1m\nquotaMaxConnections=5\n"
               "quotaOverrides=User:alice=produce:2k,connections:0;User:bob=fetch:10\n")
    alice, bob, anon = limits_for(c, "User:alice"), limits_for(c, "User:bob"), limits_for(c, ANONYMOUS)
    assert (alice.produce_bytes_per_s, alice.fetch_bytes_per_s, alice.connections_max) == (2048, 0, 0)
    assert (bob.produce_bytes_per_s, bob.fetch_bytes_per_s, bob.connections_max) == (1 << 20, 10, 5)
    assert (anon.produce_bytes_per_s, anon.connections_max) == (1 << 20, 5)


@pytest.mark.parametrize("bad", ["alice=produce:1", "User:a=speed:1", "User:a=produce:x",
                                 "User:a=produce:1;User:a=fetch:2", "User:a=produce:-1"])
def test_bad_overrides_are_refused_naming_the_key(bad: str) -> None:
    with pytest.raises(ConfigError, match="quotaOverrides"):
        config(f"quotaOverrides={bad}\n")


def test_a_steady_sender_is_throttled_to_the_rate_after_one_window_of_burst() -> None:
    clock = FakeClock()
    c = config("quotaProducerByteRate=1000\n")
    quotas = Quotas(lambda: c, clock)
    session = Session(principal="User:alice")
    sent = 0
    start = clock.now_s
    while clock.now_s - start < 20:
        throttle_ms = quotas.record(session, PRODUCE, 100)
        sent += 100
        clock.advance_s(max(throttle_ms / 1000, 0.001))  # a client that honours every throttle, else sends at once
    rate = sent / (clock.now_s - start)
    assert 1000 <= rate <= 1000 * 1.1, rate  # 20 s at the rate, plus the one-second burst
    assert quotas.record(Session(principal="User:bob"), FETCH, 10**9) == 0  # no fetch quota: never throttled


def test_a_throttle_is_capped_and_the_debt_is_kept() -> None:
    clock = FakeClock()
    c = config("quotaConsumerByteRate=1000\n")
    quotas = Quotas(lambda: c, clock)
    session = Session()
    assert quotas.record(session, FETCH, 100_000) == THROTTLE_MAX_MS
    assert session.throttle_ms == THROTTLE_MAX_MS
    clock.advance_s(THROTTLE_MAX_MS / 1000)
    assert quotas.record(session, FETCH, 0) == THROTTLE_MAX_MS  # 99 s of debt remain


def test_connection_counts_per_principal_and_reassignment() -> None:
    c = config("quotaMaxConnections=1\n")
    quotas = Quotas(lambda: c)
    a, b = Session(), Session()
    assert quotas.admit(a, ANONYMOUS) is None
    assert "User:ANONYMOUS already has 1 connection open" in (quotas.admit(b, ANONYMOUS) or "")
    assert quotas.reassign(a, "User:alice") is None  # authenticated: counted as alice now
    assert quotas.admit(b, ANONYMOUS) is None
    assert quotas.reassign(b, "User:alice") is not None  # alice has her one: b stays anonymous
    assert b.quota_principal == ANONYMOUS
    quotas.release(a)
    assert quotas.reassign(b, "User:alice") is None
    assert quotas.describe()["User:alice"]["connections"] == 1


def test_reloaded_limits_apply_at_once() -> None:
    holder = [config("quotaProducerByteRate=1000\n")]
    quotas = Quotas(lambda: holder[0], FakeClock())
    assert quotas.record(Session(), PRODUCE, 5000) > 0
    holder[0] = dataclasses.replace(holder[0], quota_producer_byte_rate=0)
    assert quotas.record(Session(), PRODUCE, 5000) == 0


def test_a_principal_in_debt_waits_on_every_connection_and_a_fetch_gets_what_is_left_of_the_window() -> None:
    clock = FakeClock()
    c = config("quotaConsumerByteRate=1000\n")
    quotas = Quotas(lambda: c, clock)
    one, two = Session(principal="User:bob"), Session(principal="User:bob")
    assert quotas.fetch_allowance(one) == 1000  # a whole window
    assert quotas.wait_s(one, FETCH) == 0
    quotas.record(one, FETCH, 600)
    assert quotas.fetch_allowance(two) == 400, "the window is the principal's, not the connection's"
    quotas.record(two, FETCH, 3400)  # a first batch bigger than what was left: 3 s of debt
    assert quotas.wait_s(one, FETCH) == pytest.approx(3.0)
    assert quotas.wait_s(two, FETCH) == pytest.approx(3.0)
    assert quotas.fetch_allowance(one) == 1  # at least one (whole) batch once the wait is over
    clock.advance_s(3.5)
    assert quotas.wait_s(one, FETCH) == 0 and quotas.fetch_allowance(one) == 500
    assert quotas.wait_s(Session(principal="User:alice"), FETCH) == 0, "another principal's debt is its own"
    assert quotas.fetch_allowance(Session(principal="User:alice")) == 1000
    unlimited = Quotas(lambda: config(""), clock)
    assert unlimited.fetch_allowance(one) is None and unlimited.wait_s(one, PRODUCE) == 0
