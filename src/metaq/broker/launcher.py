"""Start a broker as a child process: ``python -m metaq.broker`` on a port the kernel picks.

What the demo and the benchmarks use for their embedded broker; :class:`metaq.testing.BrokerProcess`
builds on it with the checks tests want (log scanning, expected exit codes). The broker is started
with ``--serverPort 0`` and prints ``metaq broker ready <host>:<port>`` once it accepts connections,
so there is no port race and no sleeping, and every wait has a deadline.

    with BrokerLauncher("/tmp/data", {"numPartitions": 4}) as broker:   # started; SIGTERM at the end
        use(broker.servers)
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, Self

from metaq.errors import MetaqError

__all__ = ["HTTP_READY_RE", "METRICS_RE", "READY_RE", "TLS_READY_RE", "BrokerLaunchError", "BrokerLauncher"]

READY_RE = re.compile(r"metaq broker ready (\S+):(\d+)")
"""The line ``metaq broker`` prints once it serves (see metaq.broker.main)."""
HTTP_READY_RE = re.compile(r"metaq http ready (https?://\S+)")
"""The line printed before it when httpPort is set: where the HTTP API is (docs/http.md)."""
TLS_READY_RE = re.compile(r"metaq broker tls ready (\S+):(\d+)")
"""The line printed before it when sslPort is set: where the TLS port is (docs/security.md)."""
KAFKA_READY_RE = re.compile(r"metaq kafka (tls )?ready (\S+):(\d+)")
"""The lines printed before it when kafkaPort / kafkaSslPort are set (docs/kafka.md)."""
METRICS_RE = re.compile(r"metaq broker metrics (https?://\S+)")
"""The line printed before it when dashboardHttpPort is set."""
OUTPUT_SHOWN_LINES = 200
"""How much of the broker's output :meth:`BrokerLauncher.output` (and so an error) shows."""


class BrokerLaunchError(MetaqError):
    """The broker did not become ready: it exited, or the deadline passed. The message ends with its output."""


