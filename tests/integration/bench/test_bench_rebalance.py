"""`metaq bench rebalance`: a local cluster of its own, both kinds of group, figures for every change."""

from __future__ import annotations

import json

import pytest
from cli_process import metaq


@pytest.mark.slow
def test_bench_rebalance_measures_both_groups_on_a_cluster_of_its_own() -> None:
    done = metaq("bench", "rebalance", "--brokers", "2", "--partitions", "2", "--members", "2", "--rounds", "1",
                 "--no-brokers-churn", "--json", timeout_s=240)
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)["runs"]
    assert [r["coordination"] for r in results] == ["zookeeper", "broker"]
    for r in results:
        assert r["partitions"] == 4 and r["members"] == 2
        for change in ("member_join", "member_leave"):
            assert r[change]["timeouts"] == 0 and 0 < r[change]["median_ms"] < 60_000
