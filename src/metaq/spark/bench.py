"""Rows per second that Spark reads from and writes into metaq (not a test: run it, write the figures down).

    python -m metaq.spark.bench [--servers HOST:PORT] [--rows 2000000] [--size 100] [--partitions 4]

Without ``--servers`` it starts a broker of its own in a temporary directory. It fills a fresh topic
with ``--rows`` messages of ``--size`` bytes, then times, after one warm-up query each:

- batch read: ``spark.read.format("metaq")...load()`` into the ``noop`` sink;
- streaming read: ``readStream`` with ``trigger(availableNow=True)`` into ``noop``;
- batch write: a DataFrame of ``--rows`` binary values (generated in the JVM) into another topic;
- the same with a key and an attribute per row (the per-row BatchBuilder path);
- streaming copy: ``readStream`` of the filled topic (``maxOffsetsPerTrigger`` = ``--stream-batch-rows``,
  ``trigger(availableNow=True)``) into a new topic with the sink's ``deliveryGuarantee`` at-least-once,
  then exactly-once (each micro-batch in prepared transactions the driver commits), same run.

``--sink-only`` runs just the two streaming copies; ``--cases batch-read,stream-read`` picks cases by name
(batch-read, stream-read, batch-write, keyed-write, copy-at-least-once, copy-exactly-once). After each
streaming case it prints the last query's micro-batches (rows, Spark's ``durationMs`` per stage), and at
the start the ``metaq`` module the driver and a Python worker imported (a before/after pair is run with
the old ``src`` on ``PYTHONPATH``, which Spark hands on to its workers).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

from metaq.broker.launcher import BrokerLauncher
from metaq.client.blocking import BlockingClient
from metaq.protocol.messages import CreateTopicRequest
from metaq.protocol.records import encode_values


def fill(servers: str, topic: str, partitions: int, rows: int, size: int) -> None:
    per_batch = max(1, (256 * 1024) // (size + 28))
    payload = [b"x" * size] * per_batch
    batch = encode_values(payload, int(time.time() * 1000))
    n_batches = -(-rows // per_batch)
    last = encode_values(payload[: rows - per_batch * (n_batches - 1)], int(time.time() * 1000))
    with BlockingClient(servers) as client:
        items = ((topic, i % partitions, batch if i < n_batches - 1 else last) for i in range(n_batches))
        client.produce_many(items, window=32)


CASES = ("batch-read", "stream-read", "batch-write", "keyed-write", "copy-at-least-once", "copy-exactly-once")


def progress_summary(query: Any) -> dict[str, Any]:
    """The micro-batches of a finished query: rows and Spark's durationMs per stage (ms)."""
    batches = []
    for p in query.recentProgress:
        d = p.durationMs if hasattr(p, "durationMs") else p["durationMs"]
        rows = p.numInputRows if hasattr(p, "numInputRows") else p["numInputRows"]
        batches.append({"rows": rows, **{k: int(v) for k, v in sorted(dict(d).items())}})
    return {"micro_batches": batches}


def timed(label: str, fn: Callable[[], Any], rows: int, repeat: int) -> dict[str, Any]:
    fn()  # warm-up: Python workers, JIT, first connections
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    rates = [rows / s for s in runs]
    result = {"what": label, "rows": rows, "seconds": [round(s, 3) for s in runs],
              "rows_per_s_median": round(statistics.median(rates)), "rows_per_s_best": round(max(rates))}
    print(json.dumps(result), flush=True)
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers")
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--stream-batch-rows", type=int, default=250_000)
    ap.add_argument("--sink-only", action="store_true")
    ap.add_argument("--cases", help=f"comma-separated, of: {', '.join(CASES)} (default: all)")
    args = ap.parse_args(argv)
    cases = list(CASES[-2:]) if args.sink_only else list(CASES)
    if args.cases:
        cases = [c.strip() for c in args.cases.split(",") if c.strip()]
        unknown = sorted(set(cases) - set(CASES))
        if unknown:
            ap.error(f"--cases: unknown {unknown}; choose from {', '.join(CASES)}")
    args.case_list = cases

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    broker = None
    servers = args.servers
    if servers is None:
        broker = BrokerLauncher(os.path.join(tempfile.mkdtemp(prefix="metaq-spark-bench-"), "broker"),
                                {"numPartitions": args.partitions, "unflushThreshold": 0}).start()
        servers = broker.servers
    try:
        run(servers, args)
    finally:
        if broker is not None:
            broker.stop()


