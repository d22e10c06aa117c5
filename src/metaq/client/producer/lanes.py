"""A partition's sealed batches and the rule that keeps them in send order (docs/producer.md, "Lanes").

Pure logic, no I/O: the sender asks a :class:`Lane` which batch it may write on a connection, tells it each
batch's outcome, and writes again when the lane says so.

**The generation rule.** The batches of a lane in flight on one connection are one generation. A batch is
written only when nothing of its lane is in flight or the lane's batches in flight went on the same connection,
when no failure of the current generation is being resolved, and when it is the first of the lane's waiting
batches. On one connection the broker appends in request order, so a batch is never stored behind a later
batch of its lane: the later one is not written while the earlier one may still be stored.

**Resolving a failure.** A failed batch stops the lane's writes until every batch of its generation has an
outcome. Then the batches to send again go first, in send order. A batch to send again that comes before a
batch of the generation that was stored (or may have been) can no longer be stored in order: it fails instead.
An idempotent lane (its batches carry the producer's sequence, which the broker checks) never needs that: the
broker refuses a batch whose sequence skips a missing one.

**Sequences.** An idempotent lane stamps each batch at its first write with (producer id, epoch, first
sequence), and every resend carries the same stamp, so the broker stores it once. A stamped batch that fails for
good leaves a gap: the lane starts a new epoch at sequence 0 once no batch of the old one may be stored unknown
to it. Until then only batches stamped in the old epoch are written, with their old stamps (the broker answers
"stored", or "out of order", which proves a batch was not); then the ones proven not stored get a new stamp, in
send order, before any new batch. So none is stored twice and none behind a later one.
"""

from __future__ import annotations

import bisect
import secrets
from collections import deque
from collections.abc import Hashable

from metaq.client.producer.batches import BatchKey, ProducerBatch
from metaq.protocol.records import SEQUENCE_LIMIT, ProducerStamp

EPOCH_LIMIT = 1 << 15
"""Epochs are 15 bits: past the last one, a lane takes a new producer id and starts again at epoch 0."""


def new_producer_id() -> int:
    """A random 62-bit producer id (> 0): two producers share one with odds of about 2**-62 per pair, so
    no broker has to hand ids out (docs/transactions.md)."""
    return secrets.randbits(62) + 1


