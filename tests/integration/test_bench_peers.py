"""scripts/bench_peers.py: metaq's end-to-end latency beside Redis Streams and NATS JetStream, run for real here
(Debian's redis-server and nats-server, installed by scripts/system-deps.sh), and beside a bare Python relay (the
floor under a Python broker), under the same offered load."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench_peers.py"


@pytest.mark.slow
def test_every_system_delivers_every_message_it_was_offered_under_both_pacings(tmp_path: Path) -> None:
    out = tmp_path / "peers.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--systems", "metaq-1,redis-4,redis-always,nats,relay",
                           "--pacing", "tick,even", "--rounds", "1", "--rate", "1000", "-d", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    runs = json.loads(out.read_text())["runs"]
    assert sorted((r["system"], r["pacing"]) for r in runs) == sorted(
        (s, p) for s in ("metaq-1", "redis-4", "redis-always", "nats", "relay") for p in ("tick", "even"))
    for r in runs:
        # each message is counted once, when it arrives: all of them, and each with its own positive latency
        assert r["messages"] == r["sent"] == 1000, r
        assert 0 < r["latency_ms"]["p50"] <= r["latency_ms"]["p99"] <= r["latency_ms"]["max"], r
        if r["system"] != "metaq-1":
            assert r["acked"] == 1000, r  # every send acknowledged by the peer before its producer stopped
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "system" not in line]
    assert len(rows) == 10 and all(" / " in row for row in rows)
    assert "loopback round trip p50" in done.stdout


def test_an_unknown_system_is_refused_with_the_known_ones() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--systems", "kafka"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert "unknown systems ['kafka']; known: metaq, metaq-sticky, metaq-1, metaq-sync, redis, redis-4" in done.stderr
