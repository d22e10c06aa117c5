"""Failover time under load: the master of an HA replica group killed -9, N times in a row.

A local cluster (``metaq.devcluster.DevCluster``: a real ZooKeeper, broker 1 in HA mode with
``syncReplication=true``, ``autoFailover=true`` and two slaves) takes a continuous produce load (the client in
cluster mode, round robin over the topic's partitions) while a consumer long-polls partition ``1-0``.
Each round kills the current master with SIGKILL and measures, from the kill:

* **takeover**: until ZooKeeper names a new master (a new epoch and ``ids/1/master`` registered);
* **first produce**: until the first send acknowledged by the new master (acks counted from half the
  takeover time on: the old master's last acks still arrive in the first milliseconds after the kill);
* **first fetch**: until the consumer receives a message the new master acknowledged;

then restarts the old master as a slave and waits until it is back in the in-sync set. At the end every
acknowledged message is read back (the history checker: none lost, none twice, order per partition).

    .venv/bin/python scripts/bench_failover.py --rounds 20 --session-ms 2000

Prints one JSON line per round, then p50 / max of each time and the history counts (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import tempfile
import threading
import time
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from metaq.client import connect
from metaq.devcluster import DevCluster
from metaq.testing.history import ProduceLoad, check_history, read_back

TOPIC = "failover"
PARTITIONS = 3


class Probe(threading.Thread):
    """Long-polls partition 1-0 through the client (which follows the master) and notes when each message
    arrives."""

    def __init__(self, session: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.session = session
        self.received: list[tuple[float, bytes]] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        with connect(**self.session) as session:
            consumer = session.create_pull_consumer()
            offset: Any = "latest"
            while not self.stop_event.is_set():
                try:
                    for msg in consumer.iterate(TOPIC, "1-0", offset, max_wait_ms=200):
                        self.received.append((time.monotonic(), bytes(msg.data)))
                        offset = msg.offset + 1
                        if self.stop_event.is_set():
                            return
                except Exception:  # the master is gone: try again (the client finds the new one)
                    time.sleep(0.01)


def state(zk: Any, root: str) -> dict[str, Any] | None:
    """The replica group's state; None when it does not exist. A failing read (the bench's own ZooKeeper
    session reconnecting) is tried again for a few seconds."""
    deadline = time.monotonic() + 10
    while True:
        try:
            data, _ = zk.get(f"{root}/brokers/replica-groups/1")
            return dict(json.loads(data))
        except NoNodeError:
            return None
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def wait(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.005)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--session-ms", type=int, default=2000, help="zk.zkSessionTimeoutMs of the brokers")
    parser.add_argument("--keep", default=None, help="run in this directory and keep it (the brokers' logs)")
    args = parser.parse_args()
    system = {"syncReplication": "true", "autoFailover": "true", "minInSyncSlaves": 1, "inSyncMaxLagMs": 5000}
    with (contextlib.nullcontext(args.keep) if args.keep else tempfile.TemporaryDirectory(
            prefix="metaq-bench-failover-")) as root, \
            DevCluster(root, 1, partitions=PARTITIONS, system=system, slaves=2, ha=True,
                       session_timeout_ms=args.session_ms,
                       topics=f"[topic={TOPIC}]\nnumPartitions={PARTITIONS}\n") as cluster:
        replicas = {0: cluster.brokers[1], 1: cluster.slaves[(1, 0)], 2: cluster.slaves[(1, 1)]}
        zk = KazooClient(hosts=cluster.zk_connect)
        zk.start(10)
        session = {"zk_connect": cluster.zk_connect, "zk_root": cluster.zk_root, "request_timeout_s": 10.0}
        wait(lambda: (s := state(zk, cluster.zk_root)) is not None and set(s["isr"]) == {1, 2}, 60, "the ISR")
        load = ProduceLoad(session, TOPIC, window=50, time_limit_s=60.0 + 30.0 * args.rounds).start()
        probe = Probe(session)
        probe.start()
        rows = []
        failed = True
        try:
            wait(lambda: len(load.acked) > 500 and probe.received, 60, "acks and fetches before the first kill")
            for n in range(args.rounds):
                before = state(zk, cluster.zk_root)
                assert before is not None
                old, epoch = before["master"], before["epoch"]
                killed_at = time.monotonic()
                replicas[old].kill()
                wait(lambda e=epoch: (s := state(zk, cluster.zk_root)) is not None and s["epoch"] > e
                     and zk.exists(f"{cluster.zk_root}/brokers/ids/1/master") is not None, 60, "a takeover")
                takeover = time.monotonic() - killed_at
                # acks the old master sent just before the kill still arrive in the first milliseconds after
                # it: count from half the takeover time, when no master exists (the old one is dead, the new
                # one not yet registered)
                quiet = killed_at + takeover / 2
                wait(lambda q=quiet: any(a.at > q for a in list(load.acked.values())[-500:]), 60,
                     "an ack from the new master")
                produce = min(a.at for a in list(load.acked.values()) if a.at > quiet) - killed_at

                def fetched_after(k: float = killed_at, q: float = quiet) -> float | None:
                    for at, data in list(probe.received):
                        ack = load.acked.get(data)
                        if at > q and ack is not None and ack.at > q:
                            return at - k
                    return None

                wait(lambda: fetched_after() is not None, 60, "a fetch of a message acked after the kill")
                fetch = fetched_after()
                new = state(zk, cluster.zk_root)
                assert new is not None
                row = {"round": n + 1, "old_master": old, "new_master": new["master"], "epoch": new["epoch"],
                       "takeover_s": round(takeover, 3), "first_produce_s": round(produce, 3),
                       "first_fetch_s": round(fetch or -1, 3)}
                print(json.dumps(row), flush=True)
                rows.append(row)
                proc = replicas[old]
                proc.args = ["--slave", "--slave-id", str(old)]
                proc.start()
                wait(lambda m=new["master"]: (s := state(zk, cluster.zk_root)) is not None
                     and set(s["isr"]) == set(replicas) - {m}, 60, "the old master back in the in-sync set")
            failed = False
        finally:
            if failed:
                print(f"state: {state(zk, cluster.zk_root)}")
                spy = shutil.which("py-spy")
                for r, proc in replicas.items():
                    if spy and proc.running:
                        dump = subprocess.run([spy, "dump", "--pid", str(proc.pid)], capture_output=True, text=True,
                                              timeout=30).stdout
                        print(f"-- replica {r} --\n{dump}", flush=True)
            probe.stop_event.set()
            load.stop(120)
            zk.stop()
            zk.close()
        with connect(**session) as sync:
            read = read_back(sync, TOPIC)
        problems = check_history(read, load.acked, load.failed)
    for key in ("takeover_s", "first_produce_s", "first_fetch_s"):
        values = [r[key] for r in rows]
        print(f"{key}: p50 {pct(values, 0.5)} max {max(values)}")
    print(f"history: {len(load.acked)} acked, {len(load.failed)} failed, "
          f"{sum(len(v) for v in read.values())} read back, {len(problems)} problem(s)")
    for p in problems[:10]:
        print("  " + p)


if __name__ == "__main__":
    main()
