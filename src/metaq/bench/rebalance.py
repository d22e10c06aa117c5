"""`metaq bench rebalance`: rebalance time of a consumer group, from a change to the group's new assignment fully
running.

A change is a member joining (t0: its ``complete_subscribe()`` is called), a member leaving (t0: its
``close()`` is called), a broker leaving (t0: it is sent SIGTERM) or joining (t0: it is serving and
registered). The group has *settled* when every member holds a current assignment, the members'
partitions are disjoint and cover every partition the topic has on the live brokers, each of them has
a running worker (fetching), and — in cluster mode — every member has finished its rebalance (every
partition claimed in ZooKeeper). The members live in this process (one event loop, each its own
session and ZooKeeper session); the state is polled every millisecond.

It runs against a local cluster, once with ZooKeeper's group (``zk_connect``) and once with the
broker-coordinated group (``servers``: the same-run baseline), on the same brokers.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

from metaq.bench.report import Report, markdown_table
from metaq.client.group.config import ConsumerConfig
from metaq.client.group.consumer import GroupConsumer, create_consumer
from metaq.client.group.membership import ZooKeeperMembership
from metaq.client.session import MessageSessionFactory
from metaq.devcluster import DevCluster
from metaq.types import PartitionId

SETTLE_TIMEOUT_S = 60.0
_POLL_S = 0.001


class _Member:
    def __init__(self, session: MessageSessionFactory, consumer: GroupConsumer) -> None:
        self.session = session
        self.consumer = consumer

    def settled(self) -> bool:
        c = self.consumer
        if not c.assigned.is_set():
            return False
        m = c.membership
        if isinstance(m, ZooKeeperMembership) and (m.settled_at is None or set(c.workers) != m.claimed):
            return False
        return all(w.task is not None and not w.task.done() for w in c.workers.values())

    async def close(self) -> None:
        await self.consumer.close()
        await self.session.close()


async def _noop(msg: Any) -> None:
    return None


async def run_rebalance_bench(connect: dict[str, Any], topic: str, *, members: int = 3, rounds: int = 5,
                              broker_leave: Callable[[], None] | None = None,
                              broker_join: Callable[[], None] | None = None, broker_id: int = -1) -> dict[str, Any]:
    """Seconds to settle after each change, ``rounds`` times each; ``connect``: the session's options
    (``servers=...`` or ``zk_connect=..., zk_root=...``). ``broker_leave``/``broker_join`` (blocking)
    stop and start broker ``broker_id`` (not the lowest id: in standalone mode that one coordinates). A
    change after which the group does not settle within SETTLE_TIMEOUT_S counts as ``inf``."""
    group = f"bench-rebalance-{uuid.uuid4().hex[:8]}"
    recover_dir = tempfile.TemporaryDirectory(prefix="metaq-bench-recover-")  # removed at the end
    recover = recover_dir.name
    probe = await MessageSessionFactory.connect(**connect)
    group_members: list[_Member] = []

    async def start_member() -> _Member:
        session = await MessageSessionFactory.connect(**connect)
        consumer = create_consumer(session, ConsumerConfig(group=group, recover_dir=recover, fetch_runner_count=2))
        consumer.subscribe(topic, 64 * 1024, _noop)
        await consumer.complete_subscribe()
        return _Member(session, consumer)

    async def expected() -> set[PartitionId]:
        return {p.id for p in await probe.partitions(topic)}

    async def settle(want: set[PartitionId], t0: float) -> float:
        deadline = t0 + SETTLE_TIMEOUT_S
        while True:
            owned = [tp.partition for m in group_members for tp in m.consumer.workers if tp.topic == topic]
            if len(owned) == len(set(owned)) and set(owned) == want and all(m.settled() for m in group_members):
                return time.perf_counter() - t0
            if time.perf_counter() > deadline:
                raise TimeoutError(f"the group did not settle within {SETTLE_TIMEOUT_S:.0f}s")
            await asyncio.sleep(_POLL_S)

    timings: dict[str, list[float]] = {"member_join": [], "member_leave": []}
    try:
        for _ in range(members):
            group_members.append(await start_member())
        want = await expected()
        await settle(want, time.perf_counter())
        for _ in range(rounds):
            t0 = time.perf_counter()
            group_members.append(await start_member())
            timings["member_join"].append(await settle(want, t0))
            leaving = group_members.pop(0)
            t0 = time.perf_counter()
            await leaving.close()
            timings["member_leave"].append(await settle(want, t0))
        if broker_leave is not None and broker_join is not None:
            full = want
            without = {p for p in full if p.broker_id != broker_id}
            timings["broker_leave"], timings["broker_join"] = [], []
            for _ in range(rounds):
                t0 = time.perf_counter()
                await asyncio.to_thread(broker_leave)
                try:
                    timings["broker_leave"].append(await settle(without, t0))
                except TimeoutError:
                    timings["broker_leave"].append(float("inf"))
                await asyncio.to_thread(broker_join)
                t0 = time.perf_counter()
                try:
                    timings["broker_join"].append(await settle(full, t0))
                except TimeoutError:
                    timings["broker_join"].append(float("inf"))
                    break
    finally:
        for m in group_members:
            await m.close()
        await probe.close()
        recover_dir.cleanup()
    return {"members": members, "partitions": len(want), "rounds": rounds,
            **{k: _summary(v) for k, v in timings.items()}}


def _summary(values: list[float]) -> dict[str, Any]:
    ms = sorted(v * 1000 for v in values)
    return {"median_ms": round(statistics.median(ms), 1), "min_ms": round(ms[0], 1), "max_ms": round(ms[-1], 1),
            "timeouts": sum(1 for v in ms if v == float("inf"))}


CHANGES = {"member_join": "a member joins", "member_leave": "a member leaves",
           "broker_leave": "a broker leaves (SIGTERM)", "broker_join": "a broker joins"}


def run(brokers: int, partitions: int, members: int, rounds: int, brokers_churn: bool, report: Report,
        work_dir: str | None = None) -> dict[str, Any]:
    """A local cluster of ``brokers`` (a real ZooKeeper, ZooKeeper mode, ``partitions`` on each) and on it the
    ZooKeeper-coordinated group, then the broker-coordinated one (the baseline), ``rounds`` of every change."""
    topic = "rebalance"
    runs = []
    with tempfile.TemporaryDirectory(prefix="metaq-bench-rebalance-", dir=work_dir) as tmp, \
            DevCluster(f"{tmp}/cluster", brokers, partitions=partitions,
                       topics=f"[topic={topic}]\nnumPartitions={partitions}\n") as cluster:
        last = cluster.brokers[brokers]
        churn: dict[str, Any] = {} if not brokers_churn else {
            "broker_leave": lambda: last.stop_or_kill(30), "broker_join": last.start, "broker_id": brokers}
        for coordination, connect in (("zookeeper", {"zk_connect": cluster.zk_connect, "zk_root": cluster.zk_root}),
                                      ("broker", {"servers": cluster.servers})):
            result = asyncio.run(run_rebalance_bench(connect, topic, members=members, rounds=rounds, **churn))
            runs.append({"coordination": coordination, "brokers": brokers, **result})
            report(f"{coordination}-coordinated group: " + ", ".join(
                f"{CHANGES[k]} {v['median_ms']} ms" for k, v in result.items() if k in CHANGES))
    return {"runs": runs}


def table(result: dict[str, Any]) -> str:
    by = {r["coordination"]: r for r in result["runs"]}
    first = result["runs"][0]
    rows = [[label, *(f"{by[c][k]['median_ms']:,} ({by[c][k]['min_ms']:,}-{by[c][k]['max_ms']:,})"
                      + (f", {by[c][k]['timeouts']} timed out" if by[c][k]["timeouts"] else "") for c in by)]
            for k, label in CHANGES.items() if k in first]
    return (f"{first['brokers']} brokers, {first['partitions']} partitions, {first['members']} members, "
            f"{first['rounds']} rounds; median (min-max) ms to settle:\n\n"
            + markdown_table(["change", *(f"{c}-coordinated group" + (" (baseline)" if c == "broker" else "")
                                          for c in by)], rows))
