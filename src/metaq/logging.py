"""MetaQ's log4j appender for Python: a ``logging.Handler`` that publishes log records to a metaq topic.

::

    import logging
    from metaq.logging import MetaqHandler

    handler = MetaqHandler("127.0.0.1:8123", "app-logs", spill_dir="/var/spool/app")
    logging.getLogger().addHandler(handler)
    logging.getLogger("shop.orders").info("order placed", extra={"order_id": 42})

What an application can rely on:

- **emit() never waits for the network.** It formats the record (JSON by default), appends it to a
  bounded in-memory queue and returns. A background thread with its own asyncio loop owns the
  producer and sends what is queued every ``flush_interval_s`` (sooner when ``batch_records`` are
  waiting).
- **A broker that is down, slow or unknown never blocks or crashes the application.** Records that
  could not be sent stay queued and are retried with exponential backoff (``retry_backoff_s`` up to
  ``retry_backoff_max_s``). Problems are written to stderr, at most once per ``error_interval_s``
  (and only while ``logging.raiseExceptions`` is true, as ``Handler.handleError`` does); nothing raises
  into the caller.
- **Memory is bounded.** The queue holds at most ``max_buffered_records`` records, plus the one batch
  the background thread is sending. When it is full, the oldest record is appended to a spill file in
  ``spill_dir`` (at most ``max_spill_bytes`` on disk) or, without ``spill_dir``, dropped;
  ``stats().dropped`` counts what was lost. Spilled records are sent first, oldest first, once the
  broker answers. Spill files left by a handler that is gone (closed with records unsent, or its
  process exited or was killed) are claimed and sent by the next handler of that topic given the same
  ``spill_dir``.
- **What a crash loses.** A spilled record is written to the spill file (handed to the operating
  system, one write per record) before emit() returns, so it survives the application being killed
  (SIGKILL, an abort, the OOM killer). The background thread fsyncs the spill files written since its
  last sync (and ``spill_dir`` itself, for new files) every ``spill_sync_interval_s`` (default 1 s;
  None: never, leaving it to the OS's writeback), so a machine that stops (power loss, kernel panic)
  loses at most the records spilled in the last interval: ``stats().spilled_unsynced`` counts them now.
  Records still in the memory queue (``stats().pending`` minus what is spilled) are lost with the
  process; close() spills them, fsynced.
- **flush(timeout) and close(timeout) drain within a bound** (default ``close_timeout_s``). What
  close() could not send goes to ``spill_dir`` if given, otherwise it is counted as dropped.
- **Delivery is at-least-once.** A batch whose send failed after the broker may have stored it (a
  timeout, a connection lost mid-request) is sent again, so a record can be stored twice around
  broker failures; give records a unique key (``key_func``) when readers must de-duplicate.

Records logged by the handler's own thread (the metaq client's warnings while it retries) are never
queued, which would feed the handler its own failures; they are reported like errors.

The message attribute (what MetaQ consumers filter on) is the record's level name unless
``attribute`` says otherwise; the message timestamp is the time of the logging call.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from metaq.client.selectors import PartitionSelector
from metaq.client.session import MessageSessionFactory
from metaq.errors import InvalidArgument
from metaq.fsutil import fsync_directory, pid_alive
from metaq.net.retry import RetryPolicy
from metaq.net.servers import parse_servers
from metaq.types import Message, validate_topic

__all__ = ["HandlerStats", "JsonFormatter", "MetaqHandler"]

Item = tuple[int, bytes, str | None, bytes | None]
"""A queued record: (timestamp ms, payload, attribute, key)."""

_STANDARD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}

_SPILL_HEADER = struct.Struct(">qIHH")  # timestamp ms, payload length, attribute length (0xFFFF: none), key length
_NONE = 0xFFFF
_LIVE_TOKENS: set[str] = set()
"""Spill-file tokens of the handlers of this process that are not closed: their files are not orphans."""


class JsonFormatter(logging.Formatter):
    """One JSON object per record: timestamp (ISO 8601 UTC), level, logger, message, and extra fields.

    Fields passed with ``extra=`` are added at the top level (values JSON cannot hold become strings);
    they never replace the four standard fields. An exception or stack is added as text.
    """

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in record.__dict__.items():
            if name not in _STANDARD_ATTRS and name not in doc and not name.startswith("_"):
                doc[name] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            doc["exception"] = record.exc_text
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return json.dumps(doc, default=str, ensure_ascii=False, separators=(",", ":"))


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


class _Spill:
    """Append-only spill files of one handler; every method is called with the handler's lock held."""

    def __init__(self, directory: Path, topic: str, max_bytes: int, file_records: int) -> None:
        self.dir = directory
        self.file_records = file_records
        self.dir.mkdir(parents=True, exist_ok=True)
        self.prefix = f"metaq-{topic}@"  # "@" cannot occur in a topic name
        self.max_bytes = max_bytes
        self.pid = os.getpid()
        self.token = os.urandom(6).hex()
        _LIVE_TOKENS.add(self.token)
        self.seq = 0
        self.writer: Any = None
        self.writer_path: Path | None = None
        self.writer_records = 0
        self.ready: deque[tuple[Path, int]] = deque()  # closed files to send, oldest first, with record counts
        self.bytes = 0
        self.records = 0
        self.dirty: dict[Path, int] = {}
        """Files written since their last fsync -> how many records that is (:meth:`sync`)."""

    def claim_orphans(self) -> None:
        """Take over spill files of this topic whose handler is gone (its process, or closed in this one)."""
        candidates = []
        for path in self.dir.glob(f"{self.prefix}*.spill"):
            try:
                pid_text, token = path.name[len(self.prefix):].split("-")[:2]
                pid = int(pid_text)
            except ValueError:
                continue
            if (pid == self.pid and token in _LIVE_TOKENS) or (pid != self.pid and pid_alive(pid)):
                continue
            candidates.append(path)
        for path in sorted(candidates, key=lambda p: p.name.split("-")[-2:]):
            mine = self._new_path()
            try:
                os.rename(path, mine)
            except OSError:
                continue  # another handler claimed it first
            records = sum(1 for _ in _read_spill(mine))
            self.ready.append((mine, records))
            self.bytes += mine.stat().st_size
            self.records += records

    def _new_path(self) -> Path:
        self.seq += 1
        return self.dir / f"{self.prefix}{self.pid}-{self.token}-{time.time_ns()}-{self.seq:08d}.spill"

    def release(self) -> None:
        """The handler is closed: what it leaves may be claimed by the next handler of the topic."""
        _LIVE_TOKENS.discard(self.token)

    def full(self, extra: int) -> bool:
        return self.bytes + extra > self.max_bytes

    def append(self, item: Item, *, flush: bool = True) -> int:
        """Write one record; with ``flush`` it is with the OS when this returns (a killed process keeps it)."""
        ts, payload, attribute, key = item
        attr = attribute.encode() if attribute is not None else b""
        k = key if key is not None else b""
        data = b"".join((_SPILL_HEADER.pack(ts, len(payload), _NONE if attribute is None else len(attr),
                                            _NONE if key is None else len(k)), attr, k, payload))
        if self.writer is None:
            self.writer_path = self._new_path()
            self.writer = open(self.writer_path, "ab", buffering=1 << 20)  # noqa: SIM115 - kept open across calls
            self.writer_records = 0
        self.writer.write(data)
        if flush:
            self.writer.flush()
        self.writer_records += 1
        self.bytes += len(data)
        self.records += 1
        assert self.writer_path is not None
        self.dirty[self.writer_path] = self.dirty.get(self.writer_path, 0) + 1
        if self.writer_records >= self.file_records:
            self.rotate()  # a file is sent as one batch, so it holds at most one batch
        return len(data)

    def rotate(self, sync: bool = False) -> None:
        """Close the file being written so that it can be sent."""
        if self.writer is None:
            return
        self.writer.flush()
        assert self.writer_path is not None
        if sync:
            os.fsync(self.writer.fileno())
            self.dirty.pop(self.writer_path, None)
            fsync_directory(self.dir)
        self.writer.close()
        self.ready.append((self.writer_path, self.writer_records))
        self.writer = None
        self.writer_path = None

    def sent(self, path: Path, records: int) -> None:
        """A whole file was acknowledged: forget it."""
        with contextlib.suppress(OSError):
            self.bytes -= path.stat().st_size
            path.unlink()
        self.records -= records
        self.dirty.pop(path, None)

    @property
    def unsynced(self) -> int:
        return sum(self.dirty.values())

    def synced(self, done: dict[Path, int]) -> None:
        """The files of ``done`` (a copy of :attr:`dirty` taken before :func:`_sync_files`) are on disk."""
        for path, records in done.items():
            left = self.dirty.get(path, 0) - records  # what was written meanwhile stays to be synced
            if left > 0:
                self.dirty[path] = left
            else:
                self.dirty.pop(path, None)