class Lane:
    """One partition's batches of one producer (one :data:`BatchKey`), from sealed to resolved."""

    __slots__ = ("broken", "checked", "conn", "epoch", "inflight", "key", "next_order", "next_sequence",
                 "producer_id", "resend", "resolving", "unresolved", "waiting")

    def __init__(self, key: BatchKey, *, checked: bool = False, producer_id: int = -1) -> None:
        self.key = key
        self.checked = checked
        """Idempotent: its batches are stamped and the broker checks their sequence."""
        self.waiting: deque[ProducerBatch] = deque()
        """Sealed and not written, in send order (the batches to send again first)."""
        self.inflight: deque[ProducerBatch] = deque()
        """Written on :attr:`conn`, outcome not known yet, in write order: the current generation."""
        self.conn: Hashable | None = None
        self.resend: list[ProducerBatch] = []
        """Batches of the current generation that failed and go again once it is resolved, in send order."""
        self.resolving = False
        """A batch of the current generation failed: nothing is written until every one has an outcome."""
        self.next_order = 0
        self.unresolved = 0
        """Batches added and not yet :meth:`done` (waiting, in flight, to send again)."""
        self.producer_id = producer_id
        self.epoch = 0
        self.next_sequence = 0
        self.broken = False
        """A stamped batch failed for good: a new epoch starts once the old one's outcomes are all known."""

    def __repr__(self) -> str:
        return (f"<Lane {self.key} waiting={len(self.waiting)} inflight={len(self.inflight)} "
                f"resend={len(self.resend)} resolving={self.resolving}>")

    # -- sending ---------------------------------------------------------------------------------

    def add(self, batch: ProducerBatch) -> None:
        """A sealed batch joins the lane, after every batch already in it."""
        batch.order = self.next_order
        self.next_order += 1
        self.unresolved += 1
        self.waiting.append(batch)

    def next_for(self, conn: Hashable) -> ProducerBatch | None:
        """The batch that may be written on ``conn`` now (the first waiting one), or None."""
        if self.resolving or not self.waiting:
            return None
        if self.inflight and self.conn is not conn:
            return None  # the previous generation is still unresolved
        batch = self.waiting[0]
        if self.broken and batch.stamp is None:
            return None  # a new batch waits until the old epoch's outcomes are all known
        return batch

    def can_write(self, conn: Hashable) -> bool:
        """Whether a batch joining the lane now could be written on ``conn`` at once (nothing waits before it)."""
        return not self.waiting and not self.resolving and not self.broken and (not self.inflight or self.conn is conn)

    def written(self, batch: ProducerBatch, conn: Hashable) -> None:
        """``batch`` (the first waiting one, or one added and written at once) was handed to ``conn``."""
        if self.waiting and self.waiting[0] is batch:
            self.waiting.popleft()
        self.inflight.append(batch)
        self.conn = conn

    def unwritten(self, batch: ProducerBatch) -> None:
        """The connection closed before ``batch`` was written: it waits again, first."""
        self.inflight.remove(batch)
        self.waiting.appendleft(batch)

    def stamp(self, batch: ProducerBatch) -> ProducerStamp:
        """The batch's producer block: the one it had (a resend sends the same bytes), or a new one when it has
        none or its epoch was given up and it is proven not stored."""
        stamp = batch.stamp
        if stamp is not None and (batch.maybe_written or (stamp.producer_id == self.producer_id
                                                          and stamp.producer_epoch == self.epoch)):
            return stamp
        stamp = batch.stamp = ProducerStamp(self.producer_id, self.epoch, self.next_sequence)
        batch.stamped = None
        self.next_sequence = (self.next_sequence + batch.count) % SEQUENCE_LIMIT
        return stamp

    # -- outcomes ----------------------------------------------------------------------------------

    def stored(self, batch: ProducerBatch) -> list[ProducerBatch]:
        """``batch`` was stored. Returns the batches to send again that can no longer be stored in order (they
        came before it): they fail."""
        self._take_out(batch)
        return self._before(batch.order) if self.resend and not self.checked else []

    def failed(self, batch: ProducerBatch, *, resend: bool, restart: bool = False) -> list[ProducerBatch]:
        """``batch`` failed (``batch.maybe_written`` says whether it may be stored); ``resend``: it goes again
        once its generation is resolved, else its failure is its result; ``restart``: the broker does not know
        the producer's sequence here (UNKNOWN_PRODUCER_ID), so a new epoch starts at 0 once the generation is
        resolved. Returns the batches that fail with it (as :meth:`stored`, when it may be stored)."""
        if restart and self.checked:
            self.broken = True
        in_flight = self._take_out(batch)
        if in_flight:
            self.resolving = True
        doomed = self._before(batch.order) if batch.maybe_written and not self.checked else []
        if resend:
            bisect.insort(self.resend, batch, key=_order)
            if not in_flight:  # never written this time (the connection was gone): nothing to wait for
                self.resolving = True
        elif self.checked and batch.stamp is not None:
            self.broken = True
            self.resolving = True
        return doomed

    def expire(self, batch: ProducerBatch) -> bool:
        """``batch`` (waiting or to send again, not in flight) is past its deadline: taken out. True when it was
        in the lane."""
        if batch in self.resend:
            self.resend.remove(batch)
        elif batch in self.waiting:
            self.waiting.remove(batch)
        else:
            return False
        if self.checked and batch.stamp is not None:
            self.broken = True
            self.resolving = True
        return True

    def settle(self) -> bool:
        """End the resolving when the generation is resolved: the batches to send again go first, and a broken
        sequence starts a new epoch when no batch of the old one may be stored unresolved. True when the lane
        may write again (the caller then writes its waiting batches)."""
        if self.inflight or not (self.resolving or self.broken):
            return False
        self.resolving = False
        if self.broken and not any(b.maybe_written for b in self.resend):
            self.broken = False
            self.epoch += 1
            self.next_sequence = 0
            if self.epoch >= EPOCH_LIMIT:
                self.producer_id, self.epoch = new_producer_id(), 0
        if self.resend:
            self.waiting.extendleft(reversed(self.resend))
            self.resend = []
        return True

    def done(self, batch: ProducerBatch) -> None:
        """``batch`` is resolved for good (stored, failed, moved away): no longer counted."""
        self.unresolved -= 1

    def take_waiting(self) -> list[ProducerBatch]:
        """Every batch waiting (not in flight), taken out: they move to another partition or fail."""
        out = [*self.resend, *self.waiting]
        self.resend = []
        self.waiting.clear()
        return out

    def _take_out(self, batch: ProducerBatch) -> bool:
        """Remove ``batch`` from the generation in flight; False when it was not in flight."""
        inflight = self.inflight
        if inflight and inflight[0] is batch:
            inflight.popleft()
            return True
        try:
            inflight.remove(batch)
        except ValueError:
            return False
        return True

    def _before(self, order: int) -> list[ProducerBatch]:
        """Take out the batches to send again that come before ``order``."""
        if not self.resend or self.resend[0].order > order:
            return []
        i = bisect.bisect_left(self.resend, order, key=_order)
        doomed, self.resend = self.resend[:i], self.resend[i:]
        return doomed


def _order(batch: ProducerBatch) -> int:
    return batch.order
