"""The client processes of `metaq bench produce|consume|e2e`: each runs in a spawned process of its own, measures
its part of the run and puts its figures on a queue for the parent (metaq.bench.client_bench)."""

from __future__ import annotations

import asyncio
import functools
import gc
import operator
import os
import struct
import time
from collections.abc import Sequence
from typing import Any

from metaq.bench.baselines import percentiles
from metaq.bench.client_spec import BenchSpec
from metaq.bench.pacing import send_paced
from metaq.bench.processes import install_loop, pin_process

_DATA = operator.attrgetter("data")


def worker_entry(kind: str, spec: BenchSpec, index: int, progress: Any, out: Any) -> None:
    if spec.cpus is not None and kind in ("e2e-producer", "e2e-consumer"):
        cpu = spec.cpus[1 if kind == "e2e-producer" else 2]
        if cpu is not None:
            pin_process(os.getpid(), cpu)
    install_loop(spec.event_loop)
    if spec.tune_allocator and kind in ("consume", "e2e-consumer"):
        from metaq.allocator import tune_allocator

        tune_allocator()
    fn = {"produce": _produce_worker, "consume": _consume_worker, "e2e-producer": _e2e_producer,
          "e2e-consumer": _e2e_consumer}[kind]
    try:
        out.put(asyncio.run(fn(spec, index, progress)))
    except BaseException as exc:
        out.put({"error": f"{type(exc).__name__}: {exc}"})


async def _produce_worker(spec: BenchSpec, index: int, progress: Any) -> dict[str, Any]:
    from metaq.client import Message, MessageSessionFactory
    from metaq.errors import MetaqError

    share = spec.count // spec.processes + (1 if index < spec.count % spec.processes else 0)
    payload = bytes(spec.size)
    latencies: list[float] = []
    sent = failures = 0
    async with await MessageSessionFactory.connect(spec.servers or "", **spec.tls) as session:
        producer = session.create_producer(_selector(spec.selector), linger_ms=spec.linger_ms,
                                           batch_bytes=spec.batch_bytes, compression=spec.compression,
                                           enable_idempotence=spec.idempotent, multi_produce=spec.multi_produce)
        await producer.send_batch(spec.topic, [payload])  # warm metadata and connections
        cpu_start = time.process_time()
        start = time.perf_counter()
        deadline = start + spec.duration_s
        if spec.api == "batch":
            values = [payload] * spec.batch
            remaining = share

            async def lane() -> None:
                nonlocal remaining, sent, failures
                while remaining > 0 and time.perf_counter() < deadline:
                    n = min(spec.batch, remaining)
                    remaining -= n
                    t0 = time.perf_counter()
                    result = await producer.send_batch(spec.topic, values if n == spec.batch else values[:n])
                    latencies.append((time.perf_counter() - t0) * 1000)
                    if result.success:
                        sent += n
                    else:
                        failures += n
                    progress.value += n

            await asyncio.gather(*(lane() for _ in range(spec.concurrency)))
        elif spec.api in ("async", "async-yield", "oneway"):
            # The way an application uses send_async: fire, and look at the results later. Latency is
            # sampled (1 message in 64 gets a done callback) so the harness adds no per-message callback.
            # async-yield: the event loop runs between two sends (an application sending from callbacks or
            # request handlers, one message each), where async sends a window of them in one go.
            pending: list[asyncio.Future[Any]] = []
            done_at: list[float] = []
            window = 50_000
            each_step = spec.api == "async-yield"
            i = 0
            while i < share and time.perf_counter() < deadline:
                msg = Message(spec.topic, payload)
                if spec.api == "oneway":
                    producer.send_oneway(msg)
                else:
                    fut = producer.send_async(msg)
                    if not i & 63:
                        fut.add_done_callback(functools.partial(_record_latency, done_at, time.perf_counter()))
                    pending.append(fut)
                i += 1
                if each_step:
                    await asyncio.sleep(0)
                if i % window == 0:
                    await producer.flush()
                    sent, failures = _tally(pending, sent, failures)
                    progress.value = i
            await producer.flush()
            if spec.api == "oneway":
                sent = i
            sent, failures = _tally(pending, sent, failures)
            progress.value = i
            latencies = done_at
        elif spec.api == "many":
            # send_async_many: the same Message per message as async, --batch of them per call, one future
            # per call (latency: each call's, from the call until its future is done).
            calls: list[asyncio.Future[Any]] = []
            done_at = []
            window = 50_000
            i = 0
            while i < share and time.perf_counter() < deadline:
                n = min(spec.batch, share - i)
                call = producer.send_async_many([Message(spec.topic, payload) for _ in range(n)])
                call.add_done_callback(functools.partial(_record_latency, done_at, time.perf_counter()))
                calls.append(call)
                i += n
                if i % window < n:
                    await producer.flush()
                    sent, failures = _tally_many(calls, sent, failures)
                    progress.value = i
            await producer.flush()
            sent, failures = _tally_many(calls, sent, failures)
            progress.value = i
            latencies = done_at
        elif spec.api == "sync":
            while sent + failures < share and time.perf_counter() < deadline:
                t0 = time.perf_counter()
                r = await producer.send(Message(spec.topic, payload))
                latencies.append((time.perf_counter() - t0) * 1000)
                sent += r.success
                failures += not r.success
                progress.value += 1
        elif spec.api == "transaction":
            # transactions of --batch messages each, one after another; latency = the commit's round trip
            async def one_transaction(n: int) -> None:
                nonlocal sent, failures
                try:
                    async with producer.transaction():
                        for _ in range(n):
                            await producer.send(Message(spec.topic, payload))
                        t0 = time.perf_counter()
                    latencies.append((time.perf_counter() - t0) * 1000)
                    sent += n
                except MetaqError:
                    failures += n

            while sent + failures < share and time.perf_counter() < deadline:
                n = min(spec.batch, share - sent - failures)
                await one_transaction(n)
                progress.value = sent + failures
        else:
            raise ValueError(f"unknown api {spec.api!r}")
        await producer.close()
        elapsed = time.perf_counter() - start
        cpu_s = time.process_time() - cpu_start
    return {"messages": sent, "failures": failures, "seconds": elapsed, "latencies": latencies, "cpu_s": cpu_s}


