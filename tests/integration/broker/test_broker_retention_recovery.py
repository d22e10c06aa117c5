"""Retention on a running broker: blocked or failing runs, and a deletePolicy changed by a reload.

Retention runs on each topic's ``deleteWhen`` cron; the topics here use ``* * * * * ?`` (every second)
and the tests wait for runs to happen (counted, or read from the broker's log) instead of sleeping.
The in-process tests run the broker's own scheduler (``metaq.broker.background``) on the real Broker, so a
reader can be pinned and a file removal refused from inside the test; the reload test is a broker
process driven as an operator would.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from metaq.client import Message, connect
from metaq.testing import BrokerProcess, wait_until
from metaq.testing.inprocess import InProcessBroker

EVERY_SECOND = "* * * * * ?"
CONFIG = f"""[system]
numPartitions=1
maxSegmentSize=4096
deletePolicy=delete,1s

[topic=short]
deleteWhen={EVERY_SECOND}

[topic=other]
deleteWhen={EVERY_SECOND}
"""
WAIT_S = 30.0


class RetentionRuns:
    """Wraps LogManager.run_retention (what the scheduler calls) to count its runs and their outcomes."""

    def __init__(self, broker: InProcessBroker) -> None:
        self.lock = threading.Lock()
        self.outcomes: list[Any] = []
        real = broker.broker.logs.run_retention

        def counted(topics: list[str]) -> Any:
            outcome = real(topics)
            with self.lock:
                self.outcomes.append(outcome)
            return outcome

        broker.call(setattr, broker.broker.logs, "run_retention", counted)

    def __len__(self) -> int:
        with self.lock:
            return len(self.outcomes)

    def failures(self) -> list[str]:
        """The failure messages of every run so far."""
        with self.lock:
            return [message for o in self.outcomes for message in o.failures.values()]

    def wait_for_more(self, count: int, message: str) -> None:
        target = len(self) + count
        wait_until(lambda: len(self) >= target, timeout_s=WAIT_S, message=f"{count} more retention runs ({message})")


@pytest.fixture
def retaining(tmp_path: Path) -> Iterator[InProcessBroker]:
    with InProcessBroker(tmp_path / "data", config_text=CONFIG, retention=True) as broker:
        yield broker


def fill(session: Any, topic: str, batches: int = 20) -> None:
    producer = session.create_producer()
    for _ in range(batches):  # ~1 KiB batches: several 4 KiB segments
        assert producer.send_batch(topic, [b"x" * 100] * 8).success


def start_offset(session: Any, topic: str) -> int:
    return int(session.create_pull_consumer().offsets(topic, 0)[0])


def still_serving(session: Any, topic: str) -> None:
    producer = session.create_producer()
    result = producer.send(Message(topic, b"still here"))
    assert result.success, result.error
    messages = session.create_pull_consumer().get(topic, 0, result.offset)
    assert [m.data for m in messages] == [b"still here"]


def test_a_pinned_segment_is_skipped_while_read_and_removed_by_a_run_after(retaining: InProcessBroker) -> None:
    broker = retaining
    runs = RetentionRuns(broker)
    with connect(broker.servers) as session:
        fill(session, "short", 1)
        # A reader holds the first segment (as a fetch being sent with sendfile does).
        piece = broker.call(lambda: broker.broker.logs.get("short", 0).read(0, 1))
        try:
            fill(session, "short")
            runs.wait_for_more(3, "with the first segment expired and pinned")
            assert start_offset(session, "short") == 0, "a segment was removed while a reader held it"
            still_serving(session, "short")
        finally:
            piece.release()
        wait_until(lambda: start_offset(session, "short") > 0, timeout_s=WAIT_S,
                   message="the segment to be removed once the reader let go")
        assert not runs.failures()
        still_serving(session, "short")


class RefuseUnlink:
    """``os.unlink`` fails with EACCES for files under the given directory (a fault the broker meets)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, directory: Path) -> None:
        self.prefix = str(directory) + os.sep
        self.refused: list[str] = []
        real = os.unlink

        def unlink(path: str | os.PathLike[str], *args: Any, **kwargs: Any) -> None:
            if os.fspath(path).startswith(self.prefix):
                self.refused.append(os.fspath(path))
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
            real(path, *args, **kwargs)

        monkeypatch.setattr(os, "unlink", unlink)


