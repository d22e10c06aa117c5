"""`metaq bench produce|consume|e2e`: throughput and latency through the real client and broker.

Workers are separate processes (spawned), so the figures include the protocol, the sockets and the
broker, exactly as a user's producer sees them. Every loop is bounded by a message count and a deadline.

The brokers measured: an embedded broker started for the run (the default), ``servers``, a local
cluster started for the run (``brokers``: a real ZooKeeper and N brokers in ZooKeeper mode, through
:class:`metaq.devcluster.DevCluster`), or a running cluster found in ZooKeeper (``zk``). With several
brokers the topic gets ``partitions`` partitions on each of them and the clients are given every broker.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from metaq.bench.baselines import (
    FDATASYNC_SAMPLES,
    LOOPBACK_SAMPLES,
    measure_fdatasync,
    measure_loopback_rtt,
    percentiles,
)
from metaq.bench.client_spec import FLUSH_MODES, BenchResult, BenchSpec
from metaq.bench.client_workers import latency_by_place, worker_entry
from metaq.bench.processes import children_ignore_sigint, pin_process, process_cpu_s
from metaq.broker.launcher import BrokerLauncher
from metaq.client.config import ClientConfig
from metaq.devcluster import DevCluster

if TYPE_CHECKING:
    from metaq.cluster.zk_security import ZkSecurity

__all__ = ["FLUSH_MODES", "BenchResult", "BenchSpec", "Progress", "run_bench", "run_workers", "servers_from_zookeeper"]


class Progress:
    def __init__(self, enabled: bool, total: int, label: str) -> None:
        self.enabled = enabled
        self.total = total
        self.label = label
        self._bar: Any = None

    def __enter__(self) -> Progress:
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), transient=True)
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=self.total)
        return self

    def update(self, done: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=min(done, self.total))

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()


def run_workers(kind: str, spec: BenchSpec, n: int, show: Progress,
                 before_wait: Callable[[list[Any]], None] | None = None) -> list[dict[str, Any]]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    counters = [ctx.Value("q", 0, lock=False) for _ in range(n)]
    procs = [ctx.Process(target=worker_entry, args=(kind, spec, i, counters[i], out), daemon=True) for i in range(n)]
    with children_ignore_sigint():  # Ctrl-C is the parent's: it stops the run, workers die with it
        for p in procs:
            p.start()
    if before_wait is not None:
        before_wait(counters)
    results: list[dict[str, Any]] = []
    deadline = time.monotonic() + spec.duration_s + 120
    while len(results) < n:
        try:
            results.append(out.get(timeout=0.1))
        except Exception:
            if time.monotonic() > deadline:
                for p in procs:
                    p.kill()
                raise TimeoutError(f"bench workers did not finish within {spec.duration_s + 120:.0f}s") from None
            if not any(p.is_alive() for p in procs) and out.empty():
                raise RuntimeError("bench workers exited without a result") from None
        show.update(sum(max(0, c.value) for c in counters))
    for p in procs:
        p.join(10)
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise RuntimeError("bench worker failed: " + "; ".join(errors))
    return results


def _preload(spec: BenchSpec, show: Progress) -> None:
    """Fill the topic for a consume run with the batch API (not measured)."""
    load = BenchSpec(**{**asdict(spec), "mode": "produce", "api": "batch", "processes": 1, "duration_s": 600})
    run_workers("produce", load, 1, show)


def servers_from_zookeeper(zk: str, root: str, *, tls: bool = False, security: ZkSecurity | None = None) -> str:
    """The masters registered in a cluster's ZooKeeper, ``host:port,...`` (their TLS ports with ``tls``;
    ValueError if none); ``security``: how to reach ZooKeeper."""
    from metaq.cluster.zookeeper import ZooKeeperRegistry  # kazoo only for --zk

    registry = ZooKeeperRegistry(zk, root, connection_timeout_ms=10_000, read_only=True, security=security).start()
    try:
        snapshot = registry.snapshot()
        servers = (snapshot.over_tls() if tls else snapshot).servers()
    finally:
        registry.close()
    if not servers:
        raise ValueError(f"no metaq broker is registered in ZooKeeper at {zk} under {root}")
    return servers


def run_bench(spec: BenchSpec, *, progress: bool = False) -> BenchResult:
    if not spec.topic:
        spec.topic = f"bench-{spec.mode}-{os.getpid()}-{int(time.time())}"
    broker = None
    cluster = None
    given = spec.servers
    tmp = None
    if spec.zk is not None:
        zk_options = {k: spec.tls.pop(k) for k in list(spec.tls) if k.startswith("zk_")}
        spec.servers = servers_from_zookeeper(spec.zk, spec.zk_root, tls=bool(spec.tls.get("tls")),
                                              security=ClientConfig(**zk_options).zk_security())
    elif spec.servers is None:
        tmp = tempfile.TemporaryDirectory(prefix="metaq-bench-")
        system = {"unflushThreshold": spec.flush_threshold(), "maxTransferSize": 1024 * 1024}
        if spec.brokers:
            cluster = DevCluster(os.path.join(tmp.name, "cluster"), spec.brokers, partitions=spec.partitions,
                                 system=system).start()
            spec.servers = cluster.servers
        else:
            broker = BrokerLauncher(os.path.join(tmp.name, "data"), {"numPartitions": spec.partitions, **system,
                                                                     "event-loop": spec.event_loop}).start()
            spec.servers = broker.servers
            if spec.cpus is not None and spec.cpus[0] is not None and broker.pid is not None:
                pin_process(broker.pid, spec.cpus[0])
    probe_dir = os.path.join(tmp.name, "data") if broker is not None and tmp is not None else None
    try:
        return _run(spec, progress, spec.servers or "", probe_dir, broker.pid if broker is not None else None)
    finally:
        if broker is not None:
            broker.stop()
        if cluster is not None:
            cluster.stop()
        spec.servers = given
        if tmp is not None:
            tmp.cleanup()


def _create_topic(spec: BenchSpec) -> None:
    async def go() -> None:
        from metaq.client import MessageSessionFactory
        from metaq.errors import TopicExistsError

        async with await MessageSessionFactory.connect(spec.servers or "", **spec.tls) as session:
            admin = session.admin()
            for broker_id in await admin.broker_ids():  # the topic spread over every broker
                try:
                    await admin.create_topic(spec.topic, spec.partitions, broker_id=broker_id)
                except TopicExistsError:
                    pass

    asyncio.run(go())


def _run(spec: BenchSpec, progress: bool, servers: str, probe_dir: str | None = None,
         broker_pid: int | None = None) -> BenchResult:
    _create_topic(spec)
    placement: dict[str, list[int]] = {}
    fsyncs: list[float] = []
    round_trips: list[float] = []
    client_rate = 0.0
    cpu: dict[str, float] = {}
    by_place: dict[str, dict[str, float]] = {}
    probe = probe_dir if spec.mode == "e2e" and spec.flush_threshold() == 1 else None
    if spec.mode == "produce":
        broker_cpu = process_cpu_s(broker_pid) if broker_pid is not None else None
        with Progress(progress, spec.count, f"produce ({spec.api})") as show:
            results = run_workers("produce", spec, spec.processes, show)
        seconds = max(r["seconds"] for r in results)
        messages = sum(r["messages"] for r in results)
        if messages:
            cpu["client"] = round(sum(r["cpu_s"] for r in results) / messages * 1e6, 3)
            broker_end = process_cpu_s(broker_pid) if broker_pid is not None else None
            if broker_cpu is not None and broker_end is not None:
                cpu["broker"] = round((broker_end - broker_cpu) / messages * 1e6, 3)
        latencies = [x for r in results for x in r["latencies"]]
        nbytes = messages * spec.size
    elif spec.mode == "consume":
        with Progress(progress, spec.count, "preload") as show:
            _preload(spec, show)
        with Progress(progress, spec.count, "consume") as show:
            results = run_workers("consume", spec, spec.processes, show)
        seconds = max(r["seconds"] for r in results)
        messages = sum(r["messages"] for r in results)
        nbytes = sum(r["bytes"] for r in results)
        latencies = []
        cpu_s = sum(r.get("cpu_seconds", 0.0) for r in results)
        client_rate = round(messages / cpu_s, 1) if cpu_s > 0 else 0.0
    elif spec.mode == "e2e":
        total = min(spec.count, int(spec.rate * spec.duration_s))
        with Progress(progress, total, f"e2e at {spec.rate} msg/s") as show:
            ctx = mp.get_context("spawn")
            out = ctx.Queue()
            cprog = ctx.Value("q", 0, lock=False)
            consumer = ctx.Process(target=worker_entry, args=("e2e-consumer", spec, 0, cprog, out), daemon=True)
            with children_ignore_sigint():
                consumer.start()
            deadline = time.monotonic() + 60
            while cprog.value != -1 and time.monotonic() < deadline and consumer.is_alive():
                time.sleep(0.01)
            time.sleep(0.5)  # the consumer's first long polls are in place; not a correctness wait
            if probe is not None:
                fsyncs += measure_fdatasync(probe, FDATASYNC_SAMPLES // 2)
            if probe_dir is not None:
                round_trips += measure_loopback_rtt(LOOPBACK_SAMPLES // 2, spec.size)
            presults = run_workers("e2e-producer", spec, 1, show)
            cres = out.get(timeout=spec.duration_s + 60)
            consumer.join(10)
            if probe is not None:
                fsyncs += measure_fdatasync(probe, FDATASYNC_SAMPLES - FDATASYNC_SAMPLES // 2)
            if probe_dir is not None:
                round_trips += measure_loopback_rtt(LOOPBACK_SAMPLES - LOOPBACK_SAMPLES // 2, spec.size)
            if "error" in cres:
                raise RuntimeError("e2e consumer failed: " + cres["error"])
        seconds = presults[0]["seconds"]
        messages = cres["messages"]
        latencies = cres["latencies"]
        if spec.pacing == "tick":
            by_place = latency_by_place(latencies, cres["places"])
        nbytes = messages * spec.size
        results = [*presults, cres]
        if broker_pid is not None:
            try:
                placement["broker"] = sorted(os.sched_getaffinity(broker_pid))
            except OSError:
                pass
            placement.update(producer=presults[0].get("cpus", []), consumer=cres.get("cpus", []))
    else:
        raise ValueError(f"unknown bench mode {spec.mode!r}")
    failures = sum(r.get("failures", 0) for r in results)
    seconds = max(seconds, 1e-9)
    return BenchResult(spec.mode, spec.api, messages, nbytes, round(seconds, 3), round(messages / seconds, 1),
                       round(nbytes / seconds / 1e6, 2), percentiles(latencies), failures,
                       {k: v for k, v in asdict(spec).items() if k != "servers"}, servers, percentiles(fsyncs),
                       percentiles(round_trips), client_rate, cpu, placement, by_place)