def _selector(name: str) -> Any:
    from metaq.client.selectors import RoundRobinSelector, StickyRoundRobinSelector

    selectors = {"roundrobin": RoundRobinSelector, "sticky": StickyRoundRobinSelector}
    if name not in selectors:
        raise ValueError(f"unknown selector {name!r} (roundrobin or sticky)")
    return selectors[name]()


def _tally(pending: list[asyncio.Future[Any]], sent: int, failures: int) -> tuple[int, int]:
    for fut in pending:
        if fut.result().success:
            sent += 1
        else:
            failures += 1
    pending.clear()
    return sent, failures


def _tally_many(calls: list[asyncio.Future[Any]], sent: int, failures: int) -> tuple[int, int]:
    for fut in calls:
        result = fut.result()
        failures += result.failures
        sent += len(result) - result.failures
    calls.clear()
    return sent, failures


def _record_latency(samples: list[float], t0: float, _fut: Any) -> None:
    samples.append((time.perf_counter() - t0) * 1000)


async def _consume_worker(spec: BenchSpec, index: int, progress: Any) -> dict[str, Any]:
    from metaq.client import MessageSessionFactory

    got = nbytes = 0
    async with await MessageSessionFactory.connect(spec.servers or "", **spec.tls) as session:
        every = await session.partitions(spec.topic)  # of every broker: each process takes every n-th
        parts = [p for i, p in enumerate(every) if i % spec.processes == index]
        consumer = session.create_pull_consumer()
        ends = {p: (await consumer.offsets(spec.topic, p))[1] for p in parts}
        start = time.perf_counter()
        cpu_start = time.process_time()
        deadline = start + spec.duration_s

        async def drain(p: Any) -> None:
            nonlocal got, nbytes
            offset = (await consumer.offsets(spec.topic, p))[0]
            end = ends[p]
            while offset < end and time.perf_counter() < deadline:
                result = await consumer.fetcher.fetch(spec.topic, p, offset, max_bytes=1024 * 1024)
                n = len(result.messages)
                got += n
                nbytes += sum(map(len, map(_DATA, result.messages)))  # C-level: no harness loop
                progress.value += n
                offset = result.next_offset

        async def drain_iterate(p: Any) -> None:
            """The per-message iterator: one Message at a time, its payload read."""
            nonlocal got, nbytes
            start_offset = (await consumer.offsets(spec.topic, p))[0]
            n = size = 0
            async for message in consumer.iterate(spec.topic, p, start_offset, max_messages=ends[p] - start_offset,
                                                  stop_at_end=True):
                n += 1
                size += len(message.data)
                if not n & 4095:
                    progress.value += 4096
                    if time.perf_counter() >= deadline:
                        break
            got += n
            nbytes += size

        async def drain_columns(p: Any) -> None:
            """The column view: one MessageBatch per stored batch, payload lengths from its memoryviews."""
            nonlocal got, nbytes
            start_offset = (await consumer.offsets(spec.topic, p))[0]
            async for batch in consumer.iterate_columns(spec.topic, p, start_offset,
                                                        max_messages=ends[p] - start_offset, stop_at_end=True):
                n = len(batch)
                got += n
                nbytes += sum(map(len, batch.payloads))
                progress.value += n
                if time.perf_counter() >= deadline:
                    break

        drain_fn = {"iterate": drain_iterate, "columns": drain_columns}.get(spec.api, drain)  # fetch (and the default)
        await asyncio.gather(*(drain_fn(p) for p in parts))
        elapsed = time.perf_counter() - start
        cpu_s = time.process_time() - cpu_start
    return {"messages": got, "bytes": nbytes, "failures": 0, "seconds": elapsed, "latencies": [], "cpu_seconds": cpu_s}


