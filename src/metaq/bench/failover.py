"""``metaq bench failover``: how long writes stop when an HA replica group meets each kind of fault.

A local cluster (:class:`metaq.devcluster.DevCluster`: a real ZooKeeper, broker id 1 in HA mode with
``syncReplication`` and ``autoFailover`` and two slaves, every other setting at its default, MetaQ's
``zk.zkSessionTimeoutMs`` of 30 s unless told otherwise) takes a continuous produce load through a
cluster-mode client (round robin, at most 50 messages unacknowledged). Each round of a fault kind:

* ``master-kill``: SIGKILL of the master; the old master comes back as a slave;
* ``master-stop``: SIGSTOP of the master until a slave has taken over and writes go on, then SIGCONT;
* ``slave-kill``: SIGKILL of an in-sync slave; it is restarted;
* ``zookeeper-kill``: SIGKILL of ZooKeeper, restarted ``zk_down_s`` later (nobody must fail over);
* ``promote``: ``metaq admin promote`` to another in-sync slave (the planned switchover, a baseline).

and measures, from the fault: the **unavailability window** (the longest stretch with no acknowledgement,
as the client lives it), the **takeover** (until ZooKeeper names a new master in a new epoch; for a slave,
until it left the in-sync set), and the **failed sends** reported meanwhile. Every round ends with the
group whole again (the in-sync set full). At the end every acknowledged message is read back and checked
(:func:`metaq.bench.history.check_history`: none lost, none twice, order per partition).
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import signal
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from metaq.bench.history import ProduceLoad, check_history, gap_at, read_back
from metaq.client import connect
from metaq.cluster.layout import ReplicaGroupState
from metaq.devcluster import DevCluster

TOPIC = "failover"
PARTITIONS = 3
FAULTS = ("master-kill", "master-stop", "slave-kill", "zookeeper-kill", "promote")
ROUND_TIMEOUT_S = 120.0
"""Every wait of a round has this deadline: a fault the group does not recover from ends the run, saying so."""
READER_STUCK_S = 5.0
"""The bench's own ZooKeeper reader failing this long after ZooKeeper is back is replaced by a new one."""


class FailoverBenchError(RuntimeError):
    """A round did not recover within its deadline (the message says which wait)."""


def _wait(predicate: Callable[[], Any], what: str, timeout_s: float = ROUND_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise FailoverBenchError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.005)


def _p(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3) if ordered else 0.0


