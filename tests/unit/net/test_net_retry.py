"""metaq.net.retry: the one backoff policy, driven by an injected clock and random source."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metaq.client.config import ClientConfig
from metaq.errors import InvalidArgument
from metaq.net.retry import RetryPolicy
from metaq.testing import FakeClock


def delays(policy: RetryPolicy, n: int, rand: float = 1.0) -> list[float | None]:
    backoff = policy.start(clock=FakeClock(), rand=lambda: rand)
    return [backoff.next_delay_s() for _ in range(n)]


def test_delays_double_and_are_capped() -> None:
    policy = RetryPolicy(0.1, 1.0)
    assert delays(policy, 7) == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0])
    assert delays(RetryPolicy(0.1, 10.0, multiplier=3.0), 3) == pytest.approx([0.1, 0.3, 0.9])


def test_an_initial_delay_over_the_cap_is_the_cap() -> None:
    assert delays(RetryPolicy(5.0, 2.0), 2) == [2.0, 2.0]


def test_constant() -> None:
    assert delays(RetryPolicy.constant(0.2), 4) == [0.2] * 4


def test_jitter_stays_within_its_fraction() -> None:
    policy = RetryPolicy(1.0, 1.0, jitter=0.5)
    assert delays(policy, 1, rand=0.0) == [0.5]
    assert delays(policy, 1, rand=0.5) == [0.75]
    assert delays(policy, 1, rand=0.999999) == [pytest.approx(1.0)]
    assert delays(RetryPolicy(1.0, 1.0), 1, rand=0.0) == [1.0]  # no jitter: the draw does not matter


@given(st.integers(1, 2000), st.floats(0.0, 1.0, exclude_max=True), st.floats(0.0, 1.0))
def test_every_delay_is_within_its_jittered_bounds(failures: int, rand: float, jitter: float) -> None:
    policy = RetryPolicy(0.05, 2.0, jitter=jitter)
    nominal = min(2.0, 0.05 * 2 ** min(failures - 1, 100))
    delay = policy.delay_s(failures, rand)
    assert nominal * (1 - jitter) - 1e-12 <= delay <= nominal + 1e-12


def test_max_attempts_counts_the_first_attempt() -> None:
    assert delays(RetryPolicy(0.1, 1.0, max_attempts=3), 4) == pytest.approx([0.1, 0.2, None, None])
    assert delays(RetryPolicy(0.1, 1.0, max_attempts=1), 1) == [None]


def test_the_deadline_runs_from_the_first_failure_and_no_wait_passes_it() -> None:
    clock = FakeClock()
    backoff = RetryPolicy.constant(0.4, deadline_s=1.0).start(clock=clock, rand=lambda: 1.0)
    clock.advance_s(50)  # time before the first failure does not count
    assert backoff.next_delay_s() == 0.4
    clock.advance_s(0.4)
    assert backoff.next_delay_s() == 0.4
    clock.advance_s(0.4)
    assert backoff.next_delay_s() == pytest.approx(0.2)  # cut to the deadline
    clock.advance_s(0.2)
    assert backoff.next_delay_s() is None
    assert backoff.failures == 4


def test_reset_starts_a_new_run() -> None:
    clock = FakeClock()
    backoff = RetryPolicy(0.1, 1.0, max_attempts=3, deadline_s=1.0).start(clock=clock, rand=lambda: 1.0)
    assert [backoff.next_delay_s(), backoff.next_delay_s()] == pytest.approx([0.1, 0.2])
    clock.advance_s(0.9)
    backoff.reset()
    assert backoff.failures == 0
    clock.advance_s(0.5)
    assert [backoff.next_delay_s(), backoff.next_delay_s()] == pytest.approx([0.1, 0.2])
    assert backoff.next_delay_s() is None


def test_unbounded_runs_never_give_up() -> None:
    backoff = RetryPolicy(0.2, 5.0).start()
    assert [backoff.next_delay_unbounded_s() for _ in range(10_000)][-1] == 5.0
    with pytest.raises(AssertionError):
        RetryPolicy(0.2, 5.0, max_attempts=2).start().next_delay_unbounded_s()


@pytest.mark.parametrize("kwargs", [
    {"initial_delay_s": -1, "max_delay_s": 1},
    {"initial_delay_s": 0, "max_delay_s": -1},
    {"initial_delay_s": 0.1, "max_delay_s": 1, "multiplier": 0.5},
    {"initial_delay_s": 0.1, "max_delay_s": 1, "jitter": 1.5},
    {"initial_delay_s": 0.1, "max_delay_s": 1, "max_attempts": 0},
    {"initial_delay_s": 0.1, "max_delay_s": 1, "deadline_s": -1},
])
def test_bad_policies(kwargs: dict[str, float]) -> None:
    with pytest.raises(InvalidArgument):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_the_client_reconnect_policy_keeps_its_documented_timings() -> None:
    """docs/client.md: reconnect_attempts attempts, reconnect_backoff_s doubling up to the max, x0.5 to x1.0."""
    config = ClientConfig(reconnect_attempts=4, reconnect_backoff_s=0.05, reconnect_backoff_max_s=0.15)
    policy = config.reconnect_retry()
    assert delays(policy, 4) == pytest.approx([0.05, 0.1, 0.15, None])
    assert delays(policy, 1, rand=0.0) == pytest.approx([0.025])


def test_docs_net_md_states_the_policies_the_code_uses() -> None:
    import inspect
    from pathlib import Path

    from metaq.client.group.membership import ERROR_RETRY
    from metaq.logging import MetaqHandler

    docs = (Path(__file__).resolve().parents[3] / "docs" / "net.md").read_text(encoding="utf-8")
    cfg = ClientConfig()
    assert (f"`reconnect_backoff_s` ({cfg.reconnect_backoff_s:g}) doubling to `reconnect_backoff_max_s` "
            f"({cfg.reconnect_backoff_max_s:g}), jitter {cfg.reconnect_retry().jitter:g}, `reconnect_attempts` "
            f"({cfg.reconnect_attempts}) attempts") in docs
    assert RetryPolicy(0.2, 5.0) == ERROR_RETRY and "| 0.2 s doubling to 5 s, no jitter, no bound |" in docs
    handler = inspect.signature(MetaqHandler).parameters
    assert (f"`retry_backoff_s` ({handler['retry_backoff_s'].default:g}) doubling to `retry_backoff_max_s` "
            f"({handler['retry_backoff_max_s'].default:g}), no jitter, no bound") in docs
