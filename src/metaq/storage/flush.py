"""The flusher: one background thread that makes appended batches durable, per MetaQ's flush knobs.

=====================  =========================================================================
unflush_threshold       what the flusher does
=====================  =========================================================================
1                       every append queues its own job; each job is one fdatasync; acks wait
<= 0 (group commit)     appends mark their log pending; one round fdatasyncs every pending log
                        once and resolves every ack waiting on it; appends arriving during a round
                        join the next round, which is where the coalescing comes from
N > 1                   acks do not wait; a log is synced when it has N unflushed messages or its
                        oldest unflushed append is ``unflush_interval_ms`` old, whichever is first
=====================  =========================================================================

The flusher only schedules: the log does the syncing (``flush_pending``) and resolves its durable
futures. A failing sync fails those futures and never stops the thread. The thread also closes file
descriptors left idle (``idle_hook``). A round with few logs (``inline_max_logs``, default 2) is synced
in the flusher's own thread, one log after the other: no hand-off to another thread, which is what an
ack with unflush_threshold=1 waits on when the broker serves a few busy partitions. A larger round syncs
its logs side by side on a small pool (``sync_workers``), the flusher's thread taking one of them
itself; one log's jobs always run in order. Threads, never asyncio: storage
knows nothing of event loops; the broker awaits the durable futures with ``asyncio.wrap_future``.

A round of many logs (``FilesystemSync.min_logs``, the broker's ``syncfsMinPartitions``) can be made
durable by ONE sync of the whole filesystem instead of an fdatasync per log (Linux syncfs(2); 10,000
logs with a few hundred bytes each: ~50 ms instead of ~1 s here): each log takes what it has unsynced
(``begin_covered_flush``), the flusher syncs the filesystem, each log then marks it synced and resolves its
acks (``end_covered_flush``). Should the filesystem sync fail, every log of the round fdatasyncs its own
files, so that the error reaches the log it belongs to (and only that one goes offline), and the flusher
fdatasyncs every log on its own from then on: syncfs reports a write-back error once, and the file it
belongs to may be in a later round, whose fdatasync then reports it to its log (a syncfs would not again).
A round of a few logs (``quiet_min_logs``, the broker's ``syncfsQuietMinPartitions``) is synced the same way
while the machine has little else to write back: then one syncfs costs about one fdatasync and saves the rest,
their CPU and their hand-offs. With other writers' dirty pages waiting it would wait for them too, so such a
round fdatasyncs log by log. The unflushThreshold=1 jobs of a log taken this way are resolved by the sync of
its round (it began after their batches were written).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from metaq.errors import StorageError
from metaq.fsutil import SYNCFS_DURABLE_FILESYSTEMS, WriteBackGauge, filesystem_name, syncfs, syncfs_available

log = logging.getLogger(__name__)

_IDLE_TICK_SECONDS = 1.0


class SyncTarget(Protocol):
    """What the flusher drives: a PartitionLog."""

    def flush_pending(self, forced_segment: Any = None, future: Future[None] | None = None) -> None: ...


class CoveredTarget(Protocol):
    """A SyncTarget whose flush can be split around a sync of its whole filesystem (a PartitionLog)."""

    def begin_covered_flush(self, device: int) -> Any: ...

    def end_covered_flush(self, taken: Any, synced: bool) -> None: ...


QUIET_WRITE_BACK_BYTES = 512 * 1024
"""A round of ``quiet_min_logs`` uses a syncfs only while the machine has at most this much to write back. On a
2-core VM (docs/benchmarks.md), a syncfs with four small appends took 0.17 ms against 0.75 for their
four fdatasyncs one after the other and 0.46 side by side; each MB of other dirty data added about 0.5-0.9 ms to it."""

CLEAN_UP_WRITE_BACK_BYTES = 4 << 20
CLEAN_UP_INTERVAL_S = 1.0
"""With more than :data:`QUIET_WRITE_BACK_BYTES` but at most :data:`CLEAN_UP_WRITE_BACK_BYTES` to write back, one
round a second (``CLEAN_UP_INTERVAL_S`` after the last syncfs) still uses a syncfs: a few milliseconds at most, and
it writes back what a one-time write left (files just deleted or created, another program's small write), which
would otherwise keep every round on fdatasyncs until the kernel's own write-back, up to 30 s later. A steady
writer keeps the figure high and pays nothing more; beyond the larger figure a round never waits for it."""


@dataclass(frozen=True)
class SyncfsDecision:
    """Whether flush rounds (and the clean close) of a data directory may be made durable by one syncfs, taken
    once at start: only on a filesystem known to honour it (:data:`~metaq.fsutil.SYNCFS_DURABLE_FILESYSTEMS`),
    on Linux 5.8+, and unless the operator turned it off. Everywhere else every partition fdatasyncs its own
    files and fsyncs its own directory entries."""

    used: bool
    filesystem: str
    """The data directory's filesystem (``ext4``, ``fuse``, a magic number in hex ...)."""
    reason: str
    """Why, in words for the log and ``metaq stats``."""

    def describe(self) -> dict[str, Any]:
        return {"filesystem": self.filesystem, "syncfs": self.used, "syncfs_reason": self.reason}


def decide_syncfs(directory: str | os.PathLike[str], *, enabled: bool, min_logs: int) -> SyncfsDecision:
    """The :class:`SyncfsDecision` for ``directory``: ``enabled`` is the operator's word (the broker's
    ``syncfs`` option), ``min_logs`` the rounds' threshold (0: never)."""
    name = filesystem_name(directory)
    if not enabled:
        return SyncfsDecision(False, name, "turned off (syncfs=off): every partition syncs its own files")
    if min_logs <= 0:
        return SyncfsDecision(False, name, "turned off (syncfsMinPartitions=0): every partition syncs its own files")
    if name not in SYNCFS_DURABLE_FILESYSTEMS:
        return SyncfsDecision(False, name, f"{name} is not known to make data durable with syncfs (it is used only "
                                           f"on {', '.join(sorted(SYNCFS_DURABLE_FILESYSTEMS))}): every partition "
                                           "syncs its own files")
    if not syncfs_available():
        return SyncfsDecision(False, name, "syncfs is not available here (Linux 5.8 or later reports write-back "
                                           "errors to it): every partition syncs its own files")
    return SyncfsDecision(True, name, f"{name} makes data durable with syncfs: a flush round of "
                                      f"{min_logs} or more partitions is one syncfs")


class FilesystemSync:
    """The filesystem holding a directory, synced whole (syncfs(2)) for a flush round of at least
    ``min_logs`` logs on it, or of at least ``quiet_min_logs`` (0: never) while the machine has little else to
    write back (``write_back_bytes`` at most :data:`QUIET_WRITE_BACK_BYTES`, or :data:`CLEAN_UP_WRITE_BACK_BYTES`
    once a second): then the syncfs costs about one fdatasync, and a round of a few partitions saves the others.
    Holds a descriptor of the directory (and, with ``quiet_min_logs``, of /proc/meminfo) until :meth:`close`."""

    def __init__(self, directory: str | os.PathLike[str], min_logs: int,
                 sync_filesystem: Callable[[int], None] = syncfs, *, quiet_min_logs: int = 0,
                 write_back_bytes: Callable[[], int | None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.min_logs = max(1, min_logs)
        self._clock = clock
        self._last_sync_s = float("-inf")
        self.quiet_min_logs = max(0, quiet_min_logs) if quiet_min_logs < self.min_logs else 0
        self._sync_filesystem = sync_filesystem
        self._gauge: WriteBackGauge | None = None
        if self.quiet_min_logs and write_back_bytes is None:
            self._gauge = write_back_bytes = WriteBackGauge()
        self._write_back_bytes = write_back_bytes
        self._fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        self.device = os.fstat(self._fd).st_dev
        self.syncs = 0
        """Rounds made durable this way."""
        self.failures = 0
        self.failed = False
        """A sync failed: not used again (module docstring)."""
        self.busy_skips = 0
        """Rounds of ``quiet_min_logs`` or more (fewer than ``min_logs``) fdatasynced log by log because the
        machine had more than :data:`QUIET_WRITE_BACK_BYTES` to write back (or it could not be read)."""

    def covers(self, logs: int) -> bool:
        """Whether a round of ``logs`` logs is to be synced whole."""
        if self.failed:
            return False
        if logs >= self.min_logs:
            return True
        if not self.quiet_min_logs or logs < self.quiet_min_logs or self._write_back_bytes is None:
            return False
        pending = self._write_back_bytes()
        if pending is not None and (pending <= QUIET_WRITE_BACK_BYTES or (
                pending <= CLEAN_UP_WRITE_BACK_BYTES and self._clock() - self._last_sync_s >= CLEAN_UP_INTERVAL_S)):
            return True
        self.busy_skips += 1
        return False

    def sync(self) -> bool:
        """Whether the sync succeeded (False: a write-back error somewhere on the filesystem, logged; from
        then on :attr:`failed`)."""
        try:
            self._sync_filesystem(self._fd)
        except Exception as exc:  # an OSError from syncfs(2); anything else is no sync either
            self.failures += 1
            self.failed = True
            log.error("syncfs of the data directory's filesystem failed (%s): each partition of the round "
                      "fdatasyncs its own files instead, and every flush does so until the broker restarts", exc)
            return False
        self.syncs += 1
        self._last_sync_s = self._clock()
        return True

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._gauge is not None:
            self._gauge.close()


class Flusher:
    """Background sync scheduler shared by all logs of a LogManager."""

    def __init__(self, *, clock: Callable[[], float] = time.time,
                 idle_hook: Callable[[], None] | None = None, idle_interval_seconds: float = 10.0,
                 sync_workers: int = 4, inline_max_logs: int = 2, name: str = "metaq-flusher") -> None:
        self._clock = clock
        self._sync_workers = max(1, sync_workers)
        self._inline_max_logs = max(1, inline_max_logs)
        self._pool: ThreadPoolExecutor | None = None
        self._idle_hook = idle_hook
        self._idle_interval_seconds = idle_interval_seconds
        self._name = name
        self._cond = threading.Condition(threading.Lock())
        self._singles: deque[tuple[SyncTarget, Any, Future[None]]] = deque()
        self._soon: dict[SyncTarget, None] = {}
        self._deadlines: list[tuple[int, int, SyncTarget]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._stopped = False
        self._busy = False
        self.rounds = 0
        self.errors = 0
        self.filesystem_sync: FilesystemSync | None = None
        """Set before :meth:`start` to sync large rounds with one syncfs (module docstring)."""

    # ------------------------------------------------------------------ control

    def start(self) -> None:
        with self._cond:
            if self._thread is not None:
                return
            if self._sync_workers > 1:
                self._pool = ThreadPoolExecutor(self._sync_workers, thread_name_prefix=f"{self._name}-sync")
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def stop(self, timeout: float | None = 30.0) -> None:
        """Finish every queued job, then end the thread. Later submissions raise StorageError."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        with self._cond:
            self._stopped = True

    @property
    def running(self) -> bool:
        return self._thread is not None and not self._stopping

    @property
    def accepting(self) -> bool:
        """Whether submissions are taken (before start they queue; after stop they are refused)."""
        return not self._stopping

    def wake(self) -> None:
        """Re-evaluate deadlines now (a test that moved its fake clock calls this)."""
        with self._cond:
            self._cond.notify_all()

    def drain(self, timeout: float = 30.0) -> bool:
        """Wait until nothing is queued or in progress (deadlines in the future do not count)."""
        end = time.monotonic() + timeout
        with self._cond:
            while self._singles or self._soon or self._busy:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    # ------------------------------------------------------------------ submissions (any thread)

    def sync_append(self, target: SyncTarget, segment: Any, future: Future[None]) -> None:
        """unflush_threshold == 1: one fdatasync of ``segment`` for this one append."""
        with self._cond:
            self._check_open()
            self._singles.append((target, segment, future))
            self._cond.notify()

    def flush_soon(self, target: SyncTarget) -> None:
        """Group commit, a threshold reached, a roll: sync ``target`` in the next round."""
        with self._cond:
            self._check_open()
            if target not in self._soon:
                self._soon[target] = None
                self._cond.notify()

    def flush_at(self, target: SyncTarget, deadline_ms: int) -> None:
        """Sync ``target`` at ``deadline_ms`` (the injected clock, in ms) unless synced before."""
        with self._cond:
            self._check_open()
            heapq.heappush(self._deadlines, (deadline_ms, next(self._seq), target))
            if self._deadlines[0][2] is target:
                self._cond.notify()

    def _check_open(self) -> None:
        if self._stopping:
            raise StorageError("the flusher is stopped; the log manager is closing")

    # ------------------------------------------------------------------ the thread

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _run(self) -> None:
        last_idle = time.monotonic()
        while True:
            with self._cond:
                while True:
                    due = self._pop_due_locked()
                    if self._singles or self._soon or due or self._stopping:
                        break
                    timeout = _IDLE_TICK_SECONDS
                    if self._deadlines:
                        timeout = min(timeout, max(0.0, (self._deadlines[0][0] - self._now_ms()) / 1000))
                    self._cond.wait(timeout)
                    if time.monotonic() - last_idle >= self._idle_interval_seconds:
                        break
                singles = self._singles
                self._singles = deque()
                targets = list(self._soon)
                self._soon = {}
                for target in due:
                    if target not in targets:
                        targets.append(target)
                finished = self._stopping and not singles and not targets
                self._busy = bool(singles or targets)
            if finished:
                self._run_idle_hook()
                with self._cond:
                    self._cond.notify_all()
                return
            if singles or targets:
                self.rounds += 1
                self._run_round(singles, targets)
            with self._cond:
                self._busy = False
                self._cond.notify_all()
            if time.monotonic() - last_idle >= self._idle_interval_seconds:
                last_idle = time.monotonic()
                self._run_idle_hook()

    def _run_round(self, singles: deque[tuple[SyncTarget, Any, Future[None]]],
                   targets: list[SyncTarget]) -> None:
        """One round: each log's jobs in order; the logs of a large round in parallel.

        fdatasync releases the GIL and a filesystem journal merges concurrent commits, so syncing
        the logs of a large round side by side costs about one sync instead of one per log. A round of
        one or two logs gains little from that and pays the hand-offs (the pool's threads waking, each
        waiting for the GIL the event loop holds), so the flusher syncs it itself.
        """
        work: dict[SyncTarget, list[tuple[Any, Future[None] | None]]] = {}
        for target, segment, future in singles:
            work.setdefault(target, []).append((segment, future))
        for target in targets:
            work.setdefault(target, []).append((None, None))
        filesystem = self.filesystem_sync
        if filesystem is not None and filesystem.covers(len(work)):
            work, _covered = self._sync_covered(filesystem, work)
            if not work:
                return
        if self._pool is None or len(work) <= self._inline_max_logs:
            for target, jobs in work.items():
                self._sync_all(target, jobs)
            return
        items = iter(work.items())
        own_target, own_jobs = next(items)
        waits = [self._pool.submit(self._sync_all, target, jobs) for target, jobs in items]
        self._sync_all(own_target, own_jobs)  # this thread would only wait: it takes one log itself
        for wait in waits:
            wait.result()

    def sync_covered(self, targets: Sequence[SyncTarget]) -> list[SyncTarget]:
        """A clean close of many logs, in the calling thread once the flusher is stopped: the logs whose
        unsynced bytes one successful sync of their filesystem made durable (with everything written to
        that filesystem before it, index files too). Empty without a usable :class:`FilesystemSync` or with
        fewer than its ``min_logs`` logs; each log not covered still has its bytes to sync itself."""
        filesystem = self.filesystem_sync
        if filesystem is None or filesystem.failed or len(targets) < filesystem.min_logs:
            return []
        rest, synced = self._sync_covered(filesystem, {target: list(_PLAIN_JOBS) for target in targets})
        return [target for target in targets if target not in rest] if synced else []

    def _sync_covered(self, filesystem: FilesystemSync, work: dict[SyncTarget, list[tuple[Any, Future[None] | None]]],
                      ) -> tuple[dict[SyncTarget, list[tuple[Any, Future[None] | None]]], bool]:
        """The logs of ``work`` that can be made durable by one sync of their filesystem are; the rest (a sealed
        segment to sync, on another filesystem, another flush holding the log, ...) is returned, with whether the
        sync succeeded (each log taken syncs itself when it did not).

        A log's unflushThreshold=1 jobs are covered too: they were queued after their batches were written, so
        the filesystem sync (or, when it fails, the fdatasync the log then does itself) began after each of them,
        which is the sync each of their acks waits for. They are resolved with the log's outcome."""
        taken: list[tuple[CoveredTarget, Any, list[tuple[Any, Future[None] | None]]]] = []
        rest: dict[SyncTarget, list[tuple[Any, Future[None] | None]]] = {}
        synced = False
        try:
            for target, jobs in work.items():
                begin = getattr(target, "begin_covered_flush", None)
                flush = begin(filesystem.device) if begin is not None else None
                if flush is None:
                    rest[target] = jobs
                else:
                    taken.append((target, flush, jobs))  # type: ignore[arg-type]
            synced = bool(taken) and filesystem.sync()
        finally:  # whatever happened, each log taken is given back (synced, or syncing itself) and unlocked
            for covered, flush, jobs in taken:
                error: BaseException | None = None
                try:
                    covered.end_covered_flush(flush, synced)
                except Exception as exc:  # the log already failed its own futures; the round goes on
                    self.errors += 1
                    log.exception("flush of %r failed", covered)
                    error = exc
                for _segment, future in jobs:
                    resolve(future, error)
        return rest, synced

    def _sync_all(self, target: SyncTarget, jobs: list[tuple[Any, Future[None] | None]]) -> None:
        """Sync one log for this round.

        unflushThreshold=1 appends queued for the same log share ONE forced fdatasync: it starts after
        every one of them was written, so each ack still waits for a sync covering its batch (MetaQ's
        per-put force() calls on one file coalesce in the kernel the same way). Without this a busy
        partition queues one sync per batch and its ack latency grows without bound.
        """
        singles = [(segment, future) for segment, future in jobs if future is not None]
        if singles:
            segment, last = singles[-1]
            self._sync(target, segment, last)
            error = last.exception() if last.done() else None
            for _segment, future in singles[:-1]:
                resolve(future, error)
        if len(singles) < len(jobs):
            self._sync(target, None, None)

    def _pop_due_locked(self) -> list[SyncTarget]:
        due: list[SyncTarget] = []
        if not self._deadlines:
            return due
        now = self._now_ms()
        while self._deadlines and self._deadlines[0][0] <= now:
            due.append(heapq.heappop(self._deadlines)[2])
        return due

    def _sync(self, target: SyncTarget, segment: Any, future: Future[None] | None) -> None:
        try:
            target.flush_pending(segment, future)
        except Exception:  # the log already failed its futures; the thread must go on
            self.errors += 1
            log.exception("flush of %r failed", target)

    def _run_idle_hook(self) -> None:
        if self._idle_hook is None:
            return
        try:
            self._idle_hook()
        except Exception:
            log.exception("idle hook failed")


_PLAIN_JOBS = [(None, None)]
"""A log's jobs in a round when it only has to be synced (no unflushThreshold=1 append forcing a segment)."""


def new_durable_future() -> Future[None]:
    """A future nobody can cancel: acks of many appends may share it, and asyncio.wrap_future would
    otherwise cancel it for every waiter when one waiting coroutine is cancelled."""
    future: Future[None] = Future()
    future.set_running_or_notify_cancel()
    return future


def resolve(future: Future[None] | None, error: BaseException | None = None) -> None:
    """Complete a durable future once; a second completion (close racing the flusher) is ignored."""
    if future is None or future.done():
        return
    try:
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)
    except InvalidStateError:
        pass


def done_future() -> Future[None]:
    future = new_durable_future()
    future.set_result(None)
    return future
