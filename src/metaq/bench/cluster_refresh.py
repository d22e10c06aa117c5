"""`metaq bench cluster-refresh`: how fast a cluster-mode producer follows brokers joining and leaving.

A local cluster (:class:`~metaq.devcluster.DevCluster`: a real ZooKeeper and ``brokers`` broker
processes in ZooKeeper mode) with one topic on every broker; one producer session in cluster mode
(``zk_connect``) sends round robin all the time, one message after the other. Each round stops the
last broker (SIGTERM: it deregisters, then drains) and starts it again, and times, in milliseconds:

* **leave**: from the SIGTERM until a plain ZooKeeper watcher in the same process sees the broker's
  partitions of the topic gone (``watch``, the baseline: what any ZooKeeper client could know, read
  by the same registry code on its own session), until the producer's
  metadata no longer lists the broker's partitions (``metadata``); and how many sends failed meanwhile
  (the stopping broker's refusals are moved to other partitions, so 0 is expected);
* **join**: from the broker's registration (its master node's creation time, by ZooKeeper's clock on
  this machine) until the watcher sees it (``watch``), until the producer's metadata lists its
  partitions (``metadata``), and until the first message acknowledged by it (``used``).

The metadata is polled every millisecond on the producer's event loop, so figures are +-1 ms.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from metaq.bench.report import markdown_table
from metaq.client import Message, MessageSessionFactory
from metaq.devcluster import DevCluster

TOPIC = "refresh"
_POLL_S = 0.001


class _Watcher:
    """Which brokers a plain ZooKeeper watcher sees publishing the topic (master and topic nodes
    registered), and when (time.time()) each came or went."""

    def __init__(self, zk_connect: str, zk_root: str) -> None:
        from metaq.cluster.zookeeper import ZooKeeperRegistry  # kazoo only here

        self.registry = ZooKeeperRegistry(zk_connect, zk_root, read_only=True, connection_timeout_ms=10_000)
        self.seen: dict[int, float] = {}
        self.gone: dict[int, float] = {}
        self._lock = threading.Lock()

    def start(self) -> _Watcher:
        self.registry.start()
        self.registry.add_listener(self._on_snapshot)
        self._on_snapshot(self.registry.snapshot())
        return self

    def _on_snapshot(self, snapshot: Any) -> None:
        now = time.time()
        live = {p.broker_id for p in snapshot.partitions(TOPIC, publish=True)}  # what the producer's metadata says
        with self._lock:
            for b in live - set(self.seen):
                self.seen[b] = now
                self.gone.pop(b, None)
            for b in set(self.seen) - live:
                del self.seen[b]
                self.gone[b] = now

    def close(self) -> None:
        self.registry.close()


async def _until(conditions: dict[str, Callable[[], bool]], timeout_s: float) -> dict[str, float]:
    """Poll every condition every millisecond, side by side; the time.time() each first held."""
    deadline = time.monotonic() + timeout_s
    held: dict[str, float] = {}
    while True:
        now = time.time()
        for name, predicate in conditions.items():
            if name not in held and predicate():
                held[name] = now
        if len(held) == len(conditions):
            return held
        if time.monotonic() > deadline:
            missing = ", ".join(n for n in conditions if n not in held)
            raise TimeoutError(f"cluster-refresh: no {missing} within {timeout_s:g}s")
        await asyncio.sleep(_POLL_S)


async def _measure(cluster: DevCluster, watcher: _Watcher, rounds: int,
                   report: Callable[[str], None]) -> list[dict[str, Any]]:
    target_id = max(cluster.brokers)
    target = cluster.brokers[target_id]
    async with await MessageSessionFactory.connect(zk_connect=cluster.zk_connect, zk_root=cluster.zk_root) as session:
        producer = session.create_producer()
        core = session._core  # the metadata the producer routes by
        first_ack: dict[int, float] = {}
        failures = 0
        stop = asyncio.Event()

        async def send() -> None:
            nonlocal failures
            n = 0
            while not stop.is_set():
                result = await producer.send(Message(TOPIC, b"refresh %d" % n))
                n += 1
                if result.success:
                    first_ack.setdefault(result.broker_id, time.time())
                else:
                    failures += 1

        def listed() -> bool:
            tm = core.metadata.cache.get(TOPIC)
            return tm is not None and any(p.broker_id == target_id for p in tm.partitions)

        sender = asyncio.ensure_future(send())
        rows = []
        try:
            await _until({"first message": lambda: target_id in first_ack}, 30)
            for r in range(rounds):
                failed_before = failures
                t_stop = time.time()
                stopping = asyncio.ensure_future(asyncio.to_thread(target.stop))
                left = await _until({"watch": lambda: target_id in watcher.gone, "metadata": lambda: not listed()}, 30)
                await stopping
                leave_failures = failures - failed_before
                first_ack.pop(target_id, None)
                starting = asyncio.ensure_future(asyncio.to_thread(target.start))
                joined = await _until({"watch": lambda: target_id in watcher.seen, "metadata": listed,
                                       "used": lambda: target_id in first_ack}, 60)
                await starting
                registered = await asyncio.to_thread(watcher.registry.registered_at, target_id)
                if registered is None:
                    raise RuntimeError(f"broker {target_id} started but is not registered")
                t_watch_gone, t_meta_gone = left["watch"], left["metadata"]
                t_watch, t_meta, t_used = joined["watch"], joined["metadata"], joined["used"]
                row = {"round": r + 1,
                       "leave_watch_ms": _ms(t_watch_gone - t_stop), "leave_metadata_ms": _ms(t_meta_gone - t_stop),
                       "leave_failures": leave_failures,
                       "join_watch_ms": _ms(t_watch - registered), "join_metadata_ms": _ms(t_meta - registered),
                       "join_used_ms": _ms(t_used - registered)}
                rows.append(row)
                report("  round {round}: leave watch {leave_watch_ms} ms, metadata {leave_metadata_ms} ms, "
                       "{leave_failures} failed; join watch {join_watch_ms} ms, metadata {join_metadata_ms} ms, "
                       "used {join_used_ms} ms".format(**row))
        finally:
            stop.set()
            await sender
    return rows


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def run_cluster_refresh(brokers: int = 3, rounds: int = 5, partitions: int = 2,
                        report: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Start the cluster, measure ``rounds`` leave/join rounds of its last broker, stop it; the rows
    and, per figure, the median and the maximum."""
    if brokers < 2:
        raise ValueError("cluster-refresh needs at least 2 brokers (one leaves and joins, the others stay)")
    with tempfile.TemporaryDirectory(prefix="metaq-bench-") as tmp:
        topics = f"[topic={TOPIC}]\nnumPartitions={partitions}\n"
        with DevCluster(Path(tmp) / "cluster", brokers, partitions=partitions, topics=topics) as cluster:
            watcher = _Watcher(cluster.zk_connect, cluster.zk_root).start()
            try:
                rows = asyncio.run(_measure(cluster, watcher, rounds, report))
            finally:
                watcher.close()
    keys = [k for k in rows[0] if k != "round"]
    summary = {k: {"median": round(statistics.median(r[k] for r in rows), 1), "max": max(r[k] for r in rows)}
               for k in keys}
    return {"brokers": brokers, "rounds": rows, "summary": summary}


def table(result: dict[str, Any]) -> str:
    s = {k: f"{v['median']} ({v['max']})" for k, v in result["summary"].items()}
    return (f"{result['brokers']} brokers, the last one leaving (SIGTERM) and joining {len(result['rounds'])} times "
            "under round-robin sends; median (max) ms:\n\n"
            + markdown_table(["event", "a plain ZooKeeper watcher sees it (baseline)", "the producer's metadata has it",
                              "first message acknowledged by it"],
                             [["a broker leaves", s["leave_watch_ms"], s["leave_metadata_ms"],
                               f"(failed sends: {result['summary']['leave_failures']['max']} at most)"],
                              ["a broker joins", s["join_watch_ms"], s["join_metadata_ms"], s["join_used_ms"]]]))