_TS = struct.Struct(">q")


async def _e2e_producer(spec: BenchSpec, index: int, progress: Any) -> dict[str, Any]:
    from metaq.client import Message, MessageSessionFactory

    tally = [0, 0]  # sent, failed: counted as the acks arrive, so that no future outlives its ack
    pad = bytes(max(0, spec.size - 8))
    total = min(spec.count, int(spec.rate * spec.duration_s))
    all_acked = asyncio.Event()

    def acked(fut: asyncio.Future[Any]) -> None:
        ok = not fut.cancelled() and fut.exception() is None and fut.result().success
        tally[0 if ok else 1] += 1
        if tally[0] + tally[1] >= total:
            all_acked.set()

    async with await MessageSessionFactory.connect(spec.servers or "", **spec.tls) as session:
        producer = session.create_producer(_selector(spec.selector), linger_ms=spec.linger_ms,
                                           batch_bytes=spec.batch_bytes, multi_produce=spec.multi_produce)
        await producer.send(Message(spec.topic, _TS.pack(0) + pad))
        _settle_gc(spec)
        sent = 0
        place = [0]  # the next message's place in its tick's burst (0-based), when the payload has room for it
        pad_rest = pad[1:]

        def send_one() -> None:  # stamped with its send time, which the consumer subtracts
            nonlocal sent
            stamp = _TS.pack(time.time_ns())
            if pad:
                stamp += _PLACES[min(place[0], 254)] + pad_rest
                place[0] += 1
            else:
                stamp += pad
            producer.send_async(Message(spec.topic, stamp)).add_done_callback(acked)
            sent += 1
            if not sent & 255:
                progress.value = sent

        def end_tick() -> None:
            place[0] = 0

        start = time.perf_counter()
        await send_paced(send_one, spec.rate, total, spec.pacing, end_tick=end_tick)
        progress.value = sent
        if total:
            await all_acked.wait()
        await producer.close()
        elapsed = time.perf_counter() - start
    return {"messages": tally[0], "failures": tally[1], "seconds": elapsed, "latencies": [],
            "cpus": sorted(os.sched_getaffinity(0))}


