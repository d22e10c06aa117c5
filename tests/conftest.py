"""Shared fixtures: real broker processes on 127.0.0.1 with kernel-chosen ports.

Every broker a test starts (through these fixtures or with BrokerProcess directly) is checked when
the test ends: a traceback or an ERROR/CRITICAL record in its log, or an exit code other than 0 (or
-9 after the test's own kill()), fails the test unless the test declared it (``expect_errors=True``,
``broker.allow_log(regex)``, ``broker.expect_exit_code(code)``). See metaq.testing.broker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from metaq.testing.broker import LOG_RECORD_RE, BrokerProcess, track_brokers

pytest_plugins = ["pytester", "metaq.testing.pytest_plugin"]


def _stop_and_check(brokers: list[BrokerProcess]) -> None:
    for proc in brokers:
        proc.stop_or_kill(15)
    found = [f"broker {proc.data_dir}: {problem}" for proc in brokers for problem in proc.problems()]
    if found:
        tails = "\n".join(f"-- {proc.data_dir} (last 200 lines) --\n{proc.output()}"
                          for proc in brokers if proc.problems())
        pytest.fail("a broker this test started went wrong and the test did not say it expected that:\n"
                    + "\n".join(found) + "\n" + tails, pytrace=False)


@pytest.fixture(autouse=True, scope="session")
def _check_session_brokers() -> Iterator[None]:
    """Brokers of module- or session-scoped fixtures: checked once everything is over."""
    with track_brokers() as brokers:
        yield
    _stop_and_check(brokers)


_TEST_FAILED = pytest.StashKey[bool]()
NOTABLE_LOG_LINES = 60
"""How many of each broker's WARNING-or-worse records a failed test prints (what CI shows of a flaky run)."""


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call" and report.failed:
        item.stash[_TEST_FAILED] = True
    return report


def _print_notable_lines(brokers: list[BrokerProcess]) -> None:
    """The brokers' warnings, errors and the lines following them, for a test that failed: a failover's
    or a fault's story is there (printed to the test's captured output, shown with the failure)."""
    for proc in brokers:
        notable = [line for line in proc.log_lines
                   if (m := LOG_RECORD_RE.match(line)) is not None and m.group("level") != "INFO"
                   and m.group("level") != "DEBUG"]
        print(f"-- {proc.data_dir}: the last {min(len(notable), NOTABLE_LOG_LINES)} of {len(notable)} "
              "WARNING/ERROR records --")
        print("\n".join(notable[-NOTABLE_LOG_LINES:]))


@pytest.fixture(autouse=True)
def _check_test_brokers(request: pytest.FixtureRequest) -> Iterator[None]:
    """Brokers started while a test ran (its fixtures included): stopped and checked at its end; when the
    test failed, their warnings are printed first."""
    with track_brokers() as brokers:
        yield
    if request.node.stash.get(_TEST_FAILED, False):
        _print_notable_lines(brokers)
    _stop_and_check(brokers)


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[Callable[..., BrokerProcess]]:
    """Start brokers with given MetaQ options; all are stopped (or killed) at the end of the test.

    ``expect_errors=True``: the test provokes ERROR records or tracebacks in this broker's log on purpose.
    """
    started: list[BrokerProcess] = []

    def make(options: dict[str, Any] | None = None, *, name: str = "broker", start: bool = True,
             config_text: str | None = None, expect_errors: bool = False, args: Sequence[str] = ()) -> BrokerProcess:
        proc = BrokerProcess(tmp_path / name, options, config_text=config_text, expect_errors=expect_errors,
                             args=args)
        started.append(proc)
        return proc.start() if start else proc

    yield make
    for proc in started:
        proc.stop_or_kill(15)


@pytest.fixture
def broker(broker_factory: Callable[..., BrokerProcess]) -> BrokerProcess:
    """One broker with 4 partitions per topic, group commit, and dynamic topics allowed."""
    return broker_factory({"numPartitions": 4, "unflushThreshold": 0})


@pytest.fixture
def two_brokers(broker_factory: Callable[..., BrokerProcess]) -> tuple[BrokerProcess, BrokerProcess]:
    """Two standalone brokers with brokerId 1 and 2 (2 partitions per topic, group commit, dynamic topics).

    Given together in ``servers``, a client uses the partitions of both: ``1-0, 1-1, 2-0, 2-1``.
    """
    options = {"numPartitions": 2, "unflushThreshold": 0}
    return (broker_factory({"brokerId": 1, **options}, name="broker-1"),
            broker_factory({"brokerId": 2, **options}, name="broker-2"))


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One real ZooKeeper (Debian's package) for the session; tests keep apart with their own root
    (``zk_root``). A test that stops or restarts ZooKeeper starts a server of its own instead."""
    from metaq.testing.zookeeper import ZooKeeperServer

    with ZooKeeperServer(tmp_path_factory.mktemp("zookeeper")) as server:
        yield server


@pytest.fixture
def zk_client(zookeeper: Any) -> Iterator[Any]:
    """A kazoo client on the session's ZooKeeper, for tests that read or change znodes themselves."""
    from kazoo.client import KazooClient

    client = KazooClient(hosts=zookeeper.connect_string)
    client.start(10)
    yield client
    client.stop()
    client.close()


@pytest.fixture
def zk_root() -> str:
    from metaq.testing.zookeeper import unique_root

    return unique_root()


@pytest.fixture
def cluster_factory(broker_factory: Callable[..., BrokerProcess], zookeeper: Any,
                    zk_root: str) -> Callable[..., BrokerProcess]:
    """Start a broker of a ZooKeeper-mode cluster (the session's ZooKeeper, this test's root):
    ``cluster_factory(broker_id, numPartitions=2, ...)``; extra ``[topic=...]`` sections via ``topics``;
    further command-line arguments via ``args`` (``args=["--slave"]`` starts a slave of ``broker_id``)."""

    def make(broker_id: int, *, topics: str = "", zk_session_timeout_ms: int = 4000, start: bool = True,
             expect_errors: bool = False, name: str | None = None, args: Sequence[str] = (),
             **system: Any) -> BrokerProcess:
        from metaq.testing.zookeeper import cluster_config

        return broker_factory(config_text=cluster_config(broker_id, zookeeper.connect_string, zk_root,
                                                         zk_session_timeout_ms, system, topics),
                              name=name or f"broker-{broker_id}", start=start, expect_errors=expect_errors,
                              args=args)

    return make
