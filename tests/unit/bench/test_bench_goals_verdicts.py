"""`metaq bench goals` without running a bench: the command offers exactly the goals the bench knows, counts and
durations scale, a goal is met, missed or met in k of n of the runs that finished, and a run that failed makes the
command fail."""

from __future__ import annotations

from metaq.bench import goals
from metaq.cli import bench_client_cmds


def test_the_command_offers_the_goals_the_bench_knows() -> None:
    assert tuple(goals.GOALS_BY_NAME) == bench_client_cmds._GOALS


def test_scale_multiplies_counts_and_durations_only() -> None:
    assert goals.scaled(["produce", "--count", "3000000", "--api", "batch"], 0.01) == [
        "produce", "--count", "30000", "--api", "batch"]
    assert goals.scaled(["e2e", "--rate", "5000", "-d", "8"], 0.125) == ["e2e", "--rate", "5000", "-d", "1.0"]
    assert goals.scaled(["produce", "--count", "10"], 0.001) == ["produce", "--count", "1"]  # never below one


def test_a_verdict_counts_the_runs_that_finished() -> None:
    send_async = goals.GOALS_BY_NAME["send_async"]
    fast, slow, broken = {"msgs_per_s": 600_000}, {"msgs_per_s": 400_000}, {"error": "exit 1"}
    assert goals.verdict(send_async, [fast, fast, broken]) == "met"
    assert goals.verdict(send_async, [slow, broken]) == "missed"
    assert goals.verdict(send_async, [fast, slow, slow]) == "met in 1 of 3"
    assert goals.verdict(goals.GOALS_BY_NAME["batch"], [fast]) == ""  # a baseline has nothing to meet


def test_the_table_has_a_row_per_goal_and_a_failed_run_fails_the_command() -> None:
    runs = {"this tree": {"batch": [{"msgs_per_s": 2_000_000}], "send_async": [{"msgs_per_s": 600_000}]}}
    result = {"goals": ["batch", "send_async"], "trees": ["this tree"], "commands": ["metaq bench produce"],
              "runs": runs, "peers": {}}
    rows = [line.split("|")[1].strip() for line in goals.table(result).splitlines() if line.startswith("| ")]
    assert rows == ["goal", "batch", "send_async"]
    assert "30% of batch" in goals.table(result)  # send_async beside the batch API of the same round
    assert not goals.failed(result)
    runs["this tree"]["send_async"].append({"error": "timed out after 900s"})
    assert goals.failed(result)
