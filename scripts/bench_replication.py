"""Produce throughput and ack latency with no slave, one async slave and one sync slave, same run, and the
slave's lag under that load.

Each case starts a local cluster (``metaq.devcluster.DevCluster``: a real ZooKeeper, broker 1 in
ZooKeeper mode, and its async slave, or in HA mode with ``syncReplication=true`` its sync slave), runs the
real ``metaq bench produce --zk``
against it in a child process, samples the slave's ``replication`` stats every 50 ms meanwhile (the
largest lag in messages and in ms), then measures how long the slave takes to hold every message
after the load stops, and checks that every partition's log end is the same on both.

    .venv/bin/python scripts/bench_replication.py --series 3 -n 2000000

Prints one JSON line per case and a markdown table (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from metaq.devcluster import DevCluster
from metaq.net.blocking import BlockingConnection
from metaq.net.codec import ConnectionSettings
from metaq.protocol import messages as m

SETTINGS = ConnectionSettings(client_id="bench-replication", connect_timeout_s=5.0, request_timeout_s=30.0,
                              max_in_flight=4, max_frame_bytes=64 << 20)
SAMPLE_S = 0.05
CATCH_UP_MAX_S = 300.0


def stats(address: str) -> dict[str, Any]:
    host, port = address.rsplit(":", 1)
    conn = BlockingConnection.open((host, int(port)), SETTINGS)
    try:
        return json.loads(conn.call(m.StatsRequest()).stats_json)
    finally:
        conn.close()


def end_offsets(address: str, topic: str) -> dict[str, int]:
    """Per partition: the master's log end (from its counters), or a slave's (from its replication state)."""
    doc = stats(address)
    if "replication" in doc:
        parts = doc["replication"]["partitions"].get(topic, {})
    else:
        parts = doc["topics"].get(topic, {}).get("partitions", {})
    return {p: e.get("log_end_offset", -1) for p, e in parts.items()}


class LagSampler(threading.Thread):
    """Every SAMPLE_S: the master's total log end, then the slave's, measured from outside.

    The lag in messages of a sample is master minus slave; the lag in ms of a master sample is how long
    until the slave held that many messages (the replication delay a consumer of the slave sees).
    """

    def __init__(self, master: str, slave: str) -> None:
        super().__init__(daemon=True)
        self.master, self.slave = master, slave
        self.master_samples: list[tuple[float, int]] = []
        self.slave_samples: list[tuple[float, int]] = []
        self.max_lag_messages = 0
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.wait(SAMPLE_S):
            try:
                master_total = sum(v for doc in [stats(self.master)] for t in doc["topics"].values()
                                   for v in (e.get("log_end_offset", 0) for e in t["partitions"].values()))
                at = time.monotonic()
                slave_total = sum(e["log_end_offset"] for t in stats(self.slave)["replication"]["partitions"].values()
                                  for e in t.values())
            except Exception:
                continue
            self.master_samples.append((at, master_total))
            self.slave_samples.append((time.monotonic(), slave_total))
            self.max_lag_messages = max(self.max_lag_messages, master_total - slave_total)

    def delays_ms(self) -> list[float]:
        out = []
        for at, wanted in self.master_samples:
            reached = next((t for t, have in self.slave_samples if t >= at and have >= wanted), None)
            if reached is not None:
                out.append((reached - at) * 1000)
        return sorted(out)


CASES = {"none": "no slave", "async": "one async slave", "sync": "one sync slave"}


def wait_in_sync(master: str, timeout_s: float = 60.0) -> None:
    """Sync mode: the bench starts only once the slave is in the in-sync set (else produces are refused)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if stats(master).get("replica_group", {}).get("isr"):
                return
        except Exception:
            pass
        time.sleep(SAMPLE_S)
    raise SystemExit(f"the sync slave did not join the in-sync set within {timeout_s}s")


def run_case(mode: str, count: int, partitions: int, root: str) -> dict[str, Any]:
    slaves = 0 if mode == "none" else 1
    system: dict[str, Any] = {"maxTransferSize": 1024 * 1024}
    if mode == "sync":
        system.update(syncReplication="true", minInSyncSlaves=1)
    cluster = DevCluster(os.path.join(root, f"cluster-{mode}-{time.monotonic_ns()}"), 1, partitions=partitions,
                         system=system, slaves=slaves, ha=mode == "sync")
    with cluster:
        sampler = LagSampler(cluster.brokers[1].servers, cluster.slaves[(1, 0)].servers) if slaves else None
        command = [sys.executable, "-m", "metaq.cli.main", "bench", "produce", "--zk", cluster.zk_connect,
                   "--zk-root", cluster.zk_root, "-n", str(count), "--partitions", str(partitions),
                   "--concurrency", "16", "--json", "--no-progress"]
        if mode == "sync":
            wait_in_sync(cluster.brokers[1].servers)
        if sampler is not None:
            sampler.start()
        out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=600)
        result = json.loads(out.stdout.strip().splitlines()[-1])
        case: dict[str, Any] = {"mode": mode, "slaves": slaves, "msgs_per_s": result["msgs_per_s"],
                                "p50_ack_ms": result["latency_ms"].get("p50"),
                                "p99_ack_ms": result["latency_ms"].get("p99"), "messages": result["messages"],
                                "command": " ".join(command[1:3] + command[3:]).replace(cluster.zk_connect, "ZK")}
        if sampler is not None:
            master = cluster.brokers[1].servers
            slave = cluster.slaves[(1, 0)].servers
            stopped = time.monotonic()
            (topic,) = stats(master)["topics"]  # the bench's own topic, the only one
            want = end_offsets(master, topic)
            while end_offsets(slave, topic) != want:
                if time.monotonic() - stopped > CATCH_UP_MAX_S:
                    raise SystemExit(f"the slave did not catch up within {CATCH_UP_MAX_S}s")
                time.sleep(SAMPLE_S)
            case["catch_up_after_load_ms"] = round((time.monotonic() - stopped) * 1000)
            sampler.stop_event.set()
            sampler.join()
            delays = sampler.delays_ms()
            case.update(max_lag_messages=sampler.max_lag_messages,
                        lag_ms_p50=round(delays[len(delays) // 2], 1) if delays else None,
                        lag_ms_max=round(delays[-1], 1) if delays else None, lag_samples=len(delays),
                        identical_end_offsets=end_offsets(slave, topic) == want)
        return case


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--count", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--series", type=int, default=3)
    parser.add_argument("--modes", default="none,async,sync", help="which cases, in order (none, async, sync)")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="metaq-bench-repl-") as root:
        for _ in range(args.series):
            for mode in args.modes.split(","):
                case = run_case(mode, args.count, args.partitions, root)
                print(json.dumps(case), flush=True)
                rows.append(case)
    print("\n| case | produce msg/s | p50 / p99 ack ms | slave lag: max messages, p50 / max ms "
          "| slave catch-up after load, ms |")
    print("|---|---|---|---|---|")
    for row in rows:
        lag = (f"{row['max_lag_messages']:,}, {row['lag_ms_p50']} / {row['lag_ms_max']}" if row["slaves"] else "-")
        catch = str(row.get("catch_up_after_load_ms", "-"))
        print(f"| {CASES[row['mode']]} | {row['msgs_per_s']:,.0f} | "
              f"{row['p50_ack_ms']} / {row['p99_ack_ms']} | {lag} | {catch} |")


if __name__ == "__main__":
    main()
