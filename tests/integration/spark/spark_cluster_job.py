"""A streaming query on a Spark standalone cluster, in its own driver process (the cluster test's driver).

    python spark_cluster_job.py MASTER_URL ZK_CONNECT ZK_ROOT TOPIC CHECKPOINT OUT_DIR stream|available-now

Reads TOPIC with zkConnect (the driver finds the brokers in ZooKeeper; executors on the workers read
the partitions from their brokers) into an idempotent per-batch file sink: batch N is always
``OUT_DIR/batch-N.json``, replaced when Spark replays it. ``stream`` runs until the test kills the
driver; ``available-now`` reads what is there and exits 0.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from metaq_spark_testutil import write_batch_file

import metaq.spark

COLUMNS = ("broker_id", "partition", "offset")


def main() -> None:
    master, zk_connect, zk_root, topic, checkpoint, out_dir, mode = sys.argv[1:8]
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(master).appName(f"metaq-on-a-cluster-{mode}")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.driver.memory", "768m").config("spark.executor.memory", "512m")
             .config("spark.executor.cores", "1").config("spark.cores.max", "2")
             .config("spark.pyspark.python", sys.executable)
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    metaq.spark.register(spark)
    # both executors (one per worker) registered before the first batch, so that both machines read
    deadline = time.monotonic() + 90
    while spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() < 3:  # the driver counts as one
        if time.monotonic() > deadline:
            raise SystemExit("the executors of both workers did not register within 90 s")
        time.sleep(0.2)
    print("executors ready", flush=True)
    reader = (spark.readStream.format("metaq").option("zkConnect", zk_connect).option("zkRoot", zk_root)
              .option("topic", topic).option("maxOffsetsPerTrigger", "100").load())
    writer = (reader.writeStream.foreachBatch(lambda df, batch_id: write_batch_file(out_dir, df, batch_id, COLUMNS))
              .option("checkpointLocation", checkpoint))
    if mode == "stream":
        query = writer.trigger(processingTime="300 milliseconds").start()
        print("query started", flush=True)
        query.awaitTermination()
    else:
        writer.trigger(availableNow=True).start().awaitTermination()
        print("done", flush=True)
        spark.stop()


if __name__ == "__main__":
    main()
