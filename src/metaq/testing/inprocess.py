"""A broker inside the test process: the real broker service (core, TCP transport) on a loop in a thread.

:class:`~metaq.testing.broker.BrokerProcess` runs the broker as users do, but a test cannot reach into
it. This harness runs the same :class:`~metaq.broker.service.BrokerService` as ``metaq broker`` on an
asyncio loop in a background thread, bound to ``127.0.0.1:0``, so a test can

* inject the fdatasync the logs use (``sync=``): hold it closed, see which files and byte ranges it
  covered, or make it fail with EIO (:class:`GatedSync`). A kill -9 test cannot prove the broker
  waits for the sync before acknowledging: the page cache survives a process kill, so such a test
  passes with no fsync at all;
* read the broker's state (its LogManager, its topics) on the loop thread with :meth:`call`;
* run the broker's real retention scheduler (``retention=True``: ``deleteWhen`` cron, per topic).

What differs from ``metaq broker``: no signal handlers (reload through the Reload request instead), the
standard asyncio loop (native sendfile), and of the background jobs only retention, when asked for.

    sync = GatedSync()
    with InProcessBroker(tmp_path / "data", {"unflushThreshold": 1}, sync=sync) as broker:
        with connect(broker.servers) as session:
            ...
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from metaq.broker.background import schedule_retention
from metaq.broker.core import Broker
from metaq.broker.handlers import REQUEST_HANDLERS
from metaq.broker.ini import load_broker_config
from metaq.broker.service import BrokerService
from metaq.fsutil import datasync

T = TypeVar("T")

DRAIN_S = 5.0
"""How long stop() lets in-flight requests finish before closing the logs."""


@dataclass(frozen=True)
class SyncRecord:
    """One call of a :class:`GatedSync`: which file, how long it was when the sync was asked for."""

    seq: int
    path: str
    size_bytes: int
    """The file's size when the call started: the bytes this sync is guaranteed to cover."""
    state: str
    """``waiting`` (held at the gate or running), ``synced`` or ``failed``."""


class GatedSync:
    """An fdatasync to inject (``LogManager(sync=...)``, ``Broker(sync=...)``, ``InProcessBroker(sync=...)``).

    Every call is recorded with the file's path and size at the start of the call, so a test can say
    which bytes a sync covered and whether that sync had finished before an acknowledgement arrived.
    :meth:`hold` closes a gate every later call waits at (until :meth:`release`); :meth:`fail` makes
    calls on matching paths raise ``OSError(EIO)`` as a failing disk does. A held call gives up waiting
    after ``hold_timeout_s`` so a failed test cannot hang the flusher thread forever.
    """

    def __init__(self, real: Callable[[int], None] = datasync, hold_timeout_s: float = 60.0) -> None:
        self._real = real
        self._hold_timeout_s = hold_timeout_s
        self._lock = threading.Lock()
        self._gate = threading.Event()
        self._gate.set()
        self._records: list[SyncRecord] = []
        self._failing: Callable[[str], bool] | None = None

    def hold(self) -> None:
        """Calls from now on wait at the gate (a call already past it is not stopped)."""
        self._gate.clear()

    def release(self) -> None:
        self._gate.set()

    @property
    def held(self) -> bool:
        return not self._gate.is_set()

    def fail(self, predicate: Callable[[str], bool] = lambda path: True) -> None:
        """Calls on paths for which ``predicate(path)`` is true raise OSError(EIO) (after the gate)."""
        self._failing = predicate

    def heal(self) -> None:
        self._failing = None

    def __call__(self, fd: int) -> None:
        path = _fd_path(fd)
        size = os.fstat(fd).st_size
        with self._lock:
            seq = len(self._records)
            self._records.append(SyncRecord(seq, path, size, "waiting"))
        state = "failed"
        try:
            self._gate.wait(self._hold_timeout_s)
            failing = self._failing
            if failing is not None and failing(path):
                raise OSError(errno.EIO, os.strerror(errno.EIO), path)
            self._real(fd)
            state = "synced"
        finally:
            with self._lock:
                self._records[seq] = SyncRecord(seq, path, size, state)

    def records(self, path: str | os.PathLike[str] | None = None) -> list[SyncRecord]:
        """A snapshot of the calls so far, oldest first (only those on ``path`` if given)."""
        with self._lock:
            records = list(self._records)
        if path is None:
            return records
        wanted = os.fspath(path)
        return [r for r in records if r.path == wanted]

    def waiting(self, path: str | os.PathLike[str]) -> list[SyncRecord]:
        return [r for r in self.records(path) if r.state == "waiting"]

    @staticmethod
    def covers(records: list[SyncRecord], path: str | os.PathLike[str], end_position: int) -> bool:
        """Whether a finished sync among ``records`` covered ``path`` up to ``end_position``."""
        wanted = os.fspath(path)
        return any(r.state == "synced" and r.path == wanted and r.size_bytes >= end_position for r in records)


