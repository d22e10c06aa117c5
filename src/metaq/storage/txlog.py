"""The transaction log: where a broker keeps its transactions until they commit (docs/transactions.md).

A transaction's batches are written here, not to their partitions; commit copies them into the
partitions (MetaQ's design), so a partition only ever holds committed messages. The log is a file of
records, each ``[u32 length][u32 crc32c][u8 type][payload]`` (big-endian; the CRC covers type and
payload):

==========  ================================================================================
type        payload
==========  ================================================================================
1 BEGIN     txid, timeout_ms i64, begun_ms i64, producer_group
2 PUT       txid, topic, partition i32, then the record batch (to the end of the record)
3 PREPARE   txid, xid
4 COMMIT    txid
5 ROLLBACK  txid, reason
6 APPLIED   txid (every batch of the committed transaction is in its partition)
7 DONE      txid, how (written by a checkpoint: a finished transaction and how it ended)
==========  ================================================================================

Strings are ``u16 length + UTF-8``. Replaying the records gives the transactions that are still live:
open, prepared, or committed but not yet applied, and the finished ones with how they ended
(``APPLIED``: "committed", ``ROLLBACK``: "rolled back (reason)", ``DONE``: as written), in the order they
finished: "was transaction X committed?" is answered after a restart too (the exactly-once Spark sink
relies on it).

**Files and checkpoints.** The log lives in ``<dataPath>/txlog/`` as generations
``<20-digit number>.txlog``; only the newest is appended to and replayed. A checkpoint
(``checkpointInterval``, or when the file grows past :data:`CHECKPOINT_BYTES`) writes the finished
transactions the caller still remembers (``DONE`` records) and the live transactions' records into the
next generation (a temporary file, fsynced, renamed, directory fsynced)
and switches to it, so replay never reads more than the live state plus what came after; the newest
``maxCheckpoints`` generations are kept, the older ones deleted.

**Damage.** Replay stops at the first record that is cut off or fails its CRC (a torn tail after a
crash), truncates the file there, and logs it; what came before is intact. Appends are ``os.write``
to the page cache; :meth:`TransactionLog.sync` is the fsync the caller's flush policy
(``flushTxLogAtCommit``) asks for.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import crc32c as _crc32c

from metaq.errors import StorageError
from metaq.fsutil import fsync_directory
from metaq.storage.errors import is_disk_full

log = logging.getLogger(__name__)

BEGIN, PUT, PREPARE, COMMIT, ROLLBACK, APPLIED, DONE = 1, 2, 3, 4, 5, 6, 7
_NAMES = {BEGIN: "BEGIN", PUT: "PUT", PREPARE: "PREPARE", COMMIT: "COMMIT", ROLLBACK: "ROLLBACK", APPLIED: "APPLIED",
          DONE: "DONE"}
COMMITTED = "committed"
"""How a committed transaction ended (its ``APPLIED`` is logged)."""
ROLLED_BACK = "rolled back"
"""How a rolled-back transaction's ending starts: ``"rolled back (reason)"``."""
HOW_CHARS_MAX = 300
"""A finished transaction's ending is kept to this many characters (the reason can be long)."""
_HEAD = struct.Struct(">II")
_TYPE = struct.Struct(">B")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
SUFFIX = ".txlog"
CHECKPOINT_BYTES = 256 << 20
"""A checkpoint is also taken when the newest file grows past this."""
MAX_RECORD_BYTES = 1 << 30


@dataclass(slots=True)
class TxPut:
    """One batch put into a transaction: where its bytes are in the current log file."""

    topic: str
    partition: int
    position: int
    length: int


@dataclass(slots=True)
class TxState:
    """A live transaction as the log knows it."""

    txid: str
    timeout_ms: int
    begun_ms: int
    producer_group: str = ""
    xid: str | None = None
    """Set once prepared."""
    committed: bool = False
    """COMMIT is logged: it must reach its partitions (again, after a crash)."""
    puts: list[TxPut] = field(default_factory=list)

    @property
    def size_bytes(self) -> int:
        return sum(p.length for p in self.puts)


