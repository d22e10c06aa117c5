"""A streaming query in its own driver process, for the driver-kill test.

    python spark_stream_job.py SERVERS TOPIC CHECKPOINT OUT_DIR

Reads the topic with a small maxOffsetsPerTrigger and an idempotent per-batch file sink, forever,
until the test SIGKILLs the whole process group (driver, JVM and Python workers at once).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from metaq_spark_testutil import write_batch_file

import metaq.spark
from conftest import spark_builder


def main() -> None:
    servers, topic, checkpoint, out_dir = sys.argv[1:5]
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = spark_builder("metaq-driver-kill").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    metaq.spark.register(spark)
    query = (spark.readStream.format("metaq").option("servers", servers).option("topic", topic)
             .option("maxOffsetsPerTrigger", "300").load()
             .writeStream.foreachBatch(lambda df, batch_id: write_batch_file(out_dir, df, batch_id))
             .option("checkpointLocation", checkpoint).trigger(processingTime="200 milliseconds").start())
    print("query started", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main()
