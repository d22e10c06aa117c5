"""Group consumption throughput: msg/s delivered to listeners by a group of 1, 2, 4... members.

Each member is its own process (as members are separate machines in production, and so that they do
not share one GIL). The topic is filled first; then the members start together and join; once the
group is stable with every member, each member notes how many messages it had delivered, and the
figure is the messages delivered after that moment / (last delivery - that moment), over all members:
steady-state consumption, without production or the initial rebalances in it. ``fetch`` ``both`` measures
each group with one Fetch per partition (a connection per long-polling partition) and then with MultiFetch
(one connection per broker), the first the same-run baseline of the second. Members are started with
multiprocessing's spawn: the caller's main module must be import-safe, as a console script is.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import tempfile
import time
import uuid
from typing import Any

from metaq.bench.processes import children_ignore_sigint, run_loop
from metaq.bench.report import Report, markdown_table
from metaq.broker.launcher import BrokerLauncher
from metaq.client.group.admin import describe_group
from metaq.client.group.config import ConsumerConfig
from metaq.client.group.consumer import create_consumer
from metaq.client.session import MessageSessionFactory
from metaq.errors import UnknownGroupError


def _member(servers: str, group: str, topic: str, listener_kind: str, fetch_runners: int, multi_fetch: bool,
            out: Any, go: Any, mark: Any, stop: Any) -> None:
    async def main(recover_dir: str) -> None:
        session = await MessageSessionFactory.connect(servers)
        count = 0
        first = last = 0.0
        marked: list[tuple[int, float]] = []

        async def on_message_async(msg: Any) -> None:
            nonlocal count, first, last
            last = time.perf_counter()
            if not count:
                first = last
            count += 1

        def on_message_sync(msg: Any) -> None:
            nonlocal count, first, last
            last = time.perf_counter()
            if not count:
                first = last
            count += 1

        cfg = ConsumerConfig(group=group, fetch_runner_count=fetch_runners, session_timeout_ms=6000,
                             rebalance_timeout_ms=20000, max_delay_fetch_ms=200, commit_offset_period_ms=5000,
                             recover_dir=recover_dir, multi_fetch=multi_fetch)
        listener = on_message_async if listener_kind == "async" else on_message_sync
        consumer = create_consumer(session, cfg).subscribe(topic, 1024 * 1024, listener)
        loop = asyncio.get_running_loop()
        out.put("up")
        await loop.run_in_executor(None, go.wait)
        await consumer.complete_subscribe()
        await loop.run_in_executor(None, mark.wait)
        marked.append((count, time.perf_counter()))
        await loop.run_in_executor(None, stop.wait)
        await consumer.close()
        await session.close()
        out.put((count, first, last, *marked[0]))

    with tempfile.TemporaryDirectory(prefix="metaq-bench-recover-") as recover_dir:
        run_loop(main(recover_dir))


async def _wait_stable(servers: str, group: str, members: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    async with await MessageSessionFactory.connect(servers) as session:
        while True:
            try:
                d = await describe_group(session, group)
                if d.state == "Stable" and len(d.members) == members:
                    return
            except UnknownGroupError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"group {group} did not become stable with {members} members")
            await asyncio.sleep(0.05)


async def _produce(servers: str, topic: str, partitions: int, messages: int, size: int) -> float:
    payload = b"x" * size
    async with await MessageSessionFactory.connect(servers) as session:
        producer = session.create_producer(batch_bytes=256 * 1024)
        started = time.perf_counter()
        per = messages // partitions
        for p in range(partitions):
            for i in range(0, per, 20_000):
                result = await producer.send_batch(topic, [payload] * min(20_000, per - i), partition=p)
                if not result.success:
                    raise RuntimeError(f"produce failed: {result.errors[:1]}")
        await producer.flush()
        return time.perf_counter() - started


def run_group_bench(servers: str, topic: str | None = None, members: int = 1, seconds: float = 60.0, *,
                    messages: int = 2_400_000, message_bytes: int = 100, partitions: int = 12,
                    listener: str = "async", fetch_runners: int = 2, multi_fetch: bool = True) -> dict[str, Any]:
    """Deliver ``messages`` to a fresh group of ``members`` processes; return the figures as a dict.

    ``topic`` (default: a fresh one) is created with ``partitions`` partitions if missing; it must be
    empty for the count to be exact. ``seconds`` bounds the whole run. ``listener``: "async" or "sync"
    (sync listeners run in the consumer's thread pool). ``multi_fetch``: the members fetch with MultiFetch
    over one connection per broker (ConsumerConfig.multi_fetch), or False: one Fetch per partition, long
    polls on a connection per partition.
    """
    topic = topic or f"bench-group-{uuid.uuid4().hex[:8]}"
    group = f"bench-{uuid.uuid4().hex[:8]}"
    messages -= messages % partitions

    async def setup() -> None:
        async with await MessageSessionFactory.connect(servers) as session:
            existing = await session.partitions(topic)
            if not existing:
                await session.admin().create_topic(topic, partitions)

    asyncio.run(setup())
    produce_s = asyncio.run(_produce(servers, topic, partitions, messages, message_bytes))
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    go, mark, stop = ctx.Event(), ctx.Event(), ctx.Event()
    procs = [ctx.Process(target=_member, args=(servers, group, topic, listener, fetch_runners, multi_fetch, out, go,
                                                    mark, stop),
                         daemon=True) for _ in range(members)]
    with children_ignore_sigint():
        for proc in procs:
            proc.start()
    try:
        for _ in procs:
            assert out.get(timeout=60) == "up"
        go.set()
        asyncio.run(_wait_stable(servers, group, members, min(seconds, 60.0)))
        mark.set()

        async def consumed() -> int:
            async with await MessageSessionFactory.connect(servers) as session:
                deadline = time.monotonic() + seconds
                done = 0
                while time.monotonic() < deadline:
                    try:
                        d = await describe_group(session, group, [topic])
                    except UnknownGroupError:  # the member's session lapsed before a commit: it rejoins
                        await asyncio.sleep(0.2)
                        continue
                    done = sum(max(p.committed, 0) for p in d.partitions)
                    if done >= messages:
                        return done
                    await asyncio.sleep(0.2)
                return done

        asyncio.run(consumed())
    except KeyboardInterrupt:  # Ctrl-C: the members' figures are not wanted any more
        for proc in procs:
            proc.kill()
            proc.join(30)
        raise
    except BaseException:
        stop.set()
        for _ in procs:
            out.get(timeout=60)
        raise
    stop.set()
    results = [out.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(30)
    total = sum(r[0] for r in results)
    before_mark = sum(r[3] for r in results)
    t_mark = min(r[4] for r in results)
    # perf_counter is CLOCK_MONOTONIC on Linux: system-wide, so the members' readings compare.
    t_end = max(r[2] for r in results)
    measured = total - before_mark
    elapsed = t_end - t_mark
    return {"members": members, "partitions": partitions, "messages": messages, "message_bytes": message_bytes,
            "delivered": total, "measured_messages": measured, "seconds": round(elapsed, 3),
            "msg_per_s": round(measured / elapsed) if elapsed > 0 and measured > 0 else 0, "listener": listener,
            "fetch_runner_count": fetch_runners, "fetch": "multi" if multi_fetch else "single",
            "produce_seconds": round(produce_s, 3),
            "per_member": [r[0] for r in results]}


def fetch_modes(choice: str) -> list[bool]:
    """``--fetch multi|single|both`` as the multi_fetch values to run (both: single first, the baseline)."""
    return {"multi": [True], "single": [False], "both": [False, True]}[choice]



def run(servers: str | None, members: tuple[int, ...], count: int, size: int, partitions: int, listener: str,
        duration_s: float, fetch: str, report: Report) -> dict[str, Any]:
    """Every group size of ``members`` with every fetch mode of ``fetch``, each on a fresh embedded broker
    (group commit) unless ``servers`` is given."""
    runs = []
    for n, multi in ((n, multi) for n in members for multi in fetch_modes(fetch)):
        with tempfile.TemporaryDirectory(prefix="metaq-bench-group-") as tmp:
            broker = None if servers else BrokerLauncher(f"{tmp}/data", {"numPartitions": partitions,
                                                                         "unflushThreshold": 0}).start()
            try:
                target = servers or (broker.servers if broker else "")
                r = run_group_bench(target, None, n, duration_s, messages=count, message_bytes=size,
                                    partitions=partitions, listener=listener, multi_fetch=multi)
            finally:
                if broker is not None:
                    broker.stop()
        runs.append(r)
        report(f"{n} member(s), {r['fetch']} fetch: {r['msg_per_s']:,} msg/s ({r['delivered']:,} delivered of "
               f"{r['messages']:,})")
    return {"partitions": partitions, "listener": listener, "runs": runs}


def table(result: dict[str, Any]) -> str:
    return (f"{result['partitions']} partitions, {result['listener']} listener:\n\n"
            + markdown_table(["members", "fetch", "msg/s", "delivered (of produced)", "measured messages"],
                             [[r["members"], r["fetch"], f"{r['msg_per_s']:,}", f"{r['delivered']:,} "
                               f"({r['messages']:,})", f"{r['measured_messages']:,}"] for r in result["runs"]],
                             right=[0, 2]))
