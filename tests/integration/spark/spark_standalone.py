"""A real Spark standalone cluster on loopback: a master and workers, each its own JVM, started with the
installed pyspark package's ``bin/spark-class``, as separate machines would run them.

Every wait is on a condition with a deadline: the master is up when its web UI's JSON says ALIVE, and
the cluster is ready when the master counts every worker ALIVE. ``stop()`` ends the workers, then the
master (SIGTERM, then SIGKILL past the deadline). Memory is kept modest: 256 MiB per daemon.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import IO, Any

import pyspark

from metaq.testing import unused_port, wait_until
from metaq.testing.timing import scaled

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"


class SparkStandalone:
    def __init__(self, directory: Path, workers: int = 2, worker_cores: int = 1, worker_memory: str = "1g") -> None:
        self.directory = directory
        self.workers = workers
        self.worker_cores = worker_cores
        self.worker_memory = worker_memory
        self.port = unused_port()
        self.ui_port = unused_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def worker_dir(self, index: int) -> Path:
        return self.directory / f"worker-{index}"

    def env(self) -> dict[str, str]:
        return {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_DAEMON_MEMORY": "256m",
                "SPARK_LOG_DIR": str(self.directory / "logs"), "SPARK_NO_DAEMONIZE": "1",
                "PYSPARK_PYTHON": sys.executable}  # executors' Python workers: the venv that has metaq

    def _spawn(self, name: str, *args: str) -> None:
        log = open(self.directory / f"{name}.out", "wb")  # noqa: SIM115 - closed in stop()
        self._logs.append(log)
        self.procs.append(subprocess.Popen([str(SPARK_CLASS), *args], stdout=log, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, env=self.env(), start_new_session=True))

    def state(self) -> dict[str, Any]:
        """The master's own view (its web UI's JSON); {} while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as reply:
                return dict(json.load(reply))
        except (OSError, ValueError):
            return {}

    def start(self) -> SparkStandalone:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.port), "--webui-port", str(self.ui_port))
        wait_until(lambda: self.state().get("status") == "ALIVE" or self.procs[0].poll() is not None, scaled(90), 0.2,
                   "the Spark master to be ALIVE")
        assert self.procs[0].poll() is None, self.output("master")
        for i in range(self.workers):
            self.worker_dir(i).mkdir(parents=True, exist_ok=True)
            self._spawn(f"worker-{i}", "org.apache.spark.deploy.worker.Worker", self.url,
                        "--cores", str(self.worker_cores), "--memory", self.worker_memory, "--host", "127.0.0.1",
                        "--webui-port", str(unused_port()), "--work-dir", str(self.worker_dir(i)))
        wait_until(lambda: self.state().get("aliveworkers") == self.workers
                   or any(p.poll() is not None for p in self.procs), scaled(90), 0.2, "every worker to register")
        assert all(p.poll() is None for p in self.procs), [self.output(f"worker-{i}") for i in range(self.workers)]
        return self

    def output(self, name: str) -> str:
        path = self.directory / f"{name}.out"
        return path.read_text(errors="replace")[-5000:] if path.exists() else ""

    def stop(self, timeout_s: float = 30.0) -> None:
        for proc in reversed(self.procs):  # workers (and their executors) first, the master last
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
        for log in self._logs:
            log.close()

    def __enter__(self) -> SparkStandalone:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
