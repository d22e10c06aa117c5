"""The transaction log: where a broker keeps its transactions until they commit (docs/transactions.md).

A transaction's batches are written here, not to their partitions; commit copies them into the
partitions (MetaQ's design), so a partition only ever holds committed messages. The records and their
layout are in :mod:`.format`; reading them back, damage included, in :mod:`.replay`.

**Files and checkpoints.** The log lives in ``<dataPath>/txlog/`` as generations
``<20-digit number>.txlog``; only the newest is appended to and replayed. A checkpoint
(``checkpointInterval``, or when the file grows past :data:`CHECKPOINT_BYTES`) writes the finished
transactions the caller still remembers (``DONE`` records) and the live transactions' records into the
next generation (a temporary file, fsynced, renamed, directory fsynced)
and switches to it, so replay never reads more than the live state plus what came after; the newest
``maxCheckpoints`` generations are kept, the older ones deleted.

Damaged records in the middle cost what :mod:`.replay` says (each an ERROR); damaged bytes with nothing
intact after them are a torn tail (a crash while writing): cut, with a WARNING. A generation written by
an earlier version is appended to in its own form until the next checkpoint, which writes the framed
form. Appends are ``os.write`` to the page cache; :meth:`TransactionLog.sync` is the fsync the caller's
flush policy (``flushTxLogAtCommit``) asks for.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from metaq import framing
from metaq.errors import StorageError
from metaq.fsutil import fsync_directory
from metaq.storage.checkpoint import StoreReport
from metaq.storage.errors import DiskFull, is_disk_full
from metaq.storage.txlog.format import (
    APPLIED,
    BEGIN,
    COMMIT,
    DONE,
    HOW_CHARS_MAX,
    I32,
    I64,
    PREPARE,
    PUT,
    ROLLBACK,
    encode_record,
    encode_string,
    encode_v1,
    is_v1,
)
from metaq.storage.txlog.replay import Replay, TxPut, TxState

log = logging.getLogger("metaq.storage.txlog")

STORE = "txlog"
SUFFIX = ".txlog"
CHECKPOINT_BYTES = 256 << 20
"""A checkpoint is also taken when the newest file grows past this."""


def _generation_path(directory: Path, generation: int) -> Path:
    return directory / f"{generation:020d}{SUFFIX}"


def list_generations(directory: Path) -> list[int]:
    out = []
    for name in os.listdir(directory):
        if name.endswith(SUFFIX) and name[:-len(SUFFIX)].isdigit():
            out.append(int(name[:-len(SUFFIX)]))
    return sorted(out)


class TransactionLog:
    """One broker's transaction log. Single writer (the broker's event loop); :meth:`sync` and
    :meth:`read_batch` may run in worker threads."""

    def __init__(self, directory: str | os.PathLike[str], *, max_checkpoints: int = 3,
                 sync: Callable[[int], None] = os.fsync) -> None:
        self.directory = Path(directory)
        self.max_checkpoints = max(1, max_checkpoints)
        self._sync = sync
        self._fd = -1
        self._generation = 0
        self._v1 = False
        """The newest generation was written by an earlier version: appended to in its form until a checkpoint."""
        self._numbers: dict[str, int] = {}
        """txid -> the number its next record takes."""
        self.size_bytes = 0
        self.truncated_bytes = 0
        """Bytes cut from a torn tail at open."""
        self.damage: list[str] = []
        """What the last open found damaged in the middle of the log: one message per damaged record."""
        self.checkpoints = 0
        self.finished: dict[str, str] = {}
        """After :meth:`open`: the finished transactions the log knows, txid -> how it ended, in the order
        they finished (the caller bounds how many it keeps, and hands them back to :meth:`checkpoint`)."""

    @property
    def path(self) -> Path:
        return _generation_path(self.directory, self._generation)

    # -- open and replay -------------------------------------------------------------------------

    def open(self) -> dict[str, TxState]:
        """Open (creating) the log and replay the newest generation: the live transactions, by txid."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for name in os.listdir(self.directory):
            if name.endswith(".tmp"):  # a checkpoint that did not finish: its generation never existed
                os.unlink(self.directory / name)
        generations = list_generations(self.directory)
        self._generation = generations[-1] if generations else 1
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            raise StorageError(f"cannot open the transaction log {self.path}: {exc}") from exc
        size = os.fstat(self._fd).st_size
        self._v1 = is_v1(self._fd, size)
        replay = Replay().read_v1(self._fd, size, self.path) if self._v1 else Replay().read(self._fd, size)
        self.finished = replay.finished
        self._numbers = replay.numbers
        self.damage = replay.damage
        for message in replay.damage:
            log.error("%s: %s", self.path, message)
            framing.DAMAGE.skipped_record(STORE, f"{self.path}: {message}")
        end = replay.end
        if end < size:
            self.truncated_bytes = size - end
            framing.DAMAGE.cut_tail(STORE)
            log.warning("%s: %d bytes after byte %d are cut off or damaged (a crash while writing%s); removed",
                        self.path, size - end, end, f": {replay.tail}" if replay.tail else "")
            os.ftruncate(self._fd, end)
            self._sync(self._fd)
        self.size_bytes = end
        if not generations:
            fsync_directory(self.directory, self._sync)
        return replay.live

    # -- appends ---------------------------------------------------------------------------------

    def _append(self, kind: int, txid: str, *parts: bytes | memoryview) -> int:
        """Write one record; returns the position of its body's first byte."""
        if kind in (ROLLBACK, APPLIED):
            number = self._numbers.pop(txid, 0)
        elif kind == BEGIN:
            number = 0
            self._numbers[txid] = 1
        else:
            number = self._numbers.get(txid, 0)
            self._numbers[txid] = number + 1
        if self._v1:
            pieces = encode_v1(kind, txid, *parts)
            body_at = self.size_bytes + len(pieces[0])
        else:
            pieces = encode_record(kind, number, txid, *parts)
            body_at = self.size_bytes + len(pieces[0])
        total = sum(len(p) for p in pieces)
        try:
            written = os.writev(self._fd, pieces)
            while written < total:  # a short write (a full disk takes what fits): the rest tells why
                rest = b"".join(bytes(p) for p in pieces)[written:]
                n = os.write(self._fd, rest)
                if n <= 0:
                    raise OSError(errno.ENOSPC, "no progress writing the transaction log")
                written += n
        except OSError as exc:
            self._cut_back()
            if is_disk_full(exc):
                raise DiskFull(f"the transaction log {self.path} cannot grow: the disk is full") from exc
            raise StorageError(f"cannot write the transaction log {self.path}: {exc}") from exc
        self.size_bytes += total
        return body_at

    def _cut_back(self) -> None:
        """Remove a partial record (a failed write), so the next append starts at a record boundary."""
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, self.size_bytes)

    def begin(self, state: TxState) -> None:
        self._append(BEGIN, state.txid, *_begin_body(state))

    def put(self, state: TxState, topic: str, partition: int, batch: bytes | memoryview) -> TxPut:
        head = encode_string(topic) + I32.pack(partition)
        at = self._append(PUT, state.txid, head, batch)
        put = TxPut(topic, partition, at + len(head), len(batch))
        state.puts.append(put)
        return put

    def prepare(self, state: TxState, xid: str) -> None:
        self._append(PREPARE, state.txid, encode_string(xid))
        state.xid = xid

    def commit(self, state: TxState) -> None:
        self._append(COMMIT, state.txid)
        state.committed = True

    def rollback(self, txid: str, reason: str) -> None:
        self._append(ROLLBACK, txid, encode_string(reason[:1000]))

    def applied(self, txid: str) -> None:
        self._append(APPLIED, txid)

    def read_batch(self, put: TxPut) -> bytes:
        data = os.pread(self._fd, put.length, put.position)
        if len(data) != put.length:
            raise StorageError(f"the transaction log {self.path} is shorter than a batch put into it")
        return data

    def sync(self) -> None:
        """fsync the log (the caller decides when: flushTxLogAtCommit)."""
        try:
            self._sync(self._fd)
        except OSError as exc:
            raise StorageError(f"cannot sync the transaction log {self.path}: {exc}") from exc

    # -- checkpoints -----------------------------------------------------------------------------

    def checkpoint(self, live: Iterable[TxState], finished: Iterable[tuple[str, str]] = ()) -> None:
        """Start the next generation holding only the ``finished`` transactions (txid, how it ended:
        ``DONE`` records, oldest first) and the live ones (their batches copied), then drop generations
        beyond ``max_checkpoints``. The TxState objects are updated to the new positions. Blocking: the
        caller runs it where it may block (it is rare)."""
        states = list(live)
        done = b"".join(bytes(c) for txid, how in finished
                        for c in encode_record(DONE, 0, txid, encode_string(how[:HOW_CHARS_MAX])))
        generation = self._generation + 1
        final = _generation_path(self.directory, generation)
        tmp = final.with_name(final.name + ".tmp")
        new_puts: list[list[TxPut]] = []
        numbers: dict[str, int] = {}
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                _write_all(fd, done)
                position = len(done)
                for state in states:
                    txid = state.txid
                    chunks = [encode_record(BEGIN, 0, txid, *_begin_body(state))]
                    puts = []
                    for put in state.puts:
                        head = encode_string(put.topic) + I32.pack(put.partition)
                        record = encode_record(PUT, len(chunks), txid, head, self.read_batch(put))
                        at = position + sum(len(c) for chunk in chunks for c in chunk) + len(record[0])
                        puts.append(TxPut(put.topic, put.partition, at + len(head), put.length))
                        chunks.append(record)
                    if state.xid is not None:
                        chunks.append(encode_record(PREPARE, len(chunks), txid, encode_string(state.xid)))
                    if state.committed:
                        chunks.append(encode_record(COMMIT, len(chunks), txid))
                    numbers[txid] = len(chunks)
                    data = b"".join(bytes(c) for chunk in chunks for c in chunk)
                    _write_all(fd, data)
                    position += len(data)
                    new_puts.append(puts)
                self._sync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, final)
            fsync_directory(self.directory, self._sync)
            new_fd = os.open(final, os.O_RDWR | os.O_APPEND)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if is_disk_full(exc):
                raise DiskFull(f"cannot checkpoint the transaction log into {final}: the disk is full") from exc
            raise StorageError(f"cannot checkpoint the transaction log into {final}: {exc}") from exc
        old_fd, self._fd, self._generation, self.size_bytes = self._fd, new_fd, generation, position
        os.close(old_fd)
        self._v1 = False
        self._numbers = numbers
        for state, puts in zip(states, new_puts, strict=True):
            state.puts = puts
        self.checkpoints += 1
        for old in list_generations(self.directory)[:-self.max_checkpoints]:
            with contextlib.suppress(OSError):
                os.unlink(_generation_path(self.directory, old))

    def verify(self) -> StoreReport:
        """Check every record of the newest generation as it is on disk (blocking); modifies nothing."""
        report = StoreReport(STORE, str(self.path))
        size = self.size_bytes
        try:
            fd = os.dup(self._fd)
        except OSError:
            report.notes.append("the log is closed")
            return report
        try:
            if self._v1:
                report.notes.append("written by an earlier version (checked by the replay of the next start)")
                return report
            replay = Replay().read(fd, min(size, os.fstat(fd).st_size))
        finally:
            os.close(fd)
        report.records = replay.records
        report.damaged.extend(replay.damage)
        if replay.end < size:
            report.damaged.append(replay.tail or f"bytes {replay.end}-{size} at the end are damaged")
        return report

    def close(self) -> None:
        if self._fd >= 0:
            try:
                self._sync(self._fd)
            finally:
                os.close(self._fd)
                self._fd = -1


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _begin_body(state: TxState) -> tuple[bytes, ...]:
    """A BEGIN record's body: the owner only when there is one, so a BEGIN without one (authentication off) has
    the bytes an older broker wrote."""
    body = (I64.pack(state.timeout_ms), I64.pack(state.begun_ms), encode_string(state.producer_group))
    return (*body, encode_string(state.owner)) if state.owner else body
