"""The processes of a bench: what Linux's /proc says about one (CPU time, resident set, descriptors, page faults),
where it runs (CPU pinning), its event loop, and Ctrl-C kept to the parent."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import threading
from collections.abc import Coroutine, Iterator
from typing import Any


def process_cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of a process (Linux /proc), or None where that cannot be read."""
    stat = _stat_fields(pid)
    return None if stat is None else (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


def minor_faults(pid: int | None) -> int:
    """Minor page faults of a process so far (0 where /proc cannot be read)."""
    stat = _stat_fields(pid)
    return 0 if stat is None else int(stat[7])


def _stat_fields(pid: int | None) -> list[str] | None:
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        int(fields[12])
        return fields
    except (OSError, ValueError, IndexError):
        return None


def rss_mib(pid: int | None) -> float:
    """A process's resident set (VmRSS) in MiB; 0.0 where /proc cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def open_fds(pid: int | None) -> int:
    """Descriptors a process holds open (0 where /proc cannot be read)."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def pin_process(pid: int, cpu: int) -> None:
    """Run every thread of process ``pid`` (and the threads it starts later) on ``cpu`` only."""
    try:
        tasks = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tasks = [pid]
    for task in tasks:
        os.sched_setaffinity(task, {cpu})


@contextlib.contextmanager
def children_ignore_sigint() -> Iterator[None]:
    """Processes started in the block ignore SIGINT (an ignored signal stays ignored across exec).

    Ctrl-C reaches every process of the terminal's process group; the parent alone decides what it
    means, so a worker never prints a KeyboardInterrupt traceback (e.g. while still importing).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def install_loop(kind: str) -> None:
    """Make ``kind`` ("uvloop" or "asyncio") the event loop of this process's ``asyncio.run`` calls."""
    if kind == "uvloop":
        try:
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        except ImportError:
            pass


def run_loop(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` on uvloop where it is installed (what the clients use), else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def free_port() -> int:
    """A loopback port nothing listens on now: connecting to it is refused, and a server may take it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
