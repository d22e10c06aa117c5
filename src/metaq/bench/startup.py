"""`metaq bench startup`: how long a `metaq` command takes to start, whole processes timed as a shell starts them.

Each case is a fresh ``python -m metaq.cli.main ...`` process: ``--version``, ``--help``, ``produce --help``,
``broker --help``, ``produce`` of one line to its end (connect, metadata, one acknowledged send, close) and
``consume -n 1`` of it, against a broker the bench starts. Per case: the median and the best wall time of ``runs``
runs (the best is what the code costs, the median what a busy machine adds), and the CPU time the process used
(user + system, which a busy machine inflates less). With ``baseline`` (another checkout's ``src`` directory, its
compiled modules built) the same cases run with that code first on ``PYTHONPATH``, alternating run by run, so that
both meet the machine in the same minutes.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import metaq
from metaq.bench.report import BenchError, Report, markdown_table
from metaq.broker.launcher import BrokerLauncher

THIS_SRC = Path(metaq.__file__).resolve().parent.parent
"""The ``src`` directory of the metaq this bench runs from."""


def _run_once(src: Path, args: list[str], stdin: str | None) -> tuple[float, float]:
    """(wall s, CPU s) of one `metaq ARGS` process."""
    env = {**os.environ, "PYTHONPATH": str(src), "METAQ_SERVERS": os.environ.get("METAQ_SERVERS", "")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "metaq.cli.main", *args], input=stdin, capture_output=True,
                          text=True, env=env, timeout=120)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise BenchError(f"metaq {' '.join(args)} failed ({done.returncode}) with {src}: {done.stderr.strip()}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def run(runs: int, baseline: str | None, report: Report, work_dir: str | None = None) -> dict[str, Any]:
    sources = {"this": THIS_SRC}
    if baseline is not None:
        base = Path(baseline).resolve()
        if not (base / "metaq" / "__init__.py").is_file():
            raise BenchError(f"--baseline {baseline}: not a src directory (no metaq/__init__.py in it)")
        sources["baseline"] = base
    with tempfile.TemporaryDirectory(prefix="metaq-bench-startup-", dir=work_dir) as tmp, \
            BrokerLauncher(Path(tmp) / "broker", {"numPartitions": 1}) as broker:
        cases: list[tuple[str, list[str], str | None]] = [
            ("metaq --version", ["--version"], None),
            ("metaq --help", ["--help"], None),
            ("metaq produce --help", ["produce", "--help"], None),
            ("metaq broker --help", ["broker", "--help"], None),
            ("echo x | metaq produce t (one send, to its end)", ["produce", "t", "-s", broker.servers], "x\n"),
            ("metaq consume t -n 1 (to its end)", ["consume", "t", "-n", "1", "-s", broker.servers], None),
        ]
        times: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for n in range(1, runs + 1):
            for label, args, stdin in cases:
                for name, src in sources.items():
                    times.setdefault((label, name), []).append(_run_once(src, args, stdin))
            version = ", ".join(f"{name} {times[(cases[0][0], name)][-1][0] * 1000:.0f} ms" for name in sources)
            report(f"run {n} of {runs}: metaq --version {version}")
    rows = []
    for label, _, _ in cases:
        for name in sources:
            walls = [w * 1000 for w, _ in times[(label, name)]]
            cpus = [c * 1000 for _, c in times[(label, name)]]
            rows.append({"command": label, "code": name, "wall_ms": [round(w, 1) for w in walls],
                         "cpu_ms": [round(c, 1) for c in cpus], "wall_median_ms": round(statistics.median(walls), 1),
                         "wall_best_ms": round(min(walls), 1), "cpu_median_ms": round(statistics.median(cpus), 1)})
    return {"runs": runs, "sources": {name: str(src) for name, src in sources.items()}, "cases": rows}


def table(result: dict[str, Any]) -> str:
    return markdown_table(["command", "code", "wall median", "wall best", "CPU median"], [
        [f"`{row['command']}`", row["code"], f"{row['wall_median_ms']:.0f} ms", f"{row['wall_best_ms']:.0f} ms",
         f"{row['cpu_median_ms']:.0f} ms"] for row in result["cases"]], right=[2, 3, 4])
