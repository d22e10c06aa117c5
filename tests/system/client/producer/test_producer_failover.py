"""Producers through failovers of a replica group of three (sync replication, real ZooKeeper, real processes).

Three producers under load at once -- the default one (round robin, ``retries=0``), an idempotent one, and a keyed
one (``KeyHashSelector``) -- while the master is paused past its ZooKeeper session then resumed, killed -9, cut from
ZooKeeper past its session (a TCP proxy between it and ZooKeeper, cut: no failover), or handed over with ``metaq
admin promote``. Then the whole history is checked (docs/producer.md):

* every acknowledged message is read back, at its partition and offset, once;
* per producer and partition, messages are stored in send order (``check_send_order``);
* a key's messages are all in one partition, the one its hash picks over the topic's registered partitions;
* nothing is stored that was reported certainly not stored (``error.maybe_stored`` False);
* with the default ``delivery_timeout_ms`` a failover of a few seconds fails no send of the idempotent producer, and
  none of any producer in a planned handover (promote) or while the master is cut from ZooKeeper alone (its slaves
  still hear from it: it is not replaced, and registers again in the same epoch); the default and keyed producers
  (``retries=0``) fail only what the old master held in flight when the fault struck, reported as "may have been
  stored" (a paused master appended them and was deposed before its slaves confirmed them; a killed one took its
  answers along).
"""

from __future__ import annotations

import collections
import json
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from metaq.client import KeyHashSelector, connect
from metaq.client.selectors import key_hash
from metaq.testing import BrokerProcess, wait_until
from metaq.testing.history import ProduceLoad, check_history, check_send_order, maybe_stored, read_back
from metaq.testing.proxy import CuttableProxy
from metaq.testing.zookeeper import cluster_config
from metaq.types import PartitionId

TOPIC = "orders"
PARTITIONS = 3
SESSION_MS = 2000
HA = {"syncReplication": "true", "autoFailover": "true", "minInSyncSlaves": 1, "inSyncMaxLagMs": 5000,
      "unflushThreshold": 0, "numPartitions": PARTITIONS}
KEYS = 12


def key_of(n: int) -> bytes:
    return b"key-%d" % (n % KEYS)


class Group:
    """The replicas of broker id 1, each reaching ZooKeeper through a proxy of its own (cut one to cut it off)."""

    def __init__(self, broker_factory: Callable[..., BrokerProcess], zookeeper: Any, zk_root: str) -> None:
        self.zk_root = zk_root
        self.zk_connect = zookeeper.connect_string
        host, port = zookeeper.connect_string.split(",")[0].rsplit(":", 1)
        self.proxies = {r: CuttableProxy((host, int(port))).start() for r in range(3)}
        self.procs: dict[int, BrokerProcess] = {}
        for r in range(3):
            text = cluster_config(1, self.proxies[r].address, zk_root, SESSION_MS, HA,
                                  f"[topic={TOPIC}]\nnumPartitions={PARTITIONS}\n")
            self.procs[r] = broker_factory(config_text=text, name=f"replica-{r}",
                                           args=(["--slave"] if r else []) + ["--slave-id", str(r)])
            self.procs[r].allow_log(r"replica \S+: |cannot|deposed|no longer master|took over|ZooKeeper|session")

    def close(self) -> None:
        for proxy in self.proxies.values():
            proxy.close()


def group_state(zk: Any, root: str) -> dict[str, Any] | None:
    try:
        data, _ = zk.get(f"{root}/brokers/replica-groups/1")
    except Exception:
        return None
    return dict(json.loads(data))


def wait_isr(zk: Any, root: str, want: set[int]) -> None:
    wait_until(lambda: (s := group_state(zk, root)) is not None and set(s["isr"]) == want, 60, 0.02,
               f"the in-sync set to become {sorted(want)}")


