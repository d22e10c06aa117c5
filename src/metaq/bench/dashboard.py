"""`metaq bench dashboard`: what the broker's HTTP side (``dashboardHttpPort``: Prometheus metrics and the web
dashboard) costs its produce throughput, and how long the dashboard's JSON takes for many partitions.

1. Produce throughput, `metaq bench produce` (``send_batch`` of 1000 x 100 B, 8 in flight) against a fresh broker
   per run (group commit, 4 partitions), the cases in a rotating order each round (who goes first takes turns):

   - ``no-port``: no ``dashboardHttpPort`` (the same-run baseline; the counters and histograms are kept anyway);
   - ``scraped``: ``dashboardHttpPort`` with ``GET /metrics`` every ``scrape_interval`` seconds, as Prometheus
     does (its default is 15 s: a shorter interval makes the scrape's cost visible);
   - ``page-open``: ``dashboardHttpPort`` with what an open dashboard page asks every second (``/api/state``
     and ``/api/history``), the history sampling the broker every second; the page's drawing is the browser's
     and not here.

2. ``GET /api/state`` wall time (``requests`` in a row, loopback) on an idle broker with ``topics`` topics of
   ``partitions`` partitions each, 1,000 messages in each topic.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from metaq.bench.client_bench import BenchSpec, run_bench
from metaq.bench.report import BenchError, Report, markdown_table, median, require_known
from metaq.broker.launcher import BrokerLauncher
from metaq.client import connect

CASES = ("no-port", "scraped", "page-open")


class Poller(threading.Thread):
    """GET each of ``paths`` (relative to ``base``) every ``interval_s`` seconds until stopped."""

    def __init__(self, base: str, paths: list[str], interval_s: float) -> None:
        super().__init__(daemon=True)
        self.base, self.paths, self.interval_s = base, paths, interval_s
        self.times_s: list[float] = []
        self.body_bytes = 0
        self.errors = 0
        self.stop = threading.Event()
        self.started = threading.Event()
        """Set once the first round of GETs has ended (the measured run starts after it)."""

    def run(self) -> None:
        """The first GET at once (a page that is open has loaded; a scraper scrapes when it starts), then one
        every ``interval_s``."""
        while True:
            self._get_all()
            self.started.set()
            if self.stop.wait(self.interval_s):
                return

    def _get_all(self) -> None:
        started = time.perf_counter()
        size = 0
        try:
            for path in self.paths:
                with urllib.request.urlopen(self.base + path, timeout=30) as reply:
                    size += len(reply.read())
        except OSError:
            self.errors += 1
            return
        self.body_bytes = size
        self.times_s.append(time.perf_counter() - started)


def _base_url(broker: BrokerLauncher) -> str:
    if broker.metrics_url is None:
        raise BenchError("the broker did not say where its dashboard listens")
    return broker.metrics_url.removesuffix("/metrics")


def produce_case(case: str, n: int, count: int, duration_s: float, scrape_interval_s: float,
                 work: Path) -> dict[str, Any]:
    options: dict[str, Any] = {"numPartitions": 4, "unflushThreshold": 0}
    if case != "no-port":
        options["dashboardHttpPort"] = 0
    poller = None
    with BrokerLauncher(work / f"{case}-{n}", options) as broker:
        if case == "scraped":
            poller = Poller(_base_url(broker), ["/metrics"], scrape_interval_s)
        elif case == "page-open":
            poller = Poller(_base_url(broker), ["/api/state", "/api/history?since=0"], 1.0)
        if poller is not None:
            poller.start()
            poller.started.wait(60)
        try:
            result = run_bench(BenchSpec(mode="produce", servers=broker.servers, count=count, duration_s=duration_s))
        finally:
            if poller is not None:
                poller.stop.set()
                poller.join(30)
    out: dict[str, Any] = {"case": case, "round": n, "msgs_per_s": result.msgs_per_s, "messages": result.messages,
                           "broker_cpu_us_per_msg": result.cpu_us_per_msg.get("broker")}
    if poller is not None:
        out.update(requests=len(poller.times_s), request_ms_mean=round(1000 * statistics.mean(poller.times_s), 2)
                   if poller.times_s else None, response_bytes=poller.body_bytes, request_errors=poller.errors)
    return out


def state_timing(topics: int, partitions: int, requests: int, work: Path) -> dict[str, Any]:
    with BrokerLauncher(work / "many", {"numPartitions": partitions, "dashboardHttpPort": 0}) as broker:
        with connect(broker.servers) as session:
            for t in range(topics):
                session.admin().create_topic(f"t{t}", partitions)
                if not session.create_producer().send_batch(f"t{t}", [b"x" * 100] * 1000).success:
                    raise BenchError(f"filling topic t{t} failed")
        base = _base_url(broker)
        times: list[float] = []
        size = 0
        for _ in range(requests):
            started = time.perf_counter()
            with urllib.request.urlopen(base + "/api/state", timeout=60) as reply:
                size = len(reply.read())
            times.append(time.perf_counter() - started)
    return {"partitions": topics * partitions, "median_ms": round(1000 * statistics.median(times), 1),
            "max_ms": round(1000 * max(times), 1), "bytes": size}


def run(rounds: int, count: int, duration_s: float, scrape_interval_s: float, cases: list[str], topics: int,
        partitions: int, requests: int, report: Report, work_dir: str | None = None) -> dict[str, Any]:
    require_known("cases", cases, CASES)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="metaq-bench-dashboard-", dir=work_dir) as tmp:
        for n in range(1, rounds + 1):
            shift = (n - 1) % len(cases)
            for case in cases[shift:] + cases[:shift]:
                r = produce_case(case, n, count, duration_s, scrape_interval_s, Path(tmp))
                runs.append(r)
                extra = (f"; {r['requests']} polls, {r['request_ms_mean']} ms each, {r['response_bytes']:,} B"
                         if "requests" in r else "")
                report(f"round {n}, {case}: {r['msgs_per_s']:,.0f} msg/s{extra}")
        timing = state_timing(topics, partitions, requests, Path(tmp)) if requests else {}
        if timing:
            report(f"/api/state with {timing['partitions']:,} partitions: median {timing['median_ms']} ms, max "
                   f"{timing['max_ms']} ms, {timing['bytes']:,} B")
    return {"cases": cases, "scrape_interval_s": scrape_interval_s, "runs": runs, "api_state": timing}


def table(result: dict[str, Any]) -> str:
    rows = []
    for case in result["cases"]:
        got = [r for r in result["runs"] if r["case"] == case]
        rates = [r["msgs_per_s"] for r in got]
        polls = "; ".join(f"{r['requests']} x {r['request_ms_mean']} ms" for r in got if "requests" in r)
        rows.append([case, " · ".join(f"{x / 1000:,.0f}k" for x in rates), f"{median(rates) / 1000:,.0f}k", polls])
    text = markdown_table(["case", "produce msg/s, each round", "median", "HTTP requests during the run"], rows,
                          right=[2])
    timing = result["api_state"]
    if timing:
        text += (f"\n\n`GET /api/state` with {timing['partitions']:,} partitions: median {timing['median_ms']} ms, "
                 f"max {timing['max_ms']} ms, {timing['bytes']:,} bytes")
    return text
