"""format("metaq") on more than one machine: a real Spark standalone cluster (a master and two workers, each
its own JVM, on loopback) reads a topic spread over a 3-broker ZooKeeper-mode metaq cluster through
zkConnect, exactly once across a driver killed mid-stream and restarted from its checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from spark_standalone import SparkStandalone

from metaq.client.blocking import BlockingClient
from metaq.protocol.records import encode_values
from metaq.testing import BrokerProcess, wait_until
from metaq.testing.processes import processes_using
from metaq.testing.timing import scaled
from metaq.types import PartitionId

pytestmark = [pytest.mark.spark, pytest.mark.slow]

JOB = Path(__file__).with_name("spark_cluster_job.py")
IDS = [PartitionId(b, p) for b in (1, 2, 3) for p in (0, 1)]
Row = tuple[int, int, int, str]


@pytest.fixture
def spark_cluster(tmp_path: Path) -> Iterator[SparkStandalone]:
    cluster = SparkStandalone(tmp_path / "spark")
    try:
        yield cluster.start()
    finally:
        cluster.stop()
        assert processes_using(tmp_path / "spark") == [], "the master, the workers and their executors are gone"


def produce(servers: str, per_partition: int, tag: str) -> list[Row]:
    rows: list[Row] = []
    with BlockingClient(servers) as client:
        for pid in IDS:
            values = [f"{tag}{pid}-m{i}" for i in range(per_partition)]
            resp = client.produce("spread", pid, encode_values([v.encode() for v in values], 1_700_000_000_000))
            assert resp is not None
            rows += [(pid.broker_id, pid.partition, resp.base_offset + j, v) for j, v in enumerate(values)]
    return rows


class Driver:
    """The job in its own process group (its JVM with it), output collected as it comes."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, str(JOB), *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                                     start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1",
                                                                  "PYSPARK_PYTHON": sys.executable})
        self.lines: list[str] = []
        assert self.proc.stdout is not None
        self._reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self._reader.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def output(self) -> str:
        return "\n".join(self.lines[-80:])

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)


def sink_rows(out: Path) -> list[Row]:
    """Every row the file sink holds, duplicates kept."""
    return sorted((b, p, o, v) for path in sorted(out.glob("batch-*.json"))
                  for b, p, o, v in json.loads(path.read_text()))


def test_a_standalone_cluster_reads_three_brokers_exactly_once_across_a_killed_driver(
        spark_cluster: SparkStandalone, cluster_factory: Callable[..., BrokerProcess], zookeeper: Any, zk_root: str,
        tmp_path: Path) -> None:
    brokers = [cluster_factory(b, topics="[topic=spread]\nnumPartitions=2\n") for b in (1, 2, 3)]
    servers = ",".join(b.servers for b in brokers)
    with BlockingClient(servers) as client:
        wait_until(lambda: client.partitions_for("spread") == IDS, scaled(10), message="every broker's partitions")
    first = produce(servers, 400, "a-")
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    out.mkdir()
    args = [spark_cluster.url, zookeeper.connect_string, zk_root, "spread", str(checkpoint), str(out)]

    driver = Driver(*args, "stream")
    try:
        wait_until(lambda: len(list(out.glob("batch-*.json"))) >= 3 or driver.proc.poll() is not None,
                   scaled(240), 0.05, "three micro-batches")
        assert driver.proc.poll() is None, driver.output()
        driver.kill()  # the driver dies mid-stream: no clean stop, a batch may be half done
    finally:
        driver.kill()
    assert 0 < len(sink_rows(out)) < len(first), "the driver was meant to die with data left to read"

    second = produce(servers, 30, "b-")
    again = Driver(*args, "available-now")
    try:
        assert again.proc.wait(scaled(240)) == 0, again.output()
    finally:
        again.kill()
    assert "done" in again.lines

    assert sink_rows(out) == sorted(first + second), "every message of the three brokers, none twice"
    for i in range(spark_cluster.workers):  # both machines ran executors, in both runs
        runs = list(spark_cluster.worker_dir(i).glob("app-*/*/stderr"))
        assert len({path.parent.parent for path in runs}) == 2, f"worker {i}: {runs}"
