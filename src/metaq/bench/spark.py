"""`metaq bench spark`: rows per second that Spark reads from and writes into metaq (the cases are
metaq.spark.bench's, run in a Spark session; this starts the broker, fills the topic and prints).

With no ``servers`` a broker of its own (group commit) runs in a temporary directory. A fresh topic is filled
with ``rows`` messages of ``size`` bytes by the blocking client, pipelined (not measured, but its rate is given:
what the broker takes without Spark), then each case is timed ``repeat`` times after one warm-up run.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from metaq.bench.report import BenchError, Report, markdown_table, require_known
from metaq.broker.launcher import BrokerLauncher
from metaq.client.blocking import BlockingClient
from metaq.protocol.records import encode_values

CASES = ("batch-read", "stream-read", "batch-write", "keyed-write", "copy-at-least-once", "copy-exactly-once")


@dataclass
class SparkBenchSpec:
    servers: str | None = None
    """None: a broker of its own for the run."""
    rows: int = 2_000_000
    size: int = 100
    partitions: int = 4
    repeat: int = 3
    master: str = "local[2]"
    stream_batch_rows: int = 250_000
    cases: list[str] = field(default_factory=lambda: list(CASES))


def fill(servers: str, topic: str, partitions: int, rows: int, size: int) -> None:
    per_batch = max(1, (256 * 1024) // (size + 28))
    payload = [b"x" * size] * per_batch
    batch = encode_values(payload, int(time.time() * 1000))
    n_batches = -(-rows // per_batch)
    last = encode_values(payload[: rows - per_batch * (n_batches - 1)], int(time.time() * 1000))
    with BlockingClient(servers) as client:
        items = ((topic, i % partitions, batch if i < n_batches - 1 else last) for i in range(n_batches))
        client.produce_many(items, window=32)


def run(spec: SparkBenchSpec, report: Report) -> dict[str, Any]:
    require_known("cases", spec.cases, CASES)
    try:
        from metaq.spark.bench import run_cases
    except ImportError:
        raise BenchError("pyspark is not installed: pip install 'metaq[spark]' (and Java 17)") from None
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    with tempfile.TemporaryDirectory(prefix="metaq-bench-spark-") as tmp:
        broker = None
        servers = spec.servers
        if servers is None:
            broker = BrokerLauncher(os.path.join(tmp, "broker"), {"numPartitions": spec.partitions,
                                                                  "unflushThreshold": 0}).start()
            servers = broker.servers
        try:
            topic = f"bench-{uuid.uuid4().hex[:8]}"
            t0 = time.perf_counter()
            fill(servers, topic, spec.partitions, spec.rows, spec.size)
            filled = round(spec.rows / (time.perf_counter() - t0))
            report(f"filled {spec.rows:,} rows of {spec.size} B: {filled:,} rows/s (blocking client, not Spark)")
            cases = run_cases(servers, topic, spec, tmp, report)
        finally:
            if broker is not None:
                broker.stop()
    return {"rows": spec.rows, "size": spec.size, "partitions": spec.partitions, "master": spec.master,
            "fill_rows_per_s": filled, **cases}


def table(result: dict[str, Any]) -> str:
    return (f"{result['rows']:,} rows of {result['size']} B, {result['partitions']} partitions, Spark "
            f"{result['spark']} {result['master']}; the fill (not Spark): {result['fill_rows_per_s']:,} rows/s\n\n"
            + markdown_table(["case", "rows/s, median", "best", "seconds, each run"],
                             [[r["what"], f"{r['rows_per_s_median']:,}", f"{r['rows_per_s_best']:,}",
                               " · ".join(str(x) for x in r["seconds"])] for r in result["runs"]], right=[1, 2]))
