"""scripts/bench_goals.py: issue 13's goals measured beside their same-run baselines, this tree against a commit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_goals_are_measured_per_round_and_tree_beside_the_batch_api(tmp_path: Path) -> None:
    out = tmp_path / "goals.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_goals.py"), "--rounds", "2",
                           "--only", "batch,send_async", "--scale", "0.02", "--against", "HEAD",
                           "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    runs = json.loads(out.read_text())["runs"]
    assert set(runs) == {"this tree", "HEAD"}
    for per_goal in runs.values():
        assert [len(per_goal[g]) for g in ("batch", "send_async")] == [2, 2]
        assert all(r["msgs_per_s"] > 0 and r["failures"] == 0 and r["messages"] == 20_000
                   for r in per_goal["send_async"])
    # the table: one row a goal, each run with its share of the same round's batch API, and a verdict
    rows = {line.split("|")[1].strip(): line for line in done.stdout.splitlines() if line.startswith("| ")}
    assert rows["send_async"].count("% of batch") == 4
    assert "≥ 500k msg/s" in rows["send_async"] and ("met" in rows["send_async"] or "missed" in rows["send_async"])
    assert "[HEAD]" in done.stderr and "round 2 send_async [this tree]" in done.stderr


def test_an_unknown_goal_is_refused_with_the_known_ones() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_goals.py"), "--only", "send_sync"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "unknown goal(s) send_sync; known: batch, send_async" in done.stderr
