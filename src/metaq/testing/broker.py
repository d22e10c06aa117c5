"""Start and stop a real broker process on 127.0.0.1 for tests, and check what it did.

:class:`BrokerProcess` is the product's :class:`~metaq.broker.launcher.BrokerLauncher` (``--serverPort
0``, the ready line, deadlines on every wait) with what a test harness adds.

A broker that logged a traceback or an ERROR/CRITICAL line, or exited with a code nobody expected, is
a problem the test that started it did not assert on. :meth:`BrokerProcess.problems` lists them (exit
codes and the offending log lines); a test that provokes them on purpose says so with
``expect_errors=True``, :meth:`BrokerProcess.allow_log` or :meth:`BrokerProcess.expect_exit_code`. A
SIGKILL the test sent itself (:meth:`BrokerProcess.kill`) is always expected. :func:`track_brokers`
collects every broker started while it is active, so a test harness (metaq's own ``tests/conftest.py``)
can check all of them, including the ones a test started directly.
"""

from __future__ import annotations

import re
import signal
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metaq.broker.launcher import READY_RE, BrokerLauncher
from metaq.testing.timing import scaled
from metaq.testing.waits import until, wait_until

__all__ = ["READY_RE", "BrokerProcess", "log_incidents", "start_brokers", "track_brokers", "until", "wait_until"]

LOG_RECORD_RE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (?P<level>[A-Z]+) ")
"""The start of a log record in the broker's format (``%(asctime)s %(levelname)s %(name)s: ...``)."""
PROBLEM_LEVELS = frozenset({"ERROR", "CRITICAL"})
TRACEBACK_LINE = "Traceback (most recent call last):"

_collectors: list[list[BrokerProcess]] = []
"""Lists of the active track_brokers() blocks, innermost last."""


@contextmanager
def track_brokers() -> Iterator[list[BrokerProcess]]:
    """Yield a list that receives every BrokerProcess started (for the first time) inside the block.

    Blocks nest; a broker goes to the innermost one only (a test's block, not the session's around it).
    """
    started: list[BrokerProcess] = []
    _collectors.append(started)
    try:
        yield started
    finally:
        # by identity: list.remove compares by value, and two empty blocks are equal, so it would take
        # the session's block out when a test's (empty) block ends, and a broker of a module-scoped
        # fixture would then land in a test's leftover block and never be checked
        del _collectors[next(i for i, block in enumerate(_collectors) if block is started)]


def log_incidents(lines: Sequence[str]) -> list[list[str]]:
    """The ERROR/CRITICAL records and tracebacks in a broker's output, each with its continuation lines.

    An incident starts at such a record or at a bare ``Traceback`` line (an exception nobody logged)
    and runs until the next log record, so ``log.exception``'s record and its traceback are one.
    """
    incidents: list[list[str]] = []
    current: list[str] | None = None
    for line in lines:
        record = LOG_RECORD_RE.match(line)
        if record is not None:
            current = [line] if record.group("level") in PROBLEM_LEVELS else None
            if current is not None:
                incidents.append(current)
        elif line.startswith(TRACEBACK_LINE) and current is None:
            current = [line]
            incidents.append(current)
        elif current is not None:
            current.append(line)
    return incidents


@dataclass
class _Run:
    """One process of a BrokerProcess (a restart is another run)."""

    proc: subprocess.Popen[str]
    killed: bool = False
    """the test sent SIGKILL itself: exit code -9 is expected"""
    stop_timed_out: bool = False


class BrokerProcess(BrokerLauncher):
    """A broker in a child process (:class:`~metaq.broker.launcher.BrokerLauncher`), judged when the test ends.

    ``options`` are MetaQ server.ini keys passed as flags (``{"numPartitions": 4}`` →
    ``--numPartitions 4``); ``config_text``, if given, is written to ``server.ini`` and passed with -f.
    ``expect_errors``: the test provokes ERROR records or tracebacks on purpose, so :meth:`problems`
    ignores the log (exit codes are still checked).
    """

    def __init__(self, data_dir: str | Path, options: dict[str, Any] | None = None,
                 config_text: str | None = None, port: int = 0, env: dict[str, str] | None = None,
                 ready_timeout_s: float | None = None, expect_errors: bool = False, args: Sequence[str] = ()) -> None:
        if ready_timeout_s is None:  # a broker's start is the machine's time: 30 s quiet, more when loaded
            ready_timeout_s = scaled(30.0)
        super().__init__(data_dir, options, config_text, port, env, ready_timeout_s, args=args)
        self.expect_errors = expect_errors
        self.allowed_log: list[re.Pattern[str]] = []
        self.expected_exit_codes: set[int] = {0}
        self._runs: list[_Run] = []

    def _spawned(self, proc: subprocess.Popen[str]) -> None:
        if not self._runs and _collectors:
            _collectors[-1].append(self)
        self._runs.append(_Run(proc))

    def signal(self, sig: int) -> None:
        if sig == signal.SIGKILL and self._runs:
            self._runs[-1].killed = True
        super().signal(sig)

    def kill(self) -> None:
        if self.running and self._runs:
            self._runs[-1].killed = True
        super().kill()

    def restart(self, *, keep_port: bool = True) -> BrokerProcess:
        self.stop()
        if not keep_port:
            self.port = 0
        return self.start()

    def stop_or_kill(self, timeout_s: float = 15.0) -> bool:
        """stop(); a broker that does not exit within ``timeout_s`` of SIGTERM is killed (and that is a problem)."""
        killed = super().stop_or_kill(timeout_s)
        if killed:
            self._runs[-1].stop_timed_out = True
        return killed

    # -- what the test did not expect -----------------------------------------------------------

    def allow_log(self, pattern: str) -> BrokerProcess:
        """Expect log incidents (an ERROR record, a traceback) matching ``pattern`` (re.search, any line)."""
        self.allowed_log.append(re.compile(pattern))
        return self

    def expect_exit_code(self, *codes: int) -> BrokerProcess:
        """Also accept these exit codes (0 always is; -9 after a kill() or SIGKILL the test sent)."""
        self.expected_exit_codes.update(codes)
        return self

    def problems(self) -> list[str]:
        """What went wrong that the test did not declare: unexpected exit codes, ERROR records, tracebacks.

        Runs still going are not judged by their exit code (stop them first).
        """
        found = []
        for n, run in enumerate(self._runs, 1):
            code = run.proc.poll()
            which = f"run {n} (pid {run.proc.pid})"
            if run.stop_timed_out:
                found.append(f"{which} did not exit after SIGTERM and was killed")
            elif code is not None and code not in self.expected_exit_codes and not (
                    run.killed and code == -signal.SIGKILL):
                found.append(f"{which} exited with code {code}")
        if not self.expect_errors:
            for incident in log_incidents(self.log_lines):
                text = "\n".join(incident)
                if not any(p.search(text) for p in self.allowed_log):
                    found.append("logged:\n" + text)
        return found

    def check(self) -> None:
        """AssertionError listing :meth:`problems`, if any, with the end of the broker's output."""
        found = self.problems()
        if found:
            raise AssertionError(f"broker {self.data_dir}: " + "\n".join(found)
                                 + f"\n-- broker output (last 200 lines) --\n{self.output()}")


def start_brokers(base_dir: Path, count: int, options: dict[str, Any] | None = None) -> Sequence[BrokerProcess]:
    return [BrokerProcess(base_dir / f"broker-{i}", {"brokerId": i, **(options or {})}).start()
            for i in range(count)]