class _Run:
    """One cluster, one load, the faults in turn."""

    def __init__(self, cluster: DevCluster, zk_down_s: float, progress: Callable[[str], None]) -> None:
        self.cluster = cluster
        self.zk_down_s = zk_down_s
        self.progress = progress
        self.replicas = {0: cluster.brokers[1], 1: cluster.slaves[(1, 0)], 2: cluster.slaves[(1, 1)]}
        self.registry = self._reader()
        self.session: dict[str, Any] = {"zk_connect": cluster.zk_connect, "zk_root": cluster.zk_root,
                                        "request_timeout_s": 30.0}
        self.load = ProduceLoad(self.session, TOPIC, window=50, limit=999_999_999, time_limit_s=24 * 3600.0)
        self.gap_start_s = 0.0

    def state(self) -> ReplicaGroupState | None:
        deadline = time.monotonic() + ROUND_TIMEOUT_S
        failing_since: float | None = None
        while True:
            try:
                return self.registry.read_replica_group(1)[0]
            except Exception:
                now = time.monotonic()
                if now > deadline:
                    raise
                failing_since = failing_since or now
                if now - failing_since > READER_STUCK_S:
                    # a ZooKeeper client that reconnected right as ZooKeeper restarted was seen to hang until its
                    # read timeout (20 s): this reader starts a session afresh rather than wait it out
                    self.registry.close()
                    self.registry = self._reader()
                    failing_since = None
                time.sleep(0.05)

    def _reader(self) -> Any:
        from metaq.cluster.zookeeper import ZooKeeperRegistry  # kazoo: only once the bench runs

        registry = ZooKeeperRegistry(self.cluster.zk_connect, self.cluster.zk_root, watch_cluster=False,
                                     read_only=True)
        with contextlib.suppress(Exception):  # not reachable yet: read_replica_group fails, and is asked again
            registry.start()
        return registry

    def whole(self) -> None:
        """Until every replica is in the group: the master and two in-sync slaves."""
        _wait(lambda: (s := self.state()) is not None and len(s.isr) == len(self.replicas) - 1,
              "every slave in the in-sync set")

    def acks_after(self, t: float, count: int = 50) -> bool:
        if not self.load.running:  # no ack will ever come: say why rather than wait out the round
            raise FailoverBenchError(f"the load stopped after {self.load.sent} sends: {self.load.error!r}")
        times = self.load.ack_times  # appended by the load's thread: read, never copied, while it runs
        return len(times) >= count and times[-count] > t

    def measure(self, fault_at: float, recovered_at: float) -> tuple[float, int]:
        times = self.load.ack_times
        first = bisect.bisect_left(times, fault_at - 5.0)
        start, window = gap_at(times[first:], fault_at, recovered_at)
        self.gap_start_s = round(start - fault_at, 3)
        failed = sum(1 for at in list(self.load.failed_at.values()) if fault_at <= at <= recovered_at + 30)
        return round(window, 3), failed

    # -- the faults -------------------------------------------------------------------------------

    def master_kill(self) -> dict[str, Any]:
        before = self.state()
        assert before is not None
        old = self.replicas[before.master]
        t0 = time.monotonic()
        old.kill()
        _wait(lambda: (s := self.state()) is not None and s.epoch > before.epoch, "a slave to take over")
        takeover = time.monotonic() - t0
        _wait(lambda: self.acks_after(t0 + takeover), "acks from the new master")
        window, failed = self.measure(t0, time.monotonic())
        old.args = ["--slave", "--slave-id", str(before.master)]
        old.start()
        self.whole()
        return {"takeover_s": round(takeover, 3), "window_s": window, "failed_sends": failed}

    def master_stop(self) -> dict[str, Any]:
        before = self.state()
        assert before is not None
        old = self.replicas[before.master]
        t0 = time.monotonic()
        old.signal(signal.SIGSTOP)
        try:
            _wait(lambda: (s := self.state()) is not None and s.epoch > before.epoch, "a slave to take over")
            takeover = time.monotonic() - t0
            _wait(lambda: self.acks_after(t0 + takeover), "acks from the new master")
            recovered = time.monotonic()
        finally:
            old.signal(signal.SIGCONT)
        window, failed = self.measure(t0, recovered)
        self.whole()  # the old master follows its successor in the same process
        return {"takeover_s": round(takeover, 3), "window_s": window, "failed_sends": failed}

    def slave_kill(self) -> dict[str, Any]:
        before = self.state()
        assert before is not None
        victim = max(before.isr)
        t0 = time.monotonic()
        self.replicas[victim].kill()
        _wait(lambda: (s := self.state()) is not None and victim not in s.isr, "the dead slave to leave the set")
        left = time.monotonic() - t0
        _wait(lambda: self.acks_after(t0 + left), "acks without the dead slave")
        window, failed = self.measure(t0, time.monotonic())
        self.replicas[victim].start()
        self.whole()
        return {"takeover_s": round(left, 3), "window_s": window, "failed_sends": failed}

    def zookeeper_kill(self) -> dict[str, Any]:
        before = self.state()
        assert before is not None
        zookeeper = self.cluster.zookeeper
        t0 = time.monotonic()
        zookeeper.kill()
        _wait(lambda: time.monotonic() - t0 >= self.zk_down_s, f"{self.zk_down_s:g}s of ZooKeeper down",
              self.zk_down_s + 10)
        zookeeper.start()
        back = time.monotonic()
        _wait(lambda: self.acks_after(back), "acks once ZooKeeper is back")
        window, failed = self.measure(t0, time.monotonic())
        after = self.state()
        self.whole()
        return {"takeover_s": None, "window_s": window, "failed_sends": failed, "down_s": round(back - t0, 3),
                "failovers": 0 if after is not None and after.epoch == before.epoch else 1}

    def promote(self) -> dict[str, Any]:
        before = self.state()
        assert before is not None
        target = min(before.isr)
        t0 = time.monotonic()
        with connect(**self.session) as session:
            session.admin().promote(broker_id=1, replica_id=target)
        takeover = time.monotonic() - t0
        _wait(lambda: self.acks_after(t0 + takeover), "acks from the new master")
        window, failed = self.measure(t0, time.monotonic())
        self.whole()
        return {"takeover_s": round(takeover, 3), "window_s": window, "failed_sends": failed}


