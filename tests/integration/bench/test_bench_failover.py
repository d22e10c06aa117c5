"""`metaq bench failover`: a local HA replica group under load, each fault kind once, every ack checked."""

from __future__ import annotations

import json

import pytest
from cli_process import metaq


@pytest.mark.slow
def test_bench_failover_runs_every_fault_and_checks_the_history() -> None:
    done = metaq("bench", "failover", "--rounds", "1", "--zk-down", "2", "--json", timeout_s=600)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["settings"]["zk.zkSessionTimeoutMs"] == 30_000  # MetaQ's default unless told otherwise
    assert set(result["faults"]) == {"master-kill", "master-stop", "slave-kill", "zookeeper-kill", "promote"}
    for kind, fault in result["faults"].items():
        (row,) = fault["rounds"]
        assert row["window_s"] >= 0 and fault["window_max_s"] == row["window_s"], kind
        if kind == "zookeeper-kill":
            assert row["takeover_s"] is None and row["failovers"] == 0  # nobody fails over for ZooKeeper
        else:
            assert row["takeover_s"] is not None and row["takeover_s"] < 30, kind  # never the session timeout
    history = result["history"]
    assert history["problems"] == [] and history["acked"] > 0


def test_bench_failover_names_an_unknown_fault() -> None:
    done = metaq("bench", "failover", "--faults", "master-kill,meteor")
    assert done.returncode == 2 and "unknown fault kind(s) meteor" in done.stderr
