"""scripts/bench_goals.py: issue 13's goals measured beside their same-run baselines, this tree against a commit.

What is checked is what the script does (every goal run once per tree per round, each run's result kept
whole in the JSON with sane figures, a table row per goal, refused goals), not how the table is worded: the
figures themselves are the benchmark's business (docs/benchmarks.md), never asserted here.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench_goals.py"


def table_rows(stdout: str) -> set[str]:
    """The first cell of each row of the Markdown table the script prints."""
    return {line.split("|")[1].strip() for line in stdout.splitlines() if line.startswith("| ")}


def assert_rate_run(result: dict[str, Any], messages: int) -> None:
    assert "error" not in result, result
    assert result["messages"] == messages and result["failures"] == 0, result
    assert math.isfinite(result["msgs_per_s"]) and result["msgs_per_s"] > 0, result


@pytest.mark.slow  # two rounds of two benchmarks in two trees, one of them exported and built: minutes
def test_each_goal_runs_once_per_round_and_tree_and_its_results_are_kept(tmp_path: Path) -> None:
    out = tmp_path / "goals.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--rounds", "2", "--only", "batch,send_async",
                           "--scale", "0.02", "--against", "HEAD", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert doc["started"] and doc["ended"] and doc["peers"] == {}
    assert set(doc["runs"]) == {"this tree", "HEAD"}
    for per_goal in doc["runs"].values():
        assert set(per_goal) == {"batch", "send_async"}
        for goal, messages in (("batch", 60_000), ("send_async", 20_000)):  # the counts scaled by 0.02
            assert len(per_goal[goal]) == 2
            for result in per_goal[goal]:
                assert_rate_run(result, messages)
    assert {"batch", "send_async"} <= table_rows(done.stdout)


def test_an_unknown_goal_is_refused_naming_the_known_ones() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--only", "send_sync"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2  # a usage error, before anything runs
    assert "send_sync" in done.stderr
    assert all(goal in done.stderr for goal in ("batch", "send_async", "e2e_rr", "e2e_sync"))


@pytest.mark.slow  # two rounds of two end-to-end benchmarks and their peers: minutes
def test_peers_run_once_a_round_beside_the_e2e_goals_under_their_load(tmp_path: Path) -> None:
    out = tmp_path / "goals.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--rounds", "2", "--only", "e2e_rr,e2e_sync",
                           "--scale", "0.125", "--peers", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert sorted(doc["peers"]) == ["e2e_rr", "e2e_sync"]
    for goal, system in (("e2e_rr", "redis-4"), ("e2e_sync", "redis-always")):
        # the goal's own load (5,000 msg/s for its scaled duration), every message delivered, one run a round
        assert [(r["system"], r["messages"], r["sent"]) for r in doc["peers"][goal]] == [(system, 5000, 5000)] * 2
        for result in [*doc["peers"][goal], *doc["runs"]["this tree"][goal]]:
            latency = result["latency_ms"]
            assert 0 < latency["p50"] <= latency["p99"], result
        assert len(doc["runs"]["this tree"][goal]) == 2
    assert {"e2e_rr", "e2e_sync"} <= table_rows(done.stdout)