def run_failover_bench(faults: Sequence[str] = FAULTS, rounds: int = 5, *, session_timeout_ms: int = 30_000,
                       zk_down_s: float = 8.0, directory: str | Path | None = None,
                       progress: Callable[[str], None] = lambda _line: None) -> dict[str, Any]:
    """Run ``rounds`` rounds of each fault in ``faults`` (see the module doc) on one local cluster; the result:
    the settings, per fault every round and p50 / max of its window and takeover with the failed sends, and
    the history's check."""
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown:
        raise ValueError(f"unknown fault kind(s) {unknown}; known: {', '.join(FAULTS)}")
    system = {"syncReplication": "true", "autoFailover": "true"}
    quiet = [logging.getLogger(name) for name in ("kazoo", "metaq.cluster", "metaq.client")]
    levels = [logger.level for logger in quiet]
    for logger in quiet:  # the faults are the point: the bench's own clients need not narrate them
        logger.setLevel(logging.ERROR)
    try:
        return _run(faults, rounds, session_timeout_ms, zk_down_s, directory, progress, system)
    finally:
        for logger, level in zip(quiet, levels, strict=True):
            logger.setLevel(level)


def _run(faults: Sequence[str], rounds: int, session_timeout_ms: int, zk_down_s: float,
         directory: str | Path | None, progress: Callable[[str], None], system: dict[str, str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="metaq-bench-failover-") as scratch:
        root = Path(directory) if directory is not None else Path(scratch)
        with DevCluster(root, 1, partitions=PARTITIONS, system=system, slaves=2, ha=True,
                        session_timeout_ms=session_timeout_ms,
                        topics=f"[topic={TOPIC}]\nnumPartitions={PARTITIONS}\n") as cluster:
            run = _Run(cluster, zk_down_s, progress)
            try:
                run.whole()
                run.load.start()
                _wait(lambda: len(run.load.acked) > 1000, "acks before the first fault")
                results: dict[str, Any] = {}
                for fault in faults:
                    rows = []
                    for n in range(rounds):
                        wall = time.time()
                        row = getattr(run, fault.replace("-", "_"))()
                        row["window_began_s"] = run.gap_start_s  # from the fault: which step the window was
                        row["at"] = time.strftime("%H:%M:%S", time.localtime(wall)) + f".{int(wall % 1 * 1000):03d}"
                        rows.append(row)
                        progress(f"{fault} {n + 1}/{rounds}: window {row['window_s']:.3f}s (from "
                                 f"{row['window_began_s']:.3f}s), takeover {row['takeover_s']}, failed sends "
                                 f"{row['failed_sends']}")
                    windows = [r["window_s"] for r in rows]
                    takeovers = [r["takeover_s"] for r in rows if r["takeover_s"] is not None]
                    results[fault] = {
                        "rounds": rows, "window_p50_s": _p(windows, 0.5), "window_max_s": max(windows),
                        "takeover_p50_s": _p(takeovers, 0.5) if takeovers else None,
                        "takeover_max_s": max(takeovers) if takeovers else None,
                        "failed_sends": sum(r["failed_sends"] for r in rows)}
            finally:
                run.load.stop(300)
                run.registry.close()
            with connect(**run.session) as session:
                read = read_back(session, TOPIC)
    problems = check_history(read, run.load.acked, run.load.failed)
    return {"settings": {"zk.zkSessionTimeoutMs": session_timeout_ms, "syncReplication": True, "autoFailover": True,
                         "slaves": 2, "partitions": PARTITIONS, "window": 50, "rounds": rounds,
                         "zookeeper_down_s": zk_down_s},
            "faults": results,
            "history": {"acked": len(run.load.acked), "failed": len(run.load.failed),
                        "read_back": sum(len(v) for v in read.values()), "problems": problems[:20]}}


__all__ = ["FAULTS", "FailoverBenchError", "run_failover_bench"]
