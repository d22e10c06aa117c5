"""The demo pipeline: generator determinism and event shape (fast), and the Spark job's aggregates (Spark).

The Spark test logs a known, seeded event set through a MetaqHandler into a real broker, runs the
demo's two streaming queries (availableNow) and checks every aggregate in BOTH sinks, the aggregates
topic and the Parquet files, against what the generator produced.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from metaq.client import connect
from metaq.logging import JsonFormatter, MetaqHandler
from metaq.pipeline.generator import ACCESS_LOGGER, EventGenerator, log_event, punctuation
from metaq.pipeline.summary import epoch, group_windows, read_parquet, read_topic
from metaq.testing.broker import BrokerProcess
from metaq.testing.timing import scaled

T0 = 1_800_000_000.0  # a fixed simulated start: the same events on every run
WINDOW_S = 10
WATERMARK_S = 10

# -- fast: no Spark -------------------------------------------------------------------------------


def test_generator_is_deterministic_for_a_seed() -> None:
    a = EventGenerator(42, rate=200, start=T0).until(T0 + 30)
    b = EventGenerator(42, rate=200, start=T0).until(T0 + 30)
    c = EventGenerator(43, rate=200, start=T0).until(T0 + 30)
    assert a == b
    assert a != c
    assert [e.fields["seq"] for e in a] == list(range(len(a)))
    assert all(T0 <= x.ts < y.ts < T0 + 30 for x, y in itertools.pairwise(a))
    # until() resumes where it stopped: two halves are the whole
    g = EventGenerator(42, rate=200, start=T0)
    assert g.until(T0 + 12) + g.until(T0 + 30) == a


def test_generated_traffic_looks_like_traffic() -> None:
    events = EventGenerator(7, rate=150, start=T0).until(T0 + 120)
    kinds = Counter(e.kind for e in events)
    assert 0.75 < kinds["access"] / len(events) < 0.95 and kinds["app"] > 0
    access = [e.fields for e in events if e.kind == "access"]
    statuses = Counter(a["status"] for a in access)
    assert 0.85 < (statuses[200] + statuses[201] + statuses[304]) / len(access) < 0.99
    assert sum(n for s, n in statuses.items() if s >= 500) > 0
    per_window = Counter(int(a["ts"] // WINDOW_S) for a in access if a["status"] >= 500)
    assert max(per_window.values()) >= 5 * (min(per_window.values()) + 1), "5xx come in bursts"
    lat: dict[str, list[float]] = defaultdict(list)
    for a in access:
        lat[a["endpoint"]].append(a["latency_ms"])
    for endpoint, values in lat.items():
        values.sort()
        median, p99 = values[len(values) // 2], values[int(len(values) * 0.99)]
        assert p99 > 1.8 * median and values[-1] > 5 * median, f"{endpoint}: a long tail"
    assert statistics_median(lat["/api/search"]) > 10 * statistics_median(lat["/static/app.js"])
    assert {e.logger for e in events if e.kind == "app"} >= {"shop.orders", "shop.payments", "shop.auth"}


def statistics_median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def test_event_json_shape() -> None:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    root = logging.getLogger("shape-test")
    root.propagate = False
    root.setLevel(logging.DEBUG)
    keep = Keep()
    root.addHandler(keep)
    try:
        events = EventGenerator(3, start=T0).until(T0 + 5)
        for e in events:
            log_event(e, get_logger=lambda name: logging.getLogger(f"shape-test.{name}"))
    finally:
        root.removeHandler(keep)
    docs = [json.loads(JsonFormatter().format(r)) for r in records]
    access = [d for d in docs if d["kind"] == "access"]
    app = [d for d in docs if d["kind"] == "app"]
    assert access and app and len(docs) == len(events)
    assert set(access[0]) == {"timestamp", "level", "logger", "message", "kind", "seq", "ts", "method", "endpoint",
                              "path", "status", "latency_ms", "bytes", "client_ip", "user_agent"}
    assert set(app[0]) == {"timestamp", "level", "logger", "message", "kind", "seq", "ts"}
    a = access[0]
    assert a["logger"] == f"shape-test.{ACCESS_LOGGER}" and a["level"] == "INFO"
    assert isinstance(a["status"], int) and isinstance(a["latency_ms"], float) and isinstance(a["ts"], float)
    assert a["message"] == f'{a["client_ip"]} "{a["method"]} {a["path"]}" {a["status"]} {a["latency_ms"]} ms'
    assert a["timestamp"].endswith("Z")
    pytest.importorskip("pyspark")
    from metaq.spark.pipeline import EVENT_SCHEMA

    schema_fields = {part.split()[0] for part in EVENT_SCHEMA.split(",")}
    assert set(a) - {"timestamp", "message"} <= schema_fields, "the Spark job's schema covers every field it uses"


# -- the Spark job ----------------------------------------------------------------------------------

def _expected(events: list[Any]) -> dict[str, Any]:
    access = [e.fields for e in events if e.kind == "access"]
    by_status: Counter[tuple[float, int]] = Counter()
    windows: dict[float, list[dict[str, Any]]] = defaultdict(list)
    endpoints: dict[tuple[float, str], list[float]] = defaultdict(list)
    for a in access:
        w = math.floor(a["ts"] / WINDOW_S) * WINDOW_S
        by_status[(w, a["status"])] += 1
        windows[w].append(a)
        endpoints[(w, a["endpoint"])].append(a["latency_ms"])
    return {"by_status": by_status, "windows": windows, "endpoints": endpoints, "requests": len(access)}


def _p95_ok(got: float, values: list[float]) -> bool:
    """percentile_approx(x, 0.95, 10000): an element whose rank is within n/10000 (+1) of ceil(0.95 n)."""
    values = sorted(values)
    n = len(values)
    k = math.ceil(0.95 * n)
    tol = 1 + n // 10_000
    return got in values[max(0, k - 1 - tol):k + tol]


def _check_rows(rows: list[dict[str, Any]], expected: dict[str, Any], sink: str) -> None:
    got_status = {(epoch(r["window_start"]), r["status"]): r["requests"] for r in rows if r["kind"] == "status"}
    assert got_status == dict(expected["by_status"]), f"{sink}: requests per status per window"
    windows = {ws.start: ws for ws in group_windows(rows, written_at_key=None)}
    assert set(windows) == set(expected["windows"]), f"{sink}: one row set per window"
    for start, events in expected["windows"].items():
        ws = windows[start]
        assert ws.total is not None and ws.end == start + WINDOW_S
        errors = sum(1 for a in events if a["status"] >= 500)
        assert (ws.total["requests"], ws.total["errors"]) == (len(events), errors), f"{sink}: window {start}"
        assert ws.total["error_rate"] == pytest.approx(errors / len(events))
        assert ws.total["max_event_ts"] == pytest.approx(max(a["ts"] for a in events), abs=1e-6)
        assert _p95_ok(ws.total["p95_latency_ms"], [a["latency_ms"] for a in events])
    endpoint_rows = [r for r in rows if r["kind"] == "endpoint"]
    assert len(endpoint_rows) == len(expected["endpoints"]), f"{sink}: one row per window and endpoint"
    for r in endpoint_rows:
        start = epoch(r["window_start"])
        values = expected["endpoints"][(start, r["endpoint"])]
        assert r["requests"] == len(values)
        assert _p95_ok(r["p95_latency_ms"], values), (sink, r["endpoint"], r["p95_latency_ms"])
    assert sum(ws.requests for ws in windows.values()) == expected["requests"], f"{sink}: every request counted"


@pytest.mark.spark
@pytest.mark.slow
def test_demo_job_aggregates_are_exact_in_the_topic_and_in_parquet(spark: Any, broker: BrokerProcess,
                                                                   tmp_path: Path) -> None:
    from metaq.spark import pipeline as sp

    with connect(broker.servers) as session:
        session.admin().create_topic("events", 2)
        session.admin().create_topic("aggregates", 1)

    gen = EventGenerator(11, rate=80, start=T0)
    events = gen.until(T0 + 45)
    end = punctuation(events[-1].ts + WINDOW_S + WATERMARK_S + 1, gen.next_seq())
    expected = _expected(events)
    assert any(s >= 500 for (_, s) in expected["by_status"]), "the seed gives an incident"

    handler = MetaqHandler(broker.servers, "events", key_func=lambda r: str(r.seq))  # type: ignore[attr-defined]
    base = logging.getLogger("demo-job-test")
    base.propagate = False
    base.setLevel(logging.DEBUG)
    base.addHandler(handler)
    try:
        for e in [*events, end]:
            log_event(e, get_logger=lambda name: logging.getLogger(f"demo-job-test.{name}"))
        assert handler.drain(30)
    finally:
        base.removeHandler(handler)
        handler.close()

    # Several micro-batches (maxOffsetsPerTrigger), so that the watermark moves between them.
    agg = sp.start_aggregation(spark, servers=broker.servers, topic="events", output_topic="aggregates",
                               checkpoint=str(tmp_path / "ck-aggregate"), window=f"{WINDOW_S} seconds",
                               watermark=f"{WATERMARK_S} seconds", trigger=None, max_offsets_per_trigger=1000)
    agg.awaitTermination(scaled(120))
    assert not agg.isActive and agg.exception() is None
    assert sp.total_input_rows(agg) == len(events) + 1
    assert len([p for p in agg.recentProgress if p["numInputRows"]]) >= 3

    live_rows: list[dict[str, Any]] = []
    archive = sp.start_archive(spark, servers=broker.servers, output_topic="aggregates",
                               parquet_dir=str(tmp_path / "parquet"), checkpoint=str(tmp_path / "ck-archive"),
                               trigger=None, on_batch=lambda _id, rows: live_rows.extend(rows))
    archive.awaitTermination(scaled(120))
    assert not archive.isActive and archive.exception() is None

    topic = read_topic(broker.servers, "aggregates", {})
    assert topic.duplicates == 0
    _check_rows(topic.rows, expected, "aggregates topic")
    parquet = read_parquet(tmp_path / "parquet")          # pyarrow, no Spark
    _check_rows(parquet.rows, expected, "parquet (pyarrow)")
    assert parquet.keys == topic.keys
    spark_rows = [r.asDict() for r in sp.read_parquet(spark, str(tmp_path / "parquet")).collect()]
    _check_rows(spark_rows, expected, "parquet (Spark)")
    assert sorted(r["key"] for r in live_rows) == sorted(topic.keys), "the live callback saw every row once"
    # every key names its row: kind|window start ms|status or endpoint (the same on a replay)
    for r in topic.rows:
        group = str(r["status"]) if r["kind"] == "status" else (r.get("endpoint") or "")
        assert f"{r['kind']}|{round(epoch(r['window_start']) * 1000)}|{group}" in topic.keys


# -- the whole demo over a 3-broker cluster ---------------------------------------------------------

@pytest.mark.spark
@pytest.mark.slow
def test_demo_over_three_brokers_checks_itself_and_stops_everything_on_ctrl_c(tmp_path: Path) -> None:
    """``python -m metaq.demo --brokers 3`` as a user runs it, stopped by Ctrl-C once Spark has read events:
    the events are spread over the three brokers, the final self-check passes, and neither ZooKeeper nor
    a broker outlives the demo."""
    import os
    import re
    import signal
    import subprocess
    import sys
    import threading

    from metaq.testing import wait_until
    from metaq.testing.processes import processes_using

    data = tmp_path / "demo-data"
    proc = subprocess.Popen([sys.executable, "-m", "metaq.demo", "--brokers", "3", "--duration", "300",
                             "--data", str(data), "--seed", "5"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: list[str] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(line.rstrip("\n") for line in proc.stdout), daemon=True)
    reader.start()
    try:
        wait_until(lambda: any("cluster ready: ZooKeeper 127.0.0.1:" in line for line in lines)
                   or proc.poll() is not None, scaled(60), 0.1, "the cluster to be ready")
        assert proc.poll() is None, "\n".join(lines)
        wait_until(lambda: any(re.search(r"Spark read [1-9][\d,]* in", line) for line in lines)
                   or proc.poll() is not None, scaled(120), 0.1, "Spark to read events")
        assert proc.poll() is None, "\n".join(lines)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in the terminal: the whole foreground process group
        assert proc.wait(scaled(120)) == 0, "\n".join(lines)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    reader.join(10)
    text = "\n".join(lines)
    spread = re.search(r"events topic +([\d,]+) messages in 'demo-logs' over brokers 1: ([\d,]+), 2: ([\d,]+), "
                       r"3: ([\d,]+)$", text, re.M)
    assert spread, text
    total, *per_broker = (int(x.replace(",", "")) for x in spread.groups())
    assert sum(per_broker) == total and min(per_broker) > 0
    assert re.search(rf"Spark read +{spread.group(1)} events", text), "Spark read every event"
    assert re.search(r"requests counted +([\d,]+) of \1 generated \(every window closed and written\)", text), text
    assert "; 0 duplicate(s)" in text and "same rows as the topic: yes" in text and "PROBLEM" not in text
    # the generator starts once Spark has run a micro-batch, so the windows show while it runs (it started first,
    # and on a busy machine Spark read every event at the end)
    ready = next(i for i, line in enumerate(lines) if "Spark ready;" in line)
    assert ready < next(i for i, line in enumerate(lines) if "generator started:" in line), text
    assert "stopping the brokers (SIGTERM: deregister, flush and close), then ZooKeeper" in text
    assert processes_using(data) == [], "ZooKeeper and the brokers are gone"
