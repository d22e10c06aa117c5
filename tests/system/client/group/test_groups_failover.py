"""Consumers in child processes: kill -9, graceful leave, many rebalances — nothing lost, duplicates bounded.

Each child consumer appends one line per delivered message to its own file with a single ``write``
(kernel page cache: it survives the child's kill -9), so the test knows exactly what every member
was handed and when.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvloop

from metaq.client import MessageSessionFactory
from metaq.client.group.admin import describe_group
from metaq.errors import UnknownGroupError
from metaq.testing import produce_blocking
from metaq.testing.broker import BrokerProcess, wait_until

SESSION_MS = 2000
COMMIT_MS = 500

CHILD = r'''
import asyncio, os, sys, time, signal, logging
logging.basicConfig(level=os.environ.get("METAQ_CHILD_LOG", "WARNING"), stream=sys.stderr)
from metaq.client import MessageSessionFactory
from metaq.client.group import ConsumerConfig, create_consumer

servers, group, topic, out_path, work_ms = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])
fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

def listener(msg):
    if work_ms:
        time.sleep(work_ms / 1000)
    os.write(fd, b"%d %d %.6f\n" % (msg.partition, msg.offset, time.time()))

async def main():
    session = await MessageSessionFactory.connect(servers)
    cfg = ConsumerConfig(group=group, session_timeout_ms=SESSION_MS, rebalance_timeout_ms=SESSION_MS * 3,
                         commit_offset_period_ms=COMMIT_MS, max_delay_fetch_ms=300, fetch_runner_count=4,
                         recover_dir=out_path + ".recover", consumer_id=os.path.basename(out_path))
    consumer = create_consumer(session, cfg).subscribe(topic, 16 * 1024, listener)
    await consumer.complete_subscribe()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await consumer.close()
    await session.close()

asyncio.run(main())
'''.replace("SESSION_MS", str(SESSION_MS)).replace("COMMIT_MS", str(COMMIT_MS))


@dataclass
class Delivery:
    partition: int
    offset: int
    at: float


class Child:
    def __init__(self, tmp: Path, name: str, servers: str, group: str, topic: str, work_ms: float) -> None:
        self.out = tmp / name
        self.out.touch()
        script = tmp / "child.py"
        if not script.exists():
            script.write_text(CHILD)
        self.proc = subprocess.Popen([sys.executable, str(script), servers, group, topic, str(self.out), str(work_ms)],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.killed_at: float | None = None

    def deliveries(self) -> list[Delivery]:
        out = []
        for line in self.out.read_bytes().splitlines():
            p, o, t = line.split()
            out.append(Delivery(int(p), int(o), float(t)))
        return out

    def count(self) -> int:
        return self.out.read_bytes().count(b"\n")

    def kill9(self) -> None:
        self.killed_at = time.time()
        self.proc.kill()
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)


def group_state(servers: str, group: str) -> Any:
    async def go() -> Any:
        async with await MessageSessionFactory.connect(servers) as session:
            return await describe_group(session, group)
    return uvloop.run(go())


def produce(servers: str, topic: str, partitions: int, n: int) -> None:
    """``topic`` created with ``partitions`` partitions and messages 0 .. n-1 spread evenly: every member has work."""
    produce_blocking(servers, topic, [b"%d" % j for j in range(n)], spread=True, create_partitions=partitions)


def stable_with(servers: str, group: str, members: int, partitions: int) -> bool:
    try:
        d = group_state(servers, group)
    except UnknownGroupError:  # nobody has joined yet
        return False
    owned = [p for mb in d.members for a in mb.assignment.values() for p in a]
    return d.state == "Stable" and len(d.members) == members and len(owned) == partitions


def test_kill9_moves_partitions_and_duplicates_only_since_the_last_commit(
        broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    broker = broker_factory({"numPartitions": 12})
    n = 6000
    produce(broker.servers, "jobs", 12, n)
    children = [Child(tmp_path, f"c{i}", broker.servers, "workers", "jobs", 5) for i in range(3)]
    try:
        wait_until(lambda: stable_with(broker.servers, "workers", 3, 12), 30, 0.1, "three members")
        victim = children[0]
        wait_until(lambda: victim.count() >= 300, 30, 0.01, "the victim consuming")
        before = group_state(broker.servers, "workers")
        victim_parts = {p.partition for mb in before.members if mb.client_id == "c0" for p in mb.assignment["jobs"]}
        victim.kill9()
        assert victim.killed_at is not None
        survivors = children[1:]
        # every message is delivered, by someone
        wait_until(lambda: len({(d.partition, d.offset) for c in children for d in c.deliveries()}) == n,
                   60, 0.05, "every message delivered")
        took_over = min(d.at for c in survivors for d in c.deliveries()
                        if d.partition in victim_parts and d.at > victim.killed_at)
        takeover_s = took_over - victim.killed_at
        # the coordinator drops the dead member after its session timeout; survivors learn at their next
        # heartbeat (a third of it), commit, rejoin
        assert takeover_s < 2 * SESSION_MS / 1000 + 2, takeover_s
        counts = Counter((d.partition, d.offset) for c in children for d in c.deliveries())
        dups = {k for k, v in counts.items() if v > 1}
        victim_first = {(d.partition, d.offset): d.at for d in victim.deliveries()}
        for key in dups:
            # only the killed member's uncommitted tail is delivered twice ...
            assert key in victim_first, f"{key} duplicated but never reached the killed member"
            # ... and only what it got within one commit period (plus a commit's round trip) of dying
            assert victim_first[key] >= victim.killed_at - COMMIT_MS / 1000 - 0.5, key
        print(f"kill -9: takeover {takeover_s:.2f}s, {len(dups)} duplicates "
              f"(victim had {len(victim_first)} deliveries)")
        for c in survivors:
            c.stop()
            assert c.proc.returncode == 0, c.proc.stderr.read() if c.proc.stderr else ""
    finally:
        for c in children:
            c.stop()


def test_graceful_leave_and_join_deliver_everything_exactly_once(
        broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    broker = broker_factory({"numPartitions": 6})
    n = 3000
    produce(broker.servers, "tasks", 6, n)
    a = Child(tmp_path, "a", broker.servers, "g", "tasks", 10)
    children = [a]
    try:
        wait_until(lambda: a.count() >= 200, 30, 0.01, "a consuming")
        b = Child(tmp_path, "b", broker.servers, "g", "tasks", 10)
        children.append(b)
        wait_until(lambda: b.count() >= 100, 30, 0.01, "b consuming after the rebalance")
        a.stop()  # SIGTERM: commit, leave
        assert a.proc.returncode == 0
        wait_until(lambda: a.count() + b.count() >= n, 60, 0.05, "everything")
        counts = Counter((d.partition, d.offset) for c in children for d in c.deliveries())
        assert len(counts) == n and max(counts.values()) == 1
    finally:
        for c in children:
            c.stop()


@pytest.mark.slow
def test_many_real_rebalances_leave_no_partition_unowned(
        broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    broker = broker_factory({"numPartitions": 8})
    n = 4000
    produce(broker.servers, "churn", 8, n)
    children: list[Child] = []
    live: list[Child] = []
    try:
        for i in range(12):
            if len(live) < 3 or i % 3 == 0:
                c = Child(tmp_path, f"m{i}", broker.servers, "churners", "churn", 3)
                children.append(c)
                live.append(c)
            else:
                victim = live.pop(0)
                if i % 2:
                    victim.kill9()
                else:
                    victim.stop()
            wait_until(lambda: stable_with(broker.servers, "churners", len(live), 8), 30, 0.1,
                       f"a stable group after step {i}")
        wait_until(lambda: len({(d.partition, d.offset) for c in children for d in c.deliveries()}) == n,
                   90, 0.1, "every message delivered")
        d = group_state(broker.servers, "churners")
        assert sorted(str(p) for mb in d.members for p in mb.assignment["churn"]) == [f"0-{p}" for p in range(8)]
        assert d.generation >= 12
    finally:
        for c in children:
            c.stop()


def test_broadcast_members_each_get_everything(broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    broker = broker_factory({"numPartitions": 4})

    async def main() -> None:
        from metaq.client.group import ConsumerConfig, LocalFileOffsetStorage, create_consumer

        session = await MessageSessionFactory.connect(broker.servers)
        await session.admin().create_topic("bcast", 4)
        producer = session.create_producer()
        await producer.send_batch("bcast", [b"%d" % i for i in range(400)])
        await producer.flush()
        boxes: list[Counter[bytes]] = [Counter() for _ in range(3)]
        consumers = []
        for i, box in enumerate(boxes):
            cfg = ConsumerConfig(group="everyone", broadcast=True, consumer_id=f"host{i}", recover_dir=tmp_path,
                                 commit_offset_period_ms=200, max_delay_fetch_ms=300)
            c = create_consumer(session, cfg, LocalFileOffsetStorage(tmp_path / "offsets"))
            c.subscribe("bcast", 8192, lambda msg, box=box: box.update([bytes(msg.data)]))
            await c.complete_subscribe()
            consumers.append(c)
        deadline = time.monotonic() + 30
        while not all(len(b) == 400 for b in boxes):
            assert time.monotonic() < deadline, [len(b) for b in boxes]
            await asyncio.sleep(0.01)
        assert all(max(b.values()) == 1 for b in boxes)
        for c in consumers:
            await c.close()
        await session.close()

    uvloop.run(main())

