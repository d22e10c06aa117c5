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
import functools
import gc
import logging
import multiprocessing as mp
import operator
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from metaq.broker.launcher import BrokerLauncher
from metaq.client.config import ClientConfig
from metaq.client.group.bench import children_ignore_sigint
from metaq.devcluster import DevCluster

if TYPE_CHECKING:
    from metaq.cluster.zk_security import ZkSecurity

log = logging.getLogger(__name__)

_DATA = operator.attrgetter("data")
FLUSH_MODES = {"group": 0, "sync": 1}


@dataclass
class BenchSpec:
    mode: str = "produce"
    servers: str | None = None
    """None: start an embedded broker for the run (in a temporary directory) and stop it after."""
    topic: str = ""
    size: int = 100
    count: int = 1_000_000
    duration_s: float = 60.0
    """Upper bound on the measured phase, whichever of count and duration comes first."""
    batch: int = 1000
    """Messages per send_batch call (api=batch), per send_async_many call (api=many), per transaction."""
    api: str = "batch"
    """produce: batch, async, async-yield (send_async, each in its own event-loop iteration), sync, oneway or
    transaction; consume: fetch (``Fetcher.fetch``, a list of Messages
    per fetch), iterate (``PullConsumer.iterate``, one Message at a time) or columns (``iterate_columns``)."""
    linger_ms: float = 5.0
    batch_bytes: int = 256 * 1024
    partitions: int = 4
    flush: str = "group"
    """Embedded broker's unflushThreshold: group (0), sync (1) or a number."""
    processes: int = 1
    concurrency: int = 8
    """Calls in flight per process (api=batch) — pipelining."""
    rate: int = 20_000
    """e2e: messages per second the producer offers."""
    pacing: str = "tick"
    """e2e: ``tick``, every millisecond the messages due since the last tick, sent together (a burst of about
    rate/1000: the loop's timers have millisecond resolution), or ``even``, each message at its own time
    (start + i/rate, woken by a pacing thread), so that a message usually leaves alone."""
    consumer: str = "partition"
    """e2e: ``partition``, one ``iterate_batches`` per partition (a connection and a long poll each), or ``multi``,
    one ``PullConsumer.get_many`` loop over every partition (one connection, one MultiFetch long poll)."""
    gc_freeze: bool = True
    """e2e: the producer and consumer processes call ``gc.freeze()`` once connected, before the measured phase (as
    the broker does after start-up; what a latency-sensitive application does): a full collection then walks only
    what was made since, not the ~26,000 objects of the imported client (10-30 ms with the loop stopped)."""
    tune_allocator: bool = False
    """consume: the consumer processes call :func:`metaq.allocator.tune_allocator` first (glibc's trim and mmap
    thresholds fixed; what an application reading ~1 MB messages may do), not by default."""
    compression: str = "none"
    cpus: tuple[int | None, int | None, int | None] | None = None
    """e2e: the CPU the embedded broker, the producer and the consumer each run on (``os.sched_setaffinity``, every
    thread), None for one the scheduler places: where the kernel's scheduler puts them (docs/benchmarks.md)."""
    selector: str = "roundrobin"
    """produce: the producer's partition selector, ``roundrobin`` (RoundRobinSelector, the default) or ``sticky``
    (StickyRoundRobinSelector: one partition until its batch is full or sent)."""
    multi_produce: bool = True
    """produce, e2e: the producer's ``multi_produce`` (a broker's batches that leave together in one MultiProduce)."""
    idempotent: bool = False
    """produce: an idempotent producer (every batch stamped, duplicates dropped by the broker)."""
    event_loop: str = "uvloop"
    brokers: int = 0
    """> 0: start a local cluster of this many brokers in ZooKeeper mode for the run (servers unset)."""
    zk: str | None = None
    """A running cluster's ZooKeeper (``host:port``): its registered brokers are measured."""
    zk_root: str = "/meta"
    tls: dict[str, Any] = field(default_factory=dict)
    """ClientConfig TLS and SASL options (``tls``, ``tls_ca_file``, ``sasl_username``...) for every session of
    the run; empty: plain TCP, no authentication."""

    def flush_threshold(self) -> int:
        if self.flush in FLUSH_MODES:
            return FLUSH_MODES[self.flush]
        return int(self.flush)


