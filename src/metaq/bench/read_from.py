"""`metaq bench read-from`: consumers reading a master or its async slave (``read_from``), in the same run, and how
long a ``prefer-slave`` consumer's deliveries stop when its slave is killed -9.

One local cluster (:class:`metaq.devcluster.DevCluster`: a real ZooKeeper, broker 1 in ZooKeeper mode and its async
slave 0, group commit), a topic of ``partitions`` partitions preloaded with ``count`` messages of 100 B and fully
replicated, then ``series`` times, the two in turn (the master first in odd series, the slave first in even ones):

* **read**: a cluster-mode session with ``read_from="master"`` and one with ``read_from="slave"`` fetch every
  partition from its start to its end (the pull consumer's Fetcher, 1 MiB per fetch, all partitions at once):
  messages per second. The master is the same-run baseline.

Then once, **a dead slave**: a ``prefer-slave`` consumer iterates partition 1-0 (long polling) while a producer
sends one message every 5 ms; the slave is killed -9; measured: from the kill to the first delivery of a message
sent after it (read from the master), and whether every message sent was delivered exactly once, in order.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from typing import Any

from metaq.bench.report import BenchError, Report, each, markdown_table, median
from metaq.client import Message, MessageSessionFactory
from metaq.devcluster import DevCluster
from metaq.types import PartitionId

TOPIC = "bench-read-from"
PAYLOAD = bytes(100)


async def preload(cluster: DevCluster, count: int) -> dict[PartitionId, int]:
    async with await MessageSessionFactory.connect(zk_connect=cluster.zk_connect, zk_root=cluster.zk_root) as s:
        producer = s.create_producer()
        sent = 0
        while sent < count:
            n = min(10_000, count - sent)
            results = await producer.send_batch(TOPIC, [PAYLOAD] * n)
            if not all(r.success for r in results):
                raise BenchError("the preload failed")
            sent += n
        reader = s.create_pull_consumer()
        return {p.id: (await reader.offsets(TOPIC, p))[1] for p in await s.partitions(TOPIC)}


async def replicated(cluster: DevCluster, ends: dict[PartitionId, int]) -> None:
    async with await MessageSessionFactory.connect(zk_connect=cluster.zk_connect, zk_root=cluster.zk_root,
                                                   read_from="slave") as s:
        reader = s.create_pull_consumer()
        deadline = time.monotonic() + 300
        while [p for p, end in ends.items() if (await reader.offsets(TOPIC, p))[1] < end]:
            if time.monotonic() > deadline:
                raise BenchError("the slave did not catch up within 300 s")
            await asyncio.sleep(0.1)


async def read_all(cluster: DevCluster, read_from: str, ends: dict[PartitionId, int]) -> dict[str, Any]:
    async with await MessageSessionFactory.connect(zk_connect=cluster.zk_connect, zk_root=cluster.zk_root,
                                                   read_from=read_from) as s:
        consumer = s.create_pull_consumer()
        parts = {p.id: p for p in await s.partitions(TOPIC)}
        got = 0

        async def drain(pid: PartitionId) -> None:
            nonlocal got
            offset = 0
            while offset < ends[pid]:
                result = await consumer.fetcher.fetch(TOPIC, parts[pid], offset, max_bytes=1 << 20)
                got += len(result.messages)
                offset = result.next_offset

        start = time.perf_counter()
        await asyncio.gather(*(drain(p) for p in ends))
        seconds = time.perf_counter() - start
    return {"case": "read", "read_from": read_from, "messages": got, "seconds": round(seconds, 3),
            "msgs_per_s": round(got / seconds)}


async def kill_slave_while_tailing(cluster: DevCluster) -> dict[str, Any]:
    """A prefer-slave consumer tails partition 1-0 while one message goes out every 5 ms; the slave dies."""
    pid = PartitionId(1, 0)
    async with await MessageSessionFactory.connect(zk_connect=cluster.zk_connect, zk_root=cluster.zk_root) as ps, \
            await MessageSessionFactory.connect(zk_connect=cluster.zk_connect, zk_root=cluster.zk_root,
                                                read_from="prefer-slave") as cs:
        producer = ps.create_producer(selector=lambda topic, partitions, message: partitions[0])  # 1-0
        start_offset = (await cs.create_pull_consumer().offsets(TOPIC, pid))[1]
        sent: list[bytes] = []
        received: list[tuple[int, bytes, float]] = []
        stop = asyncio.Event()

        async def produce() -> None:
            i = 0
            while not stop.is_set():
                value = b"%d:%d" % (i, time.time_ns())
                result = await producer.send(Message(TOPIC, value))
                if not result.success:
                    raise BenchError(f"a send failed: {result}")
                sent.append(value)
                i += 1
                await asyncio.sleep(0.005)

        async def tail() -> None:
            async for msg in cs.create_pull_consumer().iterate(TOPIC, pid, start_offset, max_wait_ms=500):
                received.append((msg.offset, bytes(msg.data), time.time()))

        tasks = [asyncio.create_task(produce()), asyncio.create_task(tail())]
        await asyncio.sleep(2.0)  # steady state: reading the slave
        killed_at = time.time()
        slave = cluster.slaves[(1, 0)]
        await asyncio.to_thread(slave.kill)
        await asyncio.sleep(3.0)
        stop.set()
        await tasks[0]
        deadline = time.monotonic() + 30
        while len(received) < len(sent) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        tasks[1].cancel()
        await asyncio.gather(tasks[1], return_exceptions=True)
    after = [at for _, value, at in received if int(value.split(b":")[1]) / 1e9 > killed_at]
    values = [v for _, v, _ in received]
    return {"case": "slave killed under prefer-slave", "sent": len(sent), "received": len(received),
            "exactly_once_in_order": values == sent,
            "kill_to_first_new_delivery_ms": round((after[0] - killed_at) * 1000, 1) if after else None}


async def _run(count: int, partitions: int, series: int, report: Report, work_dir: str | None) -> dict[str, Any]:
    reads: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="metaq-bench-read-from-", dir=work_dir) as tmp:
        topics = f"[topic={TOPIC}]\nnumPartitions={partitions}\n"
        system = {"unflushThreshold": 0, "maxTransferSize": 1 << 20}
        with DevCluster(os.path.join(tmp, "cluster"), 1, partitions=partitions, topics=topics, system=system,
                        slaves=1) as cluster:
            ends = await preload(cluster, count)
            await replicated(cluster, ends)
            for n in range(1, series + 1):
                for read_from in ("master", "slave") if n % 2 else ("slave", "master"):  # both orders
                    row = {"series": n, **await read_all(cluster, read_from, ends)}
                    reads.append(row)
                    report(f"series {n}, read from the {read_from}: {row['msgs_per_s']:,} msg/s")
            killed = await kill_slave_while_tailing(cluster)
            report(f"slave killed -9 under a prefer-slave consumer: first new message delivered "
                   f"{killed['kill_to_first_new_delivery_ms']} ms after the kill; {killed['sent']} sent, "
                   f"{killed['received']} delivered, exactly once in order: {killed['exactly_once_in_order']}")
    return {"count": count, "partitions": partitions, "reads": reads, "slave_killed": killed}


def run(count: int, partitions: int, series: int, report: Report, work_dir: str | None = None) -> dict[str, Any]:
    return asyncio.run(_run(count, partitions, series, report, work_dir))


def table(result: dict[str, Any]) -> str:
    by = {where: [r["msgs_per_s"] for r in result["reads"] if r["read_from"] == where] for where in ("master", "slave")}
    killed = result["slave_killed"]
    rows = [[f"read, from the {where}", each(rates), f"{median(rates):,.0f}"] for where, rates in by.items()]
    rows.append(["the slave killed -9 under a prefer-slave consumer: kill to the first new message delivered",
                 f"{killed['kill_to_first_new_delivery_ms']} ms",
                 f"{killed['received']} of {killed['sent']} delivered"
                 + (", exactly once, in order" if killed["exactly_once_in_order"] else ", NOT exactly once in order")])
    return markdown_table(["case", "msg/s, each series", "median"], rows, right=[2])
