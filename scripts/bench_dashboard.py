"""What the web dashboard costs the broker, and how long its JSON takes for many partitions.

1. Produce throughput, `metaq bench produce` against a fresh broker per run (group commit, 4 partitions),
   alternating two cases in a rotating order:

   - ``no-port``: no ``dashboardHttpPort``;
   - ``page-open``: ``--dashboardHttpPort 0`` (so the history samples every second) with the dashboard
     open in headless Chromium on the Overview view, polling ``/api/state`` and ``/api/history``
     every second, as an operator's browser does.

2. ``GET /api/state`` wall time (urllib on loopback, ``--requests`` in a row, median and max) on an idle
   broker with ``--topics`` topics of ``--partitions`` partitions each.

    .venv/bin/python scripts/bench_dashboard.py --rounds 3 -n 4000000 -d 15 --topics 5 --partitions 250

Prints one JSON line per run and a markdown summary (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from metaq.broker.launcher import BrokerLauncher
from metaq.client import connect
from metaq.testing.browser import dashboard_url, headless_chromium

METAQ = str(Path(sys.executable).with_name("metaq"))


def produce_run(case: str, args: argparse.Namespace, workdir: Path, n: int) -> dict[str, Any]:
    options: dict[str, Any] = {"numPartitions": 4, "unflushThreshold": 0}
    if case == "page-open":
        options["dashboardHttpPort"] = 0
    broker = BrokerLauncher(workdir / f"{case}-{n}", options)
    broker.start()
    try:
        with ExitStack() as stack:
            if case == "page-open":
                driver = stack.enter_context(headless_chromium())
                driver.get(dashboard_url(broker) + "/#overview")  # type: ignore[arg-type]
            done = subprocess.run([METAQ, "bench", "produce", "-s", broker.servers, "--json", "--no-progress",
                                   "-n", str(args.count), "-d", str(args.duration)],
                                  capture_output=True, text=True, timeout=args.duration + 300)
            if done.returncode != 0:
                raise SystemExit(f"bench failed ({case}): {done.stderr}")
            result: dict[str, Any] = json.loads(done.stdout)
    finally:
        broker.stop()
    return {"case": case, "round": n, "msgs_per_s": result.get("msgs_per_s") or result.get("messages_per_s")}


def state_timing(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    broker = BrokerLauncher(workdir / "many", {"numPartitions": args.partitions, "dashboardHttpPort": 0})
    broker.start()
    try:
        with connect(broker.servers) as session:
            for t in range(args.topics):
                session.admin().create_topic(f"t{t}", args.partitions)
                assert session.create_producer().send_batch(f"t{t}", [b"x" * 100] * 1000).success
        base = dashboard_url(broker)  # type: ignore[arg-type]
        times, size = [], 0
        for _ in range(args.requests):
            started = time.perf_counter()
            with urllib.request.urlopen(base + "/api/state", timeout=60) as reply:
                size = len(reply.read())
            times.append(time.perf_counter() - started)
    finally:
        broker.stop()
    return {"partitions": args.topics * args.partitions, "median_ms": round(1000 * statistics.median(times), 1),
            "max_ms": round(1000 * max(times), 1), "bytes": size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-n", "--count", type=int, default=4_000_000)
    parser.add_argument("-d", "--duration", type=float, default=15.0)
    parser.add_argument("--topics", type=int, default=5)
    parser.add_argument("--partitions", type=int, default=250)
    parser.add_argument("--requests", type=int, default=20)
    args = parser.parse_args()
    cases = ["no-port", "page-open"]
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="metaq-bench-dash-") as tmp:
        for n in range(args.rounds):
            for case in cases[n % 2:] + cases[:n % 2]:
                runs.append(produce_run(case, args, Path(tmp), n))
                print(json.dumps(runs[-1]), flush=True)
        timing = state_timing(args, Path(tmp))
        print(json.dumps(timing), flush=True)
    print("\n| case | produce msg/s (each round) | median |\n|---|---|---|")
    for case in cases:
        rates = [r["msgs_per_s"] for r in runs if r["case"] == case]
        print(f"| {case} | {', '.join(f'{r / 1000:,.0f}k' for r in rates)} | {statistics.median(rates) / 1000:,.0f}k |")
    print(f"\n/api/state with {timing['partitions']} partitions: median {timing['median_ms']} ms, "
          f"max {timing['max_ms']} ms, {timing['bytes']} bytes")


if __name__ == "__main__":
    main()
