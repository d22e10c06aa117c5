"""format("metaq") with zkConnect: the driver finds the brokers of a 3-broker ZooKeeper-mode cluster (real
ZooKeeper, real broker processes) in ZooKeeper and hands every task the addresses, its partition's own
broker first; one Spark input partition per brokerId-partition; reads (batch and stream) are exact and
writes reach every broker."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from metaq.client.blocking import BlockingClient
from metaq.protocol.records import encode_values
from metaq.spark.options import ReadOptions
from metaq.spark.source import MetaqBatchReader
from metaq.testing import BrokerProcess, wait_until
from metaq.testing.timing import scaled
from metaq.types import PartitionId

pytestmark = [pytest.mark.spark]

IDS = [PartitionId(b, p) for b in (1, 2, 3) for p in (0, 1)]
Row = tuple[int, int, int, bytes]


@pytest.fixture
def cluster(cluster_factory: Callable[..., BrokerProcess]) -> dict[int, BrokerProcess]:
    brokers = {b: cluster_factory(b, topics="[topic=spread]\nnumPartitions=2\n") for b in (1, 2, 3)}
    with BlockingClient(brokers[1].servers) as client:
        wait_until(lambda: client.partitions_for("spread") == IDS, scaled(10), message="every broker's partitions")
    return brokers


def servers_of(cluster: dict[int, BrokerProcess]) -> str:
    return ",".join(b.servers for b in cluster.values())


def produce(servers: str, per_partition: int, tag: str = "") -> list[Row]:
    rows: list[Row] = []
    with BlockingClient(servers) as client:
        for pid in IDS:
            values = [f"{tag}{pid}-m{i}".encode() for i in range(per_partition)]
            resp = client.produce("spread", pid, encode_values(values, 1_700_000_000_000))
            assert resp is not None
            rows += [(pid.broker_id, pid.partition, resp.base_offset + j, v) for j, v in enumerate(values)]
    return sorted(rows)


def rows_of(df: Any) -> list[Row]:
    return sorted((r["broker_id"], r["partition"], r["offset"], bytes(r["value"]))
                  for r in df.select("broker_id", "partition", "offset", "value").collect())


def test_tasks_get_the_brokers_from_zookeeper_their_own_first(cluster: dict[int, BrokerProcess], zookeeper: Any,
                                                              zk_root: str) -> None:
    produce(servers_of(cluster), 3)
    opts = ReadOptions.parse({"zkConnect": zookeeper.connect_string, "zkRoot": zk_root, "topic": "spread"})
    parts = MetaqBatchReader(opts).partitions()
    assert [(p.partition, p.start, p.end) for p in parts] == [(pid, 0, 3) for pid in IDS]  # type: ignore[attr-defined]
    for part in parts:
        own = part.partition.broker_id  # type: ignore[attr-defined]
        others = [cluster[b].servers for b in (1, 2, 3) if b != own]
        assert part.servers.split(",") == [cluster[own].servers, *others]  # type: ignore[attr-defined]


def test_batch_and_stream_reads_and_writes_through_zk_connect(spark: Any, cluster: dict[int, BrokerProcess],
                                                             zookeeper: Any, zk_root: str, tmp_path: Path) -> None:
    zk = {"zkConnect": zookeeper.connect_string, "zkRoot": zk_root}
    sent = produce(servers_of(cluster), 40)
    df = spark.read.format("metaq").options(**zk).option("topic", "spread").load()
    assert df.rdd.getNumPartitions() == 6  # one task per brokerId-partition of the three brokers
    assert rows_of(df) == sent

    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    (spark.readStream.format("metaq").options(**zk).option("topic", "spread").option("maxOffsetsPerTrigger", "50")
     .load().writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(checkpoint))
     .trigger(availableNow=True).start().awaitTermination())
    streamed = spark.read.schema("broker_id int, partition int, offset long, value binary").parquet(str(out))
    assert rows_of(streamed) == sent

    # a write with zkConnect: a key hashes over every broker's partitions
    (spark.range(300).selectExpr("CAST(id AS STRING) AS key", "CAST(id AS STRING) AS value")
     .write.format("metaq").options(**zk).option("topic", "spread").mode("append").save())
    with BlockingClient(servers_of(cluster)) as client:
        ends = client.list_offsets_many("spread", IDS, -1)
    written = {pid: ends[pid].log_end_offset - 40 for pid in IDS}
    assert sum(written.values()) == 300 and all(n > 0 for n in written.values()), written


def test_no_broker_under_the_root_names_the_option(spark: Any, zookeeper: Any, zk_root: str) -> None:
    df = (spark.read.format("metaq").option("zkConnect", zookeeper.connect_string).option("zkRoot", zk_root)
          .option("topic", "spread").load())
    with pytest.raises(Exception, match="option 'zkConnect': no metaq broker is registered in ZooKeeper"):
        df.collect()
