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


def test_peers_run_once_a_round_beside_the_e2e_goals_they_set(tmp_path: Path) -> None:
    out = tmp_path / "goals.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_goals.py"), "--rounds", "2",
                           "--only", "e2e_rr,e2e_sync", "--scale", "0.125", "--peers", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    peers = json.loads(out.read_text())["peers"]
    assert sorted(peers) == ["e2e_rr", "e2e_sync"]
    for goal, system in (("e2e_rr", "redis-4"), ("e2e_sync", "redis-always")):
        # the goal's own load (5,000 msg/s for its scaled duration), every message delivered, one run a round
        assert [(r["system"], r["messages"], r["sent"]) for r in peers[goal]] == [(system, 5000, 5000)] * 2
    rows = {line.split("|")[1].strip(): line for line in done.stdout.splitlines() if line.startswith("| ")}
    assert "redis-4: " in rows["e2e_rr"] and rows["e2e_rr"].count(" / ") == 4  # 2 runs of metaq, 2 of the peer
    assert "redis-always: " in rows["e2e_sync"]
    assert "the same shape's peer" in rows["goal"]
