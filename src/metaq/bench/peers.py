"""`metaq bench peers`: metaq's end-to-end latency beside the peers its latency goals came from, on this machine, in
the same minutes, under the same offered load.

The goals (p50 <= 0.3 ms, p99 <= 1 ms at 5,000 msg/s of 100 B, one producer and one consumer process) were taken
from Redis Streams and NATS JetStream measured with Python clients on another machine. Figures move between
machines by tens of percent, so this runs the peers here, interleaved with metaq: the same rate, message size and
pacing (``tick`` sends what is due every millisecond together, bursts of five at 5,000 msg/s; ``even`` sends each
message at its own time), each message stamped with ``time.time_ns()`` when the application hands it to the client
and measured when the consumer gets it (metaq's append-to-delivery). Producer and consumer are separate processes
on uvloop that collect and freeze their garbage once connected, as `metaq bench e2e` does.

- ``metaq``, ``metaq-sticky``, ``metaq-sync``: `metaq bench e2e --linger-ms 0` with its embedded broker (``--flush
  1000``; the sticky selector; ``--flush sync``, an fdatasync before every ack), 4 partitions (MetaQ's round robin
  spreads a tick's five messages over four batches); ``metaq-1``: one partition.
- ``redis``: one Redis stream (Debian's redis-server, no persistence), redis-py's asyncio client with hiredis over
  one connection: the messages pending when its sender is free (a tick's burst) are one pipeline of XADDs; the
  consumer loops on XREADGROUP ... COUNT 1000 BLOCK 500 NOACK. ``redis-4``: four streams written round robin and
  read by one XREADGROUP of the four, the shape of the ``metaq`` run.
- ``redis-always``: the same with ``appendonly yes``, ``appendfsync always`` (replies after the AOF fsync: the
  peer of ``metaq-sync``).
- ``nats``: NATS JetStream (Debian's nats-server, file storage, no sync per message), nats-py: ``publish_async``
  of each message (the acks awaited at the end), an ordered push consumer.
- ``relay``: the floor under a broker written in Python, not a product: a uvloop server that forwards each
  produced frame to the consumer's connection and acknowledges it, storing and checking nothing; its clients are
  asyncio streams, the producer one request in flight as Redis's.

The peers need ``pip install 'metaq[peers]'`` and ``apt-get install redis-server nats-server`` (what
scripts/system-deps.sh installs); the machine's loopback round trip is measured once a round beside them. Every
loop is bounded by a count and a deadline; servers listen on 127.0.0.1 on free ports and are stopped at the end.
"""

from __future__ import annotations

import asyncio
import gc
import multiprocessing as mp
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from metaq.bench.baselines import measure_loopback_rtt, percentiles
from metaq.bench.client_bench import BenchSpec, run_bench
from metaq.bench.pacing import send_paced
from metaq.bench.processes import free_port, run_loop
from metaq.bench.report import BenchError, Report, markdown_table, require_known

_TS = struct.Struct(">Q")
STREAM_KEY = "bench"
METAQ_SYSTEMS: dict[str, dict[str, Any]] = {
    "metaq": {"flush": "1000"}, "metaq-sticky": {"flush": "1000", "selector": "sticky"},
    "metaq-1": {"flush": "1000", "partitions": 1}, "metaq-sync": {"flush": "sync"}}
"""`metaq bench e2e` options of each metaq system (--linger-ms 0 for all)."""
PEER_SYSTEMS = ("redis", "redis-4", "redis-always", "nats", "relay")
REDIS_STREAMS = {"redis": 1, "redis-4": 4, "redis-always": 1}
"""Streams a Redis system uses: several are written round robin (a tick's XADDs still one pipeline) and read by
one XREADGROUP of them all, the shape of metaq's default run (4 partitions round robin)."""


# -- servers ------------------------------------------------------------------------------------


