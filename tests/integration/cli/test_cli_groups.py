"""`metaq group list|describe|reset` against a real broker."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from cli_process import CliProcess, assert_quiet_interrupt, metaq

from metaq.client import connect
from metaq.testing import BrokerProcess
from metaq.testing.broker import wait_until


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


def _describe(servers: str, group: str) -> dict:  # type: ignore[type-arg]
    done = metaq("group", "describe", group, "--json", "-s", servers)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _members(servers: str, group: str) -> list[dict]:  # type: ignore[type-arg]
    """The group's members; none while it is not yet known to the broker (its first member still starting)."""
    done = metaq("group", "describe", group, "--json", "-s", servers)
    if done.returncode != 0 and "UNKNOWN_GROUP" in done.stderr:
        return []
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["members"]  # type: ignore[no-any-return]


def test_consume_group_prints_what_the_group_has_not_read_and_resumes_after_it(broker: BrokerProcess) -> None:
    s = ["-s", broker.servers]
    with connect(broker.servers) as session:
        session.admin().create_topic("carts", 2)
        producer = session.create_producer()
        assert producer.send_batch("carts", [b"a%d" % i for i in range(6)], partition=0).success
        assert producer.send_batch("carts", [b"b%d" % i for i in range(4)], partition=1).success

    first = metaq("consume", "carts", "--group", "shop", *s)
    assert first.returncode == 0, first.stderr
    assert sorted(first.stdout.split()) == sorted([f"a{i}" for i in range(6)] + [f"b{i}" for i in range(4)])
    assert {(p["partition"], p["committed"], p["lag"]) for p in _describe(broker.servers, "shop")["partitions"]} \
        == {("0-0", 6, 0), ("0-1", 4, 0)}
    again = metaq("consume", "carts", "--group", "shop", *s)
    assert (again.returncode, again.stdout) == (0, "")  # caught up: it ends without waiting for more

    with connect(broker.servers) as session:
        assert session.create_producer().send_batch("carts", [b"c0", b"c1"], partition=1).success
    assert metaq("consume", "carts", "--group", "shop", *s).stdout.split() == ["c0", "c1"]

    # --max: only what was printed is committed; the rest is the group's lag
    two = metaq("consume", "carts", "--group", "partial", "-n", "2", "--format", "json", *s)
    assert two.returncode == 0, two.stderr
    assert [json.loads(line)["payload"] for line in two.stdout.splitlines()] and len(two.stdout.splitlines()) == 2
    assert _describe(broker.servers, "partial")["total_lag"] == 12 - 2
    # a new group starts at the end with -o latest, at the beginning with --from-beginning
    assert metaq("consume", "carts", "--group", "late", "-o", "latest", *s).stdout == ""
    assert len(metaq("consume", "carts", "--group", "early", "--from-beginning", *s).stdout.split()) == 12


def test_consume_group_refuses_a_partition_or_an_offset_number(broker: BrokerProcess) -> None:
    s = ["-s", broker.servers]
    one = metaq("consume", "carts", "--group", "g", "-p", "0", *s)
    assert one.returncode == 2 and "no --partition" in one.stderr
    other = metaq("consume", "carts", "--group", "g", "-o", "5", *s)
    assert other.returncode == 2 and "metaq group reset" in other.stderr


def test_two_consume_group_members_share_the_partitions(broker: BrokerProcess) -> None:
    s = ["-s", broker.servers]
    with connect(broker.servers) as session:
        session.admin().create_topic("clicks4", 4)
    with CliProcess("consume", "clicks4", "--group", "watchers", "--follow", *s) as first:
        wait_until(lambda: len(_members(broker.servers, "watchers")) == 1, 60,
                   message="the first member joined")
        with CliProcess("consume", "clicks4", "--group", "watchers", "--follow", *s) as second:
            def split() -> list[list[str]] | None:
                members = _members(broker.servers, "watchers")
                owned = [sorted(p for ps in m["assignment"].values() for p in ps) for m in members]
                return owned if len(owned) == 2 and all(len(o) == 2 for o in owned) else None
            owned = wait_until(split, 60, message="two members with two partitions each")
            assert sorted(owned[0] + owned[1]) == ["0-0", "0-1", "0-2", "0-3"]
            with connect(broker.servers) as session:
                producer = session.create_producer()
                for p in range(4):
                    assert producer.send_batch("clicks4", [b"p%d" % p], partition=p).success
            wait_until(lambda: len(first.stdout) + len(second.stdout) >= 4, 60, message="4 messages printed")
            assert sorted(first.stdout + second.stdout) == ["p0", "p1", "p2", "p3"]
            assert first.stdout and second.stdout  # each member printed its own partitions' messages
            second.interrupt()
            assert_quiet_interrupt(second)
        first.interrupt()
        assert_quiet_interrupt(first)
