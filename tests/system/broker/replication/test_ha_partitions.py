"""HA under real network partitions: each replica on a host of its own (a network namespace), links cut with
blackhole routes (packets dropped, nothing refused), MetaQ's default session timeout, load through a
cluster-mode client in the root namespace. The loopback versions of these faults (a kill, a pause, ZooKeeper
killed or cut off) always run in tests/integration/broker/replication/test_replication_failover.py; these
skip, saying why, where namespaces cannot be made (they need root).

What a user relies on (docs/replication.md):

* a slave that loses only its own link to a healthy master does not depose it: the other in-sync slave,
  which still hears the master, vetoes; the cut slave leaves the in-sync set and writes go on;
* a master cut off from its slaves and from ZooKeeper (its clients still reach it) is replaced, and
  acknowledges nothing it receives after the takeover: its lease runs out, it refuses writes; every
  acknowledged message is read back once, in order (the history checker).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from metaq.client import connect
from metaq.testing import wait_until
from metaq.testing.history import ProduceLoad, check_history, longest_gap, read_back
from metaq.testing.netns import NamespacedBroker, Namespaces, unavailable
from metaq.testing.zookeeper import ZooKeeperServer, cluster_config, unique_root

pytestmark = pytest.mark.slow

TOPIC = "orders"
TOPICS = f"[topic={TOPIC}]\nnumPartitions=3\n"
HA_DEFAULTS = {"syncReplication": "true", "autoFailover": "true", "unflushThreshold": 0}


@dataclass
class Group:
    """Replicas 0 (master), 1, 2 of broker id 1, replica r on host r; ZooKeeper and the test in the root namespace."""

    hosts: Namespaces
    zookeeper: ZooKeeperServer
    root: str
    zk: KazooClient
    procs: dict[int, NamespacedBroker] = field(default_factory=dict)

    @property
    def session(self) -> dict[str, Any]:
        return {"zk_connect": self.zookeeper.connect_string, "zk_root": self.root, "request_timeout_s": 30.0}

    def state(self) -> dict[str, Any] | None:
        try:
            data, _ = self.zk.get(f"{self.root}/brokers/replica-groups/1")
        except Exception:
            return None
        return dict(json.loads(data))

    def wait_isr(self, want: set[int]) -> dict[str, Any]:
        wait_until(lambda: (s := self.state()) is not None and set(s["isr"]) == want, 60, 0.02,
                   f"the in-sync set to become {sorted(want)}")
        state = self.state()
        assert state is not None
        return state


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Group]:
    reason = unavailable()
    if reason is not None:
        pytest.skip(f"network namespaces cannot be made here ({reason}); the loopback versions of these faults "
                    "run in tests/integration/broker/replication/test_replication_failover.py")
    with Namespaces(3) as hosts:
        zookeeper = ZooKeeperServer(tmp_path / "zk")
        zookeeper.host = hosts.zookeeper_host
        zookeeper.start()
        zk = KazooClient(hosts=zookeeper.connect_string)
        zk.start(30)
        g = Group(hosts, zookeeper, unique_root(), zk)
        try:
            for r in (0, 1, 2):
                proc = NamespacedBroker(hosts, r, tmp_path / f"replica-{r}", config_text=cluster_config(
                    1, zookeeper.connect_string, g.root, 30_000, HA_DEFAULTS, TOPICS),
                    args=(["--slave"] if r else []) + ["--slave-id", str(r)])
                proc.allow_log(r"replica \S+: |cannot|deposed|no longer master|took over")
                g.procs[r] = proc
                proc.start()
            yield g
        finally:
            hosts.heal()
            for proc in g.procs.values():
                proc.stop_or_kill(15)
            zk.stop()
            zk.close()
            zookeeper.stop()


def check(group: Group, load: ProduceLoad) -> None:
    with connect(**group.session) as sync:
        read = read_back(sync, TOPIC)
    problems = check_history(read, load.acked, load.failed)
    kinds = sorted({type(e).__name__ for e in load.failed.values()})
    print(f"history: {len(load.acked)} acked, {len(load.failed)} failed {kinds}, "
          f"{sum(len(v) for v in read.values())} read back; {len(problems)} problem(s)")
    assert not problems, "\n".join(problems[:20])


def test_a_slave_cut_from_its_master_alone_does_not_depose_it(group: Group) -> None:
    before = group.wait_isr({1, 2})
    load = ProduceLoad(group.session, TOPIC, window=50, time_limit_s=180.0).start()
    try:
        wait_until(lambda: len(load.acked) > 1000, 60, 0.01, "acks before the cut")
        cut_at = time.monotonic()
        group.hosts.cut(0, 1)  # replica 1 loses its master; replica 2 still hears it
        group.wait_isr({2})
        left_after = time.monotonic() - cut_at
        # it suspects its master, but the master dropped it from the in-sync set first (silent for two thirds
        # of the lease, against the lease it needs to suspect): it may not take over
        wait_until(lambda: any("may not take over" in line for line in group.procs[1].log_lines), 30, 0.05,
                   "replica 1 to suspect its master")
        acked = len(load.acked)
        wait_until(lambda: len(load.acked) > acked + 1000, 60, 0.01, "acks while replica 1 is cut off")
        group.hosts.heal()
        group.wait_isr({1, 2})
        acked = len(load.acked)
        wait_until(lambda: len(load.acked) > acked + 1000, 60, 0.01, "acks after the link is back")
    finally:
        load.stop(120)
    after = group.state()
    stall = longest_gap([a.at for a in load.acked.values()], cut_at, cut_at + left_after)
    print(f"slave cut from its master: it left the in-sync set after {left_after:.2f}s, longest stretch without an "
          f"ack {stall:.2f}s; state before {before}, after {after}")
    assert after is not None and after["master"] == 0 and after["epoch"] == before["epoch"], after
    assert not any("took over" in line for p in group.procs.values() for line in p.log_lines)
    assert not load.failed, sorted({str(e)[:160] for e in load.failed.values()})
    check(group, load)


def test_the_other_slave_vetoes_a_takeover_by_a_slave_that_lost_only_its_own_link(group: Group) -> None:
    """The master is cut from ZooKeeper (it cannot drop a slave from the in-sync set) and from replica 1; replica
    1 finds it silent and asks replica 2, which still hears it: no takeover. Sync writes wait meanwhile (the set
    cannot shrink without ZooKeeper), and go on, nothing lost, when the links are back."""
    before = group.wait_isr({1, 2})
    load = ProduceLoad(group.session, TOPIC, window=50, time_limit_s=180.0).start()
    try:
        wait_until(lambda: len(load.acked) > 1000, 60, 0.01, "acks before the cut")
        group.hosts.cut_from_zookeeper(0)
        group.hosts.cut(0, 1)
        wait_until(lambda: any("heard from the master" in line for line in group.procs[1].log_lines), 30, 0.05,
                   "replica 1 to suspect its master and replica 2 to veto")
        vetoed_at = time.monotonic()
        wait_until(lambda: time.monotonic() - vetoed_at > 3, 10, 0.1, "3 s more of the cut")
        assert group.state() == before, "a slave took over though the other one still heard the master"
        group.hosts.heal()
        acked = len(load.acked)
        wait_until(lambda: len(load.acked) > acked + 1000, 60, 0.01, "acks after the links are back")
    finally:
        load.stop(120)
    after = group.state()
    print(f"master cut from ZooKeeper and from replica 1: vetoed, no takeover; state before {before}, after {after}")
    assert after is not None and after["master"] == 0 and after["epoch"] == before["epoch"], after
    assert not any("took over" in line for p in group.procs.values() for line in p.log_lines)
    check(group, load)


def test_a_master_cut_off_from_its_slaves_and_zookeeper_is_replaced_and_acks_nothing_after(group: Group) -> None:
    before = group.wait_isr({1, 2})
    load = ProduceLoad(group.session, TOPIC, window=50, time_limit_s=180.0).start()
    try:
        wait_until(lambda: len(load.acked) > 1000, 60, 0.01, "acks before the cut")
        cut_at = time.monotonic()
        group.hosts.isolate(0)  # its clients (this process) still reach it
        wait_until(lambda: (s := group.state()) is not None and s["master"] != 0, 30, 0.01, "a slave to take over")
        took_over = time.monotonic() - cut_at
        acked = len(load.acked)
        wait_until(lambda: len(load.acked) > acked + 1000, 60, 0.01, "acks from the new master")
        acked_again = time.monotonic() - cut_at
        new_master = group.state()["master"]  # type: ignore[index]
        group.hosts.heal()
        wait_until(lambda: group.zk.exists(f"{group.root}/brokers/ids/1/slave0") is not None, 60, 0.05,
                   "the old master to step down and follow")
        group.wait_isr({0, 1, 2} - {new_master})
        acked = len(load.acked)
        wait_until(lambda: len(load.acked) > acked + 1000, 60, 0.01, "acks after the link is back")
    finally:
        load.stop(120)
    window = longest_gap([a.at for a in load.acked.values()], cut_at, cut_at + acked_again)
    print(f"master cut off: replica {new_master} took over after {took_over:.2f}s (epoch {before['epoch']} -> "
          f"{group.state()}), acks again after {acked_again:.2f}s, longest stretch without an ack {window:.2f}s")
    check(group, load)