def _settle_gc(spec: BenchSpec) -> None:
    """Before the measured phase: collect once and freeze what is alive, unless told not to (BenchSpec.gc_freeze)."""
    if spec.gc_freeze:
        gc.collect()
        gc.freeze()


async def _e2e_consumer(spec: BenchSpec, index: int, progress: Any) -> dict[str, Any]:
    from metaq.client import MessageSessionFactory

    latencies: list[float] = []
    places = bytearray()  # each latency's message's place in its burst, plus one (0: the payload had no room)
    total = min(spec.count, int(spec.rate * spec.duration_s))
    async with await MessageSessionFactory.connect(spec.servers or "", **spec.tls) as session:
        parts = await session.partitions(spec.topic)
        consumer = session.create_pull_consumer()
        deadline = time.perf_counter() + spec.duration_s + 30

        def record(data: bytes, now: int) -> None:  # the warm-up message (timestamp 0) is not counted
            ts = _TS.unpack_from(data)[0]
            if ts:
                latencies.append((now - ts) / 1e6)
                places.append(_place_of(data))

        async def follow(p: Any) -> None:
            async for batch in consumer.iterate_batches(spec.topic, p, "latest", max_wait_ms=500):
                now = time.time_ns()
                for m in batch:
                    record(m.data, now)
                progress.value = len(latencies)
                if len(latencies) >= total or time.perf_counter() > deadline:
                    return

        async def follow_many() -> None:
            positions: dict[tuple[str, Any], int] = {}
            for p in parts:
                positions[(spec.topic, p)] = (await consumer.offsets(spec.topic, p))[1]
            key_of = {(spec.topic, p.id): (spec.topic, p) for p in parts}
            while True:
                results = await consumer.get_many(positions, max_wait_ms=500)
                now = time.time_ns()
                for key, result in results.items():
                    if isinstance(result, Exception):
                        raise result
                    for m in result.messages:
                        record(m.data, now)
                    positions[key_of[key]] = result.next_offset
                progress.value = len(latencies)
                if len(latencies) >= total or time.perf_counter() > deadline:
                    return

        if spec.consumer == "multi":
            tasks = [asyncio.create_task(follow_many())]
        else:
            tasks = [asyncio.create_task(follow(p)) for p in parts]
        await asyncio.sleep(0)  # the iterators started (their connections are made as they go)
        _settle_gc(spec)
        progress.value = -1  # tells the parent the consumer is positioned at the end: start producing
        while len(latencies) < total and time.perf_counter() < deadline and not all(t.done() for t in tasks):
            await asyncio.sleep(0.05)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {"messages": len(latencies), "failures": total - len(latencies), "seconds": 0.0, "latencies": latencies,
            "places": bytes(places), "cpus": sorted(os.sched_getaffinity(0))}


_PLACES = [bytes((i + 1,)) for i in range(255)]
"""The ninth byte of an e2e payload: its place in its burst plus one (0 is the warm-up message's padding)."""


def _place_of(data: bytes) -> int:
    return data[8] if len(data) > 8 else 0


def latency_by_place(latencies: Sequence[float], places: bytes) -> dict[str, dict[str, float]]:
    """Percentiles (and ``count``) of ``latencies`` grouped by their message's place in its burst (1-based keys,
    in order); messages without a place (0) are left out."""
    groups: dict[int, list[float]] = {}
    for latency, place in zip(latencies, places, strict=True):
        if place:
            groups.setdefault(place, []).append(latency)
    return {str(place): {**percentiles(values), "count": len(values)} for place, values in sorted(groups.items())}