def _s(text: str) -> bytes:
    data = text.encode()
    if len(data) > 0xFFFF:
        raise StorageError(f"a transaction log string is {len(data)} bytes; at most 65535")
    return _U16.pack(len(data)) + data


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: memoryview) -> None:
        self.data = data
        self.pos = 0

    def s(self) -> str:
        (n,) = _U16.unpack_from(self.data, self.pos)
        self.pos += 2 + n
        if self.pos > len(self.data):
            raise ValueError("string runs past the record")
        return bytes(self.data[self.pos - n:self.pos]).decode()

    def i32(self) -> int:
        (v,) = _I32.unpack_from(self.data, self.pos)
        self.pos += 4
        return int(v)

    def i64(self) -> int:
        (v,) = _I64.unpack_from(self.data, self.pos)
        self.pos += 8
        return int(v)


def encode_record(kind: int, *parts: bytes | memoryview) -> list[bytes | memoryview]:
    """The pieces of one record, ready for ``os.writev`` (the payload is not copied)."""
    body_len = 1 + sum(len(p) for p in parts)
    if body_len > MAX_RECORD_BYTES:
        raise StorageError(f"a transaction log record of {body_len} bytes is over {MAX_RECORD_BYTES}")
    crc = _crc32c.crc32c(_TYPE.pack(kind))
    for p in parts:
        crc = _crc32c.crc32c(p, crc)
    return [_HEAD.pack(body_len, crc) + _TYPE.pack(kind), *parts]


