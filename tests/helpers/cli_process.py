"""The `metaq` command line as a user runs it: a real process, its output read as it comes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

from metaq.testing.broker import wait_until

METAQ = str(Path(sys.executable).with_name("metaq"))
"""The console script installed in the venv the tests run in."""


def metaq(*args: str, input: str | None = None, timeout_s: float = 60,
          env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command to its end (``env``: the environment, default this process's)."""
    return subprocess.run([METAQ, *args], capture_output=True, text=True, timeout=timeout_s, input=input,
                          env={**(os.environ if env is None else env), "METAQ_SERVERS": ""})


class CliProcess:
    """A running `metaq` command in its own process group, as a terminal's foreground job is.

    :meth:`interrupt` is Ctrl-C: SIGINT to the whole group (the command and any child it started).
    """

    def __init__(self, *args: str, stdin: int | None = subprocess.DEVNULL) -> None:
        self.proc = subprocess.Popen([METAQ, *args], stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env={**os.environ, "METAQ_SERVERS": "", "PYTHONUNBUFFERED": "1"},
                                     start_new_session=True)
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._readers = [threading.Thread(target=self._read, args=(self.proc.stdout, self.stdout), daemon=True),
                         threading.Thread(target=self._read, args=(self.proc.stderr, self.stderr), daemon=True)]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream: IO[str], lines: list[str]) -> None:
        for line in stream:
            lines.append(line.rstrip("\n"))

    def write(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def wait_for_stdout(self, count: int, timeout_s: float = 30) -> list[str]:
        wait_until(lambda: len(self.stdout) >= count or self.proc.poll() is not None, timeout_s,
                   message=f"{count} lines on stdout (stderr so far: {self.stderr})")
        assert len(self.stdout) >= count, f"exited {self.proc.returncode}; stderr: {self.stderr}"
        return self.stdout[:count]

    def wait_for_stderr(self, text: str, timeout_s: float = 30) -> str:
        def found() -> str | None:
            return next((line for line in self.stderr if text in line), None)
        line: str = wait_until(lambda: found() or self.proc.poll() is not None, timeout_s,
                               message=f"{text!r} on stderr (so far: {self.stderr})")
        assert found(), f"exited {self.proc.returncode}; stderr: {self.stderr}"
        return line

    def interrupt(self) -> None:
        """Ctrl-C."""
        os.killpg(self.proc.pid, signal.SIGINT)

    def wait(self, timeout_s: float = 30) -> int:
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"metaq did not exit within {timeout_s}s; stderr: {self.stderr}") from None
        for reader in self._readers:
            reader.join(10)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def __enter__(self) -> CliProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
        if self.proc.stdin is not None:
            self.proc.stdin.close()


def assert_quiet_interrupt(proc: CliProcess) -> None:
    """Ctrl-C ended the command the conventional way: exit 130, no 'Aborted!', no traceback."""
    code = proc.wait()
    err = "\n".join(proc.stderr)
    assert code == 130, f"exit code {code}; stderr:\n{err}"
    assert "Aborted!" not in err and "Traceback" not in err and "KeyboardInterrupt" not in err, err
