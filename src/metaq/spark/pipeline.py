"""The demo pipeline's Spark jobs: log events in a metaq topic -> windowed aggregates -> metaq and Parquet.

Two streaming queries (docs/demo.md has the picture):

1. **aggregate** (:func:`start_aggregation`): ``readStream.format("metaq")`` on the events topic,
   ``from_json`` with :data:`EVENT_SCHEMA`, a watermark on the event time, and one stateful
   aggregation over three grouping sets of each window: (window, status), (window, endpoint) and
   (window). Per group it computes requests, 5xx errors, the error rate, the p95 latency
   (``percentile_approx``) and the latest event time. Output mode append: a window's rows are written
   once, when the watermark has passed its end, to the aggregates topic with
   ``writeStream.format("metaq")`` (one JSON message per row, keyed ``kind|window start ms|group``).
2. **archive** (:func:`start_archive`): ``readStream.format("metaq")`` on the aggregates topic, each
   micro-batch written to Parquet under ``<dir>/batch_id=N`` (overwritten if Spark replays the batch,
   so a replay leaves no duplicate files) and handed to a callback that prints the live summary.

Only access events are counted, but every event (application lines too) goes through the watermark,
so the event time keeps moving while requests are rare; a ``punctuation`` event (see
:func:`metaq.pipeline.generator.punctuation`) moves it past the last window at shutdown.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

import metaq.spark

EVENT_SCHEMA = ("kind string, seq long, ts double, method string, endpoint string, path string, status int, "
                "latency_ms double, bytes long, client_ip string, user_agent string, level string, logger string")
"""The fields the job reads from each event's JSON (other fields are ignored)."""

AGGREGATE_SCHEMA = ("kind string, window_start timestamp, window_end timestamp, status int, endpoint string, "
                    "requests long, errors long, error_rate double, p95_latency_ms double, max_event_ts double")
"""One output row: kind is 'status', 'endpoint' or 'window' (which of status/endpoint is set)."""

DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""C1 only and the serial collector: a short local driver JVM starts about twice as fast (SPARK_NOTES)."""

PERCENTILE_ACCURACY = 10_000
"""percentile_approx's accuracy: the result is within 1/accuracy of the exact rank (here 0.01 %)."""


def build_session(app_name: str = "metaq-demo", master: str = "local[2]", log_level: str = "WARN",
                  log4j_config: str | None = None) -> SparkSession:
    """A local SparkSession for the demo: UI and console progress off, 2 shuffle partitions, metaq registered.

    ``log4j_config``: a log4j2 properties file for the driver JVM (replaces Spark's default, whose
    start-up lines are printed before ``log_level`` can apply).
    """
    # Python workers must run this interpreter (metaq is installed here), not python3 from PATH.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # local mode: no need to look up the host name
    java_options = DRIVER_JAVA_OPTIONS
    if log4j_config:
        java_options += f" -Dlog4j2.configurationFile=file:{os.path.abspath(log4j_config)}"
    spark = (SparkSession.builder.master(master).appName(app_name)
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.adaptive.enabled", "false")  # streaming and stateful queries do not use it
             .config("spark.driver.memory", "1g")
             .config("spark.driver.extraJavaOptions", java_options)
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.streaming.numRecentProgressUpdates", "10000")
             .getOrCreate())
    spark.sparkContext.setLogLevel(log_level)
    metaq.spark.register(spark)
    return spark


def parse_events(raw: DataFrame) -> DataFrame:
    """metaq rows -> one row per event with ``event_time``; values that are not event JSON are dropped."""
    parsed = raw.select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e")).select("e.*")
    return parsed.where(F.col("ts").isNotNull()).withColumn("event_time", F.timestamp_seconds("ts"))


def aggregate(events: DataFrame, window: str = "10 seconds", watermark: str = "10 seconds") -> DataFrame:
    """Windowed aggregates of the access events (see the module doc); columns as in AGGREGATE_SCHEMA."""
    w = F.window("event_time", window)
    access = F.col("kind") == "access"
    # Conditional aggregates rather than a filter: a filter on `kind` would be pushed below the
    # watermark by the optimizer, and then application lines and punctuation would not move it.
    grouped = (events.withWatermark("event_time", watermark)
               .groupingSets([[w, F.col("status")], [w, F.col("endpoint")], [w]], w, F.col("status"),
                             F.col("endpoint"))
               .agg(F.count_if(access).alias("requests"),
                    F.count_if(access & (F.col("status") >= 500)).alias("errors"),
                    F.percentile_approx(F.when(access, F.col("latency_ms")), 0.95, PERCENTILE_ACCURACY)
                    .alias("p95_latency_ms"),
                    F.max(F.when(access, F.col("ts"))).alias("max_event_ts"),
                    F.grouping_id().alias("gid")))
    # grouping_id() has a bit per grouping column (window, status, endpoint), set when it is rolled up.
    kind: Column = F.when(F.col("gid") == 1, "status").when(F.col("gid") == 2, "endpoint").otherwise("window")
    return (grouped.where(F.col("requests") > 0)
            .select(kind.alias("kind"), F.col("window.start").alias("window_start"),
                    F.col("window.end").alias("window_end"), "status", "endpoint", "requests", "errors",
                    (F.col("errors") / F.col("requests")).alias("error_rate"), "p95_latency_ms", "max_event_ts"))