def wait_new_master(zk: Any, root: str, old_epoch: int) -> dict[str, Any]:
    wait_until(lambda: (s := group_state(zk, root)) is not None and s["epoch"] > old_epoch
               and zk.exists(f"{root}/brokers/ids/1/master") is not None, SESSION_MS / 1000 + 30, 0.01,
               "a slave to take over")
    state = group_state(zk, root)
    assert state is not None
    return state


@pytest.fixture
def group(broker_factory: Callable[..., BrokerProcess], zookeeper: Any, zk_root: str) -> Iterator[Group]:
    g = Group(broker_factory, zookeeper, zk_root)
    try:
        yield g
    finally:
        g.close()


RATE = 1500.0
"""Messages a second per producer: paced, with a window far larger than a fault's worth of sends, so that sends
go on while the old master holds earlier ones (a producer fed by requests does not stop because acks are late)."""
WINDOW = 50_000


def start_loads(zookeeper: Any, zk_root: str) -> dict[str, ProduceLoad]:
    session = {"zk_connect": zookeeper.connect_string, "zk_root": zk_root}
    common: dict[str, Any] = {"window": WINDOW, "time_limit_s": 150.0, "rate": RATE}
    return {
        "default": ProduceLoad(session, TOPIC, prefix=b"d", **common).start(),
        "idempotent": ProduceLoad(session, TOPIC, prefix=b"i", producer_config={"enable_idempotence": True},
                                  **common).start(),
        "keyed": ProduceLoad(session, TOPIC, prefix=b"k", key=key_of, selector=KeyHashSelector, **common).start(),
    }


def sent_on(loads: dict[str, ProduceLoad], more: int) -> None:
    """Wait until every load has sent ``more`` messages since now (the fault goes on meanwhile)."""
    at = {name: load.sent for name, load in loads.items()}
    wait_until(lambda: all(load.sent >= at[name] + more for name, load in loads.items()), 60, 0.01,
               f"every producer to send {more} more messages")


def acked(loads: dict[str, ProduceLoad]) -> int:
    return min(len(load.acked) for load in loads.values())


def pause_past_session(group: Group, zk: Any, master: int, epoch: int, loads: dict[str, ProduceLoad]) -> None:
    """SIGSTOP the master until a slave has taken over (its session expired) and the producers have sent more
    since (they would go to the new master), then SIGCONT it: it refuses what it held (NOT_MASTER)."""
    group.procs[master].signal(signal.SIGSTOP)
    try:
        wait_new_master(zk, group.zk_root, epoch)
        sent_on(loads, 1000)
    finally:
        group.procs[master].signal(signal.SIGCONT)


def kill_9(group: Group, zk: Any, master: int, epoch: int, loads: dict[str, ProduceLoad]) -> None:
    group.procs[master].kill()
    wait_new_master(zk, group.zk_root, epoch)
    proc = group.procs[master]
    proc.args = ["--slave", "--slave-id", str(master)]
    proc.start()  # the old master returns as a slave


def cut_from_zookeeper(group: Group, zk: Any, master: int, epoch: int, loads: dict[str, ProduceLoad]) -> None:
    """Cut the master from ZooKeeper alone (its clients and slaves still reach it) until its session has expired
    (its node is gone) and the producers have sent more since. Its slaves still hear from it, so none takes over
    (docs/replication.md): it registers again in the same epoch once the link returns."""
    node = f"{group.zk_root}/brokers/ids/1/master"
    group.proxies[master].cut()
    try:
        wait_until(lambda: zk.exists(node) is None, SESSION_MS / 1000 + 30, 0.01,
                   "the cut master's session to expire")
        sent_on(loads, 1000)
    finally:
        group.proxies[master].restore()
    wait_until(lambda: zk.exists(node) is not None, 60, 0.01, "the master to register again")
    state = group_state(zk, group.zk_root)
    assert state is not None and (state["epoch"], state["master"]) == (epoch, master), state


