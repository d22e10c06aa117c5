"""Reading a generation back: the live transactions, the finished ones, and what damage cost.

Replaying the records gives the transactions that are still live: open, prepared, or committed but not
yet applied, and the finished ones with how they ended (``APPLIED``: "committed", ``ROLLBACK``: "rolled
back (reason)", ``DONE``: as written), in the order they finished: "was transaction X committed?" is
answered after a restart too (the exactly-once Spark sink relies on it).

**Damage.** Each record is checked on its own. A damaged record in the middle is skipped and replay
goes on with the next intact one; what it cost is worked out from what is known of it
(:attr:`Replay.damage`, each an ERROR of the log's open):

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

Damaged bytes with nothing intact after them are a torn tail (:attr:`Replay.end`, :attr:`Replay.tail`):
the log cuts them. A generation of the earlier form is read as an earlier version read it, up to its
first damaged record (:func:`replay_v1`).
"""

from __future__ import annotations

import logging
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

from metaq import framing
from metaq.storage.txlog.format import (
    APPLIED,
    BEGIN,
    COMMIT,
    COMMITTED,
    DONE,
    HOW_CHARS_MAX,
    NAMES,
    PREPARE,
    PUT,
    ROLLBACK,
    ROLLED_BACK,
    V1_HEAD,
    BodyReader,
    describe_key,
    iter_v1,
    parse_key,
)

log = logging.getLogger("metaq.storage.txlog")


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


