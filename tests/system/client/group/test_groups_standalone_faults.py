"""A consumer group over two standalone brokers, one of them killed with kill -9 and restarted: the other
broker's partitions go on being consumed, and the history shows nothing skipped and duplicates only within
one commit period, only on the killed broker's partitions (docs/consumers.md, "Standalone groups").

Two consumers in child processes each append one line per delivery with a single ``write`` (the kernel
keeps it through anything that happens to the child); the test process produces sequence-numbered
messages to every partition of both brokers the whole time and records what each send answered.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

import uvloop

from metaq.client import MessageSessionFactory
from metaq.testing.broker import BrokerProcess, wait_until

SESSION_MS = 2000
COMMIT_MS = 500
PARTITIONS = ["1-0", "1-1", "2-0", "2-1"]

CHILD = r'''
import asyncio, os, sys, signal, logging, time
logging.basicConfig(level=os.environ.get("METAQ_CHILD_LOG", "WARNING"), stream=sys.stderr)
from metaq.client import MessageSessionFactory
from metaq.client.group import ConsumerConfig, create_consumer

servers, out_path = sys.argv[1], sys.argv[2]
fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

def listener(msg):
    os.write(fd, b"%s %d %s %.6f\n" % (str(msg.partition_id).encode(), msg.offset, bytes(msg.data), time.time()))

async def main():
    session = await MessageSessionFactory.connect(servers)
    cfg = ConsumerConfig(group="workers", session_timeout_ms=SESSION_MS, rebalance_timeout_ms=SESSION_MS * 3,
                         commit_offset_period_ms=COMMIT_MS, max_delay_fetch_ms=300, recover_dir=out_path + ".recover")
    consumer = create_consumer(session, cfg).subscribe("jobs", 16 * 1024, listener)
    await consumer.complete_subscribe()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await consumer.close()
    await session.close()

asyncio.run(main())
'''.replace("SESSION_MS", str(SESSION_MS)).replace("COMMIT_MS", str(COMMIT_MS))


class Child:
    def __init__(self, tmp: Path, name: str, servers: str) -> None:
        self.out = tmp / name
        self.out.touch()
        script = tmp / "child.py"
        if not script.exists():
            script.write_text(CHILD)
        self.proc = subprocess.Popen([sys.executable, str(script), servers, str(self.out)], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def deliveries(self) -> list[tuple[str, int, bytes, float]]:
        out = []
        for line in self.out.read_bytes().splitlines():
            partition, offset, data, at = line.split()
            out.append((partition.decode(), int(offset), data, float(at)))
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)


class Producer:
    """One task per partition, sending sequence-numbered messages; records (partition, offset, data, time)
    of every acknowledged send and the data of every send that failed (it may or may not be stored).
    Each broker's partitions are sent to over a session given only that broker: a batch never moves to
    the other broker's partitions while one is down."""

    def __init__(self, servers: dict[int, str]) -> None:
        self.servers = servers
        self.acked: list[tuple[str, int, bytes, float]] = []
        self.failed: set[bytes] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: uvloop.run(self._main()), daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    async def _main(self) -> None:
        sessions = {b: await MessageSessionFactory.connect(servers, request_timeout_s=5)
                    for b, servers in self.servers.items()}
        producers = {b: session.create_producer() for b, session in sessions.items()}

        async def partition_loop(partition: str) -> None:
            producer = producers[int(partition.split("-")[0])]
            seq = 0
            while not self._stop.is_set():
                data = f"{partition}/{seq}".encode()
                seq += 1
                try:
                    batch = await producer.send_batch("jobs", [data], partition=partition, timeout_s=5)
                    result = batch[0] if batch.success else None
                except Exception:
                    result = None
                if result is not None:
                    self.acked.append((str(result.partition_id), result.offset, data, time.time()))
                else:
                    self.failed.add(data)
                    await asyncio.sleep(0.05)  # the broker is down: do not spin
                await asyncio.sleep(0.01)  # pacing, about 100 messages a second per partition

        await asyncio.gather(*(partition_loop(p) for p in PARTITIONS))
        for producer in producers.values():
            await producer.close()
        for session in sessions.values():
            await session.close()