def _fd_path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return f"<fd {fd}>"


class InProcessBroker:
    """The real broker on ``127.0.0.1:0`` in a background thread of this process.

    ``options`` are MetaQ server.ini keys (``{"unflushThreshold": 1}``), applied over ``config_text``
    (a server.ini written beside the data dir, so the Reload request re-reads it after a test edits
    :attr:`config_path`). ``sync`` is the fdatasync every log of the broker uses.
    """

    def __init__(self, data_dir: str | Path, options: Mapping[str, Any] | None = None, *,
                 config_text: str | None = None, sync: Callable[[int], None] = datasync,
                 retention: bool = False) -> None:
        self.data_dir = Path(data_dir)
        self.options = dict(options or {})
        self.config_text = config_text
        self.sync = sync
        self.retention = retention
        self.host = "127.0.0.1"
        self.port = 0
        self._broker: Broker | None = None
        self._service: BrokerService | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def config_path(self) -> Path:
        return self.data_dir.parent / f"{self.data_dir.name}-server.ini"

    @property
    def broker(self) -> Broker:
        """The Broker object: read it on the loop thread (:meth:`call`) unless the value is immutable."""
        assert self._broker is not None, "the broker is not started"
        return self._broker

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> InProcessBroker:
        assert not self.running, "already started"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config_path: str | None = None
        if self.config_text is not None:
            self.config_path.write_text(self.config_text)
            config_path = str(self.config_path)
        overrides = {"dataPath": str(self.data_dir), "serverPort": "0", "hostName": self.host}
        for key, value in self.options.items():
            overrides[key] = ("true" if value else "false") if isinstance(value, bool) else str(value)
        config = load_broker_config(config_path, overrides)
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="metaq-inprocess-broker", daemon=True)
        self._thread.start()
        try:
            self._run(self._start(config, config_path, overrides))
        except BaseException:
            self._stop_loop()
            raise
        return self

    async def _start(self, config: Any, config_path: str | None, overrides: dict[str, str]) -> None:
        broker = Broker(config, REQUEST_HANDLERS, config_path=config_path, overrides=overrides, sync=self.sync)
        service = BrokerService(broker, jobs=[schedule_retention] if self.retention else [])
        await service.start()
        self._broker, self._service = broker, service
        self.port = broker.port

    def stop(self) -> None:
        """Stop as SIGTERM does: drain in-flight requests, close the logs (clean shutdown record).

        Raises what closing the logs raised (StorageError after a failed sync), after the thread ended.
        """
        if not self.running:
            return
        try:
            self._run(self._stop())
        finally:
            self._stop_loop()

    async def _stop(self) -> None:
        if self._service is not None:
            await self._service.stop(DRAIN_S)

    def _stop_loop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        if not thread.is_alive():
            loop.close()
        self._thread = None

    def __enter__(self) -> InProcessBroker:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        release = getattr(self.sync, "release", None)
        if callable(release):
            release()  # a test that failed while holding the sync must not hang the shutdown
        self.stop()

    # ------------------------------------------------------------------ reaching in

    def _run(self, coro: Any, timeout_s: float = 60.0) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the broker's loop thread and return its result.

        It also orders the test after everything the loop did before: a reply the broker had decided
        on before this call is written to its socket by the time it returns.
        """
        async def run() -> T:
            return fn(*args)

        return self._run(run())

    def log_end_offset(self, topic: str, partition: int) -> int:
        plog = self.call(self.broker.logs.get, topic, partition)
        return -1 if plog is None else plog.log_end_offset

    def batch_extent(self, topic: str, partition: int, offset: int) -> tuple[Path, int]:
        """(segment file, end position) of the stored batch that holds ``offset``.

        With a sync's recorded file size this tells whether that sync covered the batch.
        """
        def locate() -> tuple[Path, int]:
            plog = self.broker.logs.get(topic, partition)
            assert plog is not None, f"no partition {topic}-{partition}"
            base, position = plog.locate(offset)
            with plog.read(offset, 1) as piece:  # the first batch comes back whole: exactly that batch
                size = piece.size
            return plog.directory / f"{base:020d}.log", position + size

        return self.call(locate)

