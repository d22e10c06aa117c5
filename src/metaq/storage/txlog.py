"""The transaction log: where a broker keeps its transactions until they commit (docs/transactions.md).

A transaction's batches are written here, not to their partitions; commit copies them into the
partitions (MetaQ's design), so a partition only ever holds committed messages. The log is a file of
framed records (:mod:`metaq.framing`: a magic, lengths, a checksum of the key and one of the body). The
key says which record of which transaction it is; the body holds the rest (big-endian, strings
``u16 length + UTF-8``)::

    key   u8 type, u32 number (the record's place among its transaction's records: BEGIN is 0), txid

==========  ================================================================================
type        body
==========  ================================================================================
1 BEGIN     timeout_ms i64, begun_ms i64, producer_group
2 PUT       topic, partition i32, then the record batch (to the end of the record)
3 PREPARE   xid
4 COMMIT    (empty)
5 ROLLBACK  reason
6 APPLIED   (empty: every batch of the committed transaction is in its partition)
7 DONE      how (written by a checkpoint: a finished transaction and how it ended)
==========  ================================================================================

Replaying the records gives the transactions that are still live: open, prepared, or committed but not
yet applied, and the finished ones with how they ended (``APPLIED``: "committed", ``ROLLBACK``: "rolled
back (reason)", ``DONE``: as written), in the order they finished: "was transaction X committed?" is
answered after a restart too (the exactly-once Spark sink relies on it).

**Files and checkpoints.** The log lives in ``<dataPath>/txlog/`` as generations
``<20-digit number>.txlog``; only the newest is appended to and replayed. A checkpoint
(``checkpointInterval``, or when the file grows past :data:`CHECKPOINT_BYTES`) writes the finished
transactions the caller still remembers (``DONE`` records) and the live transactions' records into the
next generation (a temporary file, fsynced, renamed, directory fsynced)
and switches to it, so replay never reads more than the live state plus what came after; the newest
``maxCheckpoints`` generations are kept, the older ones deleted.

**Damage.** Each record is checked on its own. A damaged record in the middle is skipped and replay
goes on with the next intact one; what it cost is worked out from what is known of it
(:attr:`TransactionLog.damage`, each an ERROR):

- its key intact (the damage is in its body or lengths): which record of which transaction it was.
  A lost COMMIT or APPLIED is no loss (the key is all they hold); a lost ROLLBACK ends the transaction as
  rolled back, its reason lost; a lost DONE loses how that transaction ended (its status is then
  unknown); a lost BEGIN keeps the transaction with its timeout and producer group unknown; a lost PUT
  or PREPARE **damages** the transaction (:attr:`TxState.damaged`): it is never applied in part, the
  caller rolls it back.
- its key damaged too: the numbers of the transaction's later records show the gap (a lost record 0 is
  its BEGIN; any other is of unknown type: the transaction is damaged). A lost record that was the last
  of its transaction leaves no gap: the transactions whose last record came before it are named as the
  ones it may have belonged to.

Damaged bytes with nothing intact after them are a torn tail (a crash while writing): cut, with a
WARNING. A generation written by an earlier version (records ``[u32 length][u32 crc32c][u8
type][txid][payload]``) is replayed as it is (up to its first damaged record) and appended to in its own
form until the next checkpoint, which writes the framed form. Appends are ``os.write`` to the page
cache; :meth:`TransactionLog.sync` is the fsync the caller's flush policy (``flushTxLogAtCommit``) asks
for.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import crc32c as _crc32c

from metaq import framing
from metaq.errors import StorageError
from metaq.fsutil import fsync_directory
from metaq.storage.errors import DiskFull, is_disk_full
from metaq.storage.verify import StoreReport

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
STORE = "txlog"
_KEY = struct.Struct(">BI")
_V1_HEAD = struct.Struct(">II")
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
    """0 when its BEGIN record was lost to damage (the caller then takes its longest timeout)."""
    begun_ms: int
    producer_group: str = ""
    xid: str | None = None
    """Set once prepared."""
    committed: bool = False
    """COMMIT is logged: it must reach its partitions (again, after a crash)."""
    puts: list[TxPut] = field(default_factory=list)
    damaged: str | None = None
    """Set at replay when a record that may have been one of its batches (or its PREPARE) was lost to
    damage: the transaction must not be applied; the caller rolls it back with this as the reason."""

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

    def __init__(self, data: memoryview | bytes) -> None:
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


def _key(kind: int, number: int, txid: str) -> bytes:
    return _KEY.pack(kind, number) + txid.encode()


def _parse_key(key: bytes) -> tuple[int, int, str] | None:
    if len(key) < _KEY.size:
        return None
    kind, number = _KEY.unpack_from(key)
    if kind not in _NAMES:
        return None
    try:
        return kind, number, key[_KEY.size:].decode()
    except UnicodeDecodeError:
        return None


def _describe_key(key: bytes) -> str:
    parsed = _parse_key(key)
    if parsed is None:
        return repr(key)
    kind, number, txid = parsed
    return f"{_NAMES[kind]} (record {number}) of transaction {txid!r}"


def encode_record(kind: int, number: int, txid: str, *parts: bytes | memoryview) -> list[bytes | memoryview]:
    """The pieces of one record, ready for ``os.writev`` (the payload is not copied)."""
    body_len = sum(len(p) for p in parts)
    if body_len > MAX_RECORD_BYTES:
        raise StorageError(f"a transaction log record of {body_len} bytes is over {MAX_RECORD_BYTES}")
    return framing.encode(_key(kind, number, txid), *parts)  # type: ignore[return-value]


def _encode_v1(kind: int, txid: str, *parts: bytes | memoryview) -> list[bytes | memoryview]:
    """A record in the earlier, unframed form (appended to a generation an earlier version wrote)."""
    head = _s(txid)
    body_len = 1 + len(head) + sum(len(p) for p in parts)
    if body_len > MAX_RECORD_BYTES:
        raise StorageError(f"a transaction log record of {body_len} bytes is over {MAX_RECORD_BYTES}")
    crc = _crc32c.crc32c(head, _crc32c.crc32c(_TYPE.pack(kind)))
    for p in parts:
        crc = _crc32c.crc32c(p, crc)
    return [_V1_HEAD.pack(body_len, crc) + _TYPE.pack(kind) + head, *parts]


def _iter_v1(fd: int, size: int) -> Iterator[tuple[int, int, memoryview, int]]:
    """(position, type, payload, payload position) of the records of an earlier-format generation, up to the
    first that is cut off or damaged. The payload starts with the txid."""
    position = 0
    while size - position >= _V1_HEAD.size + 1:
        body_len, crc = _V1_HEAD.unpack(os.pread(fd, _V1_HEAD.size, position))
        if body_len < 1 or body_len > MAX_RECORD_BYTES or position + _V1_HEAD.size + body_len > size:
            return
        body = os.pread(fd, body_len, position + _V1_HEAD.size)
        if len(body) != body_len or _crc32c.crc32c(body) != crc:
            return
        view = memoryview(body)
        yield position, view[0], view[1:], position + _V1_HEAD.size + 1
        position += _V1_HEAD.size + body_len


def _is_v1(fd: int, size: int) -> bool:
    """Whether a generation was written by an earlier version (its first record unframed and intact)."""
    if size < len(framing.MAGIC) or os.pread(fd, len(framing.MAGIC), 0) == framing.MAGIC:
        return False
    return next(_iter_v1(fd, size), None) is not None


def _generation_path(directory: Path, generation: int) -> Path:
    return directory / f"{generation:020d}{SUFFIX}"


def list_generations(directory: Path) -> list[int]:
    out = []
    for name in os.listdir(directory):
        if name.endswith(SUFFIX) and name[:-len(SUFFIX)].isdigit():
            out.append(int(name[:-len(SUFFIX)]))
    return sorted(out)


@dataclass(slots=True)
class _Unnamed:
    """A damaged record whose key cannot be read, and what the gaps in later records' numbers tell of it."""

    position: int
    end: int
    guess: str
    explained: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Replay:
    """The state a replay builds, and what damage cost."""

    live: dict[str, TxState] = field(default_factory=dict)
    finished: dict[str, str] = field(default_factory=dict)
    numbers: dict[str, int] = field(default_factory=dict)
    """txid -> the number its next record takes (live transactions)."""
    last_at: dict[str, int] = field(default_factory=dict)
    """txid -> where its last intact record starts (live transactions)."""
    damage: list[str] = field(default_factory=list)
    unnamed: list[_Unnamed] = field(default_factory=list)
    records: int = 0
    end: int = 0
    """Where the intact records end (a torn tail starts)."""
    tail: str | None = None


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
        self._v1 = _is_v1(self._fd, size)
        replay = self._replay_v1(size) if self._v1 else self._replay(self._fd, size)
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

    def _replay(self, fd: int, size: int) -> _Replay:
        out = _Replay()
        if size == 0:
            return out
        with mmap.mmap(fd, size, prot=mmap.PROT_READ) as data:
            apply, record_type = self._apply, framing.Record
            for item in framing.scan(data, 0, size):
                if type(item) is record_type:
                    position, key, body_at, end = item
                    parsed = _parse_key(key)
                    # a PUT's batch stays in the file: only its topic and partition are read
                    body = data[body_at:end] if parsed is None or parsed[0] != PUT else \
                        data[body_at:min(end, body_at + 2 + 0xFFFF + 4)]
                    try:
                        if parsed is None:
                            raise ValueError(f"key {key!r} is not a record type, number and txid")
                        apply(out, *parsed, body, body_at, end - body_at, position)
                    except (ValueError, struct.error, UnicodeDecodeError) as exc:
                        self._lost(out, parsed, position, end, f"it does not parse ({exc})")
                    out.records += 1
                    out.end = end
                    continue
                assert isinstance(item, framing.Damage)
                if item.tail:
                    out.tail = f"the last record, {item.describe_key(_describe_key)}, {item.problem}"
                    break
                else:
                    self._lost(out, _parse_key(item.key) if item.key is not None else None, item.position,
                               item.end, item.problem, item.describe_key(_describe_key))
                    out.end = item.end
        for unnamed in out.unnamed:
            where = f"the damaged record at bytes {unnamed.position}-{unnamed.end} (its key unreadable: " \
                    f"{unnamed.guess})"
            if unnamed.explained:
                out.damage.append(f"{where}: " + "; ".join(unnamed.explained))
                continue
            suspects = sorted(t for t, at in out.last_at.items() if at < unnamed.position)
            out.damage.append(
                f"{where} left no gap in the numbers of any transaction's later records: it was the last record of "
                "one of the live transactions " + (", ".join(repr(t) for t in suspects) if suspects else "(none)")
                + ", or the DONE record of a finished one; they stay as their intact records say")
        return out

    def _lost(self, out: _Replay, parsed: tuple[int, int, str] | None, position: int, end: int,
              problem: str, guess: str = "") -> None:
        """A record at ``[position, end)`` that cannot be read; ``parsed``: its key, if known."""
        if parsed is None:  # worked out from the gaps in the numbers of the later records (see _apply)
            out.unnamed.append(_Unnamed(position, end, guess))
            return
        kind, number, txid = parsed
        what = f"the {_NAMES[kind]} record (number {number}) of transaction {txid!r} at bytes {position}-{end} is " \
               f"damaged ({problem}) and skipped"
        if kind == DONE:
            out.finished.pop(txid, None)
            out.damage.append(f"{what}: how the transaction ended is lost (its status is now unknown)")
            return
        state = out.live.get(txid)
        if state is None:
            # its BEGIN is lost too (no other record of a transaction comes after it ended)
            state = self._begun_without_record(out, txid, number)
            if kind != BEGIN:
                what += "; its BEGIN record was lost before it"
        if kind == BEGIN:
            out.damage.append(f"{what}: the transaction is kept with its timeout and producer group unknown")
        elif kind == COMMIT:
            state.committed = True
            out.damage.append(f"{what}: its key is all it holds, so the transaction is committed all the same")
        elif kind == APPLIED:
            self._finish(out, txid, COMMITTED)
            out.damage.append(f"{what}: its key is all it holds, so the transaction is committed and applied")
            return
        elif kind == ROLLBACK:
            self._finish(out, txid, f"{ROLLED_BACK} (its reason was lost to damage in the transaction log)")
            out.damage.append(f"{what}: the transaction is rolled back, its reason lost")
            return
        else:
            self._damaged(out, txid, f"its {_NAMES[kind]} record (number {number}) was lost to damage in the "
                                     "transaction log")
            out.damage.append(f"{what}: the transaction is damaged and will be rolled back, never applied in part")
        out.numbers[txid] = max(out.numbers.get(txid, 0), number + 1)

    def _gap(self, out: _Replay, txid: str, since: int, position: int, message: str) -> None:
        """Records of ``txid`` between ``since`` and ``position`` were lost: say so with the damage there."""
        for unnamed in out.unnamed:
            if since < unnamed.position < position:
                unnamed.explained.append(message)
                return
        out.damage.append(message)

    @staticmethod
    def _begun_without_record(out: _Replay, txid: str, number: int) -> TxState:
        state = TxState(txid, 0, 0, "")
        out.live[txid] = state
        out.finished.pop(txid, None)
        out.numbers[txid] = number + 1
        return state

    @staticmethod
    def _damaged(out: _Replay, txid: str, reason: str) -> None:
        state = out.live[txid]
        if state.damaged is None:
            state.damaged = reason

    @staticmethod
    def _finish(out: _Replay, txid: str, how: str) -> None:
        out.live.pop(txid, None)
        out.numbers.pop(txid, None)
        out.last_at.pop(txid, None)
        out.finished.pop(txid, None)
        out.finished[txid] = how[:HOW_CHARS_MAX]

    def _apply(self, out: _Replay, kind: int, number: int, txid: str, body: bytes, body_at: int, body_len: int,
               position: int) -> None:
        r = _Reader(body)
        if kind == DONE:
            out.finished.pop(txid, None)
            out.finished[txid] = r.s()[:HOW_CHARS_MAX]
            return
        if kind == BEGIN:
            timeout_ms, begun_ms = r.i64(), r.i64()
            out.live[txid] = TxState(txid, timeout_ms, begun_ms, r.s())
            out.finished.pop(txid, None)  # a rolled-back transaction id begun again
            out.numbers[txid] = 1
            out.last_at[txid] = position
            return
        state = out.live.get(txid)
        expected = out.numbers.get(txid, 0) if state is not None else 0
        if state is None and number == 0:
            raise ValueError(f"{_NAMES[kind]} numbered 0 (the number of a BEGIN)")
        if number > expected:  # records of this transaction were lost to damage before this one
            since = out.last_at.get(txid, -1)
            if state is None:
                state = self._begun_without_record(out, txid, 0)
                self._gap(out, txid, since, position, f"it was the BEGIN record of transaction {txid!r}, which is "
                                                      "kept with its timeout and producer group unknown")
                expected = 1
            if number > expected:
                lost = f"record {expected}" if number == expected + 1 else f"records {expected}-{number - 1}"
                if kind in (ROLLBACK, APPLIED):
                    self._gap(out, txid, since, position,
                              f"transaction {txid!r} lost its {lost}; its next record ends it "
                              f"({_NAMES[kind]}), so nothing else is lost")
                else:
                    self._damaged(out, txid, f"its {lost} were lost to damage in the transaction log")
                    self._gap(out, txid, since, position,
                              f"transaction {txid!r} lost its {lost}, which may have been one of its batches: the "
                              "transaction is damaged and will be rolled back, never applied in part")
        elif state is None:
            if kind in (ROLLBACK, APPLIED):
                self._finish(out, txid, COMMITTED if kind == APPLIED else f"{ROLLED_BACK} ({r.s()})")
                return
            raise ValueError(f"{_NAMES[kind]} for transaction {txid!r}, which is not live")
        out.numbers[txid] = number + 1
        out.last_at[txid] = position
        if kind == PUT:
            topic, partition = r.s(), r.i32()
            state.puts.append(TxPut(topic, partition, body_at + r.pos, body_len - r.pos))
        elif kind == PREPARE:
            state.xid = r.s()
        elif kind == COMMIT:
            state.committed = True
        elif kind == ROLLBACK:
            self._finish(out, txid, f"{ROLLED_BACK} ({r.s()})")
        elif kind == APPLIED:
            self._finish(out, txid, COMMITTED)

    def _replay_v1(self, size: int) -> _Replay:
        """A generation of the earlier form: up to its first damaged record, as an earlier version read it."""
        out = _Replay()
        for position, kind, payload, payload_at in _iter_v1(self._fd, size):
            try:
                self._apply_v1(out, kind, payload, payload_at)
            except (ValueError, struct.error, UnicodeDecodeError) as exc:
                log.warning("%s: record at byte %d does not parse (%s); the log ends there", self.path, position, exc)
                break
            out.end = position + _V1_HEAD.size + 1 + len(payload)
        return out

    def _apply_v1(self, out: _Replay, kind: int, payload: memoryview, payload_at: int) -> None:
        r = _Reader(payload)
        txid = r.s()
        number = out.numbers.get(txid, 0)
        if kind == BEGIN:
            timeout_ms, begun_ms = r.i64(), r.i64()
            out.live[txid] = TxState(txid, timeout_ms, begun_ms, r.s())
            out.finished.pop(txid, None)
            out.numbers[txid] = 1
            return
        if kind == DONE:
            out.finished.pop(txid, None)
            out.finished[txid] = r.s()[:HOW_CHARS_MAX]
            return
        if kind in (ROLLBACK, APPLIED):
            self._finish(out, txid, COMMITTED if kind == APPLIED else f"{ROLLED_BACK} ({r.s()})")
            return
        state = out.live.get(txid)
        if state is None:
            log.warning("%s: %s for unknown transaction %r ignored", self.path, _NAMES.get(kind, kind), txid)
            return
        out.numbers[txid] = number + 1
        if kind == PUT:
            topic, partition = r.s(), r.i32()
            state.puts.append(TxPut(topic, partition, payload_at + r.pos, len(payload) - r.pos))
        elif kind == PREPARE:
            state.xid = r.s()
        elif kind == COMMIT:
            state.committed = True
        else:
            raise ValueError(f"unknown record type {kind}")

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
            pieces = _encode_v1(kind, txid, *parts)
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
        self._append(BEGIN, state.txid, _I64.pack(state.timeout_ms), _I64.pack(state.begun_ms),
                     _s(state.producer_group))

    def put(self, state: TxState, topic: str, partition: int, batch: bytes | memoryview) -> TxPut:
        head = _s(topic) + _I32.pack(partition)
        at = self._append(PUT, state.txid, head, batch)
        put = TxPut(topic, partition, at + len(head), len(batch))
        state.puts.append(put)
        return put

    def prepare(self, state: TxState, xid: str) -> None:
        self._append(PREPARE, state.txid, _s(xid))
        state.xid = xid

    def commit(self, state: TxState) -> None:
        self._append(COMMIT, state.txid)
        state.committed = True

    def rollback(self, txid: str, reason: str) -> None:
        self._append(ROLLBACK, txid, _s(reason[:1000]))

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
                        for c in encode_record(DONE, 0, txid, _s(how[:HOW_CHARS_MAX])))
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
                    chunks = [encode_record(BEGIN, 0, txid, _I64.pack(state.timeout_ms), _I64.pack(state.begun_ms),
                                            _s(state.producer_group))]
                    puts = []
                    for put in state.puts:
                        head = _s(put.topic) + _I32.pack(put.partition)
                        record = encode_record(PUT, len(chunks), txid, head, self.read_batch(put))
                        at = position + sum(len(c) for chunk in chunks for c in chunk) + len(record[0])
                        puts.append(TxPut(put.topic, put.partition, at + len(head), put.length))
                        chunks.append(record)
                    if state.xid is not None:
                        chunks.append(encode_record(PREPARE, len(chunks), txid, _s(state.xid)))
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
            replay = TransactionLog(self.directory)._replay(fd, min(size, os.fstat(fd).st_size))
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
