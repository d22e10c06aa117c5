"""A bounded pool of open file descriptors, so one process can hold tens of thousands of segments.

Every segment and index file is opened through a FileCache when it is used and stays open while it
is used again soon. Past ``max_open_files`` the least recently used descriptor that nobody holds is
closed; a pinned descriptor (a reader's slice being sent, a write in progress) is never closed under
its holder.

A plain LRU thrashes when more files are used in turn than the budget holds (a producer going round robin
over more partitions than ``maxOpenFiles``): each file is the least recently used one just before it is
needed again, so every use reopens it, even with the budget one file short. So once the pool is full, a
newly opened descriptor goes in at the least recently used end, first in line to be closed unless it is used
again before the next open, and only one in ``INSERT_RECENT_EVERY``, drawn at random, at the most recently
used end (bimodal insertion, BIP: Qureshi et al., "Adaptive insertion policies for high performance
caching", 2007; at random, because a fixed every-n-th would never pick a file whose opens alternate in step
with others). Files used in turn then keep about ``max_open_files`` of them open (a hit rate of budget /
files instead of 0); a file used again soon still stays open, after a few dozen reopens at most; a pool
with room is a plain LRU.

If every descriptor is pinned the pool goes over its budget rather than blocking or
failing a reader: the budget is a soft limit, and ``overshoot_count`` says how often it was passed.
Descriptors unused for a while are closed by ``close_idle`` (the flusher thread calls it).

Running out of descriptors is not a storage failure. When an open fails with EMFILE or ENFILE (the
process's or the system's open-files limit is below what the budget assumed: a low ``ulimit -n``, or
sockets using the rest) the pool closes idle descriptors, a quarter at a time (at least
``SHORTAGE_HEADROOM``), until the open succeeds, and lowers its budget to what is left open; ``shortages``
counts these, and each is logged. Opens outside the pool (a partition's directory listing, a directory to
fsync) go through ``call``/``open_raw`` for the same answer. ``close_idle`` gives the
budget back (the shortage may have been a burst of connections). Only with no idle descriptor to close
does the error reach the caller.

The pool is keyed by path. A path can be ``discard``-ed (segment deleted, log closed): the descriptor
is closed at once when nobody holds it, or when its last holder releases it.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import resource
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

_OPEN_FLAGS = os.O_RDWR | getattr(os, "O_CLOEXEC", 0)
SHORTAGE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE})
SHORTAGE_HEADROOM = 16
"""Descriptors a shortage frees beyond the one the pool needs, for the storage's opens outside the pool."""
INSERT_RECENT_EVERY = 32
"""Of the descriptors opened into a full pool, one in this many (at random) goes in as the most recently used,
the others as the least recently used: see the module docstring."""
_T = TypeVar("_T")

log = logging.getLogger(__name__)


