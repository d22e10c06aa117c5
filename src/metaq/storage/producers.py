"""What a partition remembers of its idempotent producers: the last batches each one stored.

An idempotent producer stamps every batch with its producer id, an epoch and the sequence number of
the batch's first record (``records.ProducerStamp``); sequences run on per producer and partition.
Before the broker appends a stamped batch it asks :meth:`ProducerStateTable.check`:

- a batch this producer already stored (the same first and last sequence as one of its last
  :data:`BATCHES_KEPT` batches) is a **duplicate**: it is not written again, and the answer is the
  offsets the original got;
- the next batch (first sequence = last stored + 1) is appended;
- a batch from an older epoch is **fenced** (the producer restarted its sequence since);
- a gap (a first sequence past the next one) is **out of order**: nothing is stored and the producer
  retries once the batch before it is in;
- an older sequence that is no longer remembered is a **duplicate whose offsets are unknown**.

A producer id the partition does not know (a new producer, or one forgotten after
``producer_expiration_ms`` without a batch, or whose batches were cut) is taken from sequence 0 only: a
batch at a later sequence is **unknown-producer** (nothing stored). Taking it would store it with its
predecessors missing, and a resend of those would then look like an old duplicate and be dropped: acked,
never stored. The producer starts a new epoch at 0 instead (docs/producer.md).

The table is rebuilt from the log itself: a snapshot (``<offset>.producers``) is written when a segment
rolls and when the log is closed, and on open the batches after the newest usable snapshot are read
(headers and producer blocks only). So a retried batch is recognised after a restart, a kill -9, or a
failover to a slave (which stores the same stamped batches).

A snapshot is text lines (:mod:`metaq.framing`): ``{"offset": N}``, then one line per producer
``{"producer": id, "epoch": e, "last_ms": t, "batches": [[first_seq, last_seq, base, last, time], ...]}``,
each with its checksums. A damaged line costs that producer only (an ERROR names it): the partition then
takes it at whatever sequence it sends next, as a producer it never saw, so a retry of a batch it stored
before the snapshot may be stored again. A snapshot an earlier version wrote (a CRC line, then one JSON
document) is still read.
"""

from __future__ import annotations

import json
import logging
import os
import zlib
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from metaq.protocol.records import SEQUENCE_LIMIT, ProducerStamp
from metaq.storage.checkpoint import check_records, parse_records, write_records

log = logging.getLogger(__name__)

BATCHES_KEPT = 64
"""Batches remembered per producer and partition: a retry of any of them gets the original offsets.
(A producer has at most this many batches in flight to one partition before the oldest is answered.)"""
MAX_PRODUCERS = 100_000
"""Producers remembered per partition; past it, the one idle longest is forgotten."""
SNAPSHOT_SUFFIX = ".producers"
SNAPSHOTS_KEPT = 3
STORE = "producers"


def _key(obj: dict[str, object]) -> str:
    return "offset" if "offset" in obj else f"producer {obj['producer']}"


class StoredBatch(NamedTuple):
    first_sequence: int
    last_sequence: int
    base_offset: int
    last_offset: int
    append_time_ms: int


@dataclass(slots=True)
class ProducerEntry:
    epoch: int
    last_append_ms: int
    batches: deque[StoredBatch] = field(default_factory=lambda: deque(maxlen=BATCHES_KEPT))

    @property
    def last_sequence(self) -> int:
        return self.batches[-1].last_sequence


class Verdict(NamedTuple):
    """What :meth:`ProducerStateTable.check` decided. ``kind`` is one of ``append``, ``duplicate``,
    ``duplicate-unknown``, ``out-of-order``, ``fenced``, ``unknown-producer``; ``original`` is set for
    ``duplicate``."""

    kind: str
    original: StoredBatch | None = None
    detail: str = ""


APPEND = Verdict("append")


def _after(sequence: int) -> int:
    return (sequence + 1) % SEQUENCE_LIMIT


def _older(a: int, b: int) -> bool:
    """Whether sequence ``a`` comes before ``b``, with wrap-around (a window of half the space)."""
    return 0 < (b - a) % SEQUENCE_LIMIT < SEQUENCE_LIMIT // 2


