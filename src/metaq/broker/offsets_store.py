"""Committed consumer offsets, durable in the broker's data directory.

One append-only file, ``<dir>/consumer_offsets.log`` (in the broker's dataPath, beside the partition
directories), of records::

    u32 length        bytes of the body that follows
    u32 crc           CRC32C of the body
    body              UTF-8 JSON: {"g": group, "o": [[topic, "brokerId-partition", offset, metadata], ...]}

The partition is keyed ``brokerId-partition`` (``"1-3"``), the key MetaQ's ZooKeeper offsets use
(``offsets/<topic>/<brokerId-partition>``): a standalone coordinator keeps the offsets of its group's
partitions on every broker. A log written before partition ids carried the broker id (a bare number)
is read as this broker's partitions (the only ones that coordinator accepted) and rewritten in the
new form by the compaction that follows every open.

One record is one OffsetCommit request, so a commit of several partitions is all-or-nothing. An offset
of -1 deletes the entry (a reset that forgets the group's position).

Durability: :meth:`OffsetsStore.commit` returns only after the record is written and fsynced, so a commit
the broker acknowledged survives ``kill -9``. Commits that arrive while an fsync is running are written
together and share the next fsync (group commit), and the write and fsync run in a worker thread, never
on the event loop.

Recovery: :meth:`open` reads records until the end or the first torn or corrupt one (a crash in the middle
of a write), cuts the file there, and then compacts: the live offsets are written as a fresh log to
``consumer_offsets.log.tmp``, fsynced, renamed over the log, and the directory fsynced — so the file holds
one record per group after every start and a crash at any step leaves either the old or the new log.
The log is compacted again the same way while running when it grows past ``compact_bytes`` and four times
its size after the last compaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import struct
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import crc32c

from metaq.errors import StorageError
from metaq.storage.errors import DiskFull, is_disk_full
from metaq.types import PartitionId

log = logging.getLogger("metaq.broker.offsets")

LOG_NAME = "consumer_offsets.log"
_HEAD = struct.Struct(">II")
RECORD_BYTES_MAX = 64 * 1024 * 1024
"""A length above this is a torn or corrupt header, not a record."""
DEFAULT_COMPACT_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: int
    metadata: str | None = None


OffsetKey = tuple[str, PartitionId]
"""(topic, brokerId-partition)."""
Entry = tuple[str, PartitionId, int, str | None]
"""(topic, partition, offset, metadata); offset -1 forgets the partition."""


def _encode(group: str, entries: Iterable[Entry]) -> bytes:
    body = json.dumps({"g": group, "o": [[t, str(p), o, m] for t, p, o, m in entries]},
                      separators=(",", ":")).encode()
    return _HEAD.pack(len(body), crc32c.crc32c(body)) + body


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class OffsetsStore:
    """group -> (topic, brokerId-partition) -> committed offset; reads from memory, writes through to disk.

    ``broker_id`` is the broker's own id: what a bare partition number of the earlier format means.
    """

    def __init__(self, directory: str | Path, *, name: str = LOG_NAME, compact_bytes: int = DEFAULT_COMPACT_BYTES,
                 fsync: bool = True, broker_id: int = 0) -> None:
        self.directory = Path(directory)
        self.broker_id = broker_id
        self.path = self.directory / name
        self._tmp = self.directory / (name + ".tmp")
        self.compact_bytes = compact_bytes
        self.fsync_enabled = fsync
        self._offsets: dict[str, dict[OffsetKey, CommittedOffset]] = {}
        self._file: int | None = None
        self._size = 0
        self._size_after_compaction = 0
        self._lock = threading.Lock()  # the worker thread vs. close()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="metaq-offsets")
        self._pending: list[tuple[str, list[Entry], bytes, asyncio.Future[None]]] = []
        self._writer: asyncio.Task[None] | None = None
        self.corrupt_tail_bytes = 0
        """Bytes cut off the end of the log at the last open (0 after a clean stop)."""

    # -- open / recover / compact ---------------------------------------------------------------

    def open(self) -> None:
        """Load, cut a torn tail, compact. Blocking: call before serving (or in an executor)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self._tmp.unlink()
        valid = 0
        total = 0
        if self.path.exists():
            data = self.path.read_bytes()
            total = len(data)
            valid = self._replay(data)
        self.corrupt_tail_bytes = total - valid
        if self.corrupt_tail_bytes:
            log.warning("offsets log %s: cut %d bytes of torn or corrupt tail at position %d",
                        self.path, self.corrupt_tail_bytes, valid)
        try:
            self._compact()
        except OSError as exc:
            # A full disk must not keep the broker from starting: keep the log as it is, cut in place
            # (shrinking needs no space), and compact at a later start.
            with contextlib.suppress(OSError):
                self._tmp.unlink()
            log.warning("offsets log %s: cannot compact (%s); appending to it as it is", self.path, exc)
            self._open_in_place(valid)

    def _replay(self, data: bytes) -> int:
        pos = 0
        while len(data) - pos >= _HEAD.size:
            length, crc = _HEAD.unpack_from(data, pos)
            end = pos + _HEAD.size + length
            if length > RECORD_BYTES_MAX or end > len(data):
                break
            body = data[pos + _HEAD.size:end]
            if crc32c.crc32c(body) != crc:
                break
            try:
                rec = json.loads(body)
                group = rec["g"]
                entries = [(str(t), self._partition_id(p), int(o), m) for t, p, o, m in rec["o"]]
            except (ValueError, KeyError, TypeError):
                break
            self._apply(group, entries)
            pos = end
        return pos

    def _partition_id(self, stored: object) -> PartitionId:
        """A stored key: ``"1-3"``, or a bare number of the earlier format (this broker's partition)."""
        if isinstance(stored, int) and not isinstance(stored, bool):
            return PartitionId(self.broker_id, stored)
        if isinstance(stored, str):
            return PartitionId.parse(stored)
        raise TypeError(f"partition key {stored!r}")

    def _apply(self, group: str, entries: Iterable[Entry]) -> None:
        offsets = self._offsets.setdefault(group, {})
        for topic, partition, offset, metadata in entries:
            if offset < 0:
                offsets.pop((topic, partition), None)
            else:
                offsets[(topic, partition)] = CommittedOffset(offset, metadata)
        if not offsets:
            del self._offsets[group]

    def _compact(self) -> None:
        """Rewrite the log as one record per group: temp, fsync, rename, fsync the directory."""
        tmp = self._tmp
        records = [_encode(g, [(t, p, c.offset, c.metadata) for (t, p), c in sorted(offs.items())])
                   for g, offs in sorted(self._offsets.items())]
        blob = b"".join(records)
        with self._lock:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                _write_all(fd, blob)
                if self.fsync_enabled:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            if self.fsync_enabled:
                _fsync_dir(self.directory)
            if self._file is not None:
                os.close(self._file)
            self._file = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            self._size = self._size_after_compaction = len(blob)

    def _open_in_place(self, valid_bytes: int) -> None:
        with self._lock:
            if self._file is not None:
                os.close(self._file)
            self._file = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.ftruncate(self._file, valid_bytes)
            if self.fsync_enabled:
                os.fsync(self._file)
            self._size = self._size_after_compaction = valid_bytes

    # -- reads --------------------------------------------------------------------------------

    def get(self, group: str, topic: str, partition: PartitionId) -> CommittedOffset | None:
        return self._offsets.get(group, {}).get((topic, partition))

    def group_offsets(self, group: str) -> dict[OffsetKey, CommittedOffset]:
        return dict(self._offsets.get(group, {}))

    def groups(self) -> list[str]:
        return sorted(self._offsets)

    # -- writes -------------------------------------------------------------------------------

    async def commit(self, group: str, entries: list[Entry]) -> None:
        """Make ``entries`` durable, then visible. Returns after the fsync that covers them."""
        if not entries:
            return
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._pending.append((group, entries, _encode(group, entries), fut))
        if self._writer is None or self._writer.done():
            self._writer = loop.create_task(self._write_pending())
        await fut

    async def _write_pending(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                await loop.run_in_executor(self._executor, self._write_sync, b"".join(r[2] for r in batch))
            except Exception as exc:  # every waiter must hear about the failure
                for *_, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            # Visible only once durable, and in commit order.
            for group, entries, _, fut in batch:
                self._apply(group, entries)
                if not fut.done():
                    fut.set_result(None)
            if self._size > self.compact_bytes and self._size > 4 * self._size_after_compaction:
                await loop.run_in_executor(self._executor, self._compact)

    def _write_sync(self, blob: bytes) -> None:
        with self._lock:
            if self._file is None:
                raise StorageError("the offsets store is closed")
            try:
                _write_all(self._file, blob)
            except OSError as exc:
                # No torn record may stay in front of later ones: cut back to the last whole record.
                try:
                    os.ftruncate(self._file, self._size)
                except OSError as cut_exc:
                    raise StorageError(f"cannot cut a partial offsets record in {self.path}: {cut_exc}") from exc
                if is_disk_full(exc):
                    raise DiskFull(f"cannot store committed offsets in {self.path}: the disk is full") from exc
                raise StorageError(f"cannot store committed offsets in {self.path}: {exc}") from exc
            if self.fsync_enabled:
                try:
                    os.fsync(self._file)
                except OSError as exc:
                    raise StorageError(f"cannot fsync committed offsets in {self.path}: {exc}") from exc
            self._size += len(blob)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                os.close(self._file)
                self._file = None
        self._executor.shutdown(wait=True)


def _write_all(fd: int, blob: bytes) -> None:
    view = memoryview(blob)
    while view:
        n = os.write(fd, view)
        view = view[n:]