def iter_records(fd: int, size: int) -> Iterator[tuple[int, int, memoryview, int]]:
    """(position, type, payload, payload position) of each intact record from the start of the file,
    stopping at the first that is cut off or damaged (the caller truncates there)."""
    position = 0
    while size - position >= _HEAD.size + 1:
        head = os.pread(fd, _HEAD.size, position)
        body_len, crc = _HEAD.unpack(head)
        if body_len < 1 or body_len > MAX_RECORD_BYTES or position + _HEAD.size + body_len > size:
            return
        body = os.pread(fd, body_len, position + _HEAD.size)
        if len(body) != body_len or _crc32c.crc32c(body) != crc:
            return
        view = memoryview(body)
        yield position, view[0], view[1:], position + _HEAD.size + 1
        position += _HEAD.size + body_len


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
        self.size_bytes = 0
        self.truncated_bytes = 0
        """Bytes cut from a torn tail at open."""
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
        live: dict[str, TxState] = {}
        self.finished = {}
        end = 0
        for position, kind, payload, payload_at in iter_records(self._fd, size):
            try:
                self._replay(live, kind, payload, payload_at)
            except (ValueError, struct.error, UnicodeDecodeError) as exc:
                log.warning("%s: record at byte %d does not parse (%s); the log ends there", self.path, position, exc)
                break
            end = position + _HEAD.size + 1 + len(payload)
        if end < size:
            self.truncated_bytes = size - end
            log.warning("%s: %d bytes after byte %d are cut off or damaged (a crash while writing); removed",
                        self.path, size - end, end)
            os.ftruncate(self._fd, end)
            self._sync(self._fd)
        self.size_bytes = end
        if not generations:
            fsync_directory(self.directory, self._sync)
        return live

    def _replay(self, live: dict[str, TxState], kind: int, payload: memoryview, payload_at: int) -> None:
        r = _Reader(payload)
        txid = r.s()
        if kind == BEGIN:
            timeout_ms, begun_ms = r.i64(), r.i64()
            live[txid] = TxState(txid, timeout_ms, begun_ms, r.s())
            self.finished.pop(txid, None)  # a rolled-back transaction id begun again
            return
        if kind in (ROLLBACK, APPLIED, DONE):
            how = COMMITTED if kind == APPLIED else r.s() if kind == DONE else f"{ROLLED_BACK} ({r.s()})"
            self.finished.pop(txid, None)
            self.finished[txid] = how[:HOW_CHARS_MAX]
            if kind == DONE:
                return
        state = live.get(txid)
        if state is None:
            if kind not in (ROLLBACK, APPLIED):
                log.warning("%s: %s for unknown transaction %r ignored", self.path, _NAMES.get(kind, kind), txid)
            return
        if kind == PUT:
            topic, partition = r.s(), r.i32()
            state.puts.append(TxPut(topic, partition, payload_at + r.pos, len(payload) - r.pos))
        elif kind == PREPARE:
            state.xid = r.s()
        elif kind == COMMIT:
            state.committed = True
        elif kind in (ROLLBACK, APPLIED):
            del live[txid]
        else:
            raise ValueError(f"unknown record type {kind}")

    # -- appends ---------------------------------------------------------------------------------

    def _append(self, kind: int, *parts: bytes | memoryview) -> int:
        """Write one record; returns the position of its payload's first byte."""
        pieces = encode_record(kind, *parts)
        total = sum(len(p) for p in pieces)
        try:
            written = os.writev(self._fd, pieces)
        except OSError as exc:
            self._cut_back()
            if is_disk_full(exc):
                raise StorageError(f"the transaction log {self.path} cannot grow: the disk is full") from exc
            raise StorageError(f"cannot write the transaction log {self.path}: {exc}") from exc
        if written != total:
            self._cut_back()
            raise StorageError(f"short write to the transaction log {self.path} ({written} of {total} bytes)")
        at = self.size_bytes + _HEAD.size + 1
        self.size_bytes += total
        return at

    def _cut_back(self) -> None:
        """Remove a partial record (a failed write), so the next append starts at a record boundary."""
        try:
            os.ftruncate(self._fd, self.size_bytes)
        except OSError:
            pass

    def begin(self, state: TxState) -> None:
        self._append(BEGIN, _s(state.txid), _I64.pack(state.timeout_ms), _I64.pack(state.begun_ms),
                     _s(state.producer_group))

    def put(self, state: TxState, topic: str, partition: int, batch: bytes | memoryview) -> TxPut:
        head = _s(state.txid) + _s(topic) + _I32.pack(partition)
        at = self._append(PUT, head, batch)
        put = TxPut(topic, partition, at + len(head), len(batch))
        state.puts.append(put)
        return put

    def prepare(self, state: TxState, xid: str) -> None:
        self._append(PREPARE, _s(state.txid), _s(xid))
        state.xid = xid

    def commit(self, state: TxState) -> None:
        self._append(COMMIT, _s(state.txid))
        state.committed = True

    def rollback(self, txid: str, reason: str) -> None:
        self._append(ROLLBACK, _s(txid), _s(reason[:1000]))

    def applied(self, txid: str) -> None:
        self._append(APPLIED, _s(txid))

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
                        for c in encode_record(DONE, _s(txid), _s(how[:HOW_CHARS_MAX])))
        generation = self._generation + 1
        final = _generation_path(self.directory, generation)
        tmp = final.with_name(final.name + ".tmp")
        new_puts: list[list[TxPut]] = []
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, done)
                position = len(done)
                for state in states:
                    chunks = [encode_record(BEGIN, _s(state.txid), _I64.pack(state.timeout_ms),
                                            _I64.pack(state.begun_ms), _s(state.producer_group))]
                    puts = []
                    for put in state.puts:
                        head = _s(state.txid) + _s(put.topic) + _I32.pack(put.partition)
                        record = encode_record(PUT, head, self.read_batch(put))
                        at = position + sum(len(c) for chunk in chunks for c in chunk) + _HEAD.size + 1
                        puts.append(TxPut(put.topic, put.partition, at + len(head), put.length))
                        chunks.append(record)
                    if state.xid is not None:
                        chunks.append(encode_record(PREPARE, _s(state.txid), _s(state.xid)))
                    if state.committed:
                        chunks.append(encode_record(COMMIT, _s(state.txid)))
                    data = b"".join(bytes(c) for chunk in chunks for c in chunk)
                    os.write(fd, data)
                    position += len(data)
                    new_puts.append(puts)
                self._sync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, final)
            fsync_directory(self.directory, self._sync)
            new_fd = os.open(final, os.O_RDWR | os.O_APPEND)
        except OSError as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise StorageError(f"cannot checkpoint the transaction log into {final}: {exc}") from exc
        old_fd, self._fd, self._generation, self.size_bytes = self._fd, new_fd, generation, position
        os.close(old_fd)
        for state, puts in zip(states, new_puts, strict=True):
            state.puts = puts
        self.checkpoints += 1
        for old in list_generations(self.directory)[:-self.max_checkpoints]:
            try:
                os.unlink(_generation_path(self.directory, old))
            except OSError:
                pass

    def close(self) -> None:
        if self._fd >= 0:
            try:
                self._sync(self._fd)
            finally:
                os.close(self._fd)
                self._fd = -1