class ProducerStateTable:
    """The idempotent producers of one partition. Not thread-safe: the partition's writer owns it."""

    def __init__(self, expiration_ms: int = 24 * 3600 * 1000) -> None:
        self.expiration_ms = expiration_ms
        self._producers: dict[int, ProducerEntry] = {}
        self.duplicates_dropped = 0

    def __len__(self) -> int:
        return len(self._producers)

    def entry(self, producer_id: int) -> ProducerEntry | None:
        return self._producers.get(producer_id)

    def check(self, stamp: ProducerStamp, record_count: int) -> Verdict:
        """Whether a batch with this stamp and count may be appended (see the module docstring)."""
        entry = self._producers.get(stamp.producer_id)
        if entry is None or not entry.batches:
            if stamp.base_sequence == 0:
                return APPEND
            return Verdict("unknown-producer", detail=f"producer {stamp.producer_id} is not known on this partition "
                                                      f"and sent sequence {stamp.base_sequence}, not 0")
        first, last = stamp.base_sequence, stamp.last_sequence(record_count)
        if stamp.producer_epoch < entry.epoch:
            return Verdict("fenced", detail=f"producer {stamp.producer_id} sent epoch {stamp.producer_epoch}; "
                                            f"this partition already has its epoch {entry.epoch}")
        if stamp.producer_epoch > entry.epoch:
            if first == 0:
                return APPEND
            return Verdict("out-of-order", detail=f"producer {stamp.producer_id} started epoch "
                                                  f"{stamp.producer_epoch} at sequence {first}, not 0")
        expected = _after(entry.last_sequence)
        if first == expected:
            return APPEND
        for stored in reversed(entry.batches):
            if stored.first_sequence == first:
                if stored.last_sequence == last:
                    return Verdict("duplicate", stored)
                break
        if _older(first, expected):
            return Verdict("duplicate-unknown", detail=f"sequence {first} of producer {stamp.producer_id} was "
                                                       f"stored before (this partition expects {expected})")
        return Verdict("out-of-order", detail=f"producer {stamp.producer_id} sent sequence {first}; this "
                                              f"partition expects {expected}")

    def record(self, stamp: ProducerStamp, record_count: int, base_offset: int, append_time_ms: int) -> None:
        """Remember a stamped batch that was stored (appended here, replicated, or read at recovery)."""
        entry = self._producers.pop(stamp.producer_id, None)  # re-inserted last: the dict is in LRU order
        if entry is None or stamp.producer_epoch != entry.epoch:
            if entry is None and len(self._producers) >= MAX_PRODUCERS:
                del self._producers[next(iter(self._producers))]  # the one idle longest
            entry = ProducerEntry(stamp.producer_epoch, append_time_ms)
        self._producers[stamp.producer_id] = entry
        entry.batches.append(StoredBatch(stamp.base_sequence, stamp.last_sequence(record_count), base_offset,
                                         base_offset + record_count - 1, append_time_ms))
        entry.last_append_ms = max(entry.last_append_ms, append_time_ms)

    def expire(self, now_ms: int) -> int:
        """Forget producers without a batch for ``expiration_ms``; returns how many."""
        cutoff = now_ms - self.expiration_ms
        gone = [pid for pid, e in self._producers.items() if e.last_append_ms < cutoff]
        for pid in gone:
            del self._producers[pid]
        return len(gone)

    def forget_from(self, offset: int) -> None:
        """Drop what was stored at ``offset`` and after (the log was cut back there)."""
        for pid in list(self._producers):
            entry = self._producers[pid]
            while entry.batches and entry.batches[-1].last_offset >= offset:
                entry.batches.pop()
            if not entry.batches:
                del self._producers[pid]

    # -- snapshots -----------------------------------------------------------------------------

    @classmethod
    def from_document(cls, document: dict[str, object], expiration_ms: int) -> ProducerStateTable:
        table = cls(expiration_ms)
        producers = document["producers"]
        assert isinstance(producers, dict)
        for pid, (epoch, last_ms, batches) in producers.items():
            entry = ProducerEntry(int(epoch), int(last_ms))
            entry.batches.extend(StoredBatch(*map(int, b)) for b in batches)
            table._producers[int(pid)] = entry
        return table


