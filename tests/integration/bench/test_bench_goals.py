"""`metaq bench goals` against another commit and beside its peers: every goal run once per tree per round (this
tree and a commit exported and built), each run's result kept whole in the JSON with sane figures, the peers of the
end-to-end goals run once a round under the goal's own load. What is checked is what the bench does, not how its
table is worded: the figures themselves are the benchmark's business (docs/benchmarks.md), never asserted here.
test_bench_commands.py runs it once on this tree alone and checks it refuses an unknown goal."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from cli_process import metaq


def goals_json(*args: str) -> dict[str, Any]:
    done = metaq("bench", "goals", *args, "--json", timeout_s=600)
    assert done.returncode == 0, done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def assert_rate_run(result: dict[str, Any], messages: int) -> None:
    assert "error" not in result, result
    assert result["messages"] == messages and result["failures"] == 0, result
    assert math.isfinite(result["msgs_per_s"]) and result["msgs_per_s"] > 0, result


@pytest.mark.slow  # two rounds of two benchmarks in two trees, one of them exported and built: minutes
def test_each_goal_runs_once_per_round_and_tree_and_its_results_are_kept() -> None:
    doc = goals_json("--rounds", "2", "--only", "batch,send_async", "--scale", "0.02", "--against", "HEAD")
    assert doc["peers"] == {} and doc["trees"] == ["this tree", "HEAD"]
    assert set(doc["runs"]) == {"this tree", "HEAD"}
    for per_goal in doc["runs"].values():
        assert set(per_goal) == {"batch", "send_async"}
        for goal, messages in (("batch", 60_000), ("send_async", 20_000)):  # the counts scaled by 0.02
            assert len(per_goal[goal]) == 2
            for result in per_goal[goal]:
                assert_rate_run(result, messages)


@pytest.mark.slow  # two rounds of two end-to-end benchmarks and their peers: minutes
def test_peers_run_once_a_round_beside_the_e2e_goals_under_their_load() -> None:
    doc = goals_json("--rounds", "2", "--only", "e2e_rr,e2e_sync", "--scale", "0.125", "--peers")
    assert sorted(doc["peers"]) == ["e2e_rr", "e2e_sync"]
    for goal, system in (("e2e_rr", "redis-4"), ("e2e_sync", "redis-always")):
        # the goal's own load (5,000 msg/s for its scaled duration), every message delivered, one run a round
        assert [(r["system"], r["messages"], r["sent"]) for r in doc["peers"][goal]] == [(system, 5000, 5000)] * 2
        for result in [*doc["peers"][goal], *doc["runs"]["this tree"][goal]]:
            latency = result["latency_ms"]
            assert 0 < latency["p50"] <= latency["p99"], result
        assert len(doc["runs"]["this tree"][goal]) == 2
