"""`metaq group list|describe|reset` against a real broker."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from metaq.client import connect
from metaq.testing import BrokerProcess


def _metaq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metaq.cli.main", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "METAQ_SERVERS": ""})


def test_group_reset_then_list_and_describe_show_offsets_and_lag(broker: BrokerProcess) -> None:
    s = ["-s", broker.servers]
    with connect(broker.servers) as session:
        session.admin().create_topic("clicks", 2)
        producer = session.create_producer()
        assert producer.send_batch("clicks", [b"a"] * 10, partition=0).success
        assert producer.send_batch("clicks", [b"b"] * 4, partition=1).success

    dry = _metaq("group", "reset", "reporting", "clicks", "--to", "latest", "--dry-run", *s)
    assert dry.returncode == 0, dry.stderr
    assert "would reset 2 partitions" in dry.stderr
    assert _metaq("group", "list", *s).stdout.split() == []  # a dry run commits nothing

    reset = _metaq("group", "reset", "reporting", "clicks", "--to", "3", "-p", "0", *s)
    assert reset.returncode == 0, reset.stderr
    assert reset.stdout.splitlines() == ["clicks\t0-0\t-1 -> 3"]  # partitions are shown brokerId-partition
    assert _metaq("group", "list", *s).stdout.split() == ["reporting"]
    bad = _metaq("group", "reset", "reporting", "clicks", "-p", "0-", *s)
    assert bad.returncode == 2 and "'0-' is not brokerId-partition" in bad.stderr

    described = _metaq("group", "describe", "reporting", "--json", *s)
    assert described.returncode == 0, described.stderr
    doc = json.loads(described.stdout)
    p0 = next(p for p in doc["partitions"] if p["topic"] == "clicks" and p["partition"] == "0-0")
    assert (p0["committed"], p0["log_end"], p0["lag"]) == (3, 10, 7)
    assert _metaq("group", "reset", "reporting", "clicks", "--to", "soon", *s).returncode == 2
