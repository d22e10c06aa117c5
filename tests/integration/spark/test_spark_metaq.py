"""format("metaq") on a real local Spark against a real broker process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from metaq_spark_testutil import (
    expected_rows,
    merge,
    produce,
    read_batch_files,
    rows_of,
    write_batch_file,
)

from metaq.client.blocking import BlockingClient
from metaq.protocol.messages import CreateTopicRequest
from metaq.testing.broker import BrokerProcess, wait_until
from metaq.testing.ports import unused_port
from metaq.testing.timing import scaled

pytestmark = [pytest.mark.spark]

PARTS = [0, 1, 2, 3]


def _read(spark: Any, servers: str, topic: str, **options: str) -> Any:
    reader = spark.read.format("metaq").option("servers", servers).option("topic", topic)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def _stream(spark: Any, servers: str, topic: str, **options: str) -> Any:
    reader = spark.readStream.format("metaq").option("servers", servers).option("topic", topic)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def _run_available_now(df: Any, out: Path, checkpoint: Path) -> Any:
    query = (df.writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    query.awaitTermination()
    return query


def _parquet_rows(spark: Any, out: Path) -> list[tuple[int, int, bytes]]:
    return rows_of(spark.read.schema("partition int, offset long, value binary").parquet(str(out)))


# -- batch ----------------------------------------------------------------------------------------

def test_batch_read_is_exact_and_ordered(spark: Any, broker: BrokerProcess) -> None:
    produced = produce(broker.servers, "orders", PARTS, 230, keyed=True)
    df = _read(spark, broker.servers, "orders")
    rows = df.collect()
    assert sorted((r.partition, r.offset, bytes(r.value)) for r in rows) == expected_rows(produced)
    # per partition, rows come out in offset order, and every column is what was sent
    by_part: dict[int, list[Any]] = {}
    for r in rows:
        by_part.setdefault(r.partition, []).append(r)
    for p, msgs in produced.items():
        got = by_part[p]
        assert [r.offset for r in got] == [m.offset for m in msgs]
        for r, m in zip(got, msgs, strict=True):
            assert (r.key, r.attribute, r.topic) == (m.key, m.attribute, "orders")
            assert r.message_id == f"{m.id:032x}"
            assert [(h.key, bytes(h.value)) for h in r.headers or []] == (m.headers or [])
            assert int(r.timestamp.timestamp() * 1000) == m.timestamp_ms


def test_batch_read_offset_range_and_min_partitions(spark: Any, broker: BrokerProcess) -> None:
    produced = produce(broker.servers, "ranges", PARTS, 100)
    df = _read(spark, broker.servers, "ranges", startingOffsets='{"ranges": {"0": 10, "2": -1}}',
               endingOffsets='{"ranges": {"0": 60, "1": 7}}', minPartitions="12")
    assert df.rdd.getNumPartitions() >= 12
    want = [(p, m.offset, bytes(m.data)) for p, msgs in produced.items() for m in msgs
            if (p == 0 and 10 <= m.offset < 60) or (p == 1 and m.offset < 7) or p == 3]
    assert rows_of(df) == sorted(want)
    # a range of offsets can be read again and again: the same rows
    assert rows_of(df) == sorted(want)


# -- streaming ------------------------------------------------------------------------------------

def test_stream_available_now_in_several_batches_then_more(spark: Any, broker: BrokerProcess,
                                                           tmp_path: Path) -> None:
    first = produce(broker.servers, "events", PARTS, 250)
    df = _stream(spark, broker.servers, "events", maxOffsetsPerTrigger="300")
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    query = _run_available_now(df, out, checkpoint)
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [300, 300, 300, 100]
    assert _parquet_rows(spark, out) == expected_rows(first)
    # messages produced between runs are read by the next run, once
    second = produce(broker.servers, "events", PARTS, 40, tag="second-")
    _run_available_now(df, out, checkpoint)
    assert _parquet_rows(spark, out) == expected_rows(merge(first, second))
    # nothing new: another run adds nothing
    query = _run_available_now(df, out, checkpoint)
    assert sum(p["numInputRows"] for p in query.recentProgress) == 0
    assert _parquet_rows(spark, out) == expected_rows(merge(first, second))


def test_stream_restart_mid_stream_no_loss_no_repeat(spark: Any, broker: BrokerProcess, tmp_path: Path) -> None:
    first = produce(broker.servers, "clicks", PARTS, 500)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    query = (_stream(spark, broker.servers, "clicks", maxOffsetsPerTrigger="200").writeStream.format("parquet")
             .option("path", str(out)).option("checkpointLocation", str(checkpoint))
             .trigger(processingTime="100 milliseconds").start())
    try:
        wait_until(lambda: query.lastProgress and query.lastProgress["batchId"] >= 2, scaled(120), 0.05,
                   "three micro-batches")
    finally:
        query.stop()
    done = len(_parquet_rows(spark, out))
    assert 0 < done < 2000, "the query was meant to be stopped mid-stream"
    second = produce(broker.servers, "clicks", PARTS, 30, tag="late-")
    _run_available_now(_stream(spark, broker.servers, "clicks", maxOffsetsPerTrigger="200"), out, checkpoint)
    assert _parquet_rows(spark, out) == expected_rows(merge(first, second))


def test_stream_starting_latest_is_resolved_once(spark: Any, broker: BrokerProcess, tmp_path: Path) -> None:
    produce(broker.servers, "news", PARTS, 20, tag="old-")
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    df = _stream(spark, broker.servers, "news", startingOffsets="latest", checkpointLocation=str(checkpoint))
    _run_available_now(df, out, checkpoint)
    assert _parquet_rows(spark, out) == []
    kept = list((checkpoint / "metaq-source").glob("news-*.json"))
    assert len(kept) == 1 and json.loads(kept[0].read_text()) == {"news": {f"0-{p}": 20 for p in PARTS}}
    fresh = produce(broker.servers, "news", PARTS, 5, tag="new-")
    _run_available_now(df, out, checkpoint)
    assert _parquet_rows(spark, out) == expected_rows(fresh)


def test_stream_rides_out_a_broker_restart(spark: Any, broker: BrokerProcess, tmp_path: Path) -> None:
    first = produce(broker.servers, "ticks", PARTS, 100)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    query = (_stream(spark, broker.servers, "ticks").writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(checkpoint)).trigger(processingTime="100 milliseconds").start())

    def rows_in() -> int:
        assert query.exception() is None, query.exception()
        return sum(p["numInputRows"] for p in query.recentProgress)

    try:
        wait_until(lambda: rows_in() >= 400, scaled(120), 0.05, "the first 400 rows")
        broker.restart()
        second = produce(broker.servers, "ticks", PARTS, 50, tag="after-restart-")
        wait_until(lambda: rows_in() >= 600, scaled(120), 0.05, "the rows produced after the restart")
    finally:
        query.stop()
    assert query.exception() is None
    assert _parquet_rows(spark, out) == expected_rows(merge(first, second))


def test_data_deleted_before_it_was_read(spark: Any, broker_factory: Any, tmp_path: Path) -> None:
    # small segments and a retention of one second, checked every second
    broker = broker_factory({"numPartitions": 1, "maxSegmentSize": "4k", "deletePolicy": "delete,1s",
                             "deleteWhen": "* * * * * ?"})
    first = produce(broker.servers, "short", [0], 10)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    _run_available_now(_stream(spark, broker.servers, "short"), out, checkpoint)
    assert _parquet_rows(spark, out) == expected_rows(first)
    second = produce(broker.servers, "short", [0], 300, tag="later-")
    with BlockingClient(broker.servers) as client:
        wait_until(lambda: client.list_offsets("short", 0, -1).log_start_offset > 10, scaled(60), 0.05, "retention")
    # the query is at offset 10, which is gone: it stops and says so ...
    with pytest.raises(Exception, match="failOnDataLoss=false"):
        _run_available_now(_stream(spark, broker.servers, "short"), out, checkpoint)
    with pytest.raises(Exception, match="failOnDataLoss=false"):
        _read(spark, broker.servers, "short", startingOffsets='{"short": {"0": 0}}').collect()
    # ... unless told to skip to what is still there
    _run_available_now(_stream(spark, broker.servers, "short", failOnDataLoss="false"), out, checkpoint)
    with BlockingClient(broker.servers) as client:
        log_start = client.list_offsets("short", 0, -1).log_start_offset
    rows = _parquet_rows(spark, out)
    assert rows[:10] == expected_rows(first)
    resumed_at = rows[10][1]
    assert 10 < resumed_at <= log_start
    assert rows[10:] == [r for r in expected_rows(second) if r[1] >= resumed_at]


@pytest.mark.slow
def test_stream_survives_a_killed_driver(spark: Any, broker: BrokerProcess, tmp_path: Path) -> None:
    produced = produce(broker.servers, "payments", PARTS, 600)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    out.mkdir()
    job = Path(__file__).parent / "spark_stream_job.py"
    proc = subprocess.Popen([sys.executable, str(job), broker.servers, "payments", str(checkpoint), str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        # kill it once a few batches are committed: later ones are planned or half-written
        wait_until(lambda: proc.poll() is not None or len(list((checkpoint / "commits").glob("[0-9]*"))) >= 3,
                   scaled(180), 0.02, "three committed batches in the child query")
        assert proc.poll() is None, "the streaming job exited by itself"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    assert len(read_batch_files(str(out))) < 2400, "the driver was meant to die mid-stream"
    more = produce(broker.servers, "payments", PARTS, 25, tag="after-")
    query = (_stream(spark, broker.servers, "payments", maxOffsetsPerTrigger="300").writeStream
             .foreachBatch(lambda df, batch_id: write_batch_file(str(out), df, batch_id))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    query.awaitTermination()
    assert read_batch_files(str(out)) == expected_rows(merge(produced, more))


# -- writes ---------------------------------------------------------------------------------------

def test_write_then_read_back(spark: Any, broker: BrokerProcess) -> None:
    rows = [(f"v{i}", f"k{i % 5}" if i % 2 else None, "even" if i % 2 == 0 else None, i % 4 if i < 40 else None)
            for i in range(200)]
    df = spark.createDataFrame(rows, "value string, key string, attribute string, partition int")
    with BlockingClient(broker.servers) as client:  # keyed rows need the topic's partition count
        client.request(CreateTopicRequest("written", 4))
    (df.write.format("metaq").option("servers", broker.servers).option("topic", "written")
     .option("batchBytes", "2048").mode("append").save())
    back = _read(spark, broker.servers, "written").collect()
    assert sorted(bytes(r.value).decode() for r in back) == sorted(r[0] for r in rows)
    got = {bytes(r.value).decode(): r for r in back}
    for value, key, attribute, partition in rows:
        r = got[value]
        assert (r.key, r.attribute) == (key.encode() if key else None, attribute)
        if partition is not None:
            assert r.partition == partition
    # a key without an explicit partition always lands in the same partition
    for k in {r[1] for r in rows if r[1] and r[3] is None}:
        assert len({got[v].partition for v, key, _a, part in rows if key == k and part is None}) == 1


def test_keyed_write_to_a_missing_topic_says_what_to_do(spark: Any, broker: BrokerProcess) -> None:
    df = spark.createDataFrame([("v", "k")], "value string, key string")
    with pytest.raises(Exception, match="topic 'absent' does not exist yet"):
        df.write.format("metaq").option("servers", broker.servers).option("topic", "absent").mode("append").save()


def test_stream_write_copies_a_topic(spark: Any, broker: BrokerProcess, tmp_path: Path) -> None:
    produced = produce(broker.servers, "source", PARTS, 120)
    query = (_stream(spark, broker.servers, "source").select("value", "key", "partition").writeStream
             .format("metaq").option("servers", broker.servers).option("topic", "copy")
             .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
    query.awaitTermination()
    copy = _read(spark, broker.servers, "copy").collect()
    # same partition, same order: a copy that keeps the partition column is ordered like its source
    assert sorted((r.partition, r.offset, bytes(r.value)) for r in copy) == expected_rows(produced)


# -- bad options ----------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["unknown topic", "malformed startingOffsets", "servers down",
                                  "unknown partition"])
def test_bad_options_fail_naming_the_option(spark: Any, broker: BrokerProcess, case: str) -> None:
    produce(broker.servers, "known", [0], 3)
    options = {"servers": broker.servers, "topic": "known"}
    option = {"unknown topic": "topic", "malformed startingOffsets": "startingOffsets", "servers down": "servers",
              "unknown partition": "startingOffsets"}[case]
    if case == "unknown topic":
        options["topic"] = "no-such-topic"
    elif case == "malformed startingOffsets":
        options["startingOffsets"] = '{"known": {"0": "ten"}}'
    elif case == "servers down":
        options["servers"] = f"127.0.0.1:{unused_port()}"
    else:
        options["startingOffsets"] = '{"known": {"9": 0}}'
    reader = spark.read.format("metaq")
    for k, v in options.items():
        reader = reader.option(k, v)
    with pytest.raises(Exception, match=f"option '{option}'") as info:
        reader.load().collect()
    if case == "unknown topic":
        assert "no-such-topic" in str(info.value)
    if case == "servers down":
        assert options["servers"] in str(info.value)


def test_bad_stream_option_fails_the_query(spark: Any, broker: BrokerProcess, tmp_path: Path) -> None:
    df = _stream(spark, broker.servers, "missing-topic")
    with pytest.raises(Exception, match="option 'topic'"):
        _run_available_now(df, tmp_path / "out", tmp_path / "checkpoint")


def test_latest_stream_without_checkpoint_location_is_refused(spark: Any, broker: BrokerProcess,
                                                             tmp_path: Path) -> None:
    produce(broker.servers, "known", [0], 1)
    df = _stream(spark, broker.servers, "known", startingOffsets="latest")
    with pytest.raises(Exception, match="option 'checkpointLocation'"):
        _run_available_now(df, tmp_path / "out", tmp_path / "checkpoint")


def test_blocking_client_names_servers_when_down() -> None:
    servers = f"127.0.0.1:{unused_port()}"
    with pytest.raises(Exception, match=servers):
        BlockingClient(servers, timeout_s=2)