def _sync_files(directory: Path, paths: list[Path]) -> None:
    """fsync each spill file (by name: the writer may close it meanwhile) and the directory. A file already
    sent and deleted is simply gone."""
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fsync_directory(directory)


def _read_all(path: Path) -> list[Item]:
    return list(_read_spill(path))


def _read_spill(path: Path) -> Iterator[Item]:
    """Items of a spill file in order; a torn last record (a crash mid-write) ends the file."""
    with open(path, "rb") as f:
        data = f.read()
    pos, n = 0, len(data)
    while pos + _SPILL_HEADER.size <= n:
        ts, plen, alen, klen = _SPILL_HEADER.unpack_from(data, pos)
        pos += _SPILL_HEADER.size
        a = 0 if alen == _NONE else alen
        k = 0 if klen == _NONE else klen
        if pos + a + k + plen > n:
            return
        attribute = None if alen == _NONE else data[pos:pos + a].decode()
        pos += a
        key = None if klen == _NONE else data[pos:pos + k]
        pos += k
        yield ts, data[pos:pos + plen], attribute, key
        pos += plen


class MetaqHandler(logging.Handler):
    """A logging handler that publishes each record as one message of ``topic`` (see the module doc).

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
        self._spill = _Spill(Path(spill_dir), topic, max_spill_bytes, batch_records) if spill_dir is not None else None
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
                        _sync_files(spill.dir, list(dirty))  # and the files written before, not synced yet
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
                await loop.run_in_executor(None, _sync_files, spill.dir, list(dirty))
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
                items = await asyncio.get_running_loop().run_in_executor(None, _read_all, spill_file[0])
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
