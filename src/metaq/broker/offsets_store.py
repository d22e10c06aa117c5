"""Committed consumer offsets, durable in the broker's data directory.

One append-only file, ``<dir>/consumer_offsets.log`` (in the broker's dataPath, beside the partition
directories), of framed records (:mod:`metaq.framing`, docs/storage.md), one per OffsetCommit::

    key     the group (UTF-8)
    body    UTF-8 JSON: {"o": [[topic, "brokerId-partition", offset, metadata], ...]}

The partition is keyed ``brokerId-partition`` (``"1-3"``), the key MetaQ's ZooKeeper offsets use
(``offsets/<topic>/<brokerId-partition>``): a standalone coordinator keeps the offsets of its group's
partitions on every broker. One record is one OffsetCommit request, so a commit of several partitions is
all-or-nothing. An offset of -1 deletes the entry (a reset that forgets the group's position).

An earlier version wrote records as ``u32 length, u32 crc32c, {"g": group, "o": [...]}`` (with bare
partition numbers before partition ids carried the broker id: read as this broker's). Such a log is read
as it is and rewritten in the framed form by the compaction that follows the open.

Durability: :meth:`OffsetsStore.commit` returns only after the record is written and fsynced, so a commit
the broker acknowledged survives ``kill -9``. Commits that arrive while an fsync is running are written
together and share the next fsync (group commit), and the write and fsync run in a worker thread, never
on the event loop.

Recovery: :meth:`open` reads every record; a record damaged in the middle of the log (a flipped bit) is
skipped with an ERROR naming its group, and the others are read; damaged bytes with nothing intact after
them are a torn tail (a crash while writing), cut with a WARNING. Then it compacts: the live offsets
are written as a fresh log (:func:`metaq.fsutil.atomic_write`), so the file holds one record per group
after every start. When a record was skipped, the damaged log is kept beside it first
(``consumer_offsets.log.damaged-<time>``) and the ERROR names that file. The log is compacted again while
running when it grows past ``compact_bytes`` and four times its size after the last compaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import struct
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import crc32c

from metaq import framing
from metaq.errors import StorageError
from metaq.fsutil import atomic_write
from metaq.storage.checkpoint import StoreReport
from metaq.storage.errors import DiskFull, is_disk_full
from metaq.types import PartitionId

log = logging.getLogger("metaq.broker.offsets")

LOG_NAME = "consumer_offsets.log"
STORE = "offsets"
_V1_HEAD = struct.Struct(">II")
RECORD_BYTES_MAX = 64 * 1024 * 1024
"""A length above this is a torn or corrupt header in the earlier format, not a record."""
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
    body = json.dumps({"o": [[t, str(p), o, m] for t, p, o, m in entries]}, separators=(",", ":")).encode()
    return framing.encode_bytes(group.encode(), body)


def _group_name(key: bytes) -> str:
    return repr(key.decode("utf-8", "replace"))


@dataclass(slots=True)
class _Read:
    """What a read of the log found."""

    records: list[tuple[str, list[Entry]]]
    damaged: list[str]
    """One message per record skipped in the middle."""
    tail_at: int
    """Where the torn tail starts (the file's size if none)."""
    tail: str | None = None


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
        self.damaged_records: list[str] = []
        """What the last open skipped: one message per damaged record, naming its group."""

    # -- open / recover / compact ---------------------------------------------------------------

    def open(self) -> None:
        """Load, cut a torn tail, compact. Blocking: call before serving (or in an executor)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self._tmp.unlink()
        data = self.path.read_bytes() if self.path.exists() else b""
        read = self._read(data)
        for group, entries in read.records:
            self._apply(group, entries)
        self.damaged_records = read.damaged
        kept = None
        if read.damaged:
            kept = self._keep_damaged_copy()
        for message in read.damaged:
            where = f"; the damaged log is kept as {kept}" if kept else ""
            log.error("offsets log %s: %s%s", self.path, message, where)
            framing.DAMAGE.skipped_record(STORE, f"{self.path}: {message}")
        self.corrupt_tail_bytes = len(data) - read.tail_at
        if self.corrupt_tail_bytes:
            framing.DAMAGE.cut_tail(STORE)
            log.warning("offsets log %s: cut %d bytes of torn or corrupt tail at position %d%s", self.path,
                        self.corrupt_tail_bytes, read.tail_at, f" ({read.tail})" if read.tail else "")
        try:
            self._compact()
        except OSError as exc:
            # A full disk must not keep the broker from starting: keep the log as it is, its tail cut in place
            # (shrinking needs no space), and compact at a later start (which skips a damaged record again).
            with contextlib.suppress(OSError):
                self._tmp.unlink()
            log.warning("offsets log %s: cannot compact (%s); appending to it as it is", self.path, exc)
            self._open_in_place(read.tail_at)

    def _read(self, data: bytes) -> _Read:
        if data[:4] != framing.MAGIC:
            earlier = self._read_v1(data)
            if earlier is not None:
                return earlier
        out = _Read([], [], len(data))
        for item in framing.scan(data):
            if isinstance(item, framing.Record):
                group = item.key.decode("utf-8", "replace")
                try:
                    doc = json.loads(data[item.body_at:item.end])
                    entries = [(str(t), self._partition_id(p), int(o), m) for t, p, o, m in doc["o"]]
                except (ValueError, KeyError, TypeError) as exc:  # intact bytes, not what this version writes
                    out.damaged.append(f"a record of group {group!r} at byte {item.position} does not parse ({exc}) "
                                       "and is skipped: the offsets it committed are lost")
                    continue
                out.records.append((group, entries))
            elif item.tail:
                out.tail_at = min(out.tail_at, item.position)
                if out.tail is None:
                    out.tail = f"the last record, of group {item.describe_key(_group_name)}, {item.problem}"
            else:
                out.damaged.append(
                    f"the record of group {item.describe_key(_group_name)} at bytes {item.position}-{item.end} is "
                    f"damaged ({item.problem}) and is skipped: the offsets it committed are lost unless a later "
                    "commit of the group replaced them")
        return out

    def _read_v1(self, data: bytes) -> _Read | None:
        """A log of the earlier format (unframed records), or None when ``data`` is not one."""
        pos = 0
        records: list[tuple[str, list[Entry]]] = []
        while len(data) - pos >= _V1_HEAD.size:
            length, crc = _V1_HEAD.unpack_from(data, pos)
            end = pos + _V1_HEAD.size + length
            if length > RECORD_BYTES_MAX or end > len(data):
                break
            body = data[pos + _V1_HEAD.size:end]
            if crc32c.crc32c(body) != crc:
                break
            try:
                rec = json.loads(body)
                group = rec["g"]
                entries = [(str(t), self._partition_id(p), int(o), m) for t, p, o, m in rec["o"]]
            except (ValueError, KeyError, TypeError):
                break
            records.append((group, entries))
            pos = end
        if not records:
            return None
        return _Read(records, [], pos)

    def _keep_damaged_copy(self) -> str | None:
        """Keep the damaged log beside the new one (a hard link: no space needed); its name, or None."""
        copy = self.directory / f"{self.path.name}.damaged-{int(time.time())}"
        try:
            os.link(self.path, copy)
        except OSError as exc:
            log.warning("offsets log %s: cannot keep the damaged log as %s: %s", self.path, copy, exc)
            return None
        return str(copy)

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
        """Rewrite the log as one record per group (:func:`metaq.fsutil.atomic_write`)."""
        records = [_encode(g, [(t, p, c.offset, c.metadata) for (t, p), c in sorted(offs.items())])
                   for g, offs in sorted(self._offsets.items())]
        blob = b"".join(records)
        with self._lock:
            atomic_write(self.path, blob, sync=os.fsync if self.fsync_enabled else None, tmp_path=self._tmp)
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

    def verify(self) -> StoreReport:
        """Check every record of the log as it is on disk (blocking); modifies nothing."""
        report = StoreReport(STORE, str(self.path))
        report.notes.extend(f"a damaged log was kept as {p} when the records it could not read were skipped"
                            for p in sorted(self.directory.glob(f"{self.path.name}.damaged-*")))
        with self._lock:
            size = self._size if self._file is not None else None
        try:
            with open(self.path, "rb") as f:
                data = f.read() if size is None else f.read(size)
        except FileNotFoundError:
            return report
        read = self._read(data)
        report.records = len(read.records)
        report.damaged.extend(read.damaged)
        if read.tail_at < len(data):
            report.damaged.append(read.tail or f"bytes {read.tail_at}-{len(data)} at the end are damaged")
        return report

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