def test_killing_one_standalone_broker_stops_only_its_partitions_and_redelivers_one_commit_period(
        broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    options = {"numPartitions": 2, "unflushThreshold": 0}
    b1 = broker_factory({"brokerId": 1, **options}, name="broker-1")
    b2 = broker_factory({"brokerId": 2, **options}, name="broker-2")
    servers = f"{b1.servers},{b2.servers}"

    async def create() -> None:
        async with await MessageSessionFactory.connect(servers) as session:
            for broker_id in (1, 2):
                await session.admin().create_topic("jobs", 2, broker_id=broker_id)
    uvloop.run(create())

    producer = Producer({1: b1.servers, 2: b2.servers})
    children = [Child(tmp_path, f"c{i}", servers) for i in range(2)]
    try:
        producer.start()

        def delivered() -> list[tuple[str, int, bytes, float]]:
            return [d for c in children for d in c.deliveries()]

        wait_until(lambda: {d[0] for d in delivered()} == set(PARTITIONS) and len(delivered()) >= 400, 60, 0.05,
                   "both consumers consuming every partition")
        killed_at = time.time()
        b1.kill()
        # broker 2's partitions go on: what is sent to them while broker 1 is down is delivered
        wait_until(lambda: any(d[0].startswith("2-") and d[3] > killed_at + 3 * SESSION_MS / 1000
                               for d in delivered()), 60, 0.05, "broker 2's partitions consumed after the kill")
        outage = time.time()
        wait_until(lambda: time.time() > outage + 2, 10, 0.1, "two more seconds of the outage")
        restarted_at = time.time()
        b1.start()
        wait_until(lambda: any(d[0].startswith("1-") and d[3] > restarted_at for d in delivered()), 60, 0.05,
                   "broker 1's partitions consumed again")
        producer.stop()
        acked = {(p, o): (data, at) for p, o, data, at in producer.acked}
        wait_until(lambda: set(acked) <= {(d[0], d[1]) for d in delivered()}, 60, 0.1,
                   "every acknowledged message delivered")
    finally:
        producer.stop()
        for c in children:
            c.stop()

    history = delivered()
    # nothing skipped, nothing that was never sent, each delivery the message stored at its offset
    assert set(acked) <= {(p, o) for p, o, _d, _t in history}
    same_offset = Counter((p, o) for p, o, _d, _t in producer.acked)
    assert max(same_offset.values()) == 1, [(a, killed_at, restarted_at) for a in producer.acked
                                            if same_offset[(a[0], a[1])] > 1]  # one ack per offset
    sent = {data for _p, _o, data, _at in producer.acked} | producer.failed
    for p, o, data, _at in history:
        assert data in sent, f"{p}@{o}: {data!r} was never sent"
        if (p, o) in acked:
            assert acked[(p, o)][0] == data, f"{p}@{o} delivered {data!r}, acknowledged {acked[(p, o)][0]!r}"
    # in order per partition and consumer, except where a partition starts over from its committed offset
    counts = Counter((p, o) for p, o, _d, _t in history)
    duplicates = {k for k, v in counts.items() if v > 1}
    assert all(p.startswith("1-") for p, _o in duplicates), sorted(duplicates)[:10]  # broker 2 never repeats
    first_seen: dict[tuple[str, int], float] = {}
    for p, o, _d, at in history:
        first_seen[(p, o)] = min(at, first_seen.get((p, o), at))
    for key in duplicates:  # only what was consumed within one commit period (and a round trip) of the kill
        assert first_seen[key] >= killed_at - COMMIT_MS / 1000 - 0.5, (key, killed_at - first_seen[key])
    # broker 2's messages sent during the outage were each delivered within a session timeout of their send
    late = [(p, o, round(first_seen[(p, o)] - at, 2)) for (p, o), (_d, at) in acked.items()
            if p.startswith("2-") and killed_at <= at <= restarted_at and first_seen[(p, o)] - at > SESSION_MS / 1000]
    assert not late, late[:10]
    during = sum(1 for (p, _o), (_d, at) in acked.items() if p.startswith("2-") and killed_at <= at <= restarted_at)
    by_partition = defaultdict(int)
    for p, _o in duplicates:
        by_partition[p] += 1
    print(f"broker 1 killed for {restarted_at - killed_at:.1f}s: {during} messages to broker 2 delivered during "
          f"the outage, none later than a session timeout; {len(acked)} acknowledged, {len(history)} deliveries, "
          f"{len(duplicates)} redelivered ({dict(by_partition)}); consumer exit codes "
          f"{[c.proc.returncode for c in children]}")
    assert all(c.proc.returncode == 0 for c in children), [c.proc.stderr.read() if c.proc.stderr else b""
                                                          for c in children]
    assert os.path.exists(tmp_path / "c0")
