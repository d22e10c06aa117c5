"""What Prometheus metrics cost the broker: `metaq bench produce` against a broker without and with
``dashboardHttpPort`` (scraped every ``--scrape-interval`` seconds meanwhile), same run, alternating.

Cases, each a fresh broker process (group commit, 4 partitions, uvloop) measured by the real
``metaq bench produce -s``:

- ``no-port``: this tree, no dashboardHttpPort (the counters and the three histograms are kept anyway);
- ``scraped``: this tree with ``--dashboardHttpPort 0``, ``GET /metrics`` every scrape interval;
- ``base`` (with ``--base-src DIR``): another tree's ``src`` (the commit before the metrics), for the
  cost of the per-batch histogram observations themselves.

    .venv/bin/python scripts/bench_metrics.py --rounds 3 -n 2000000 --base-src /work/main/src

Each round runs every case once, in a rotating order (who goes first takes its turn). Prints one
JSON line per run, then a markdown table (docs/benchmarks.md). The scrape time reported is
the mean wall time of a scrape, measured by the scraper (HTTP on loopback included).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from metaq.broker.launcher import BrokerLauncher

METAQ = str(Path(sys.executable).with_name("metaq"))
METRICS_LINE = re.compile(r"metaq broker metrics (http://\S+)")


class Scraper(threading.Thread):
    def __init__(self, url: str, interval_s: float) -> None:
        super().__init__(daemon=True)
        self.url, self.interval_s = url, interval_s
        self.times_s: list[float] = []
        self.body_bytes = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.interval_s):
            started = time.perf_counter()
            with urllib.request.urlopen(self.url, timeout=30) as reply:
                self.body_bytes = len(reply.read())
            self.times_s.append(time.perf_counter() - started)


def run_case(case: str, args: argparse.Namespace, workdir: Path, n: int) -> dict[str, Any]:
    options: dict[str, Any] = {"numPartitions": 4, "unflushThreshold": 0}
    env = dict(os.environ)
    if case == "scraped":
        options["dashboardHttpPort"] = 0
    if case == "base":
        env["PYTHONPATH"] = args.base_src
    broker = BrokerLauncher(workdir / f"{case}-{n}", options, env=env)
    broker.start()
    scraper = None
    try:
        if case == "scraped":
            urls = [m.group(1) for m in map(METRICS_LINE.search, broker.log_lines) if m]
            scraper = Scraper(urls[-1], args.scrape_interval)
            scraper.start()
        done = subprocess.run([METAQ, "bench", "produce", "-s", broker.servers, "--json", "--no-progress",
                               "-n", str(args.count), "-d", str(args.duration)],
                              capture_output=True, text=True, timeout=args.duration + 300)
        if done.returncode != 0:
            raise SystemExit(f"bench failed ({case}): {done.stderr}")
        result: dict[str, Any] = json.loads(done.stdout)
    finally:
        if scraper is not None:
            scraper.stop.set()
            scraper.join(30)
        broker.stop()
    out = {"case": case, "round": n, "msgs_per_s": result.get("msgs_per_s") or result.get("messages_per_s"),
           "bench": result}
    if scraper is not None:
        out["scrapes"] = len(scraper.times_s)
        out["scrape_ms_mean"] = round(1000 * statistics.mean(scraper.times_s), 2) if scraper.times_s else None
        out["scrape_bytes"] = scraper.body_bytes
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-n", "--count", type=int, default=2_000_000)
    parser.add_argument("-d", "--duration", type=float, default=20.0)
    parser.add_argument("--scrape-interval", type=float, default=1.0)
    parser.add_argument("--base-src", default=None, help="src directory of the tree to compare with")
    args = parser.parse_args()
    cases = (["base"] if args.base_src else []) + ["no-port", "scraped"]
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as tmp:
        for n in range(1, args.rounds + 1):
            shift = (n - 1) % len(cases)  # each case takes its turn at going first
            for case in cases[shift:] + cases[:shift]:
                r = run_case(case, args, Path(tmp), n)
                print(json.dumps({k: v for k, v in r.items() if k != "bench"}), flush=True)
                results.append(r)
    print("\n| case | produce msg/s (each round) | scrape |")
    print("|---|---|---|")
    for case in cases:
        rows = [r for r in results if r["case"] == case]
        rates = ", ".join(f"{r['msgs_per_s'] / 1000:,.0f}k" for r in rows if r["msgs_per_s"])
        scrape = ""
        if case == "scraped":
            scrape = "; ".join(f"{r['scrapes']} scrapes, {r['scrape_ms_mean']} ms, {r['scrape_bytes']} B"
                               for r in rows)
        print(f"| {case} | {rates} | {scrape} |")


if __name__ == "__main__":
    main()
