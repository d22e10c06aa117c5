"""`metaq bench kafka`: confluent-kafka on the Kafka listener beside metaq's clients, every message sent and read."""

from __future__ import annotations

import json

import pytest
from cli_process import metaq

pytest.importorskip("confluent_kafka")


def test_bench_kafka_runs_every_step_with_every_message() -> None:
    done = metaq("bench", "kafka", "-n", "3000", "--rounds", "1", "--json", timeout_s=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    [rnd] = result["rounds"]
    counts = rnd["messages"]
    assert counts["kafka-produce"] == counts["kafka-consume"] == counts["native-produce"] == 3000
    assert counts["native-consume"] >= 3000  # metaq bench consume reads its preloaded topic to its end
    assert all(rnd[k] > 0 for k in ("native_produce", "kafka_produce", "native_consume", "kafka_consume"))
    assert set(rnd["broker_cpu_us"]) == set(rnd["messages"]) and result["client_produce_ceiling"] > 0
