"""How long a `metaq` command takes to start: wall and CPU time of whole runs, against the code before a change.

Each case is a fresh `python -m metaq.cli.main ...` process, as a user's shell starts one; the figures are the
median and the best of --runs runs (the best is what the code costs, the median what a busy machine adds),
and the CPU time the process used (user + system, which a busy machine inflates less than the wall time).
With --baseline SRC the same cases run with that ``src`` directory first on PYTHONPATH (the code before a
change: ``git worktree add /tmp/base main``, with its compiled modules built), alternating run by run, so both
see the same machine.

    .venv/bin/python scripts/bench_cli_startup.py --runs 15 --baseline /tmp/base/src

The produce and consume cases run against a broker this script starts (on a free port; stopped at the end):
`produce` sends one line and exits (connect, metadata, one acknowledged send, close); `consume -n 1` reads it.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1] / "src"


def run_once(src: Path, args: list[str], stdin: str | None) -> tuple[float, float]:
    """(wall s, CPU s) of one `metaq ARGS` process."""
    env = {**os.environ, "PYTHONPATH": str(src), "METAQ_SERVERS": os.environ.get("METAQ_SERVERS", "")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "metaq.cli.main", *args], input=stdin, capture_output=True,
                          text=True, env=env, timeout=120)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"metaq {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--baseline", type=Path, default=None, help="src directory of the code to compare with")
    opts = parser.parse_args()
    sources = {"this": HERE} | ({"baseline": opts.baseline.resolve()} if opts.baseline else {})

    from metaq.testing import BrokerProcess  # the harness: a real broker process on a free port

    with tempfile.TemporaryDirectory() as tmp, BrokerProcess(Path(tmp), {"numPartitions": 1}) as broker:
        cases: list[tuple[str, list[str], str | None]] = [
            ("metaq --version", ["--version"], None),
            ("metaq --help", ["--help"], None),
            ("metaq produce --help", ["produce", "--help"], None),
            ("metaq broker --help", ["broker", "--help"], None),
            ("echo x | metaq produce t (one send, to its end)", ["produce", "t", "-s", broker.servers], "x\n"),
            ("metaq consume t -n 1 (to its end)", ["consume", "t", "-n", "1", "-s", broker.servers], None),
        ]
        results: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for _ in range(opts.runs):
            for label, args, stdin in cases:
                for name, src in sources.items():
                    results.setdefault((label, name), []).append(run_once(src, args, stdin))
    print(f"{opts.runs} runs each, alternating; load average before the end: {os.getloadavg()[0]:.1f}")
    print("| command | code | wall median | wall best | CPU median |")
    print("|---|---|---:|---:|---:|")
    for label, _, _ in cases:
        for name in sources:
            walls = [w for w, _ in results[(label, name)]]
            cpus = [c for _, c in results[(label, name)]]
            print(f"| `{label}` | {name} | {statistics.median(walls) * 1000:.0f} ms | {min(walls) * 1000:.0f} ms "
                  f"| {statistics.median(cpus) * 1000:.0f} ms |")


if __name__ == "__main__":
    main()