class BrokerLauncher:
    """A broker in a child process: ``python -m metaq.broker --dataPath DIR --serverPort 0 ...``.

    ``options`` are MetaQ server.ini keys passed as flags (``{"numPartitions": 4}`` →
    ``--numPartitions 4``); ``config_text``, if given, is written to a server.ini beside the data
    directory (:attr:`config_path`) and passed with -f. ``port`` 0 lets the kernel choose. The broker's
    output (stdout and stderr) is read continuously into :attr:`log_lines`; with ``log_path`` it is
    appended to that file instead and :attr:`log_lines` keeps only the last lines (a broker that runs
    for days must not grow a list in its launcher).
    """

    def __init__(self, data_dir: str | Path, options: dict[str, Any] | None = None,
                 config_text: str | None = None, port: int = 0, env: dict[str, str] | None = None,
                 ready_timeout_s: float = 30.0, *, log_path: str | Path | None = None,
                 args: Sequence[str] = ()) -> None:
        self.data_dir = Path(data_dir)
        self.options = dict(options or {})
        self.args = list(args)
        """Further command-line arguments, after the options (``["--slave", "--slave-id", "1"]``)."""
        self.config_text = config_text
        self.requested_port = port
        self.env = env
        self.ready_timeout_s = ready_timeout_s
        self.log_path = Path(log_path) if log_path is not None else None
        self.proc: subprocess.Popen[str] | None = None
        self.host = "127.0.0.1"
        self.port = 0
        self.log_lines: list[str] = []
        self.http_url: str | None = None
        """``http://host:port`` of the HTTP API once ready, when the broker serves one (httpPort)."""
        self.tls_port: int | None = None
        self.kafka_port: int | None = None
        """The Kafka listener's port once ready (kafkaPort); a restart keeps it."""
        self.kafka_tls_port: int | None = None
        """The Kafka listener's TLS port once ready (kafkaSslPort); a restart keeps it."""
        """The TLS port once ready, when the broker serves one (sslPort); a restart keeps it."""
        self.metrics_url: str | None = None
        """The /metrics URL once ready, when the broker serves it (dashboardHttpPort)."""
        self._ready = threading.Event()
        """Set by the output reader at the ready line, or when the output ends (the broker exited)."""
        self._ready_seen = False
        self._reader: threading.Thread | None = None

    @property
    def servers(self) -> str:
        """``host:port``, what a client connects to."""
        return f"{self.host}:{self.port}"

    @property
    def config_path(self) -> Path:
        return self.data_dir.parent / f"{self.data_dir.name}-server.ini"

    def command(self) -> list[str]:
        """The broker's command line (a subclass may run it differently)."""
        cmd = [sys.executable, "-m", "metaq.broker", "--dataPath", str(self.data_dir),
               "--serverPort", str(self.port or self.requested_port)]
        if self.config_text is not None:
            self.config_path.write_text(self.config_text)
            cmd += ["-f", str(self.config_path)]
        for key, value in self.options.items():
            if key == "sslPort" and self.tls_port is not None:
                value = self.tls_port
            if key == "kafkaPort" and self.kafka_port is not None:
                value = self.kafka_port
            if key == "kafkaSslPort" and self.kafka_tls_port is not None:
                value = self.kafka_tls_port
            if isinstance(value, bool):
                value = "true" if value else "false"
            cmd += [f"--{key}", str(value)]
        return cmd + self.args

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> Self:
        """Start the broker and wait for its ready line (``ready_timeout_s``); BrokerLaunchError if it does
        not come (the broker is then killed). A restart keeps the port the broker had."""
        if self.running:
            raise BrokerLaunchError(f"the broker of {self.data_dir} is already running (pid {self.pid})")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._ready.clear()
        self._ready_seen = False
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        if self.env:
            env.update(self.env)
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, text=True, env=env)
        self._spawned(self.proc)
        assert self.proc.stdout is not None
        self._reader = threading.Thread(target=self._read_output, args=(self.proc.stdout,), daemon=True)
        self._reader.start()
        if not self._ready.wait(self.ready_timeout_s) or not self._ready_seen:
            code = self.proc.poll()
            self.kill()
            raise BrokerLaunchError(f"broker not ready after {self.ready_timeout_s}s (exit code {code}); "
                                    f"output:\n{self.output()}")
        return self

    def _spawned(self, proc: subprocess.Popen[str]) -> None:
        """Called once the process exists, before its ready line (for subclasses that keep records)."""

    def _read_output(self, stream: IO[str]) -> None:
        log = open(self.log_path, "a") if self.log_path is not None else None  # noqa: SIM115 - closed below
        try:
            for line in stream:
                self._take_line(line, log)
        finally:
            if log is not None:
                log.close()
        self._ready.set()  # process ended: unblock start(), which then reports the failure

    def _take_line(self, line: str, log: IO[str] | None) -> None:
        self.log_lines.append(line.rstrip("\n"))
        if log is not None:
            log.write(line)
            log.flush()
            if len(self.log_lines) > 2 * OUTPUT_SHOWN_LINES:
                del self.log_lines[:-OUTPUT_SHOWN_LINES]
        if not self._ready.is_set():
            http = HTTP_READY_RE.search(line)
            if http:
                self.http_url = http.group(1)
            tls = TLS_READY_RE.search(line)
            if tls:
                self.tls_port = int(tls.group(2))
            kafka = KAFKA_READY_RE.search(line)
            if kafka:
                if kafka.group(1):
                    self.kafka_tls_port = int(kafka.group(3))
                else:
                    self.kafka_port = int(kafka.group(3))
            metrics = METRICS_RE.search(line)
            if metrics:
                self.metrics_url = metrics.group(1)
            match = READY_RE.search(line)
            if match:
                self.host, self.port = match.group(1), int(match.group(2))
                self._ready_seen = True
                self._ready.set()

    def output(self) -> str:
        """The last OUTPUT_SHOWN_LINES lines of the broker's output."""
        return "\n".join(self.log_lines[-OUTPUT_SHOWN_LINES:])

    @property
    def pid(self) -> int:
        assert self.proc is not None, "the broker was never started"
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        assert self.proc is not None, "the broker was never started"
        self.proc.send_signal(sig)

    def wait(self, timeout_s: float = 30.0) -> int:
        """The exit code, once the broker exited; TimeoutError if it does not within ``timeout_s``."""
        assert self.proc is not None, "the broker was never started"
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"broker did not exit within {timeout_s}s; output:\n{self.output()}") from None
        if self._reader is not None:
            self._reader.join(5)
        return code

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait: the broker finishes in-flight requests, flushes, closes and exits 0."""
        if not self.running:
            return self.proc.returncode if self.proc else 0
        self.signal(signal.SIGTERM)
        return self.wait(timeout_s)

    def kill(self) -> None:
        """SIGKILL: no flush, no clean shutdown (what a crash looks like to the log)."""
        if self.proc is not None and self.running:
            self.proc.kill()
            self.proc.wait(30)
        if self._reader is not None:
            self._reader.join(5)

    def stop_or_kill(self, timeout_s: float = 15.0) -> bool:
        """stop(), or kill() a broker that does not exit within ``timeout_s`` of SIGTERM; True if killed."""
        if not self.running:
            return False
        try:
            self.stop(timeout_s)
        except TimeoutError:
            self.kill()
            return True
        return False

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop_or_kill()
