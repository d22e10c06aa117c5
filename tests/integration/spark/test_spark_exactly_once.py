"""The exactly-once metaq sink (deliveryGuarantee=exactly-once): a streaming copy from one topic into
another holds every input row exactly once, in order per partition, after the driver is killed with
SIGKILL while tasks write, after they prepared, and in the middle of the driver's commit, then
restarted from its checkpoint; readers never see rows of a batch whose tasks have not all prepared."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from metaq_spark_testutil import Produced, produce
from spark_eos_job import copy_query

from metaq.client import connect
from metaq.client.blocking import BlockingClient
from metaq.protocol.messages import CreateTopicRequest
from metaq.spark.failpoints import ENV, ENV_DIR
from metaq.testing.broker import BrokerProcess, wait_until
from metaq.testing.timing import scaled

pytestmark = [pytest.mark.spark]

PARTS = [0, 1, 2, 3]
PER_PARTITION = 300


def _sink_rows(servers: str, topic: str) -> dict[int, list[bytes]]:
    """Every message of the sink topic, per partition in offset order (duplicates kept)."""
    out: dict[int, list[bytes]] = {}
    with connect(servers) as session:
        consumer = session.create_pull_consumer()
        for p in session.partitions(topic):
            for batch in consumer.iterate_batches(topic, p, "earliest", stop_at_end=True):
                out.setdefault(p.partition, []).extend(bytes(msg.data) for msg in batch)
    return {p: rows for p, rows in out.items() if rows}


def _source_history(produced: Produced, below: dict[int, int] | None = None) -> dict[int, list[bytes]]:
    """The source's values per partition in offset order (only offsets under ``below``, if given)."""
    out = {p: [bytes(m.data) for m in msgs if below is None or m.offset < below.get(p, 0)]
           for p, msgs in produced.items()}
    return {p: rows for p, rows in out.items() if rows}


def _batch_end(checkpoint: Path, batch_id: int, topic: str) -> dict[int, int]:
    """The source offsets batch ``batch_id`` ends at, from Spark's offset log (its last line)."""
    line = (checkpoint / "offsets" / str(batch_id)).read_text().strip().splitlines()[-1]
    return {int(key.split("-")[1]): offset for key, offset in json.loads(line)[topic].items()}


def _setup(broker: BrokerProcess) -> Produced:
    produced = produce(broker.servers, "src", PARTS, PER_PARTITION)
    with BlockingClient(broker.servers) as client:  # a transaction writes into existing topics only
        client.request(CreateTopicRequest("dst", len(PARTS)))
    return produced


def _run_to_the_end(spark: Any, broker: BrokerProcess, checkpoint: Path) -> None:
    query = copy_query(spark, broker.servers, "src", "dst", str(checkpoint)).trigger(availableNow=True).start()
    query.awaitTermination()


def test_a_batch_replayed_after_its_commit_is_not_written_again(spark: Any, broker: BrokerProcess,
                                                                tmp_path: Path) -> None:
    """The driver died after the brokers committed batch N and before Spark logged it: Spark runs batch
    N again, and its tasks find their transactions committed and send nothing."""
    produced = _setup(broker)
    checkpoint = tmp_path / "checkpoint"
    _run_to_the_end(spark, broker, checkpoint)
    assert _sink_rows(broker.servers, "dst") == _source_history(produced)
    commits = sorted((checkpoint / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
    assert len(commits) >= 3, "several micro-batches were meant to run"
    commits[-1].unlink()  # as if the driver had been killed just before writing it
    (checkpoint / "commits" / f".{commits[-1].name}.crc").unlink(missing_ok=True)
    _run_to_the_end(spark, broker, checkpoint)
    assert (checkpoint / "commits" / commits[-1].name).exists(), "the batch was run again"
    assert _sink_rows(broker.servers, "dst") == _source_history(produced)


@pytest.mark.slow
@pytest.mark.parametrize("failpoint", ["write", "commit", "mid-commit"])
def test_exactly_once_after_the_driver_is_killed(spark: Any, broker: BrokerProcess, tmp_path: Path,
                                                 failpoint: str) -> None:
    produced = _setup(broker)
    checkpoint, markers = tmp_path / "checkpoint", tmp_path / "failpoints"
    markers.mkdir()
    batch = 2
    job = Path(__file__).parent / "spark_eos_job.py"
    env = {**os.environ, ENV: f"{failpoint}:{batch}", ENV_DIR: str(markers)}
    proc = subprocess.Popen([sys.executable, str(job), broker.servers, "src", "dst", str(checkpoint)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        marker = markers / f"{failpoint}-{batch}"
        wait_until(lambda: proc.poll() is not None or marker.exists(), scaled(180), 0.02,
                   f"the child query to reach failpoint {failpoint} in batch {batch}")
        assert proc.poll() is None, "the streaming job exited by itself"
        # What readers see now: batches 0 and 1 whole; of batch 2 nothing, or (in the middle of the
        # driver's commit) whole tasks' shares of it, never rows of a transaction not yet committed.
        committed = _source_history(produced, _batch_end(checkpoint, batch - 1, "src"))
        visible = _sink_rows(broker.servers, "dst")
        if failpoint == "mid-commit":
            in_batch = _source_history(produced, _batch_end(checkpoint, batch, "src"))
            extra = {p: rows[len(committed.get(p, [])):] for p, rows in visible.items()}
            assert all(visible[p][:len(rows)] == rows for p, rows in committed.items())
            assert any(extra.values()), "the first transaction of batch 2 was committed"
            for p, rows in extra.items():
                start = len(committed.get(p, []))
                assert rows == in_batch.get(p, [])[start:start + len(rows)]
        else:
            assert visible == committed
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    _run_to_the_end(spark, broker, checkpoint)
    assert _sink_rows(broker.servers, "dst") == _source_history(produced)


@pytest.mark.slow
def test_exactly_once_across_a_broker_kill_between_prepare_and_commit(spark: Any, broker: BrokerProcess,
                                                                      tmp_path: Path) -> None:
    """The broker is killed -9 after the tasks prepared batch 2 and restarted before the driver commits:
    the prepared transactions survived, the driver commits them, and the query goes on; killing the
    driver afterwards and restarting changes nothing."""
    produced = _setup(broker)
    checkpoint, markers = tmp_path / "checkpoint", tmp_path / "failpoints"
    markers.mkdir()
    job = Path(__file__).parent / "spark_eos_job.py"
    env = {**os.environ, ENV: "commit:2", ENV_DIR: str(markers)}
    proc = subprocess.Popen([sys.executable, str(job), broker.servers, "src", "dst", str(checkpoint)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        marker = markers / "commit-2"
        wait_until(lambda: proc.poll() is not None or marker.exists(), scaled(180), 0.02,
                   "the child query to have batch 2 prepared")
        broker.kill()
        broker.start()
        assert _sink_rows(broker.servers, "dst") == _source_history(produced, _batch_end(checkpoint, 1, "src"))
        marker.with_name(marker.name + ".release").touch()
        wait_until(lambda: proc.poll() is not None or _sink_rows(broker.servers, "dst") == _source_history(produced),
                   scaled(180), 0.1, "the child query to commit batch 2 and copy the rest")
        assert proc.poll() is None, "the streaming job exited (did the commit after the broker restart fail?)"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    _run_to_the_end(spark, broker, checkpoint)
    assert _sink_rows(broker.servers, "dst") == _source_history(produced)
