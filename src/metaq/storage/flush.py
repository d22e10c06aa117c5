"""The flusher: background threads that make appended batches durable, per MetaQ's flush knobs.

=====================  =========================================================================
unflush_threshold       what the flusher does
=====================  =========================================================================
1                       every append queues its own job; each job is one fdatasync; acks wait
<= 0 (group commit)     appends mark their log pending; one sync of that log covers every append
                        pending when it starts and resolves every ack waiting on it; appends
                        arriving during a log's sync join its next one, which is where the
                        coalescing comes from
N > 1                   acks do not wait; a log is synced when it has N unflushed messages or its
                        oldest unflushed append is ``unflush_interval_ms`` old, whichever is first
=====================  =========================================================================

The flusher only schedules: the log does the syncing (``flush_pending``) and resolves its durable
futures. A failing sync fails those futures and never stops a thread.

``sync_workers`` threads (the flusher's own thread and ``sync_workers - 1`` helpers) take the logs
that have jobs queued, at most ``inline_max_logs`` (2) logs per take, and sync each taken log's jobs in
order, one log after the other. Whichever thread is idle takes the work: the appends of a burst wake
one waiting thread (no hand-off from a scheduling thread to a pool and back), and a
log's next sync starts as soon as its previous one ended, not when the slowest log of a "round" is
done. Many busy logs are synced side by side by all the threads (fdatasync releases the GIL and a
filesystem journal merges concurrent commits). A log is never synced by two threads at once, so its
jobs always run in order. The flusher's own thread also runs the ``flush_at`` deadlines and closes
file descriptors left idle (``idle_hook``). Threads, never asyncio: storage knows nothing of event
loops; the broker awaits the durable futures.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import Any, Protocol

from metaq.errors import StorageError

log = logging.getLogger(__name__)

_IDLE_TICK_SECONDS = 1.0

_Jobs = list[tuple[Any, "Future[None] | None"]]
"""One log's queued jobs, in arrival order: (segment, future) for an unflush_threshold=1 append,
(None, None) for "sync whatever is pending" (at most one queued per log)."""


class SyncTarget(Protocol):
    """What the flusher drives: a PartitionLog."""

    def flush_pending(self, forced_segment: Any = None, future: Future[None] | None = None) -> None: ...


class Flusher:
    """Background sync scheduler shared by all logs of a LogManager."""

    def __init__(self, *, clock: Callable[[], float] = time.time,
                 idle_hook: Callable[[], None] | None = None, idle_interval_seconds: float = 10.0,
                 sync_workers: int = 4, inline_max_logs: int = 2, name: str = "metaq-flusher") -> None:
        self._clock = clock
        self._sync_workers = max(1, sync_workers)
        self._inline_max_logs = max(1, inline_max_logs)
        self._idle_hook = idle_hook
        self._idle_interval_seconds = idle_interval_seconds
        self._name = name
        lock = threading.Lock()
        self._cond = threading.Condition(lock)  # the syncing threads wait here for work
        self._idle = threading.Condition(lock)  # drain() waits here for nothing queued or running
        self._queued: dict[SyncTarget, _Jobs] = {}
        self._soon: set[SyncTarget] = set()
        self._running: set[SyncTarget] = set()  # logs being synced (their new jobs wait their turn)
        self._waiting = 0  # syncing threads waiting for work
        self._wake_pending = False  # a waiting thread was woken and has not taken work yet
        self._deadlines: list[tuple[int, int, SyncTarget]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._helpers: list[threading.Thread] = []
        self._stopping = False
        self._stopped = False
        self.rounds = 0
        self.errors = 0

    # ------------------------------------------------------------------ control

    def start(self) -> None:
        with self._cond:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._helpers = [threading.Thread(target=self._help, name=f"{self._name}-sync_{i}", daemon=True)
                             for i in range(self._sync_workers - 1)]
            for thread in [self._thread, *self._helpers]:
                thread.start()

    def stop(self, timeout: float | None = 30.0) -> None:
        """Finish every queued job, then end the threads. Later submissions raise StorageError."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            threads = [t for t in (self._thread, *self._helpers) if t is not None]
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout)
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
        with self._idle:
            while self._queued or self._running:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    # ------------------------------------------------------------------ submissions (any thread)

    def sync_append(self, target: SyncTarget, segment: Any, future: Future[None]) -> None:
        """unflush_threshold == 1: one fdatasync of ``segment`` for this one append."""
        with self._cond:
            self._check_open()
            self._queued.setdefault(target, []).append((segment, future))
            if target not in self._running:
                self._wake_one_locked()

    def flush_soon(self, target: SyncTarget) -> None:
        """Group commit, a threshold reached, a roll: sync ``target`` in its next sync."""
        with self._cond:
            self._check_open()
            self._soon_locked(target)

    def _soon_locked(self, target: SyncTarget) -> None:
        if target not in self._soon:
            self._soon.add(target)
            self._queued.setdefault(target, []).append((None, None))
            if target not in self._running:
                self._wake_one_locked()

    def _wake_one_locked(self) -> None:
        """Wake one waiting thread for new work, unless one is already woken (it takes all that is queued
        by the time it runs, up to ``inline_max_logs`` logs) or none waits (a busy thread takes it next).
        The appends of one burst so wake one thread, not one each: every wake-up is a thread that then
        waits for the GIL the event loop holds."""
        if self._waiting and not self._wake_pending:
            self._wake_pending = True
            self._cond.notify()

    def flush_at(self, target: SyncTarget, deadline_ms: int) -> None:
        """Sync ``target`` at ``deadline_ms`` (the injected clock, in ms) unless synced before."""
        with self._cond:
            self._check_open()
            heapq.heappush(self._deadlines, (deadline_ms, next(self._seq), target))
            if self._deadlines[0][2] is target:
                self._cond.notify_all()  # the flusher's own thread keeps the deadlines

    def _check_open(self) -> None:
        if self._stopping:
            raise StorageError("the flusher is stopped; the log manager is closing")

    # ------------------------------------------------------------------ the threads

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _run(self) -> None:
        """The flusher's own thread: syncs like the helpers, and also keeps the deadlines and the idle
        hook; it is the last to end at a stop (after every queued and running job)."""
        last_idle = time.monotonic()
        while True:
            with self._cond:
                while True:
                    for target in self._pop_due_locked():
                        self._soon_locked(target)
                    work = self._take_locked()
                    if work or (self._stopping and not self._queued and not self._running):
                        break
                    if time.monotonic() - last_idle >= self._idle_interval_seconds:
                        break
                    timeout = _IDLE_TICK_SECONDS
                    if self._deadlines:
                        timeout = min(timeout, max(0.0, (self._deadlines[0][0] - self._now_ms()) / 1000))
                    self._waiting += 1
                    try:
                        self._cond.wait(timeout)
                    finally:
                        self._waiting -= 1
                finished = not work and self._stopping and not self._queued and not self._running
            if finished:
                self._run_idle_hook()
                with self._cond:
                    self._idle.notify_all()
                return
            if work:
                self._run_round(work)
            if time.monotonic() - last_idle >= self._idle_interval_seconds:
                last_idle = time.monotonic()
                self._run_idle_hook()

    def _help(self) -> None:
        """A helper thread: takes work like the flusher's own thread; ends at a stop once nothing is
        left to take (the flusher's own thread stays for the jobs of logs still running)."""
        while True:
            with self._cond:
                while True:
                    work = self._take_locked()
                    if work:
                        break
                    if self._stopping and not self._queued:
                        return
                    self._waiting += 1
                    try:
                        self._cond.wait()
                    finally:
                        self._waiting -= 1
            self._run_round(work)

    def _take_locked(self) -> dict[SyncTarget, _Jobs]:
        """Up to ``inline_max_logs`` queued logs that no thread is syncing, marked running."""
        self._wake_pending = False  # whoever was woken, this thread takes what is there
        work: dict[SyncTarget, _Jobs] = {}
        more = False
        for target in self._queued:
            if target not in self._running:
                if len(work) == self._inline_max_logs:
                    more = True
                    break
                work[target] = self._queued[target]
        for target in work:
            del self._queued[target]
            self._soon.discard(target)
        self._running.update(work)
        if more:
            self._wake_one_locked()  # another idle thread takes the rest side by side
        return work

    def _run_round(self, work: dict[SyncTarget, _Jobs]) -> None:
        """Sync the taken logs one after the other in this thread."""
        self.rounds += 1
        for target, jobs in work.items():
            try:
                self._sync_all(target, jobs)
            finally:
                with self._cond:
                    self._running.discard(target)
                    if target in self._queued:
                        self._wake_one_locked()  # its next jobs arrived meanwhile: an idle thread takes them
                    elif not self._running:
                        if not self._queued:
                            self._idle.notify_all()
                        if self._stopping:
                            self._cond.notify_all()  # the flusher's own thread ends after the last job

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