def to_messages(aggregates: DataFrame) -> DataFrame:
    """Aggregate rows -> (key, value, attribute) for the metaq sink; the key is the same on a replay."""
    group = F.coalesce(F.col("status").cast("string"), F.col("endpoint"), F.lit(""))
    key = F.concat_ws("|", F.col("kind"), F.unix_millis("window_start").cast("string"), group)
    return aggregates.select(key.alias("key"), F.to_json(F.struct(*aggregates.columns)).alias("value"),
                             F.col("kind").alias("attribute"))


def brokers_options(servers: str = "", zk_connect: str | None = None, zk_root: str = "/meta") -> dict[str, str]:
    """The source's and sink's options naming the brokers: ``servers``, or a cluster's ZooKeeper."""
    return {"zkConnect": zk_connect, "zkRoot": zk_root} if zk_connect else {"servers": servers}


def _trigger(writer: Any, trigger: str | None) -> Any:
    return writer.trigger(availableNow=True) if trigger is None else writer.trigger(processingTime=trigger)


def start_aggregation(spark: SparkSession, *, servers: str = "", topic: str, output_topic: str, checkpoint: str,
                      window: str = "10 seconds", watermark: str = "10 seconds", trigger: str | None = "1 second",
                      starting_offsets: str = "earliest", max_offsets_per_trigger: int | None = None,
                      zk_connect: str | None = None, zk_root: str = "/meta") -> StreamingQuery:
    """Start query 1: events topic -> aggregates -> ``output_topic``. ``trigger=None``: availableNow.
    ``zk_connect``/``zk_root`` instead of ``servers``: the brokers of a ZooKeeper-mode cluster.

    The rows of a micro-batch are written by one task (``coalesce(1)``): with a one-partition output
    topic they are one produce request, so a reader sees a batch's windows whole or not at all.
    """
    brokers = brokers_options(servers, zk_connect, zk_root)
    reader = (spark.readStream.format("metaq").options(**brokers).option("topic", topic)
              .option("startingOffsets", starting_offsets))
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    messages = to_messages(aggregate(parse_events(reader.load()), window, watermark)).coalesce(1)
    writer = (messages.writeStream.format("metaq").queryName("metaq-demo-aggregate").outputMode("append")
              .options(**brokers).option("topic", output_topic).option("checkpointLocation", checkpoint))
    query: StreamingQuery = _trigger(writer, trigger).start()
    return query


def read_aggregates(raw: DataFrame) -> DataFrame:
    """metaq rows of the aggregates topic -> AGGREGATE_SCHEMA columns plus key and where/when it was written."""
    return raw.select(F.from_json(F.col("value").cast("string"), AGGREGATE_SCHEMA).alias("a"),
                      F.col("key").cast("string").alias("key"), F.col("timestamp").alias("written_at"),
                      "partition", "offset").select("a.*", "key", "written_at", "partition", "offset")


def start_archive(spark: SparkSession, *, servers: str = "", output_topic: str, parquet_dir: str, checkpoint: str,
                  trigger: str | None = "1 second", starting_offsets: str = "earliest",
                  on_batch: Callable[[int, list[dict[str, Any]]], None] | None = None,
                  zk_connect: str | None = None, zk_root: str = "/meta") -> StreamingQuery:
    """Start query 2: aggregates topic -> Parquet (``<parquet_dir>/batch_id=N``) and ``on_batch(id, rows)``."""
    raw = (spark.readStream.format("metaq").options(**brokers_options(servers, zk_connect, zk_root))
           .option("topic", output_topic)
           .option("startingOffsets", starting_offsets).load())

    def each_batch(df: DataFrame, batch_id: int) -> None:
        df = df.persist()
        try:
            if on_batch is None:
                if not df.isEmpty():
                    df.write.mode("overwrite").parquet(os.path.join(parquet_dir, f"batch_id={batch_id}"))
                return
            rows = [r.asDict() for r in df.collect()]
            if rows:
                df.write.mode("overwrite").parquet(os.path.join(parquet_dir, f"batch_id={batch_id}"))
                on_batch(batch_id, rows)
        finally:
            df.unpersist()

    writer = (read_aggregates(raw).writeStream.queryName("metaq-demo-archive").foreachBatch(each_batch)
              .option("checkpointLocation", checkpoint))
    query: StreamingQuery = _trigger(writer, trigger).start()
    return query


def read_parquet(spark: SparkSession, parquet_dir: str) -> DataFrame:
    """Everything the archive wrote (with its ``batch_id`` partition column)."""
    return spark.read.parquet(parquet_dir)


def total_input_rows(query: StreamingQuery) -> int:
    """Rows the query read from its source so far (from its progress reports)."""
    return sum(int(p.get("numInputRows", 0)) for p in query.recentProgress)


def watermark_ms(query: StreamingQuery) -> int | None:
    """The event-time watermark of the query's latest micro-batch, in ms since the epoch (None before one)."""
    progress = query.lastProgress
    if not progress:
        return None
    text = (progress.get("eventTime") or {}).get("watermark")
    if not text:
        return None
    from datetime import datetime

    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)