def run(servers: str, args: argparse.Namespace) -> None:
    from pyspark.sql import SparkSession

    import metaq.spark

    topic = f"bench-{uuid.uuid4().hex[:8]}"
    t0 = time.perf_counter()
    fill(servers, topic, args.partitions, args.rows, args.size)
    print(json.dumps({"what": "fill (blocking client, pipelined)", "rows": args.rows,
                      "rows_per_s": round(args.rows / (time.perf_counter() - t0))}), flush=True)

    spark = (SparkSession.builder.master(args.master).appName("metaq-spark-bench")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.memory", "2g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    metaq.spark.register(spark)
    worker_module = spark.sparkContext.parallelize([0], 1).map(lambda _: __import__("metaq").__file__).collect()[0]
    print(json.dumps({"driver_metaq": metaq.spark.__file__, "worker_metaq": worker_module}), flush=True)
    print(json.dumps({"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
                      "spark": spark.version, "master": args.master, "partitions": args.partitions,
                      "message_bytes": args.size}), flush=True)

    def batch_read() -> None:
        (spark.read.format("metaq").option("servers", servers).option("topic", topic).load()
         .write.format("noop").mode("overwrite").save())

    checkpoints = tempfile.mkdtemp(prefix="metaq-spark-bench-ck-")

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
    with BlockingClient(servers) as client:
        client.request(CreateTopicRequest(keyed_topic, args.partitions))
    keyed = spark.range(args.rows, numPartitions=args.partitions).selectExpr(
        f"CAST(lpad(CAST(id AS STRING), {args.size}, 'x') AS BINARY) AS value",
        "CAST(CAST(id % 1000 AS STRING) AS BINARY) AS key", "'tag' AS attribute")

    def keyed_write() -> None:
        (keyed.write.format("metaq").option("servers", servers).option("topic", keyed_topic)
         .mode("append").save())

    def stream_copy(guarantee: str) -> Callable[[], None]:
        def run_once() -> None:
            target = f"{topic}-{guarantee}-{uuid.uuid4().hex[:6]}"
            with BlockingClient(servers) as client:  # exactly-once writes into existing topics only
                client.request(CreateTopicRequest(target, args.partitions))
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
                raise SystemExit(f"{target}: {stored} messages after copying {args.rows} rows")
        return run_once

    cases = args.case_list
    if "batch-read" in cases:
        timed("batch read -> noop", batch_read, args.rows, args.repeat)
    if "stream-read" in cases:
        timed("stream read (availableNow) -> noop", stream_read, args.rows, args.repeat)
        for i, summary in enumerate(progress):
            print(json.dumps({"stream read run": "warm-up" if i == 0 else i, **summary}), flush=True)
    if "batch-write" in cases:
        timed("batch write (spark.range -> metaq)", batch_write, args.rows, args.repeat)
    if "keyed-write" in cases:
        timed("batch write with key + attribute (crc32(key) partitioning)", keyed_write, args.rows, args.repeat)
    for guarantee in ("at-least-once", "exactly-once"):
        if f"copy-{guarantee}" in cases:
            timed(f"stream copy metaq -> metaq sink, deliveryGuarantee={guarantee} "
                  f"(maxOffsetsPerTrigger={args.stream_batch_rows})", stream_copy(guarantee), args.rows, args.repeat)
    spark.stop()


if __name__ == "__main__":
    main()
