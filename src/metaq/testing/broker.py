"""Start and stop a real broker process on 127.0.0.1 for tests.

The broker is started with ``--serverPort 0``: the kernel picks a free port and the broker prints
``metaq broker ready <host>:<port>`` once it accepts connections, so there is no port race and no
sleeping. Every wait has a deadline.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

READY_RE = re.compile(r"metaq broker ready (\S+):(\d+)")


def wait_until(predicate: Callable[[], Any], timeout_s: float = 10.0, interval_s: float = 0.005,
               message: str = "condition") -> Any:
    """Poll ``predicate`` until it returns a truthy value or the deadline passes (then AssertionError)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {message}")
        time.sleep(interval_s)


class BrokerProcess:
    """A broker in a child process: ``python -m metaq.broker --dataPath DIR --serverPort 0 ...``.

    ``options`` are MetaQ server.ini keys passed as flags (``{"numPartitions": 4}`` →
    ``--numPartitions 4``); ``config_text``, if given, is written to ``server.ini`` and passed with -f.
    """

    def __init__(self, data_dir: str | Path, options: dict[str, Any] | None = None,
                 config_text: str | None = None, port: int = 0, env: dict[str, str] | None = None,
                 ready_timeout_s: float = 30.0) -> None:
        self.data_dir = Path(data_dir)
        self.options = dict(options or {})
        self.config_text = config_text
        self.requested_port = port
        self.env = env
        self.ready_timeout_s = ready_timeout_s
        self.proc: subprocess.Popen[str] | None = None
        self.host = "127.0.0.1"
        self.port = 0
        self.log_lines: list[str] = []
        self._ready = threading.Event()
        self._reader: threading.Thread | None = None

    @property
    def servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def config_path(self) -> Path:
        return self.data_dir.parent / f"{self.data_dir.name}-server.ini"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "metaq.broker", "--dataPath", str(self.data_dir),
               "--serverPort", str(self.port or self.requested_port)]
        if self.config_text is not None:
            self.config_path.write_text(self.config_text)
            cmd += ["-f", str(self.config_path)]
        for key, value in self.options.items():
            if isinstance(value, bool):
                value = "true" if value else "false"
            cmd += [f"--{key}", str(value)]
        return cmd

    def start(self) -> BrokerProcess:
        assert self.proc is None or self.proc.poll() is not None, "broker already running"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._ready.clear()
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        if self.env:
            env.update(self.env)
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, text=True, env=env)
        assert self.proc.stdout is not None
        self._reader = threading.Thread(target=self._read_output, args=(self.proc.stdout,), daemon=True)
        self._reader.start()
        if not self._ready.wait(self.ready_timeout_s):
            code = self.proc.poll()
            self.kill()
            raise AssertionError(f"broker not ready after {self.ready_timeout_s}s (exit code {code}); "
                                 f"output:\n{self.output()}")
        return self

    def _read_output(self, stream: IO[str]) -> None:
        for line in stream:
            self.log_lines.append(line.rstrip("\n"))
            if not self._ready.is_set():
                m = READY_RE.search(line)
                if m:
                    self.host, self.port = m.group(1), int(m.group(2))
                    self._ready.set()
        self._ready.set()  # process ended: unblock start(), which then reports the failure

    def output(self) -> str:
        return "\n".join(self.log_lines[-200:])

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout_s: float = 30.0) -> int:
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"broker did not exit within {timeout_s}s; output:\n{self.output()}") from None
        if self._reader is not None:
            self._reader.join(5)
        return code

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait: the broker finishes in-flight requests, flushes and exits 0."""
        if not self.running:
            return self.proc.returncode if self.proc else 0
        self.signal(signal.SIGTERM)
        return self.wait(timeout_s)

    def kill(self) -> None:
        """SIGKILL: no flush, no clean shutdown (what a crash looks like to the log)."""
        if self.running:
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait(30)
        if self._reader is not None:
            self._reader.join(5)

    def restart(self, *, keep_port: bool = True) -> BrokerProcess:
        self.stop()
        if not keep_port:
            self.port = 0
        return self.start()

    def __enter__(self) -> BrokerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.running:
            try:
                self.stop(15)
            except AssertionError:
                self.kill()


def start_brokers(base_dir: Path, count: int, options: dict[str, Any] | None = None) -> Sequence[BrokerProcess]:
    return [BrokerProcess(base_dir / f"broker-{i}", {"brokerId": i, **(options or {})}).start()
            for i in range(count)]