@dataclass
class BenchResult:
    mode: str
    api: str
    messages: int
    bytes: int
    seconds: float
    msgs_per_s: float
    mb_per_s: float
    latency_ms: dict[str, float] = field(default_factory=dict)
    """p50/p99/p999/max of what the mode measures (produce: ack latency; e2e: append to delivery)."""
    failures: int = 0
    spec: dict[str, Any] = field(default_factory=dict)
    broker: str = ""
    fdatasync_ms: dict[str, float] = field(default_factory=dict)
    """e2e with an embedded broker and unflushThreshold=1: the disk's own fdatasync latency (p50/p99/p999/max)
    of a small write in the broker's data directory, measured in the same run (half just before the
    measured phase, half just after), the floor under every acknowledgement and what the e2e latency is
    compared with."""
    loopback_rtt_ms: dict[str, float] = field(default_factory=dict)
    """e2e with an embedded broker: the machine's round trip of a message-sized write between two Python
    processes over TCP on 127.0.0.1 (p50/p99/p999/max; blocking sockets, nothing else done), measured in the
    same run: the floor under a delivery, which crosses two such hops (producer to broker, broker to
    consumer). It moves between machines by tens of percent (how fast a process is woken), and so do the
    e2e figures with it."""
    client_msgs_per_cpu_s: float = 0.0
    """consume: messages per second of the client processes' own CPU time (summed over them): the client's
    cost per message, steadier than ``msgs_per_s`` when other work shares the machine."""
    cpu_us_per_msg: dict[str, float] = field(default_factory=dict)
    """produce: CPU time per message of the client processes (their measured phase) and, for an embedded broker,
    of the broker process (over the workers' run): on a shared machine a steadier figure than msg/s, and it
    says which side is the floor."""
    placement: dict[str, list[int]] = field(default_factory=dict)
    """e2e with an embedded broker: the CPUs the broker, the producer and the consumer were allowed to run on
    (``--cpus``; all of them when not pinned)."""
    latency_by_place_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    """e2e with ``--pacing tick``: the append-to-delivery latency of the messages by their place in their
    millisecond's burst ("1" the first sent, "2" the second...; p50/p99/p999/max and ``count``). Round robin puts
    the places of a burst in different partitions, so it says what each further batch of a burst adds (it
    appends, wakes and answers after the ones before it). Needs ``--size`` ≥ 9 (the place is the payload's
    ninth byte)."""


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process (Linux /proc), or None where that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


FDATASYNC_SAMPLES = 200
"""fdatasync calls of the disk measurement (split before and after the measured phase)."""


def measure_fdatasync(directory: str, count: int, write_bytes: int = 171) -> list[float]:
    """``count`` times: write ``write_bytes`` (a 100-byte message's batch) at the end of a file in ``directory``
    and fdatasync it, as the flusher does for each append under unflushThreshold=1. Milliseconds per call."""
    path = os.path.join(directory, f".fdatasync-probe-{os.getpid()}")
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    data = bytes(write_bytes)
    samples: list[float] = []
    try:
        position = 0
        for _ in range(count):
            os.pwrite(fd, data, position)
            position += write_bytes
            t0 = time.perf_counter()
            os.fdatasync(fd)
            samples.append((time.perf_counter() - t0) * 1000)
    finally:
        os.close(fd)
        os.unlink(path)
    return samples


LOOPBACK_SAMPLES = 2000
"""Round trips of the loopback measurement (split before and after the measured phase)."""

_ECHO_CHILD = """
import socket, sys
conn = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
size = int(sys.argv[2])
while True:
    data = b""
    while len(data) < size:
        more = conn.recv(size - len(data))
        if not more:
            sys.exit(0)
        data += more
    conn.sendall(data)
"""


def measure_loopback_rtt(count: int, size: int = 100, warmup: int = 50) -> list[float]:
    """``count`` round trips of ``size`` bytes to a child process that echoes them over TCP on 127.0.0.1:
    milliseconds each (after ``warmup`` unmeasured ones). Each round trip wakes each process once, as a
    message going from the producer through the broker to the consumer does; no event loop, no protocol.
    A baseline that cannot be measured (no child process, a timeout) is logged and left out, with the round
    trips made so far: it never fails the bench it stands beside."""
    samples: list[float] = []
    try:
        _echo_round_trips(samples, count, size, warmup)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("the loopback round trip was not measured (%d of %d round trips): %s", len(samples), count, exc)
    return samples


