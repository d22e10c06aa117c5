"""`metaq bench cluster-refresh`: a local cluster, one broker leaving and joining under round-robin sends."""

from __future__ import annotations

import json

import pytest
from cli_process import metaq


@pytest.mark.slow
def test_cluster_refresh_times_a_broker_leaving_and_joining() -> None:
    done = metaq("bench", "cluster-refresh", "--brokers", "2", "--rounds", "2", "--json", timeout_s=180)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["brokers"] == 2 and len(result["rounds"]) == 2
    for row in result["rounds"]:
        assert row["leave_failures"] == 0
        assert 0 <= row["join_watch_ms"] < 10_000 and 0 <= row["join_metadata_ms"] <= row["join_used_ms"] < 10_000
        assert 0 <= row["leave_watch_ms"] < 10_000 and 0 <= row["leave_metadata_ms"] < 10_000
