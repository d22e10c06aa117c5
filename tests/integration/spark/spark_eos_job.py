"""A streaming copy into the exactly-once metaq sink in its own driver process, for the driver-kill tests.

    METAQ_SPARK_FAILPOINT=<name>:<batch> METAQ_SPARK_FAILPOINT_DIR=<dir> \
        python spark_eos_job.py SERVERS SOURCE SINK CHECKPOINT

Runs until the test SIGKILLs the whole process group (driver, JVM and Python workers at once), which
it does once the sink has stopped at the failpoint (metaq.spark.failpoints).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import metaq.spark
from conftest import spark_builder


def copy_query(spark: object, servers: str, source: str, sink: str, checkpoint: str) -> object:
    """The query both the child and the test's restart run: the same plan, from the same checkpoint."""
    return (spark.readStream.format("metaq").option("servers", servers).option("topic", source)  # type: ignore[attr-defined]
            .option("maxOffsetsPerTrigger", "200").load()
            .select("value", "partition")
            .writeStream.format("metaq").option("servers", servers).option("topic", sink)
            .option("deliveryGuarantee", "exactly-once").option("checkpointLocation", checkpoint))


def main() -> None:
    servers, source, sink, checkpoint = sys.argv[1:5]
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = spark_builder("metaq-eos-driver-kill").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    metaq.spark.register(spark)
    query = copy_query(spark, servers, source, sink, checkpoint).trigger(  # type: ignore[attr-defined]
        processingTime="100 milliseconds").start()
    print("query started", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main()
