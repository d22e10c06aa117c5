"""The Spark side of `metaq bench spark` (metaq.bench.spark starts the broker, fills the topic and prints): each
case run in a Spark session against a filled topic, timed ``repeat`` times after one warm-up run.

- ``batch-read``: ``spark.read.format("metaq")...load()`` into the ``noop`` sink;
- ``stream-read``: ``readStream`` with ``trigger(availableNow=True)`` into ``noop``;
- ``batch-write``: a DataFrame of ``rows`` binary values (generated in the JVM) into another topic;
- ``keyed-write``: the same with a key and an attribute per row (the per-row BatchBuilder path);
- ``copy-at-least-once``, ``copy-exactly-once``: a streaming copy of the filled topic (``maxOffsetsPerTrigger`` =
  ``stream_batch_rows``, ``trigger(availableNow=True)``) into a new topic with the sink's ``deliveryGuarantee``
  at-least-once, then exactly-once (each micro-batch in prepared transactions the driver commits); each copy is
  checked to hold every row exactly once.

After the streaming reads it keeps the micro-batches of each query (rows, Spark's ``durationMs`` per stage), and
the ``metaq`` module the driver and a Python worker imported (Spark hands ``PYTHONPATH`` on to its workers).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from metaq.client import BlockingClient, connect


def progress_summary(query: Any) -> dict[str, Any]:
    """The micro-batches of a finished query: rows and Spark's durationMs per stage (ms)."""
    batches = []
    for p in query.recentProgress:
        d = p.durationMs if hasattr(p, "durationMs") else p["durationMs"]
        rows = p.numInputRows if hasattr(p, "numInputRows") else p["numInputRows"]
        batches.append({"rows": rows, **{k: int(v) for k, v in sorted(dict(d).items())}})
    return {"micro_batches": batches}


Report = Callable[[str], None]


def timed(label: str, fn: Callable[[], Any], rows: int, repeat: int, report: Report) -> dict[str, Any]:
    fn()  # warm-up: Python workers, JIT, first connections
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    rates = [rows / s for s in runs]
    result = {"what": label, "rows": rows, "seconds": [round(s, 3) for s in runs],
              "rows_per_s_median": round(statistics.median(rates)), "rows_per_s_best": round(max(rates))}
    report(f"{label}: {result['rows_per_s_median']:,} rows/s (median of {repeat}; best {result['rows_per_s_best']:,})")
    return result


def run_cases(servers: str, topic: str, args: Any, tmp: str, report: Report) -> dict[str, Any]:
    """Each case of ``args.cases`` against ``topic``, filled with ``args.rows`` messages of ``args.size`` bytes
    (``args``: a metaq.bench.spark.SparkBenchSpec); checkpoints under ``tmp``."""
    from pyspark.sql import SparkSession

    import metaq.spark

    out: dict[str, Any] = {"runs": []}

    spark = (SparkSession.builder.master(args.master).appName("metaq-spark-bench")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.memory", "2g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    metaq.spark.register(spark)
    worker_module = spark.sparkContext.parallelize([0], 1).map(lambda _: __import__("metaq").__file__).collect()[0]
    out.update(driver_metaq=metaq.spark.__file__, worker_metaq=worker_module, spark=spark.version,
               arch=platform.machine())
    report(f"Spark {spark.version}, {args.master}; metaq from {metaq.spark.__file__} (driver), {worker_module} "
           "(worker)")

    def batch_read() -> None:
        (spark.read.format("metaq").option("servers", servers).option("topic", topic).load()
         .write.format("noop").mode("overwrite").save())

    checkpoints = os.path.join(tmp, "checkpoints")

    progress: list[dict[str, Any]] = []

    def stream_read() -> None:
        query = (spark.readStream.format("metaq").option("servers", servers).option("topic", topic).load()
                 .writeStream.format("noop").option("checkpointLocation", os.path.join(checkpoints, uuid.uuid4().hex))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        progress.append(progress_summary(query))

    out_topic = f"{topic}-out"
    data = spark.range(args.rows, numPartitions=args.partitions).selectExpr(
        f"CAST(lpad(CAST(id AS STRING), {args.size}, 'x') AS BINARY) AS value")

    def batch_write() -> None:
        (data.write.format("metaq").option("servers", servers).option("topic", out_topic)
         .mode("append").save())

    keyed_topic = f"{topic}-keyed"
    with connect(servers) as session:
        session.admin().create_topic(keyed_topic, args.partitions)
    keyed = spark.range(args.rows, numPartitions=args.partitions).selectExpr(
        f"CAST(lpad(CAST(id AS STRING), {args.size}, 'x') AS BINARY) AS value",
        "CAST(CAST(id % 1000 AS STRING) AS BINARY) AS key", "'tag' AS attribute")

    def keyed_write() -> None:
        (keyed.write.format("metaq").option("servers", servers).option("topic", keyed_topic)
         .mode("append").save())

    def stream_copy(guarantee: str) -> Callable[[], None]:
        def run_once() -> None:
            target = f"{topic}-{guarantee}-{uuid.uuid4().hex[:6]}"
            with connect(servers) as session:  # exactly-once writes into existing topics only
                session.admin().create_topic(target, args.partitions)
            query = (spark.readStream.format("metaq").option("servers", servers).option("topic", topic)
                     .option("maxOffsetsPerTrigger", str(args.stream_batch_rows)).load().select("value")
                     .writeStream.format("metaq").option("servers", servers).option("topic", target)
                     .option("deliveryGuarantee", guarantee)
                     .option("checkpointLocation", os.path.join(checkpoints, uuid.uuid4().hex))
                     .trigger(availableNow=True).start())
            query.awaitTermination()
            with BlockingClient(servers) as client:  # the figure counts only if every row arrived, once
                ends = client.list_offsets_many(target, client.partitions_for(target), -1)
                stored = sum(r.offset for r in ends.values())
            if stored != args.rows:
                raise RuntimeError(f"{target}: {stored} messages after copying {args.rows} rows")
        return run_once

    cases = args.cases
    runs = out["runs"]
    if "batch-read" in cases:
        runs.append(timed("batch read -> noop", batch_read, args.rows, args.repeat, report))
    if "stream-read" in cases:
        runs.append(timed("stream read (availableNow) -> noop", stream_read, args.rows, args.repeat, report))
        out["stream_read_progress"] = progress  # the warm-up query first
    if "batch-write" in cases:
        runs.append(timed("batch write (spark.range -> metaq)", batch_write, args.rows, args.repeat, report))
    if "keyed-write" in cases:
        runs.append(timed("batch write with key + attribute (crc32(key) partitioning)", keyed_write, args.rows,
                          args.repeat, report))
    for guarantee in ("at-least-once", "exactly-once"):
        if f"copy-{guarantee}" in cases:
            runs.append(timed(f"stream copy metaq -> metaq sink, deliveryGuarantee={guarantee} "
                              f"(maxOffsetsPerTrigger={args.stream_batch_rows})", stream_copy(guarantee), args.rows,
                              args.repeat, report))
    spark.stop()
    return out