@dataclass(slots=True)
class _Unnamed:
    """A damaged record whose key cannot be read, and what the gaps in later records' numbers tell of it."""

    position: int
    end: int
    guess: str
    explained: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Replay:
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

    def read(self, fd: int, size: int) -> Replay:
        """Replay the framed records of ``fd``'s first ``size`` bytes."""
        if size == 0:
            return self
        with mmap.mmap(fd, size, prot=mmap.PROT_READ) as data:
            apply, record_type = self._apply, framing.Record
            for item in framing.scan(data, 0, size):
                if type(item) is record_type:
                    position, key, body_at, end = item
                    parsed = parse_key(key)
                    # a PUT's batch stays in the file: only its topic and partition are read
                    body = data[body_at:end] if parsed is None or parsed[0] != PUT else \
                        data[body_at:min(end, body_at + 2 + 0xFFFF + 4)]
                    try:
                        if parsed is None:
                            raise ValueError(f"key {key!r} is not a record type, number and txid")
                        apply(*parsed, body, body_at, end - body_at, position)
                    except (ValueError, struct.error, UnicodeDecodeError) as exc:
                        self._lost(parsed, position, end, f"it does not parse ({exc})")
                    self.records += 1
                    self.end = end
                    continue
                assert isinstance(item, framing.Damage)
                if item.tail:
                    self.tail = f"the last record, {item.describe_key(describe_key)}, {item.problem}"
                    break
                else:
                    self._lost(parse_key(item.key) if item.key is not None else None, item.position,
                               item.end, item.problem, item.describe_key(describe_key))
                    self.end = item.end
        for unnamed in self.unnamed:
            where = f"the damaged record at bytes {unnamed.position}-{unnamed.end} (its key unreadable: " \
                    f"{unnamed.guess})"
            if unnamed.explained:
                self.damage.append(f"{where}: " + "; ".join(unnamed.explained))
                continue
            suspects = sorted(t for t, at in self.last_at.items() if at < unnamed.position)
            self.damage.append(
                f"{where} left no gap in the numbers of any transaction's later records: it was the last record of "
                "one of the live transactions " + (", ".join(repr(t) for t in suspects) if suspects else "(none)")
                + ", or the DONE record of a finished one; they stay as their intact records say")
        return self

    def _lost(self, parsed: tuple[int, int, str] | None, position: int, end: int, problem: str,
              guess: str = "") -> None:
        """A record at ``[position, end)`` that cannot be read; ``parsed``: its key, if known."""
        if parsed is None:  # worked out from the gaps in the numbers of the later records (see _apply)
            self.unnamed.append(_Unnamed(position, end, guess))
            return
        kind, number, txid = parsed
        what = f"the {NAMES[kind]} record (number {number}) of transaction {txid!r} at bytes {position}-{end} is " \
               f"damaged ({problem}) and skipped"
        if kind == DONE:
            self.finished.pop(txid, None)
            self.damage.append(f"{what}: how the transaction ended is lost (its status is now unknown)")
            return
        state = self.live.get(txid)
        if state is None:
            # its BEGIN is lost too (no other record of a transaction comes after it ended)
            state = self._begun_without_record(txid, number)
            if kind != BEGIN:
                what += "; its BEGIN record was lost before it"
        if kind == BEGIN:
            self.damage.append(f"{what}: the transaction is kept with its timeout and producer group unknown")
        elif kind == COMMIT:
            state.committed = True
            self.damage.append(f"{what}: its key is all it holds, so the transaction is committed all the same")
        elif kind == APPLIED:
            self._finish(txid, COMMITTED)
            self.damage.append(f"{what}: its key is all it holds, so the transaction is committed and applied")
            return
        elif kind == ROLLBACK:
            self._finish(txid, f"{ROLLED_BACK} (its reason was lost to damage in the transaction log)")
            self.damage.append(f"{what}: the transaction is rolled back, its reason lost")
            return
        else:
            self._damaged(txid, f"its {NAMES[kind]} record (number {number}) was lost to damage in the "
                                "transaction log")
            self.damage.append(f"{what}: the transaction is damaged and will be rolled back, never applied in part")
        self.numbers[txid] = max(self.numbers.get(txid, 0), number + 1)

    def _gap(self, since: int, position: int, message: str) -> None:
        """Records of a transaction between ``since`` and ``position`` were lost: say so with the damage there."""
        for unnamed in self.unnamed:
            if since < unnamed.position < position:
                unnamed.explained.append(message)
                return
        self.damage.append(message)

    def _begun_without_record(self, txid: str, number: int) -> TxState:
        state = TxState(txid, 0, 0, "")
        self.live[txid] = state
        self.finished.pop(txid, None)
        self.numbers[txid] = number + 1
        return state

    def _damaged(self, txid: str, reason: str) -> None:
        state = self.live[txid]
        if state.damaged is None:
            state.damaged = reason

    def _finish(self, txid: str, how: str) -> None:
        self.live.pop(txid, None)
        self.numbers.pop(txid, None)
        self.last_at.pop(txid, None)
        self.finished.pop(txid, None)
        self.finished[txid] = how[:HOW_CHARS_MAX]

    def _apply(self, kind: int, number: int, txid: str, body: bytes, body_at: int, body_len: int,
               position: int) -> None:
        r = BodyReader(body)
        if kind == DONE:
            self.finished.pop(txid, None)
            self.finished[txid] = r.s()[:HOW_CHARS_MAX]
            return
        if kind == BEGIN:
            timeout_ms, begun_ms = r.i64(), r.i64()
            self.live[txid] = TxState(txid, timeout_ms, begun_ms, r.s())
            self.finished.pop(txid, None)  # a rolled-back transaction id begun again
            self.numbers[txid] = 1
            self.last_at[txid] = position
            return
        state = self.live.get(txid)
        expected = self.numbers.get(txid, 0) if state is not None else 0
        if state is None and number == 0:
            raise ValueError(f"{NAMES[kind]} numbered 0 (the number of a BEGIN)")
        if number > expected:  # records of this transaction were lost to damage before this one
            since = self.last_at.get(txid, -1)
            if state is None:
                state = self._begun_without_record(txid, 0)
                self._gap(since, position, f"it was the BEGIN record of transaction {txid!r}, which is "
                                           "kept with its timeout and producer group unknown")
                expected = 1
            if number > expected:
                lost = f"record {expected}" if number == expected + 1 else f"records {expected}-{number - 1}"
                if kind in (ROLLBACK, APPLIED):
                    self._gap(since, position, f"transaction {txid!r} lost its {lost}; its next record ends it "
                                               f"({NAMES[kind]}), so nothing else is lost")
                else:
                    self._damaged(txid, f"its {lost} were lost to damage in the transaction log")
                    self._gap(since, position,
                              f"transaction {txid!r} lost its {lost}, which may have been one of its batches: the "
                              "transaction is damaged and will be rolled back, never applied in part")
        elif state is None:
            if kind in (ROLLBACK, APPLIED):
                self._finish(txid, COMMITTED if kind == APPLIED else f"{ROLLED_BACK} ({r.s()})")
                return
            raise ValueError(f"{NAMES[kind]} for transaction {txid!r}, which is not live")
        self.numbers[txid] = number + 1
        self.last_at[txid] = position
        if kind == PUT:
            topic, partition = r.s(), r.i32()
            state.puts.append(TxPut(topic, partition, body_at + r.pos, body_len - r.pos))
        elif kind == PREPARE:
            state.xid = r.s()
        elif kind == COMMIT:
            state.committed = True
        elif kind == ROLLBACK:
            self._finish(txid, f"{ROLLED_BACK} ({r.s()})")
        elif kind == APPLIED:
            self._finish(txid, COMMITTED)

    def read_v1(self, fd: int, size: int, path: Path) -> Replay:
        """A generation of the earlier form: up to its first damaged record, as an earlier version read it."""
        for position, kind, payload, payload_at in iter_v1(fd, size):
            try:
                self._apply_v1(kind, payload, payload_at, path)
            except (ValueError, struct.error, UnicodeDecodeError) as exc:
                log.warning("%s: record at byte %d does not parse (%s); the log ends there", path, position, exc)
                break
            self.end = position + V1_HEAD.size + 1 + len(payload)
        return self

    def _apply_v1(self, kind: int, payload: memoryview, payload_at: int, path: Path) -> None:
        r = BodyReader(payload)
        txid = r.s()
        number = self.numbers.get(txid, 0)
        if kind == BEGIN:
            timeout_ms, begun_ms = r.i64(), r.i64()
            self.live[txid] = TxState(txid, timeout_ms, begun_ms, r.s())
            self.finished.pop(txid, None)
            self.numbers[txid] = 1
            return
        if kind == DONE:
            self.finished.pop(txid, None)
            self.finished[txid] = r.s()[:HOW_CHARS_MAX]
            return
        if kind in (ROLLBACK, APPLIED):
            self._finish(txid, COMMITTED if kind == APPLIED else f"{ROLLED_BACK} ({r.s()})")
            return
        state = self.live.get(txid)
        if state is None:
            log.warning("%s: %s for unknown transaction %r ignored", path, NAMES.get(kind, kind), txid)
            return
        self.numbers[txid] = number + 1
        if kind == PUT:
            topic, partition = r.s(), r.i32()
            state.puts.append(TxPut(topic, partition, payload_at + r.pos, len(payload) - r.pos))
        elif kind == PREPARE:
            state.xid = r.s()
        elif kind == COMMIT:
            state.committed = True
        else:
            raise ValueError(f"unknown record type {kind}")
