"""A partition's epoch history: which master epoch wrote which offsets (docs/replication.md).

Every time a replica of a broker id becomes master it starts a new **epoch** (a number kept in
ZooKeeper, one higher than the last). The history is the list of ``(epoch, start_offset)``: epoch ``e``
wrote the offsets from its start up to the next entry's start (the last one: up to the log end). A
follower copies its master's history with the batches, so two replicas that agree on an epoch's start
agree on everything before it; where they disagree, the end offset of the last common epoch is where the
follower's log must be cut (:meth:`EpochHistory.end_offset_for`, Kafka's ``OffsetsForLeaderEpoch``).

The batch format does not change: the history lives beside the log in ``epochs.json``, a checkpoint
file (written to a temporary file, fsynced, renamed; docs/storage.md) of one text line per entry, each
with its checksums (:mod:`metaq.framing`), so a damaged entry costs that entry only: an ERROR names its
epoch, and the epoch before it then seems to run on to the next start (a follower cut by it keeps the
records of the lost epoch, as it would have before this epoch history existed). It is written before
the first batch of a new epoch is, so it never lags the log; after a crash it may name an epoch whose
start is at or past the recovered log end, which :meth:`EpochHistory.clamp` drops.
"""

from __future__ import annotations

import os
import threading
from bisect import bisect_right
from collections.abc import Callable
from pathlib import Path

from metaq import framing
from metaq.storage.checkpoint import StoreReport, check_records, parse_records, read_bytes, read_json, write_records

EPOCHS_FILE = "epochs.json"
NO_EPOCH = -1
STORE = "epochs"


def epoch_key(obj: dict[str, object]) -> str:
    return f"epoch {obj['epoch']}"


class EpochHistory:
    """``(epoch, start_offset)`` entries of one partition, epochs and starts both increasing."""

    def __init__(self, directory: Path, *, sync: Callable[[int], None] = os.fsync) -> None:
        self.path = directory / EPOCHS_FILE
        self._sync = sync
        self._lock = threading.Lock()
        self._entries: list[tuple[int, int]] = []
        self.damaged: list[str] = []
        """What the load skipped: one message per damaged entry."""
        data = read_bytes(self.path)
        raw: object = None
        if data is not None and not framing.is_text_lines(data):  # one JSON document, as an earlier version wrote
            document = read_json(self.path)
            raw = document.get("epochs") if document else None
        elif data is not None:
            records, self.damaged = parse_records(
                data, self.path, epoch_key, store=STORE,
                lost=lambda key: f"{key or 'an epoch'}'s start offset is lost: the epoch before it seems to run on "
                                 "to the next one's start")
            raw = [[r.get("epoch"), r.get("start")] for r in records]
        if isinstance(raw, list):
            for item in raw:
                if (isinstance(item, list) and len(item) == 2 and all(isinstance(v, int) for v in item)
                        and item[0] >= 0 and item[1] >= 0
                        and (not self._entries or (item[0] > self._entries[-1][0]
                                                   and item[1] >= self._entries[-1][1]))):
                    self._entries.append((item[0], item[1]))

    @property
    def entries(self) -> list[tuple[int, int]]:
        with self._lock:
            return list(self._entries)

    def latest_epoch(self) -> int:
        with self._lock:
            return self._entries[-1][0] if self._entries else NO_EPOCH

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` writes from ``start_offset`` on (durably); False when it adds nothing
        (the epoch is already the latest). An older epoch is refused with ValueError."""
        with self._lock:
            if self._entries:
                last_epoch, last_start = self._entries[-1]
                if epoch == last_epoch:
                    return False
                if epoch < last_epoch or start_offset < last_start:
                    raise ValueError(f"epoch {epoch} from offset {start_offset} cannot follow epoch {last_epoch} "
                                     f"from offset {last_start}")
                if start_offset == last_start:  # the previous epoch wrote nothing here: replace it
                    self._entries.pop()
            self._entries.append((epoch, start_offset))
            self._write_locked()
            return True

    def epoch_at(self, offset: int) -> tuple[int, int]:
        """(epoch holding ``offset``, the start offset of the next epoch or -1 when it is the latest)."""
        with self._lock:
            starts = [s for _, s in self._entries]
            i = bisect_right(starts, offset) - 1
            if i < 0:
                return NO_EPOCH, (starts[0] if starts else -1)
            nxt = starts[i + 1] if i + 1 < len(starts) else -1
            return self._entries[i][0], nxt

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(the largest epoch here that is <= ``epoch``, the offset where it ends): what a follower whose
        last batch came from ``epoch`` must cut its log to, at most. (NO_EPOCH, start of the first epoch)
        when every epoch here is newer."""
        with self._lock:
            found = -1
            for i, (e, _) in enumerate(self._entries):
                if e <= epoch:
                    found = i
            if found < 0:
                return NO_EPOCH, (self._entries[0][1] if self._entries else log_end_offset)
            end = self._entries[found + 1][1] if found + 1 < len(self._entries) else log_end_offset
            return self._entries[found][0], end

    def truncate_from(self, offset: int) -> None:
        """The log was cut to end at ``offset``: forget epochs that start at or after it."""
        with self._lock:
            kept = [(e, s) for e, s in self._entries if s < offset]
            if kept != self._entries:
                self._entries = kept
                self._write_locked()

    def clamp(self, log_end_offset: int) -> None:
        """After recovery: drop entries past the recovered log end (their batches were never stored)."""
        with self._lock:
            kept = [(e, s) for e, s in self._entries if s <= log_end_offset]
            if kept != self._entries:
                self._entries = kept
                self._write_locked()

    def _write_locked(self) -> None:
        write_records(self.path, ((f"epoch {e}", {"epoch": e, "start": s}) for e, s in self._entries), sync=self._sync)
        self.damaged = []

    def verify(self) -> StoreReport:
        """Check the file as it is on disk (blocking); modifies nothing."""
        report = StoreReport(STORE, str(self.path))
        report.records, report.damaged = check_records(read_bytes(self.path), epoch_key)
        return report


__all__ = ["EPOCHS_FILE", "NO_EPOCH", "EpochHistory"]
