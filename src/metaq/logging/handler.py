"""The handler: what the application's logging calls do, and the background thread that sends what they queue
(the contract is in :mod:`metaq.logging`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metaq.client.selectors import PartitionSelector
from metaq.client.session import MessageSessionFactory
from metaq.errors import InvalidArgument
from metaq.logging.formatter import JsonFormatter
from metaq.logging.spill import Item, SpillFiles, read_all, sync_files
from metaq.net.retry import RetryPolicy
from metaq.net.servers import parse_servers
from metaq.types import Message, validate_topic


@dataclass(frozen=True)
class HandlerStats:
    """Counters since the handler was created (a snapshot)."""

    accepted: int
    """records queued by emit()"""
    sent: int
    """records the broker acknowledged (a record resent after a 'maybe stored' failure counts again)"""
    dropped: int
    """records lost: queue full without spill_dir, spill limit reached, or unsent at close without spill_dir"""
    spilled: int
    """records written to spill files (each on disk for the OS once counted: a killed process keeps them)"""
    failed: int
    """records that could not be formatted or are too large to send (reported, never queued)"""
    send_errors: int
    """failed send attempts (each is retried)"""
    pending: int
    """records not yet acknowledged: queued, in flight, or in spill files"""
    spilled_unsynced: int = 0
    """spilled records not fsynced yet: lost if the machine (not only the process) stops before the next
    sync, at most ``spill_sync_interval_s`` away"""


class MetaqHandler(logging.Handler):
    """A logging handler that publishes each record as one message of ``topic`` (see :mod:`metaq.logging`).

    ``attribute``: a string for every record, a function of the record, or None for the record's level
    name. ``key_func(record)`` gives the message key (str or bytes) or None. ``formatter`` defaults to
    :class:`JsonFormatter`. ``selector`` chooses partitions (default round robin).
    ``client_options``/``producer_options`` go to the metaq client.
    """

    def __init__(self, servers: str, topic: str, *,
                 attribute: str | Callable[[logging.LogRecord], str | None] | None = None,
                 key_func: Callable[[logging.LogRecord], str | bytes | None] | None = None,
                 formatter: logging.Formatter | None = None,
                 level: int = logging.NOTSET,
                 max_buffered_records: int = 100_000,
                 spill_dir: str | os.PathLike[str] | None = None,
                 max_spill_bytes: int = 256 * 1024 * 1024,
                 spill_sync_interval_s: float | None = 1.0,
                 flush_interval_s: float = 0.05,
                 batch_records: int = 1000,
                 retry_backoff_s: float = 0.1,
                 retry_backoff_max_s: float = 5.0,
                 error_interval_s: float = 10.0,
                 close_timeout_s: float = 5.0,
                 selector: PartitionSelector | None = None,
                 client_options: dict[str, Any] | None = None,
                 producer_options: dict[str, Any] | None = None) -> None:
        super().__init__(level)
        parse_servers(servers)  # a typo is an InvalidArgument now, not a retry loop on stderr
        validate_topic(topic)
        if max_buffered_records < 1 or batch_records < 1:
            raise InvalidArgument("max_buffered_records and batch_records must be >= 1")
        if spill_sync_interval_s is not None and not spill_sync_interval_s > 0:
            raise InvalidArgument("spill_sync_interval_s must be > 0 (or None: never fsync), "
                                  f"not {spill_sync_interval_s}")
        self.servers = servers
        self.topic = topic
        self.attribute = attribute
        self.key_func = key_func
        self.setFormatter(formatter if formatter is not None else JsonFormatter())
        self.max_buffered_records = max_buffered_records
        self.flush_interval_s = flush_interval_s
        self.spill_sync_interval_s = spill_sync_interval_s
        self.batch_records = batch_records
        self.retry_backoff_s = retry_backoff_s
        self.retry_backoff_max_s = retry_backoff_max_s
        self.error_interval_s = error_interval_s
        self.close_timeout_s = close_timeout_s
        self.selector = selector
        self.client_options = {"connect_timeout_s": 5.0, "request_timeout_s": 10.0, "reconnect_attempts": 1,
                               "client_id": "metaq-logging", **(client_options or {})}
        self.producer_options = dict(producer_options or {})

        self._mu = threading.Lock()
        self._changed = threading.Condition(self._mu)  # notified whenever pending work shrinks
        self._queue: deque[Item] = deque()
        self._in_flight = 0
        self._closing = False
        self._closed = False
        self._accepted = self._sent = self._dropped = self._spilled = self._failed = self._send_errors = 0
        self._spill = None if spill_dir is None else SpillFiles(Path(spill_dir), topic, max_spill_bytes, batch_records)
        if self._spill is not None:
            self._spill.claim_orphans()
        self._report_later: BaseException | None = None  # set under the lock, reported by the worker
        self._last_report = float("-inf")
        self._suppressed = 0
        self._wake_pending = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._session: MessageSessionFactory | None = None  # owned by the background thread
        self._producer: Any = None
        self._backoff = RetryPolicy(retry_backoff_s, retry_backoff_max_s).start()
        self._stopping = False
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._thread_main, name=f"metaq-logging-{topic}", daemon=True)
        self._thread.start()
        self._started.wait(5)

    # -- the application's side ---------------------------------------------------------------

    def emit(self, record: logging.LogRecord) -> None:
        if threading.current_thread() is self._thread:
            self._report(f"log record from the handler's own thread (not sent): {record.getMessage()}")
            return
        try:
            payload = self.format(record).encode()
            attribute = self._attribute(record)
            key = self._key(record)
        except Exception as exc:
            with self._mu:
                self._failed += 1
            self._report("cannot format a log record (dropped)", exc)
            return
        item = (int(record.created * 1000), payload, attribute, key)
        wake = False
        with self._mu:
            if self._closed:
                self._dropped += 1
                return
            self._queue.append(item)
            self._accepted += 1
            if len(self._queue) > self.max_buffered_records:
                self._overflow_locked()
            if len(self._queue) >= self.batch_records and not self._wake_pending:
                self._wake_pending = wake = True
        if wake:
            self._poke()

    def _attribute(self, record: logging.LogRecord) -> str | None:
        if self.attribute is None:
            return record.levelname
        if isinstance(self.attribute, str):
            return self.attribute
        return self.attribute(record)

    def _key(self, record: logging.LogRecord) -> bytes | None:
        if self.key_func is None:
            return None
        key = self.key_func(record)
        return key.encode() if isinstance(key, str) else key

    def _overflow_locked(self) -> None:
        """The queue is over its bound: move its oldest record to disk, or drop it."""
        oldest = self._queue.popleft()
        spill = self._spill
        if spill is not None and not spill.full(len(oldest[1]) + 64):
            try:
                spill.append(oldest)
                self._spilled += 1
                return
            except OSError as exc:
                self._report_later = exc
        self._dropped += 1

    def stats(self) -> HandlerStats:
        """The handler's counters now: accepted, sent, dropped, spilled, failed, send errors, pending."""
        with self._mu:
            spilled_pending = self._spill.records if self._spill is not None else 0
            return HandlerStats(self._accepted, self._sent, self._dropped, self._spilled, self._failed,
                                self._send_errors, len(self._queue) + self._in_flight + spilled_pending,
                                self._spill.unsynced if self._spill is not None else 0)

    @property
    def pending(self) -> int:
        """Records accepted and not yet sent (queued, being sent, or spilled to disk)."""
        return self.stats().pending

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until everything accepted so far is acknowledged (or lost); False if ``timeout`` passed first."""
        if threading.current_thread() is self._thread:
            return False
        deadline = time.monotonic() + (self.close_timeout_s if timeout is None else timeout)
        self._poke()
        with self._mu:
            while self._pending_locked():
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._changed.wait(min(left, 0.1))
        return True

    def _pending_locked(self) -> int:
        return len(self._queue) + self._in_flight + (self._spill.records if self._spill is not None else 0)

    def flush(self, timeout: float | None = None) -> None:
        """Send what is queued, waiting at most ``timeout`` seconds (default ``close_timeout_s``)."""
        self.drain(timeout)

    def close(self, timeout: float | None = None) -> None:
        """Drain for at most ``timeout`` seconds, stop the background thread, keep or count what is left."""
        with self._mu:
            if self._closing:
                already = True
            else:
                already = False
                self._closing = True
        if not already:
            self.drain(timeout)
            loop = self._loop
            if loop is not None and not loop.is_closed():
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self._stop)
            self._thread.join(2.0)
            with self._mu:
                self._closed = True
                left = list(self._queue)
                self._queue.clear()
                spill = self._spill
                kept = 0
                if spill is not None:
                    for item in left:
                        try:
                            spill.append(item, flush=False)  # rotate(sync=True) below writes them all
                            kept += 1
                        except OSError as exc:
                            self._report_later = exc
                            break
                    try:
                        spill.rotate(sync=True)
                        dirty = dict(spill.dirty)
                        sync_files(spill.dir, list(dirty))  # and the files written before, not synced yet
                        spill.synced(dirty)
                    except OSError as exc:
                        self._report_later = exc
                    spill.release()
                    self._spilled += kept
                self._dropped += len(left) - kept
                self._changed.notify_all()
            if len(left) - kept:
                self._report(f"closed with {len(left) - kept} record(s) unsent; they are lost", force=True)
            elif kept:
                self._report(f"closed with {kept} record(s) unsent; kept in {spill.dir if spill else ''} for the next "
                             "handler of this topic", force=True)
        super().close()

    # -- reporting ------------------------------------------------------------------------------

    def _report(self, what: str, exc: BaseException | None = None, *, force: bool = False) -> None:
        """Tell stderr what went wrong, at most once per error_interval_s (unless forced); never raises."""
        now = time.monotonic()
        with self._mu:
            if now - self._last_report < self.error_interval_s and not force:
                self._suppressed += 1
                return
            self._last_report = now
            suppressed, self._suppressed = self._suppressed, 0
        if not logging.raiseExceptions:
            return
        text = f"metaq.logging.MetaqHandler(topic={self.topic!r}, servers={self.servers!r}): {what}"
        if exc is not None:
            text += f": {type(exc).__name__}: {exc}"
        if suppressed:
            text += f" ({suppressed} similar report(s) suppressed)"
        try:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()
        except Exception:
            pass

    # -- the background thread ------------------------------------------------------------------

    def _poke(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is None or wake is None:
            return
        with contextlib.suppress(RuntimeError):  # loop already closed
            loop.call_soon_threadsafe(wake.set)

    def _thread_main(self) -> None:
        loop: asyncio.AbstractEventLoop
        try:
            import uvloop
            loop = uvloop.new_event_loop()
        except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
            loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        self._wake = asyncio.Event()
        self._task = loop.create_task(self._run())
        self._started.set()
        try:
            loop.run_until_complete(self._task)
        except asyncio.CancelledError:  # close()
            pass
        except BaseException as exc:  # the application must never see it
            self._report("background thread stopped", exc)
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            with self._mu:
                self._changed.notify_all()

    def _take(self) -> tuple[list[Item], tuple[Path, int] | None]:
        """The next batch to send: a spill file first (they hold the oldest records), else the queue."""
        with self._mu:
            self._wake_pending = False
            spill = self._spill
            if spill is not None:
                if not spill.ready and spill.writer is not None:
                    try:
                        spill.rotate()
                    except OSError as exc:
                        self._report_later = exc
                if spill.ready:
                    path, records = spill.ready[0]
                    return [], (path, records)
            n = min(len(self._queue), self.batch_records)
            batch = [self._queue.popleft() for _ in range(n)]
            self._in_flight = n
            return batch, None

    def _give_back(self, items: list[Item]) -> None:
        """A failed batch goes back to the front of the queue, in order, under the same bound."""
        with self._mu:
            self._in_flight = 0
            if self._closed:  # close() gave up waiting for this batch: too late to keep it
                self._dropped += len(items)
                self._changed.notify_all()
                return
            self._queue.extendleft(reversed(items))
            while len(self._queue) > self.max_buffered_records:
                self._overflow_locked()
            self._changed.notify_all()

    async def _sleep(self, seconds: float) -> None:
        """Sleep until woken or ``seconds`` passed (no wait_for: in 3.11 it can swallow a cancel)."""
        wake = self._wake
        assert wake is not None
        if not wake.is_set():
            handle = asyncio.get_running_loop().call_later(seconds, wake.set)
            try:
                await wake.wait()
            finally:
                handle.cancel()
        wake.clear()

    def _stop(self) -> None:
        """On the loop thread: end the worker now (close() calls it once draining is over)."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()

    async def _sync_spill(self) -> None:
        """Every spill_sync_interval_s: fsync what was spilled since the last time (see the module docstring)."""
        spill, interval = self._spill, self.spill_sync_interval_s
        if spill is None or interval is None:
            return
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval)
            with self._mu:
                dirty = dict(spill.dirty)
            if not dirty:
                continue
            try:
                await loop.run_in_executor(None, sync_files, spill.dir, list(dirty))
            except OSError as exc:
                self._report("cannot fsync the spill files", exc)
                continue
            with self._mu:
                spill.synced(dirty)

    async def _run(self) -> None:
        self._backoff.reset()
        syncer = asyncio.get_running_loop().create_task(self._sync_spill(), name="metaq-logging-spill-sync")
        try:
            while not self._stopping:
                later, self._report_later = self._report_later, None
                if later is not None:
                    self._report("cannot write to spill_dir", later)
                try:
                    await self._step()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # a bug must not stop the thread: report it and carry on
                    self._report("internal error in the background thread", exc)
                    await self._close_session()
                    await asyncio.sleep(self._backoff.next_delay_unbounded_s())
        finally:
            syncer.cancel()
            await self._close_session()

    async def _close_session(self) -> None:
        session, self._session, self._producer = self._session, None, None
        if session is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(session.close(), 1.0)

    async def _step(self) -> None:
        """Send one batch (a spill file, or up to batch_records from the queue), or sleep when idle."""
        held, spill_file = self._take()  # held: given back if anything interrupts the send
        try:
            items = held
            if spill_file is not None:
                items = await asyncio.get_running_loop().run_in_executor(None, read_all, spill_file[0])
            elif not items:
                await self._sleep(self.flush_interval_s)
                return
            unsent: list[Item] = items
            error: BaseException | None = None
            if self._session is None:
                try:
                    self._session = await MessageSessionFactory.connect(self.servers, **self.client_options)
                    self._producer = self._session.create_producer(self.selector, **self.producer_options)
                except Exception as exc:
                    error = exc
                    await self._close_session()
            if self._producer is not None:
                unsent, error = await self._send(self._producer, items)
            with self._mu:
                self._sent += len(items) - len(unsent)
                if spill_file is None:
                    self._in_flight = 0
                elif not unsent:
                    assert self._spill is not None
                    self._spill.ready.popleft()
                    self._spill.sent(*spill_file)
                self._changed.notify_all()
            if spill_file is None and unsent:
                self._give_back(unsent)  # a failed spill file simply stays first in line
            held = []
        finally:
            if held:
                self._give_back(held)  # outcome unknown: kept (at-least-once)
        if not unsent:
            self._backoff.reset()
            return
        with self._mu:
            self._send_errors += 1
        what = "send failed" if self._session is not None else "cannot reach the broker"
        delay = self._backoff.next_delay_unbounded_s()
        self._report(f"{what}; {len(unsent)} record(s) kept, retrying in {delay:.1f} s", error)
        # A fresh session after a failure: new connections and metadata (a broker may have restarted).
        await self._close_session()
        await asyncio.sleep(delay)  # not cut short by new records, only by close()

    async def _send(self, producer: Any, items: list[Item]) -> tuple[list[Item], BaseException | None]:
        """Send a batch; returns the items that were not acknowledged and one of the errors."""
        topic = self.topic
        futures: list[tuple[Item, asyncio.Future[Any]]] = []
        error: BaseException | None = None
        for item in items:
            ts, payload, attribute, key = item
            try:
                fut = producer.send_async(Message(topic, payload, attribute=attribute, key=key, timestamp_ms=ts))
            except InvalidArgument as exc:  # too large for the producer: retrying cannot help
                with self._mu:
                    self._failed += 1
                self._report("log record not sendable (dropped)", exc)
                continue
            futures.append((item, fut))
        results = await asyncio.gather(*(f for _, f in futures))
        unsent = []
        for (item, _), result in zip(futures, results, strict=True):
            if not result.success:
                unsent.append(item)
                error = result.error
        return unsent, error
