"""Same-run baselines: what the machine itself gives, measured in the same minutes as the figure beside it.

A figure of metaq on a shared machine moves by tens of percent from one minute to the next; the machine's own
floor, measured in the same run, says how much of that is the machine:

- :func:`measure_fdatasync`: the disk's fdatasync of a small write (the floor under an ack after an fsync);
- :func:`measure_loopback_rtt`: a message-sized round trip between two processes over loopback TCP (the floor
  under a delivery's two hops);
- :func:`read_files` / :func:`read_files_side_by_side`: the disk's sequential read (a backlog off the page cache);
- :func:`send_files`: segment files pushed over loopback TCP by ``sendfile`` or ``pread`` + ``send`` (the copy a
  fetch reply makes, without protocol or client);
- :func:`raw_fetch`: the broker's Fetch with nothing decoded (the broker and the socket without the consumer).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def percentiles(samples: list[float]) -> dict[str, float]:
    """p50, p99, p999 and max of ``samples`` (rounded to 3 decimals); empty for no samples."""
    if not samples:
        return {}
    s = sorted(samples)

    def pick(q: float) -> float:
        return round(s[min(len(s) - 1, int(q * len(s)))], 3)

    return {"p50": pick(0.50), "p99": pick(0.99), "p999": pick(0.999), "max": round(s[-1], 3)}


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


# -- the disk and the page cache ------------------------------------------------------------------

CHUNK_BYTES = 1 << 20
"""Bytes per read, sendfile or fetch of the baselines below: a consumer's max_bytes per fetch."""


def read_files(files: list[Path]) -> tuple[int, float]:
    """(bytes, seconds) of reading ``files`` one after another, CHUNK_BYTES per ``readinto`` (what ``dd bs=1M``
    does)."""
    buf = bytearray(CHUNK_BYTES)
    total = 0
    start = time.perf_counter()
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                total += n
    return total, time.perf_counter() - start


def read_files_side_by_side(files: list[Path], streams: int) -> tuple[int, float]:
    """(bytes, seconds) of reading ``files`` by ``streams`` threads, each every n-th partition directory's files
    in turn: the disk as a broker reading several partitions at once meets it."""
    by_partition: dict[str, list[Path]] = {}
    for path in files:
        by_partition.setdefault(path.parent.name, []).append(path)
    groups: list[list[Path]] = [[] for _ in range(streams)]
    for i, name in enumerate(sorted(by_partition)):
        groups[i % streams] += by_partition[name]
    totals = [0] * streams

    def one(i: int) -> None:
        totals[i] = read_files(groups[i])[0]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(totals), time.perf_counter() - start


def resident_bytes(files: list[Path]) -> int:
    """Bytes of ``files`` in the page cache (util-linux's ``fincore``); -1 when fincore is not installed."""
    if shutil.which("fincore") is None or not files:
        return -1
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", *map(str, files)],
                         capture_output=True, text=True, check=True).stdout
    return sum(int(x) for x in out.split())


def _receive(port_out: Any, done: Any) -> None:
    """Child of :func:`send_files`: accept one connection, read it to EOF into one reused buffer, answer with
    the byte count."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port_out.put(server.getsockname()[1])
        conn, _ = server.accept()
        with conn:
            view = memoryview(bytearray(CHUNK_BYTES))
            total = 0
            while n := conn.recv_into(view):
                total += n
            conn.sendall(total.to_bytes(8, "big"))
    done.put(total)


def send_files(files: list[Path], how: str, deadline_s: float) -> tuple[int, float]:
    """(bytes, seconds) of pushing ``files`` over loopback TCP to a receiver process, ``how`` being ``sendfile``
    or ``pread`` (pread + sendall: what the broker does under uvloop, which has no loop.sendfile), CHUNK_BYTES
    per call; timed to the receiver's answer."""
    if how not in ("sendfile", "pread"):
        raise ValueError(f"unknown baseline {how!r} (sendfile or pread)")
    ctx = mp.get_context("spawn")
    port_q, done_q = ctx.Queue(), ctx.Queue()
    receiver = ctx.Process(target=_receive, args=(port_q, done_q), daemon=True)
    receiver.start()
    port = port_q.get(timeout=60)
    sent = 0
    with socket.create_connection(("127.0.0.1", port)) as conn:
        out = conn.fileno()
        start = time.perf_counter()
        deadline = start + deadline_s
        for path in files:
            fd = os.open(path, os.O_RDONLY)
            try:
                size = os.fstat(fd).st_size
                position = 0
                while position < size and time.perf_counter() < deadline:
                    if how == "sendfile":
                        n = os.sendfile(out, fd, position, min(CHUNK_BYTES, size - position))
                    else:
                        data = os.pread(fd, min(CHUNK_BYTES, size - position), position)
                        conn.sendall(data)
                        n = len(data)
                    if n == 0:
                        break
                    position += n
                    sent += n
            finally:
                os.close(fd)
        conn.shutdown(socket.SHUT_WR)
        got = int.from_bytes(conn.recv(8), "big")
        seconds = time.perf_counter() - start
    receiver.join(30)
    if got != sent:
        raise RuntimeError(f"the receiver counted {got} bytes, {sent} were sent")
    return sent, seconds


def raw_fetch(servers: str, topic: str, partitions: int, deadline_s: float) -> dict[str, Any]:
    """Every partition of ``topic`` read from its first offset to its end with the blocking client's Fetch
    (CHUNK_BYTES max_bytes, one request in flight per partition, a thread each): the batches are walked by
    their headers only, nothing decoded or checked, so this is what the broker and the socket deliver
    without the consumer's per-record work. Bytes are the records' bytes."""
    from metaq.client.blocking import BlockingClient
    from metaq.protocol.records import iter_batches

    totals = [0] * partitions
    deadline = time.perf_counter() + deadline_s

    def one(p: int) -> None:
        with BlockingClient(servers) as client:
            offset = client.list_offsets(topic, p, -2).offset
            end = client.list_offsets(topic, p, -1).offset
            while offset < end and time.perf_counter() < deadline:
                records = client.fetch(topic, p, offset, CHUNK_BYTES).records
                for _pos, header in iter_batches(records):
                    offset = header.next_offset
                totals[p] += len(records)

    threads = [threading.Thread(target=one, args=(p,)) for p in range(partitions)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(deadline_s + 60)
    seconds = time.perf_counter() - start
    return {"bytes": sum(totals), "seconds": seconds, "mb_s": sum(totals) / seconds / 1e6}