def raise_descriptor_limit(wanted: int) -> int:
    """Raise this process's soft RLIMIT_NOFILE to ``wanted`` if it is lower (never above the hard limit,
    never lowering it); returns the soft limit in force afterwards. A Linux default of 1024 would make
    a FileCache of 1024 plus the sockets fail with EMFILE long before the budget says so."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return soft if soft != resource.RLIM_INFINITY else wanted
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


class FileHandle:
    """One open descriptor and how many holders it has. Use ``fd`` only between acquire and release."""

    __slots__ = ("doomed", "fd", "last_used", "on_close", "path", "refs")

    def __init__(self, path: str, fd: int, on_close: Callable[[], None] | None) -> None:
        self.path = path
        self.fd = fd
        self.refs = 0
        self.last_used = 0.0
        self.on_close = on_close
        self.doomed = False


class FileCache:
    """LRU of open descriptors with a soft budget (and bimodal insertion once full). Thread-safe."""

    def __init__(self, max_open_files: int = 1024, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_open_files < 1:
            raise ValueError(f"max_open_files must be >= 1, not {max_open_files}")
        self.max_open_files = max_open_files
        """The budget in force: ``configured_max_open_files``, or less after a descriptor shortage."""
        self.configured_max_open_files = max_open_files
        self._clock = clock
        self._lock = threading.Lock()
        self._open: OrderedDict[str, FileHandle] = OrderedDict()
        self.open_calls = 0
        self._random = random.Random()
        self.overshoot_count = 0
        self.shortages = 0
        """Times the process was found out of descriptors (EMFILE, ENFILE) and idle ones were shed."""

    def set_budget(self, max_open_files: int) -> None:
        """Change the budget (the broker fits it under the process's open-files limit at start)."""
        if max_open_files < 1:
            raise ValueError(f"max_open_files must be >= 1, not {max_open_files}")
        with self._lock:
            self.max_open_files = self.configured_max_open_files = max_open_files
            if len(self._open) > max_open_files:
                self._evict_locked()

    @property
    def open_count(self) -> int:
        """Descriptors open now (those discarded but still held are not counted)."""
        return len(self._open)

    def acquire(self, path: str, *, create: bool = False,
                on_close: Callable[[], None] | None = None) -> FileHandle:
        """Pin and return the descriptor for ``path``, opening it (read-write) if needed.

        ``on_close`` is remembered from the first open and called (under the pool lock, so it must be
        trivial) when the descriptor is closed, letting the owner drop state tied to it.
        FileNotFoundError if the file is missing and ``create`` is false.
        """
        with self._lock:
            handle = self._open.get(path)
            if handle is None:
                fd = self._open_locked(path, _OPEN_FLAGS | os.O_CREAT if create else _OPEN_FLAGS)
                self.open_calls += 1
                handle = FileHandle(path, fd, on_close)
                handle.refs = 1  # pinned before eviction runs, so it never evicts itself
                self._open[path] = handle
                if len(self._open) > self.max_open_files:
                    if self._random.randrange(INSERT_RECENT_EVERY):
                        self._open.move_to_end(path, last=False)  # next in line, unless used again first
                    self._evict_locked()
                return handle
            self._open.move_to_end(path)
            handle.refs += 1
            return handle

    def open_raw(self, path: str | os.PathLike[str], flags: int) -> int:
        """``os.open`` for a descriptor the caller closes itself (a directory to fsync), with the pool's
        answer to a descriptor shortage."""
        return self.call(os.open, path, flags, 0o644)

    def call(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)``, something that opens descriptors of its own (a directory listing, a partition's
        open); when it fails with EMFILE or ENFILE, idle descriptors of the pool are shed and it is called
        again, until it succeeds or nothing idle is left to shed."""
        while True:
            try:
                return fn(*args)
            except OSError as exc:
                if exc.errno not in SHORTAGE_ERRNOS:
                    raise
                with self._lock:
                    if not self._shed_locked(exc):
                        raise

    def _open_locked(self, path: str | os.PathLike[str], flags: int) -> int:
        while True:
            try:
                return os.open(path, flags, 0o644)
            except OSError as exc:
                if exc.errno not in SHORTAGE_ERRNOS or not self._shed_locked(exc):
                    raise

    def _shed_locked(self, exc: OSError) -> int:
        """The process is out of descriptors: close a quarter of the idle ones, and at least
        SHORTAGE_HEADROOM (for the opens outside the pool: listings, checkpoints, sockets), least recently
        used first, and lower the budget to what is left open. Returns how many were closed (0: none was
        idle, nothing to free)."""
        idle = [path for path, handle in self._open.items() if handle.refs == 0]
        victims = idle[:max(SHORTAGE_HEADROOM, len(idle) // 4)]
        for path in victims:
            self._close_locked(self._open.pop(path))
        if victims:
            self.shortages += 1
            before, self.max_open_files = self.max_open_files, max(1, len(self._open))
            log.warning("out of file descriptors (%s): closed %d idle ones of the storage's pool and lowered its "
                        "budget from %d to %d until the next idle sweep; raise the open-files limit (ulimit -n, "
                        "LimitNOFILE=) or lower maxOpenFiles (docs/operations.md)", exc.strerror or exc,
                        len(victims), before, self.max_open_files)
        return len(victims)

    def release(self, handle: FileHandle) -> None:
        with self._lock:
            assert handle.refs > 0, f"release of {handle.path} that is not held"
            handle.refs -= 1
            handle.last_used = self._clock()
            if handle.refs == 0 and handle.doomed:
                self._close_locked(handle)

    def discard(self, path: str) -> None:
        """Forget ``path``: close it now, or when its last holder releases it."""
        with self._lock:
            handle = self._open.pop(path, None)
            if handle is None:
                return
            if handle.refs == 0:
                self._close_locked(handle)
            else:
                handle.doomed = True

    def close_idle(self, idle_seconds: float) -> int:
        """Close descriptors nobody held for ``idle_seconds``; returns how many were closed. Gives back a
        budget lowered by a descriptor shortage."""
        cutoff = self._clock() - idle_seconds
        closed = 0
        with self._lock:
            self.max_open_files = self.configured_max_open_files
            for path in [p for p, h in self._open.items() if h.refs == 0 and h.last_used <= cutoff]:
                self._close_locked(self._open.pop(path))
                closed += 1
        return closed

    def close_all(self) -> None:
        """Close every descriptor nobody holds; held ones close on release."""
        with self._lock:
            for handle in list(self._open.values()):
                if handle.refs == 0:
                    self._close_locked(handle)
                else:
                    handle.doomed = True
            self._open.clear()

    def _evict_locked(self) -> None:
        excess = len(self._open) - self.max_open_files
        victims = []
        for path, handle in self._open.items():
            if excess <= 0:
                break
            if handle.refs == 0:
                victims.append(path)
                excess -= 1
        for path in victims:
            self._close_locked(self._open.pop(path))
        if excess > 0:
            self.overshoot_count += 1

    @staticmethod
    def _close_locked(handle: FileHandle) -> None:
        if handle.fd < 0:
            return
        fd, handle.fd = handle.fd, -1
        try:
            os.close(fd)
        finally:
            if handle.on_close is not None:
                handle.on_close()
