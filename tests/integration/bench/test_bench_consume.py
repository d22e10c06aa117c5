"""`metaq bench consume --api fetch|iterate|columns`: every API reads back every preloaded message once."""

from __future__ import annotations

import json

from cli_process import metaq

from metaq.testing.broker import BrokerProcess


def test_bench_consume_reads_everything_through_each_api(broker: BrokerProcess) -> None:
    counts = {}
    for api in ("fetch", "iterate", "columns"):
        done = metaq("bench", "consume", "-s", broker.servers, "-n", "3000", "--size", "40", "--partitions", "2",
                     "--api", api, "--json")
        assert done.returncode == 0, done.stderr
        doc = json.loads(done.stdout)
        assert doc["api"] == api and doc["failures"] == 0
        assert doc["messages"] >= 3000 and doc["bytes"] == 40 * doc["messages"]
        assert doc["client_msgs_per_cpu_s"] > 0
        counts[api] = doc["messages"]
    assert len(set(counts.values())) == 1, counts
