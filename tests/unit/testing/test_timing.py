"""metaq.testing.timing: one factor by which deadlines of slow waits stretch on a busy machine."""

from __future__ import annotations

import pytest

from metaq.testing import timing
from metaq.testing.timing import SLOWNESS_MAX, TIME_SCALE_ENV, scaled, slowness


def test_the_environment_pins_the_factor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TIME_SCALE_ENV, "2.5")
    assert slowness() == 2.5 and scaled(10) == 25
    for bad in ("0.5", "fast"):
        monkeypatch.setenv(TIME_SCALE_ENV, bad)
        with pytest.raises(ValueError, match=TIME_SCALE_ENV):
            slowness()


@pytest.mark.parametrize(("load", "cpus", "factor"), [
    (0.3, 2, 1.0),      # a quiet machine keeps the deadlines as written
    (2.0, 2, 1.0),
    (7.0, 2, 3.5),      # 3.5 times more runnable work than CPUs: 3.5 times the time
    (90.0, 2, SLOWNESS_MAX),  # bounded: an overloaded machine fails later, it does not hang a run
])
def test_without_it_the_load_per_cpu_is_the_factor(monkeypatch: pytest.MonkeyPatch, load: float, cpus: int,
                                                   factor: float) -> None:
    monkeypatch.delenv(TIME_SCALE_ENV, raising=False)
    monkeypatch.setattr(timing.os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(timing.os, "cpu_count", lambda: cpus)
    assert slowness() == factor and scaled(30) == 30 * factor


def test_the_factor_is_read_at_each_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TIME_SCALE_ENV, raising=False)
    loads = iter([1.0, 8.0])
    monkeypatch.setattr(timing.os, "getloadavg", lambda: (next(loads), 0.0, 0.0))
    monkeypatch.setattr(timing.os, "cpu_count", lambda: 2)
    assert (slowness(), slowness()) == (1.0, 4.0)


SLOW_TEST = """
import time
import pytest

@pytest.mark.timeout(0.5)
def test_slow():
    time.sleep(1.5)  # a test that needs three times its limit on this "machine"
"""


@pytest.mark.parametrize(("scale", "passes"), [("1", False), ("4", True)])
def test_pytest_timeouts_scale_with_the_machine(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                scale: str, passes: bool) -> None:
    monkeypatch.setenv(TIME_SCALE_ENV, scale)
    pytester.makeconftest('pytest_plugins = ["metaq.testing.pytest_plugin"]\n')
    pytester.makepyfile(SLOW_TEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1 if passes else 0, failed=0 if passes else 1)