def test_the_broker_keeps_serving_and_retaining_when_a_segment_cannot_be_removed(
        retaining: InProcessBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    broker = retaining
    runs = RetentionRuns(broker)
    refuse = RefuseUnlink(monkeypatch, broker.data_dir / "short-0")
    with connect(broker.servers) as session:
        fill(session, "short")
        fill(session, "other")
        wait_until(lambda: runs.failures(), timeout_s=WAIT_S, message="a retention run to fail on 'short'")
        assert refuse.refused and "short-0" in runs.failures()[0]
        # Other topics of the same schedule are still retained, and every topic is still served.
        wait_until(lambda: start_offset(session, "other") > 0, timeout_s=WAIT_S,
                   message="retention of 'other' despite the failures on 'short'")
        runs.wait_for_more(2, "after the failure")
        still_serving(session, "short")
        still_serving(session, "other")
        assert session.admin().stats()["topics"]["short"]


def test_one_topic_failing_does_not_stop_retention_of_the_next(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with InProcessBroker(tmp_path / "data", config_text=CONFIG) as broker:  # no scheduler: one run by hand
        with connect(broker.servers) as session:
            fill(session, "short")
            fill(session, "other")
        RefuseUnlink(monkeypatch, broker.data_dir / "short-0")
        for topic in ("short", "other"):
            log = broker.call(broker.broker.logs.get, topic, 0)
            log.flush()
            for base in log.segment_base_offsets[:-1]:
                os.utime(log.directory / f"{base:020d}.log", (1, 1))  # long expired
        outcome = broker.broker.logs.run_retention(["short", "other"])  # what one scheduled run does
        assert "other-0" in outcome.removed, "retention of 'other' was skipped because 'short' failed"
        assert list(outcome.failures) == ["short-0"]


def test_a_reload_changing_delete_policy_applies_at_the_next_runs(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    def config(policy: str) -> str:
        return (f"[system]\nnumPartitions=1\nmaxSegmentSize=4096\n\n"
                f"[topic=logs]\ndeleteWhen={EVERY_SECOND}\ndeletePolicy={policy}\n")

    broker = broker_factory(config_text=config("delete,1h"))
    directory = broker.data_dir / "logs-0"

    def runs() -> int:
        return sum(f"retention ({EVERY_SECOND})" in line for line in broker.log_lines)

    with connect(broker.servers) as session:
        fill(session, "logs")
        seen = runs()
        wait_until(lambda: runs() >= seen + 2, timeout_s=WAIT_S, message="two runs under delete,1h")
        assert start_offset(session, "logs") == 0
        first_segments = sorted(p.name for p in directory.glob("*.log"))
        assert len(first_segments) > 2

        broker.config_path.write_text(config("archive,1s"))
        assert session.admin().reload() == ["logs"]
        # The in-memory log lets go of a segment before its file is renamed: wait for both.
        wait_until(lambda: start_offset(session, "logs") > 0 and list(directory.glob("*.log.arc")),
                   timeout_s=WAIT_S, message="archive,1s to retain after the reload")
        archived = sorted(p.name[: -len(".arc")] for p in directory.glob("*.log.arc"))
        assert archived and set(archived) <= set(first_segments[:-1])
        assert not set(archived) & {p.name for p in directory.glob("*.log")}

        broker.config_path.write_text(config("delete,1s"))
        assert session.admin().reload() == ["logs"]
        seen = runs()
        wait_until(lambda: runs() >= seen + 2, timeout_s=WAIT_S, message="two runs under delete,1s")
        archived = {p.name for p in directory.glob("*.log.arc")}
        fill(session, "logs")
        newest = max(int(p.name[:20]) for p in directory.glob("*.log"))
        wait_until(lambda: start_offset(session, "logs") >= newest
                   and all(int(p.name[:20]) >= newest for p in directory.glob("*.log")), timeout_s=WAIT_S,
                   message="delete,1s to remove every segment older than the newest after the second reload")
        # Deleted, not archived: no new archive.
        assert {p.name for p in directory.glob("*.log.arc")} == archived
        still_serving(session, "logs")
