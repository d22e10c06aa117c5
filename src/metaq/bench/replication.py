"""`metaq bench replication`: produce throughput and ack latency with no slave, one async slave and one sync slave,
in the same run, and the slave's lag under that load.

Each case starts a local cluster (:class:`metaq.devcluster.DevCluster`: a real ZooKeeper, broker 1 in ZooKeeper
mode, group commit; with its async slave, or in HA mode with ``syncReplication=true`` and its sync slave) and
measures it with `metaq bench produce --zk` (``send_batch`` of 1000 x 100 B, 16 in flight). Meanwhile the
master's log end and then the slave's are sampled every 50 ms: the lag in messages is their difference, the lag in
ms of a sample how long until the slave held what the master had then. After the load: how long the slave takes
to hold every message, and whether every partition ends at the same offset on both. The case without a slave is
the same-run baseline. Every loop is bounded by a count and a deadline.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from typing import Any

from metaq.bench.client_bench import BenchSpec, run_bench
from metaq.bench.report import BenchError, Report, each, markdown_table, median, require_known
from metaq.devcluster import DevCluster
from metaq.net.blocking import BlockingConnection
from metaq.net.codec import ConnectionSettings
from metaq.protocol import messages as m

SETTINGS = ConnectionSettings(client_id="bench-replication", connect_timeout_s=5.0, request_timeout_s=30.0,
                              max_in_flight=4, max_frame_bytes=64 << 20)
SAMPLE_S = 0.05
CATCH_UP_MAX_S = 300.0
CASES = {"none": "no slave", "async": "one async slave", "sync": "one sync slave"}


def stats(address: str) -> dict[str, Any]:
    host, port = address.rsplit(":", 1)
    conn = BlockingConnection.open((host, int(port)), SETTINGS)
    try:
        doc: dict[str, Any] = json.loads(conn.call(m.StatsRequest()).stats_json)
        return doc
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
    until the slave held that many messages (the replication delay a consumer of the slave sees). For a sync
    slave this includes batches written but not yet acknowledged.
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
                master_total = sum(e.get("log_end_offset", 0) for t in stats(self.master)["topics"].values()
                                   for e in t["partitions"].values())
                at = time.monotonic()
                slave_total = sum(e["log_end_offset"] for t in stats(self.slave)["replication"]["partitions"].values()
                                  for e in t.values())
            except (OSError, KeyError, ValueError):  # a broker busy past the timeout: the next sample
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


def _wait_in_sync(master: str, timeout_s: float = 60.0) -> None:
    """Sync mode: the bench starts only once the slave is in the in-sync set (else produces are refused)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if stats(master).get("replica_group", {}).get("isr"):
                return
        except OSError:
            pass
        time.sleep(SAMPLE_S)
    raise BenchError(f"the sync slave did not join the in-sync set within {timeout_s:.0f} s")


def run_case(mode: str, count: int, partitions: int, duration_s: float, root: str) -> dict[str, Any]:
    """One case (``none``, ``async`` or ``sync``) on a cluster of its own."""
    slaves = 0 if mode == "none" else 1
    system: dict[str, Any] = {"maxTransferSize": 1024 * 1024}
    if mode == "sync":
        system.update(syncReplication="true", minInSyncSlaves=1)
    cluster = DevCluster(os.path.join(root, f"cluster-{mode}-{time.monotonic_ns()}"), 1, partitions=partitions,
                         system=system, slaves=slaves, ha=mode == "sync")
    with cluster:
        master = cluster.brokers[1].servers
        slave = cluster.slaves[(1, 0)].servers if slaves else ""
        sampler = LagSampler(master, slave) if slaves else None
        if mode == "sync":
            _wait_in_sync(master)
        if sampler is not None:
            sampler.start()
        result = run_bench(BenchSpec(mode="produce", zk=cluster.zk_connect, zk_root=cluster.zk_root, count=count,
                                     partitions=partitions, concurrency=16, duration_s=duration_s))
        case: dict[str, Any] = {"mode": mode, "slaves": slaves, "msgs_per_s": result.msgs_per_s,
                                "messages": result.messages, "failures": result.failures,
                                "p50_ack_ms": result.latency_ms.get("p50"), "p99_ack_ms": result.latency_ms.get("p99")}
        if sampler is not None:
            stopped = time.monotonic()
            (topic,) = stats(master)["topics"]  # the bench's own topic, the only one
            want = end_offsets(master, topic)
            while end_offsets(slave, topic) != want:
                if time.monotonic() - stopped > CATCH_UP_MAX_S:
                    raise BenchError(f"the slave did not catch up within {CATCH_UP_MAX_S:.0f} s")
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


def run(count: int, partitions: int, series: int, modes: list[str], duration_s: float, report: Report,
        work_dir: str | None = None) -> dict[str, Any]:
    """``series`` times every case of ``modes``, in that order; every case's figures."""
    require_known("cases", modes, CASES)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="metaq-bench-replication-", dir=work_dir) as root:
        for n in range(1, series + 1):
            for mode in modes:
                case = {"series": n, **run_case(mode, count, partitions, duration_s, root)}
                runs.append(case)
                report(f"series {n}, {CASES[mode]}: {case['msgs_per_s']:,.0f} msg/s, ack p50/p99 "
                       f"{case['p50_ack_ms']} / {case['p99_ack_ms']} ms" + _lag(case, ", slave lag "))
    return {"count": count, "partitions": partitions, "runs": runs}


def _lag(case: dict[str, Any], prefix: str = "") -> str:
    if not case["slaves"]:
        return ""
    return (f"{prefix}max {case['max_lag_messages']:,} messages, p50 / max {case['lag_ms_p50']} / "
            f"{case['lag_ms_max']} ms, caught up {case['catch_up_after_load_ms']} ms after the load")


def table(result: dict[str, Any]) -> str:
    rows = []
    for mode in CASES:
        cases = [c for c in result["runs"] if c["mode"] == mode]
        if not cases:
            continue
        rates = [c["msgs_per_s"] for c in cases]
        rows.append([CASES[mode], each(rates), f"{median(rates):,.0f}",
                     each((c["p99_ack_ms"] or 0 for c in cases), "{}"),
                     " · ".join(_lag(c) or "-" for c in cases)])
    return markdown_table(["case", "produce msg/s, each series", "median", "ack p99 ms", "slave lag"], rows,
                          right=[2])