def _echo_round_trips(samples: list[float], count: int, size: int, warmup: int) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(30)
        child = subprocess.Popen([sys.executable, "-c", _ECHO_CHILD, str(server.getsockname()[1]), str(size)])
        try:
            conn, _ = server.accept()
            with conn:
                conn.settimeout(30)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                data = bytes(size)
                for i in range(warmup + count):
                    t0 = time.perf_counter()
                    conn.sendall(data)
                    got = 0
                    while got < size:
                        chunk = conn.recv(size - got)
                        if not chunk:
                            raise ConnectionError("the loopback echo process went away")
                        got += len(chunk)
                    if i >= warmup:
                        samples.append((time.perf_counter() - t0) * 1000)
        finally:
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def percentiles(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {}
    s = sorted(samples)

    def pick(q: float) -> float:
        return round(s[min(len(s) - 1, int(q * len(s)))], 3)

    return {"p50": pick(0.50), "p99": pick(0.99), "p999": pick(0.999), "max": round(s[-1], 3)}


# -- workers (run in child processes) -----------------------------------------------------------


def _install_loop(kind: str) -> None:
    if kind == "uvloop":
        try:
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        except ImportError:
            pass


def pin_process(pid: int, cpu: int) -> None:
    """Run every thread of process ``pid`` (and the threads it starts later) on ``cpu`` only."""
    try:
        tasks = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tasks = [pid]
    for task in tasks:
        os.sched_setaffinity(task, {cpu})


def _worker_entry(kind: str, spec: BenchSpec, index: int, progress: Any, out: Any) -> None:
    if spec.cpus is not None and kind in ("e2e-producer", "e2e-consumer"):
        cpu = spec.cpus[1 if kind == "e2e-producer" else 2]
        if cpu is not None:
            pin_process(os.getpid(), cpu)
    _install_loop(spec.event_loop)
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


async def send_paced(send_one: Callable[[], None], rate: int, total: int, pacing: str = "tick",
                     end_tick: Callable[[], None] | None = None) -> None:
    """Call ``send_one`` ``total`` times at ``rate`` a second, as `bench e2e --pacing` offers its load (also the
    offered load of scripts/bench_peers.py's peers, so that both meet the same shape). ``tick``: every millisecond
    (the resolution of the loop's timers), the sends due since the last tick, together: at 5,000 msg/s bursts of
    five. ``even``: each send at its own time, start + i/rate. ``end_tick`` (if given) runs after each tick's
    sends (after every send with ``even``): where a client that sends a tick's messages as one request does so."""
    if pacing == "even":
        await _send_evenly(send_one if end_tick is None else _then(send_one, end_tick), rate, total)
        return
    if pacing != "tick":
        raise ValueError(f"unknown pacing {pacing!r} (tick or even)")
    sent = 0
    start = time.perf_counter()
    while sent < total:
        due = min(int((time.perf_counter() - start) * rate) + 1, total)
        if sent < due:
            while sent < due:
                send_one()
                sent += 1
            if end_tick is not None:
                end_tick()
        await asyncio.sleep(0.001)


def _then(first: Callable[[], None], second: Callable[[], None]) -> Callable[[], None]:
    def both() -> None:
        first()
        second()
    return both


async def _send_evenly(send_one: Callable[[], None], rate: int, total: int) -> None:
    """Call ``send_one`` on the loop ``total`` times, the i-th at start + i/rate. The loop's own timers have
    millisecond resolution (epoll's timeout, libuv's timers), so a thread sleeps until each send is due
    (nanosleep) and hands it to the loop; sends the loop has not run yet when the next is due run in order."""
    loop = asyncio.get_running_loop()
    finished: asyncio.Future[None] = loop.create_future()
    stop = threading.Event()

    def pace() -> None:
        start = time.perf_counter()
        for i in range(total):
            if stop.is_set():
                return
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            loop.call_soon_threadsafe(send_one)
        loop.call_soon_threadsafe(finished.set_result, None)  # after the last send_one (callbacks run in order)

    thread = threading.Thread(target=pace, name="metaq-bench-pacer", daemon=True)
    thread.start()
    try:
        await finished
    finally:
        stop.set()
        thread.join()


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


# -- orchestration (parent process) -------------------------------------------------------------


class _Progress:
    def __init__(self, enabled: bool, total: int, label: str) -> None:
        self.enabled = enabled
        self.total = total
        self.label = label
        self._bar: Any = None

    def __enter__(self) -> _Progress:
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


def _run_workers(kind: str, spec: BenchSpec, n: int, show: _Progress,
                 before_wait: Callable[[list[Any]], None] | None = None) -> list[dict[str, Any]]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    counters = [ctx.Value("q", 0, lock=False) for _ in range(n)]
    procs = [ctx.Process(target=_worker_entry, args=(kind, spec, i, counters[i], out), daemon=True) for i in range(n)]
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


def _preload(spec: BenchSpec, show: _Progress) -> None:
    """Fill the topic for a consume run with the batch API (not measured)."""
    load = BenchSpec(**{**asdict(spec), "mode": "produce", "api": "batch", "processes": 1, "duration_s": 600})
    _run_workers("produce", load, 1, show)


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
        with _Progress(progress, spec.count, f"produce ({spec.api})") as show:
            results = _run_workers("produce", spec, spec.processes, show)
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
        with _Progress(progress, spec.count, "preload") as show:
            _preload(spec, show)
        with _Progress(progress, spec.count, "consume") as show:
            results = _run_workers("consume", spec, spec.processes, show)
        seconds = max(r["seconds"] for r in results)
        messages = sum(r["messages"] for r in results)
        nbytes = sum(r["bytes"] for r in results)
        latencies = []
        cpu_s = sum(r.get("cpu_seconds", 0.0) for r in results)
        client_rate = round(messages / cpu_s, 1) if cpu_s > 0 else 0.0
    elif spec.mode == "e2e":
        total = min(spec.count, int(spec.rate * spec.duration_s))
        with _Progress(progress, total, f"e2e at {spec.rate} msg/s") as show:
            ctx = mp.get_context("spawn")
            out = ctx.Queue()
            cprog = ctx.Value("q", 0, lock=False)
            consumer = ctx.Process(target=_worker_entry, args=("e2e-consumer", spec, 0, cprog, out), daemon=True)
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
            presults = _run_workers("e2e-producer", spec, 1, show)
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
