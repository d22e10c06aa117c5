"""The broker fixtures fail a test whose broker logged an error or exited badly, unless the test said so."""

from __future__ import annotations

import os
import signal
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from metaq.testing.broker import BrokerProcess, wait_until

CONFTEST = Path(__file__).resolve().parents[2] / "conftest.py"


def _refused_reload(broker: BrokerProcess) -> None:
    """Provoke an ERROR record: SIGHUP with a server.ini the broker refuses."""
    broker.config_path.write_text("[system]\nnumPartitions = many\n")
    broker.signal(signal.SIGHUP)
    wait_until(lambda: any("refused" in line for line in broker.log_lines), 30, message="the refused reload")


def test_error_record_is_a_problem_unless_allowed(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory(config_text="[system]\nnumPartitions = 2\n")
    _refused_reload(broker)
    broker.stop()
    (problem,) = broker.problems()
    assert "ERROR metaq.broker: reload of" in problem
    broker.allow_log(r"reload of .* refused")
    assert broker.problems() == []


def test_expect_errors_ignores_the_log_not_the_exit_code(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory(config_text="[system]\nnumPartitions = 2\n", expect_errors=True)
    _refused_reload(broker)
    assert broker.problems() == []
    os.kill(broker.pid, signal.SIGKILL)  # behind the harness's back: not an expected kill
    broker.wait()
    assert broker.problems() == [f"run 1 (pid {broker.pid}) exited with code -9"]
    broker.expect_exit_code(-9)
    assert broker.problems() == []


def test_a_kill_the_test_asked_for_is_expected_across_restarts(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory()
    broker.kill()
    broker.start()
    assert broker.stop() == 0
    assert broker.problems() == []


def test_the_conftest_fails_a_test_whose_broker_went_wrong(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_inner=textwrap.dedent("""
        import os, signal
        from metaq.testing.broker import BrokerProcess

        def test_direct_broker_killed_behind_the_back(tmp_path):
            broker = BrokerProcess(tmp_path / "b").start()   # not through a fixture, never stopped
            os.kill(broker.pid, signal.SIGKILL)

        def test_fixture_broker_declared(broker):
            os.kill(broker.pid, signal.SIGKILL)
            broker.expect_exit_code(-9)

        def test_fixture_broker_stopped_cleanly(broker):
            pass
    """))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_direct_broker_killed_behind_the_back*",
                                 "*exited with code -9*"])