def _wait_port(port: int, alive: Callable[[], bool], what: str, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            raise BenchError(f"{what} exited before it listened on 127.0.0.1:{port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise BenchError(f"{what} did not listen on 127.0.0.1:{port} within {timeout_s} s")


class Servers:
    """The peers' servers for the whole run, each on a free loopback port in a directory of its own."""

    def __init__(self, systems: list[str], root: Path) -> None:
        self.addresses: dict[str, str] = {}
        self._procs: list[subprocess.Popen[bytes]] = []
        self._relay: Any = None
        self._root = root
        self._systems = systems

    def __enter__(self) -> Servers:
        try:
            for system in self._systems:
                if system.startswith("redis"):
                    self._start_redis(system)
                elif system == "nats":
                    self._start_nats()
                elif system == "relay":
                    self._start_relay()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _binary(self, name: str, package: str) -> str:
        path = shutil.which(name) or (f"/usr/sbin/{name}" if os.path.exists(f"/usr/sbin/{name}") else None)
        if path is None:
            raise BenchError(f"{name} is not installed: apt-get install {package} (or leave it out with --systems)")
        return path

    def _start_redis(self, system: str) -> None:
        port = free_port()
        directory = self._root / system
        directory.mkdir()
        persistence = (["--appendonly", "yes", "--appendfsync", "always"] if system == "redis-always"
                       else ["--appendonly", "no"])
        proc = subprocess.Popen([self._binary("redis-server", "redis-server"), "--port", str(port),
                                 "--bind", "127.0.0.1", "--save", "", "--dir", str(directory),
                                 "--protected-mode", "no", "--daemonize", "no", "--logfile", "", *persistence],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._procs.append(proc)
        _wait_port(port, lambda: proc.poll() is None, system)
        self.addresses[system] = f"127.0.0.1:{port}"

    def _start_relay(self) -> None:
        port = free_port()
        self._relay = mp.get_context("spawn").Process(target=serve_relay, args=(port,), daemon=True)
        self._relay.start()
        _wait_port(port, self._relay.is_alive, "the relay")
        self.addresses["relay"] = f"127.0.0.1:{port}"

    def _start_nats(self) -> None:
        port = free_port()
        directory = self._root / "nats"
        directory.mkdir()
        proc = subprocess.Popen([self._binary("nats-server", "nats-server"), "-a", "127.0.0.1", "-p", str(port),
                                 "-js", "-sd", str(directory)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._procs.append(proc)
        _wait_port(port, lambda: proc.poll() is None, "nats-server")
        self.addresses["nats"] = f"127.0.0.1:{port}"

    def __exit__(self, *exc: object) -> None:
        for proc in self._procs:
            proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs.clear()
        if self._relay is not None:
            self._relay.terminate()
            self._relay.join(15)
            if self._relay.is_alive():
                self._relay.kill()
                self._relay.join()
            self._relay = None


# -- the peers' clients (child processes) ----------------------------------------------------------


def _settle() -> None:
    gc.collect()
    gc.freeze()


def _redis_keys(system: str) -> list[str]:
    n = REDIS_STREAMS[system]
    return [STREAM_KEY] if n == 1 else [f"{STREAM_KEY}.{i}" for i in range(n)]


async def _redis_reset(system: str, address: str) -> None:
    import redis.asyncio as aioredis

    host, port = address.rsplit(":", 1)
    r = aioredis.Redis(host=host, port=int(port))
    try:
        for key in _redis_keys(system):
            await r.delete(key)
            await r.xgroup_create(key, "bench", id="$", mkstream=True)
    finally:
        await r.aclose()


async def _redis_consume(system: str, address: str, total: int, ready: Any, deadline: float) -> list[float]:
    import redis.asyncio as aioredis

    host, port = address.rsplit(":", 1)
    r = aioredis.Redis(host=host, port=int(port))
    latencies: list[float] = []
    streams: dict[Any, Any] = dict.fromkeys(_redis_keys(system), ">")
    try:
        await r.ping()
        _settle()
        ready.set()
        while len(latencies) < total and time.perf_counter() < deadline:
            reply: Any = await r.xreadgroup("bench", "c1", streams, count=1000, block=500, noack=True)
            now = time.time_ns()
            for _stream, entries in reply or ():
                for _id, fields in entries:
                    ts = _TS.unpack_from(fields[b"d"])[0]
                    if ts:
                        latencies.append((now - ts) / 1e6)
    finally:
        await r.aclose()
    return latencies


async def _redis_produce(system: str, address: str, rate: int, total: int, pacing: str, size: int) -> int:
    import redis.asyncio as aioredis

    host, port = address.rsplit(":", 1)
    r = aioredis.Redis(host=host, port=int(port))
    pad = bytes(max(0, size - 8))
    keys = _redis_keys(system)
    turn = [0]

    def next_key() -> str:
        turn[0] += 1
        return keys[turn[0] % len(keys)]

    async def send(batch: list[bytes]) -> None:
        if len(batch) == 1:
            await r.xadd(next_key(), {"d": batch[0]})
            return
        pipe = r.pipeline(transaction=False)
        for payload in batch:
            pipe.xadd(next_key(), {"d": payload})
        await pipe.execute()

    try:
        await r.xadd(keys[0], {"d": _TS.pack(0) + pad})  # connects; the consumer skips a 0 stamp
        _settle()
        return await _produce_paced(send, pad, rate, total, pacing)
    finally:
        await r.aclose()


async def _nats_reset(system: str, address: str) -> None:
    import nats
    from nats.js.errors import NotFoundError

    nc = await nats.connect(f"nats://{address}")
    try:
        js = nc.jetstream()
        try:
            await js.delete_stream("BENCH")
        except NotFoundError:
            pass
        await js.add_stream(name="BENCH", subjects=[STREAM_KEY], storage="file")
    finally:
        await nc.close()


async def _nats_consume(system: str, address: str, total: int, ready: Any, deadline: float) -> list[float]:
    import nats

    nc = await nats.connect(f"nats://{address}")
    latencies: list[float] = []
    enough = asyncio.Event()

    async def on_message(msg: Any) -> None:
        ts = _TS.unpack_from(msg.data)[0]
        if ts:
            latencies.append((time.time_ns() - ts) / 1e6)
            if len(latencies) >= total:
                enough.set()

    try:
        js = nc.jetstream()
        await js.subscribe(STREAM_KEY, cb=on_message, ordered_consumer=True)
        _settle()
        ready.set()
        try:
            await asyncio.wait_for(enough.wait(), max(0.1, deadline - time.perf_counter()))
        except TimeoutError:
            pass
    finally:
        await nc.close()
    return latencies


async def _nats_produce(system: str, address: str, rate: int, total: int, pacing: str, size: int) -> int:
    import nats

    nc = await nats.connect(f"nats://{address}")
    pad = bytes(max(0, size - 8))
    try:
        js = nc.jetstream()
        acks: list[asyncio.Future[Any]] = []

        async def send(batch: list[bytes]) -> None:  # acks are awaited at the end, as metaq's bench counts them
            for payload in batch:
                acks.append(await js.publish_async(STREAM_KEY, payload))

        await js.publish(STREAM_KEY, _TS.pack(0) + pad)
        _settle()
        sent = await _produce_paced(send, pad, rate, total, pacing)
        await asyncio.gather(*acks)  # raises for a publish the server refused
        return sent
    finally:
        await nc.close()


async def _produce_paced(send: Callable[[list[bytes]], Any], pad: bytes, rate: int, total: int, pacing: str) -> int:
    """The offered load of `bench e2e` (send_paced) through one connection: each message stamped when the
    application hands it over, then sent by one sender task with whatever else is pending by then, as one
    request where the client has one for several (a tick's burst; with ``even`` pacing, what arrived while the
    previous request was out). A failed send fails the run. Returns the messages sent and answered."""
    loop = asyncio.get_running_loop()
    pending: list[bytes] = []
    wake = asyncio.Event()
    finished = False
    sent = 0

    def send_one() -> None:
        pending.append(_TS.pack(time.time_ns()) + pad)

    async def sender() -> None:
        nonlocal sent
        while True:
            if not pending:
                if finished:
                    return
                wake.clear()
                await wake.wait()
                continue
            batch = pending[:]
            pending.clear()
            await send(batch)
            sent += len(batch)

    task = loop.create_task(sender())
    try:
        await send_paced(send_one, rate, total, pacing, wake.set)
    finally:
        finished = True
        wake.set()
    await task
    return sent


_LEN = struct.Struct(">I")


class _Relay(asyncio.Protocol):
    """One connection of the relay server. Its first byte names it: ``C`` a consumer (answered ``K`` once it is
    registered), ``P`` a producer, whose frames (a 4-byte length, then the bytes) are written on to every consumer
    as they are read, every whole frame of one read in one write, then acknowledged by their count (4 bytes)."""

    consumers: ClassVar[set[asyncio.Transport]] = set()

    def connection_made(self, transport: Any) -> None:
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.transport: asyncio.Transport = transport
        self.buf = bytearray()
        self.role = b""

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        if not self.role:
            self.role = bytes(buf[:1])
            del buf[:1]
            if self.role == b"C":
                self.consumers.add(self.transport)
                self.transport.write(b"K")
        if self.role != b"P":
            buf.clear()
            return
        pos = count = 0
        while len(buf) - pos >= 4:
            end = pos + 4 + _LEN.unpack_from(buf, pos)[0]
            if end > len(buf):
                break
            pos = end
            count += 1
        if count:
            frames = bytes(buf[:pos])
            del buf[:pos]
            for consumer in self.consumers:
                consumer.write(frames)
            self.transport.write(_LEN.pack(count))

    def connection_lost(self, exc: Exception | None) -> None:
        self.consumers.discard(self.transport)


def serve_relay(port: int) -> None:
    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(_Relay, "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    run_loop(serve())


async def _relay_reset(system: str, address: str) -> None:
    """Nothing is kept between runs (a consumer leaves the relay when its connection closes)."""


async def _relay_open(address: str, role: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    writer.write(role)
    return reader, writer


async def _relay_consume(system: str, address: str, total: int, ready: Any, deadline: float) -> list[float]:
    reader, writer = await _relay_open(address, b"C")
    latencies: list[float] = []
    buf = bytearray()
    try:
        if await reader.readexactly(1) != b"K":
            raise RuntimeError("the relay did not register the consumer")
        _settle()
        ready.set()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout_at(loop.time() + max(0.0, deadline - time.perf_counter())):
                while len(latencies) < total:
                    data = await reader.read(1 << 16)
                    if not data:
                        break
                    now = time.time_ns()
                    buf += data
                    pos = 0
                    while len(buf) - pos >= 4:
                        end = pos + 4 + _LEN.unpack_from(buf, pos)[0]
                        if end > len(buf):
                            break
                        ts = _TS.unpack_from(buf, pos + 4)[0]
                        if ts:
                            latencies.append((now - ts) / 1e6)
                        pos = end
                    del buf[:pos]
        except TimeoutError:
            pass
    finally:
        writer.close()
    return latencies


async def _relay_produce(system: str, address: str, rate: int, total: int, pacing: str, size: int) -> int:
    reader, writer = await _relay_open(address, b"P")
    pad = bytes(max(0, size - 8))

    async def send(batch: list[bytes]) -> None:  # one request in flight, as Redis's pipeline
        writer.write(b"".join(_LEN.pack(len(payload)) + payload for payload in batch))
        acked = 0
        while acked < len(batch):
            acked += _LEN.unpack(await reader.readexactly(4))[0]

    try:
        await send([_TS.pack(0) + pad])  # the consumer skips a 0 stamp
        _settle()
        return await _produce_paced(send, pad, rate, total, pacing)
    finally:
        writer.close()


_CLIENTS: dict[str, tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]] = {
    "redis": (_redis_reset, _redis_consume, _redis_produce),
    "redis-4": (_redis_reset, _redis_consume, _redis_produce),
    "redis-always": (_redis_reset, _redis_consume, _redis_produce),
    "nats": (_nats_reset, _nats_consume, _nats_produce),
    "relay": (_relay_reset, _relay_consume, _relay_produce),
}


def _consumer_entry(system: str, address: str, total: int, ready: Any, timeout_s: float, out: Any) -> None:
    consume = _CLIENTS[system][1]
    out.put(("consumer", run_loop(consume(system, address, total, ready, time.perf_counter() + timeout_s))))


def _producer_entry(system: str, address: str, rate: int, total: int, pacing: str, size: int, out: Any) -> None:
    produce = _CLIENTS[system][2]
    out.put(("producer", run_loop(produce(system, address, rate, total, pacing, size))))


def run_peer(system: str, address: str, rate: int, duration_s: float, pacing: str, size: int) -> dict[str, Any]:
    """One run against a peer: a fresh stream, a consumer process, then a producer process; the latencies."""
    run_loop(_CLIENTS[system][0](system, address))
    total = int(rate * duration_s)
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    out = ctx.Queue()
    consumer = ctx.Process(target=_consumer_entry, args=(system, address, total, ready, duration_s + 30, out),
                           daemon=True)
    consumer.start()
    if not ready.wait(30):
        consumer.kill()
        raise BenchError(f"the {system} consumer was not ready within 30 s")
    producer = ctx.Process(target=_producer_entry, args=(system, address, rate, total, pacing, size, out),
                           daemon=True)
    producer.start()
    got: dict[str, Any] = {}
    deadline = time.monotonic() + duration_s + 60
    while len(got) < 2 and time.monotonic() < deadline:
        try:
            kind, value = out.get(timeout=max(0.1, deadline - time.monotonic()))
        except Exception:  # queue.Empty: a process died or hung; reported below
            break
        got[kind] = value
    for proc in (producer, consumer):
        proc.join(5)
        if proc.is_alive():
            proc.kill()
    if len(got) < 2:
        raise BenchError(f"{system}: {sorted(got) or 'no process'} reported (exit codes "
                           f"{producer.exitcode}, {consumer.exitcode})")
    latencies: list[float] = got["consumer"]  # all of them, as bench e2e counts every message
    return {"system": system, "pacing": pacing, "messages": len(latencies), "acked": got["producer"],
            "sent": total, "latency_ms": percentiles(latencies)}


def run_metaq(system: str, rate: int, duration_s: float, pacing: str, size: int) -> dict[str, Any]:
    """One `metaq bench e2e` run of a metaq system (its embedded broker), in the peers' shape."""
    result = run_bench(BenchSpec(mode="e2e", linger_ms=0, rate=rate, duration_s=duration_s, size=size, pacing=pacing,
                                 count=int(rate * duration_s), **METAQ_SYSTEMS[system]))
    return {"system": system, "pacing": pacing, "messages": result.messages, "sent": int(rate * duration_s),
            "latency_ms": result.latency_ms, "fdatasync_ms": result.fdatasync_ms,
            "loopback_rtt_ms": result.loopback_rtt_ms}


# -- the run ---------------------------------------------------------------------------------

SYSTEMS = (*METAQ_SYSTEMS, *PEER_SYSTEMS)


def run(systems: list[str], pacings: list[str], rounds: int, rate: int, duration_s: float, size: int,
        report: Report) -> dict[str, Any]:
    """Every system under every pacing, ``rounds`` times, interleaved; the loopback round trip once a round."""
    require_known("systems", systems, SYSTEMS)
    require_known("pacings", pacings, ("tick", "even"))
    if size < 8:
        raise BenchError("the message size must hold the 8-byte send stamp")
    results: list[dict[str, Any]] = []
    rtts: list[float] = []
    with tempfile.TemporaryDirectory(prefix="metaq-bench-peers-") as root, \
            Servers([s for s in systems if s in PEER_SYSTEMS], Path(root)) as servers:
        for rnd in range(1, rounds + 1):
            rtt = percentiles(measure_loopback_rtt(2000)).get("p50", float("nan"))
            rtts.append(rtt)
            report(f"round {rnd}: loopback round trip p50 {rtt:.3f} ms")
            for pacing in pacings:
                for system in systems:
                    if system in METAQ_SYSTEMS:
                        r = run_metaq(system, rate, duration_s, pacing, size)
                    else:
                        r = run_peer(system, servers.addresses[system], rate, duration_s, pacing, size)
                    r["round"] = rnd
                    results.append(r)
                    report(f"round {rnd} {pacing} {system}: {_cell(r)}")
    return {"systems": systems, "pacings": pacings, "rate": rate, "duration_s": duration_s, "size": size,
            "loopback_rtt_p50_ms": rtts, "runs": results}


def _cell(r: dict[str, Any]) -> str:
    lat = r["latency_ms"]
    text = f"{lat['p50']:.3f} / {lat['p99']:.2f}"
    if r.get("fdatasync_ms"):
        text += f" (fdatasync {r['fdatasync_ms']['p50']:.3f})"
    if r["messages"] < r["sent"]:
        text += f" ({r['messages']:,} of {r['sent']:,} received)"
    return text


def table(result: dict[str, Any]) -> str:
    rows = []
    for pacing in result["pacings"]:
        for system in result["systems"]:
            runs = [r for r in result["runs"] if r["system"] == system and r["pacing"] == pacing]
            rows.append([system, pacing, " · ".join(_cell(r) for r in runs)])
    rtts = ", ".join(f"{x:.3f}" for x in result["loopback_rtt_p50_ms"])
    return (f"{result['rate']:,} msg/s of {result['size']} B for {result['duration_s']:g} s a run; the loopback round "
            f"trip p50 per round (the baseline): {rtts} ms\n\n"
            + markdown_table(["system", "pacing", "p50 / p99 ms, each run"], rows))