def snapshot_path(directory: str | os.PathLike[str], offset: int) -> Path:
    return Path(directory) / f"{offset:020d}{SNAPSHOT_SUFFIX}"


def write_snapshot(directory: str | os.PathLike[str], table: ProducerStateTable, offset: int) -> None:
    """Write the table as of ``offset`` (everything below it is in the table) and drop old snapshots.

    Not fsynced: a snapshot lost or torn by a crash only means the next open reads more of the log."""
    lines: list[tuple[str, dict[str, Any]]] = [("offset", {"offset": offset})]
    lines += [(f"producer {pid}", {"producer": pid, "epoch": e.epoch, "last_ms": e.last_append_ms,
                                   "batches": [list(b) for b in e.batches]})
              for pid, e in table._producers.items()]
    write_records(snapshot_path(directory, offset), lines, sync=None)
    for old in list_snapshots(directory)[:-SNAPSHOTS_KEPT]:
        remove_snapshot(directory, old)


def list_snapshots(directory: str | os.PathLike[str]) -> list[int]:
    """Offsets of the snapshots in ``directory``, oldest first."""
    out = []
    for name in os.listdir(directory):
        if name.endswith(SNAPSHOT_SUFFIX) and name[:-len(SNAPSHOT_SUFFIX)].isdigit():
            out.append(int(name[:-len(SNAPSHOT_SUFFIX)]))
    return sorted(out)


def remove_snapshot(directory: str | os.PathLike[str], offset: int) -> None:
    try:
        os.unlink(snapshot_path(directory, offset))
    except FileNotFoundError:
        pass


def read_snapshot(directory: str | os.PathLike[str], offset: int, expiration_ms: int) -> ProducerStateTable | None:
    """The snapshot at ``offset``, or None if it is missing or unusable as a whole (then an older one is used).
    A damaged producer line costs that producer only (an ERROR names it)."""
    path = snapshot_path(directory, offset)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("producer snapshot %s is unusable (%s); reading more of the log instead", path, exc)
        return None
    try:
        first, _, rest = data.partition(b"\n")
        if len(first) == 8 and rest.startswith(b"{"):  # a CRC line, then one JSON document
            return _read_earlier(data, offset, expiration_ms)
        records, _damage = parse_records(
            data, path, _key, store=STORE,
            lost=lambda key: f"{key or 'a producer'} of {Path(directory).name} is forgotten: its next batch is taken "
                             "at whatever sequence it has (a retry of a batch stored before may be stored again)")
        table = ProducerStateTable(expiration_ms)
        stated = [r["offset"] for r in records if "offset" in r]
        if stated and stated[0] != offset:
            raise ValueError(f"it says offset {stated[0]}")
        for r in records:
            if "producer" in r:
                entry = ProducerEntry(int(r["epoch"]), int(r["last_ms"]))
                entry.batches.extend(StoredBatch(*map(int, b)) for b in r["batches"])
                table._producers[int(r["producer"])] = entry
        return table
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("producer snapshot %s is unusable (%s); reading more of the log instead", path, exc)
        return None


def _read_earlier(data: bytes, offset: int, expiration_ms: int) -> ProducerStateTable:
    """A snapshot an earlier version wrote: a CRC line, then one JSON document."""
    crc_text, body = data.split(b"\n", 1)
    if int(crc_text, 16) != zlib.crc32(body):
        raise ValueError("CRC mismatch")
    document = json.loads(body)
    if not isinstance(document, dict) or document.get("offset") != offset:
        raise ValueError("offset mismatch")
    return ProducerStateTable.from_document(document, expiration_ms)


def check_snapshot(path: Path) -> tuple[int, list[str]]:
    """(intact records, damaged lines) of a snapshot file: for verify; modifies nothing."""
    try:
        data = path.read_bytes()
    except OSError:
        return 0, []
    return check_records(data, _key)
