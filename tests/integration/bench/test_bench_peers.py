"""`metaq bench peers`: metaq's end-to-end latency beside Redis Streams and NATS JetStream, run for real here
(Debian's redis-server and nats-server, installed by scripts/system-deps.sh), and beside a bare Python relay (the
floor under a Python broker), under the same offered load."""

from __future__ import annotations

import json

import pytest
from cli_process import metaq


@pytest.mark.slow
def test_every_system_delivers_every_message_it_was_offered_under_both_pacings() -> None:
    done = metaq("bench", "peers", "--systems", "metaq-1,redis-4,redis-always,nats,relay", "--pacing", "tick,even",
                 "--rounds", "1", "--rate", "1000", "-d", "1", "--json", timeout_s=600)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    runs = doc["runs"]
    assert sorted((r["system"], r["pacing"]) for r in runs) == sorted(
        (s, p) for s in ("metaq-1", "redis-4", "redis-always", "nats", "relay") for p in ("tick", "even"))
    for r in runs:
        # each message is counted once, when it arrives: all of them, and each with its own positive latency
        assert r["messages"] == r["sent"] == 1000, r
        assert 0 < r["latency_ms"]["p50"] <= r["latency_ms"]["p99"] <= r["latency_ms"]["max"], r
        if r["system"] != "metaq-1":
            assert r["acked"] == 1000, r  # every send acknowledged by the peer before its producer stopped
    assert len(doc["loopback_rtt_p50_ms"]) == 1 and doc["loopback_rtt_p50_ms"][0] > 0  # the same-run baseline


def test_an_unknown_system_is_refused_with_the_known_ones() -> None:
    done = metaq("bench", "peers", "--systems", "kafka")
    assert done.returncode == 2  # a usage error, before anything starts
    assert "unknown kafka; choose from metaq, metaq-sticky, metaq-1, metaq-sync, redis, redis-4" in done.stderr
