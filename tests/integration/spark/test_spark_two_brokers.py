"""format("metaq") over a topic spread over two standalone brokers (brokerId 1 and 2) given together."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from metaq.client.blocking import BlockingClient
from metaq.protocol.messages import CreateTopicRequest
from metaq.protocol.records import encode_values
from metaq.testing.broker import BrokerProcess, wait_until
from metaq.testing.timing import scaled
from metaq.types import PartitionId

pytestmark = [pytest.mark.spark]

IDS = [PartitionId(b, p) for b in (1, 2) for p in (0, 1)]
Row = tuple[int, int, int, bytes]


def servers_of(two_brokers: tuple[BrokerProcess, BrokerProcess]) -> str:
    return ",".join(b.servers for b in two_brokers)


def produce(servers: str, topic: str, per_partition: int, tag: str = "") -> list[Row]:
    """``per_partition`` messages to every partition of both brokers; (broker, partition, offset, value)."""
    rows: list[Row] = []
    with BlockingClient(servers) as client:
        for pid in IDS:
            for first in range(0, per_partition, 100):
                values = [f"{tag}{pid}-m{i}".encode() for i in range(first, min(per_partition, first + 100))]
                resp = client.produce(topic, pid, encode_values(values, 1_700_000_000_000))
                assert resp is not None and resp.partition == pid.partition
                rows += [(pid.broker_id, pid.partition, resp.base_offset + j, v) for j, v in enumerate(values)]
    return sorted(rows)


def rows_of(df: Any) -> list[Row]:
    return sorted((r["broker_id"], r["partition"], r["offset"], bytes(r["value"]))
                  for r in df.select("broker_id", "partition", "offset", "value").collect())


@pytest.fixture
def spread(two_brokers: tuple[BrokerProcess, BrokerProcess]) -> str:
    servers = servers_of(two_brokers)
    with BlockingClient(servers) as client:
        for broker_id in (1, 2):
            client.request(CreateTopicRequest("spread", 2), broker_id=broker_id)
        assert client.partitions_for("spread") == IDS
    return servers


def test_batch_read_of_both_brokers_is_exact_one_task_per_broker_partition(spark: Any, spread: str) -> None:
    sent = produce(spread, "spread", 150)
    df = spark.read.format("metaq").option("servers", spread).option("topic", "spread").load()
    assert df.rdd.getNumPartitions() == 4
    assert rows_of(df) == sent
    # offsets JSON keyed brokerId-partition; a bare number is refused where both brokers have it
    ranged = (spark.read.format("metaq").option("servers", spread).option("topic", "spread")
              .option("startingOffsets", '{"spread": {"2-1": 100}}')
              .option("endingOffsets", '{"spread": {"1-0": 10, "1-1": 0, "2-0": 0}}').load())
    assert rows_of(ranged) == [r for r in sent if ((r[0], r[1]) == (1, 0) and r[2] < 10)
                               or ((r[0], r[1]) == (2, 1) and r[2] >= 100)]
    ambiguous = (spark.read.format("metaq").option("servers", spread).option("topic", "spread")
                 .option("startingOffsets", '{"spread": {"1": 5}}').load())
    with pytest.raises(Exception, match="partition 1 is ambiguous: brokers 1, 2 each have one"):
        ambiguous.collect()


def test_stream_of_both_brokers_reads_everything_exactly_once_across_a_restart(
        spark: Any, spread: str, tmp_path: Path) -> None:
    first = produce(spread, "spread", 300)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def stream() -> Any:
        return (spark.readStream.format("metaq").option("servers", spread).option("topic", "spread")
                .option("maxOffsetsPerTrigger", "200").load())

    def parquet_rows() -> list[Row]:
        return rows_of(spark.read.schema("broker_id int, partition int, offset long, value binary")
                       .parquet(str(out)))

    query = (stream().writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(checkpoint)).trigger(processingTime="100 milliseconds").start())
    try:
        wait_until(lambda: query.lastProgress and query.lastProgress["batchId"] >= 2, scaled(120), 0.05,
                   "three micro-batches")
    finally:
        query.stop()
    assert 0 < len(parquet_rows()) < len(first), "the query was meant to be stopped mid-stream"
    second = produce(spread, "spread", 20, tag="late-")
    (stream().writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(checkpoint))
     .trigger(availableNow=True).start().awaitTermination())
    assert parquet_rows() == sorted(first + second)  # every message of both brokers, none twice
    last = max((checkpoint / "offsets").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1)
    offsets = json.loads(last.read_text().splitlines()[-1])
    assert offsets == {"spread": {"1-0": 320, "1-1": 320, "2-0": 320, "2-1": 320}}


def test_exactly_once_writes_over_both_brokers_are_all_or_nothing(spark: Any, spread: str) -> None:
    """deliveryGuarantee=exactly-once on a batch write: each task holds a transaction per broker its rows
    go to; the driver commits them all once every task succeeded, and a failed job leaves nothing."""
    rows = [(f"v{i}", 1 + i % 2, (i // 2) % 2) for i in range(400)]
    df = spark.createDataFrame(rows, "value string, broker_id int, partition int").repartition(2)

    def write(frame: Any) -> None:
        (frame.write.format("metaq").option("servers", spread).option("topic", "spread")
         .option("deliveryGuarantee", "exactly-once").option("batchBytes", "2048").mode("append").save())

    write(df)
    back = spark.read.format("metaq").option("servers", spread).option("topic", "spread").load().collect()
    assert sorted((r.broker_id, r.partition, bytes(r.value).decode()) for r in back) == sorted(
        (b, p, v) for v, b, p in rows)
    # one task fails (a null payload); what the other prepared is rolled back: nothing more is visible
    bad = spark.createDataFrame([*((f"w{i}", 1 + i % 2, 0) for i in range(200)), (None, 1, 0)],
                                "value string, broker_id int, partition int").repartition(2)
    with pytest.raises(Exception, match="'value' has a null"):
        write(bad)
    again = spark.read.format("metaq").option("servers", spread).option("topic", "spread").load().count()
    assert again == len(rows)