def promote(group: Group, zk: Any, master: int, epoch: int, loads: dict[str, ProduceLoad]) -> None:
    target = next(r for r in (1, 2, 0) if r != master)
    with connect(zk_connect=group.zk_connect, zk_root=group.zk_root) as session:
        assert session.admin().promote(broker_id=1, replica_id=target)[0] == target
    wait_new_master(zk, group.zk_root, epoch)


FAULTS: dict[str, Callable[[Group, Any, int, int, dict[str, ProduceLoad]], None]] = {
    "pause": pause_past_session, "kill-9": kill_9, "zookeeper-cut": cut_from_zookeeper, "promote": promote}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_producers_keep_send_order_and_lose_nothing_through_a_failover(
        fault: str, group: Group, zookeeper: Any, zk_client: Any, zk_root: str, tmp_path: Path) -> None:
    wait_isr(zk_client, zk_root, {1, 2})
    loads = start_loads(zookeeper, zk_root)
    timings: dict[str, float] = {}
    try:
        wait_until(lambda: acked(loads) > 1000, 60, 0.01, "acks from every producer before the fault")
        state = group_state(zk_client, zk_root)
        assert state is not None
        before = {name: len(load.acked) for name, load in loads.items()}
        started = time.monotonic()
        FAULTS[fault](group, zk_client, state["master"], state["epoch"], loads)
        timings["fault over"] = time.monotonic() - started
        wait_until(lambda: all(len(load.acked) > before[n] + 3000 for n, load in loads.items()), 90, 0.01,
                   "every producer to be acknowledged again")
        timings["producing again"] = time.monotonic() - started
    finally:
        for load in loads.values():
            load.stop(180)
    with connect(zk_connect=zookeeper.connect_string, zk_root=zk_root) as session:
        read = read_back(session, TOPIC)
        key_space = sorted(PartitionId(p.broker_id, p.partition) for p in session.partitions(TOPIC))
    assert len(key_space) == PARTITIONS
    problems: list[str] = []
    report = []
    for name, load in loads.items():
        others = [d for other, o in loads.items() if other != name for d in (*o.acked, *o.failed)]
        problems += [f"{name}: {p}" for p in check_history(read, load.acked, load.failed, other=others)]
        problems += [f"{name}: {p}" for p in check_send_order(read, load.prefix)]
        kinds = collections.Counter(f"{type(e).__name__}{'(maybe stored)' if maybe_stored(e) else ''}"
                                    for e in load.failed.values())
        report.append(f"{name}: {len(load.acked)} acked, {len(load.failed)} failed {dict(kinds)}")
    where: dict[bytes, set[PartitionId]] = collections.defaultdict(set)
    for pid, messages in read.items():
        for _offset, data in messages:
            if data.startswith(b"k"):
                where[key_of(int(data[1:]))].add(pid)
    for key, pids in where.items():
        home = key_space[key_hash(key) % len(key_space)]
        if pids != {home}:
            problems.append(f"key {key!r} stored in {sorted(map(str, pids))}, not only in {home}")
    print(f"{fault}: over after {timings['fault over']:.2f}s, every producer acked again after "
          f"{timings['producing again']:.2f}s; " + "; ".join(report))
    assert not problems, "\n".join(problems[:30])
    # the idempotent producer fails nothing; the others only what may have been stored (in flight when it broke)
    assert not loads["idempotent"].failed, list(loads["idempotent"].failed.values())[:3]
    for name in ("default", "keyed"):
        certain = [e for e in loads[name].failed.values() if not maybe_stored(e)]
        assert not certain, f"{name}: failed although certainly not stored (it could have waited): {certain[:3]}"
    if fault in ("promote", "zookeeper-cut"):  # a planned handover answers every batch in flight, and a master
        # cut from ZooKeeper alone is not replaced: nothing may fail at all
        for name in ("default", "keyed"):
            assert not loads[name].failed, f"{name}: {list(loads[name].failed.values())[:3]}"
