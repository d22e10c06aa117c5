"""What a batch's outcome does (docs/producer.md): the sender's half that acts on replies.

A reply or a failure goes to the batch's lane (the generation rule decides what may still go in order); the
batch is then resolved, resent (first in its lane once its generation is resolved), moved to another
partition (certainly not stored, and a spreading selector placed it), or its failure is its result. One timer
fails what is past its delivery deadline. :class:`Outcomes` is the mixin :class:`~metaq.client.producer.sender.
Sender` takes them from; it writes nothing itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from metaq.client.config import ProducerConfig
from metaq.client.core import ClientCore
from metaq.client.exceptions import ClientClosedError
from metaq.client.metadata import Partition
from metaq.client.producer.batches import BatchKey, BufferLimit, ProducerBatch
from metaq.client.producer.lanes import Lane
from metaq.client.producer.results import BatchChunk, ManyTable, resolve_batch
from metaq.client.routing import BROKER_UNAVAILABLE, BROKER_WIDE, REFUSED_BEFORE_APPEND, maybe_stored, not_stored
from metaq.errors import (
    BrokerError,
    ConnectionClosedError,
    DeliveryTimeoutError,
    DuplicateSequenceError,
    MetaqError,
    NotMasterError,
    OutOfOrderSequenceError,
    ProtocolError,
    UnknownProducerIdError,
    WouldReorderError,
    error_for_code,
)
from metaq.protocol.messages import ANY_PARTITION, MultiProduceResponse, ProducedPartition, ProduceResponse
from metaq.protocol.records import HEADER_BYTES
from metaq.types import Message, PartitionId

log = logging.getLogger("metaq.client.producer")

EXPIRY_TICK_S = 0.1
"""The deadline timer looks again at most this often while batches are past theirs one after another."""


class FlushBarrier:
    """What one flush waits for: the batches outstanding when it was called, counted down as each gets its
    result (one future per flush, not one per batch and a gather over them all)."""

    __slots__ = ("future", "left")

    def __init__(self, future: asyncio.Future[None], left: int) -> None:
        self.future = future
        self.left = left

    def batch_done(self) -> None:
        self.left -= 1
        if self.left == 0 and not self.future.done():
            self.future.set_result(None)


def outcome_of(fut: asyncio.Future[Any]) -> tuple[Any, BaseException | None]:
    """A produce reply future's response and None, or None and the error that stands for it."""
    if fut.cancelled():
        return None, ConnectionClosedError("the produce request was cancelled")
    err = fut.exception()
    return (fut.result(), None) if err is None else (None, err)


class Outcomes:
    """The sender's state this half reads and changes, and the writing half's calls it makes."""

    _core: ClientCore
    config: ProducerConfig
    _loop: asyncio.AbstractEventLoop
    selector: Any
    _buffer: BufferLimit
    _manys: ManyTable
    _reroutable: bool
    _lanes: dict[BatchKey, Lane]
    _outstanding: dict[ProducerBatch, list[FlushBarrier] | None]
    _expiry: asyncio.TimerHandle | None
    _expiry_at: float
    closed: bool
    rerouted_batches: int
    on_idle: Callable[[BatchKey], object]

    def dispatch(self, batch: ProducerBatch) -> None:
        raise NotImplementedError

    def _wake(self, lane: Lane) -> None:
        raise NotImplementedError

    def _hold_for_master(self, broker_id: int, address: str) -> None:
        raise NotImplementedError

    def gathering(self) -> contextlib.AbstractContextManager[None]:
        raise NotImplementedError

    def open_gathering(self) -> set[int] | None:
        raise NotImplementedError

    def close_gathering(self, gathered: set[int] | None, *, flush: bool = True) -> None:
        raise NotImplementedError

    # -- outcomes --------------------------------------------------------------------------------

    def _on_reply(self, batch: ProducerBatch, address: str, fut: asyncio.Future[ProduceResponse]) -> None:
        if not fut.cancelled() and fut.exception() is None:  # outcome_of's common case, without its call
            resp = fut.result()
            if not resp.error_code:
                self._stored(batch, resp)
                return
            exc: BaseException | None = error_for_code(resp.error_code, resp.error_message or "")
        else:
            exc = outcome_of(fut)[1]
        assert exc is not None
        self._failed(batch, address, exc, written=True)

    def _on_multi_reply(self, batches: list[ProducerBatch], address: str,
                        fut: asyncio.Future[MultiProduceResponse]) -> None:
        """A MultiProduce's reply: each batch's entry is what a Produce reply of it would have said. What the
        outcomes release is written in one gathering (one MultiProduce again)."""
        resp, exc = outcome_of(fut)
        gathered = self.open_gathering()
        try:
            if resp is not None and not resp.error_code and len(resp.partitions) == len(batches):
                for batch, entry in zip(batches, resp.partitions, strict=True):
                    if not entry.error_code:
                        self._stored(batch, entry)
                    else:
                        self._failed(batch, address, error_for_code(entry.error_code, entry.error_message or ""),
                                     written=True)
                return
            if resp is not None:
                exc = error_for_code(resp.error_code, resp.error_message or "") if resp.error_code else \
                    ProtocolError(f"a MultiProduce reply from {address} has {len(resp.partitions)} results for "
                                  f"{len(batches)} batches")
            assert exc is not None
            for batch in batches:
                self._failed(batch, address, exc, written=True)
        finally:
            self.close_gathering(gathered)

    def _stored(self, batch: ProducerBatch, resp: ProduceResponse | ProducedPartition | None) -> None:
        lane = self._lanes[batch.key]
        doomed = lane.stored(batch)
        if not batch.reported:
            self._report_ok(batch, resp)
        self._retire(lane, batch)
        if doomed:
            self._out_of_order(lane, doomed, "was stored")
        self._settled(lane)

    def _failed(self, batch: ProducerBatch, address: str, exc: BaseException, *, written: bool) -> None:
        """A batch's request failed, or the broker refused it: resent, moved, or its failure is its result."""
        if isinstance(exc, DuplicateSequenceError):  # stored long ago; its offsets are forgotten
            log.warning("idempotent producer: %s (a resend of a batch stored long ago)", exc)
            self._stored(batch, ProduceResponse(partition=batch.partition))
            return
        lane = self._lanes[batch.key]
        maybe = maybe_stored(exc, written=written)
        if maybe:
            batch.maybe_written = True
        elif isinstance(exc, (OutOfOrderSequenceError, UnknownProducerIdError)):
            batch.maybe_written = False  # no copy with this stamp is stored: the broker would have said so
        batch.error = exc
        if isinstance(exc, BrokerError) and exc.refresh_metadata:
            self._core.metadata.refresh_soon(batch.topic)
        if batch.partition != ANY_PARTITION and written:
            if isinstance(exc, (ConnectionClosedError, *BROKER_UNAVAILABLE)):
                self._core.unavailable.avoid_broker(batch.broker_id)
            elif isinstance(exc, REFUSED_BEFORE_APPEND):
                self._core.unavailable.avoid_partition(batch.topic, PartitionId(batch.broker_id, batch.partition))
        target = None
        if not batch.reported and written and not maybe and not_stored(exc, written=True) \
                and not isinstance(exc, NotMasterError):
            target = self._move_target(batch, exc)
        if batch.reported:  # past its deadline, its result given: only the lane is told
            doomed = lane.failed(batch, resend=False)
            self._retire(lane, batch)
        elif target is not None:
            doomed = lane.failed(batch, resend=False)
            self._relocate(lane, batch, target, exc)
        elif written and self._resend(lane, batch, exc, maybe):
            doomed = lane.failed(batch, resend=True, restart=isinstance(exc, UnknownProducerIdError))
            if isinstance(exc, NotMasterError) and self._core.registry is not None:
                self._hold_for_master(batch.broker_id, address)
        else:
            doomed = lane.failed(batch, resend=False)
            self._report_error(batch, self._final_error(batch, exc))
            self._retire(lane, batch)
        self._out_of_order(lane, doomed, f"may have been stored ({exc})")
        self._settled(lane)

    def _out_of_order(self, lane: Lane, doomed: list[ProducerBatch], later: str) -> None:
        """Refused batches that a later batch of their partition went before: each fails, not sent again."""
        for other in doomed:
            self._give_up(lane, other, WouldReorderError(
                f"a batch of {other.count} messages to {other.topic}:{other.broker_id}-{other.partition} was refused "
                f"({other.error}) and a later batch of that partition {later} first: it was not stored, and is not "
                "sent again (that would store it behind the later one)", cause=other.error))

    def _resend(self, lane: Lane, batch: ProducerBatch, exc: BaseException, maybe: bool) -> bool:
        """Whether a failed batch goes again: within its deadline, a refusal that may pass (or a batch never
        written) always; a failure that may have stored it only when a resend cannot store it twice (idempotent)
        or ``retries`` allows it (and counts it)."""
        if self.closed or isinstance(exc, ClientClosedError) or self._loop.time() >= batch.expires_s:
            return False
        if maybe:
            if batch.attempts < self.config.effective_retries and (lane.checked or getattr(exc, "retriable", False)):
                batch.attempts += 1
                return True
            return False
        return bool(getattr(exc, "retriable", False))

    def _final_error(self, batch: ProducerBatch, exc: BaseException) -> BaseException:
        """The error a failed batch reports: the failure itself, or past the deadline a DeliveryTimeoutError."""
        if self._loop.time() >= batch.expires_s and getattr(exc, "retriable", False):
            return self._timeout_error(batch, exc)
        return exc

    def _timeout_error(self, batch: ProducerBatch, cause: BaseException | None) -> DeliveryTimeoutError:
        may = batch.maybe_written
        last = f"; last failure: {cause}" if cause is not None else ""
        return DeliveryTimeoutError(
            f"a batch of {batch.count} messages to {batch.topic}:{batch.broker_id}-{batch.partition} was not stored "
            f"within delivery_timeout_ms={self.config.delivery_timeout_ms:g}{last}; it "
            + ("may have been stored" if may else "was certainly not stored"), maybe_stored=may, cause=cause)

    def _give_up(self, lane: Lane, batch: ProducerBatch, exc: BaseException, *, in_lane: bool = False) -> None:
        """A batch fails for good (``in_lane``: it is still in its lane's generation, else already taken out)."""
        if in_lane:
            lane.failed(batch, resend=False)
        self._report_error(batch, exc)
        self._retire(lane, batch)
        if in_lane:
            self._settled(lane)

    def _settled(self, lane: Lane) -> None:
        """After an outcome: once the lane's generation is resolved its batches go again (after the back-off
        when one is to be resent), and a lane with no batch in flight writes its waiting ones."""
        if lane.inflight:
            return
        if lane.resolving or lane.broken:
            if lane.resend and not self.closed:
                self._loop.call_later(self.config.retry_backoff_ms / 1000.0, self._settle_later, lane)
                return
            lane.settle()
        if lane.waiting:
            self._wake(lane)

    def _settle_later(self, lane: Lane) -> None:
        if lane.settle() or lane.waiting:
            with self.gathering():
                self._wake(lane)

    # -- moving a batch to another partition (metaq.client.routing) --------------------------------

    def _move_target(self, batch: ProducerBatch, exc: BaseException) -> Partition | None:
        """Another usable partition, not tried yet, for a batch certainly not stored that a spreading selector
        placed; None when it may not or cannot move."""
        if (batch.pinned or not self._reroutable or batch.partition == ANY_PARTITION or batch.stamp is not None
                or batch.maybe_written or isinstance(exc, ClientClosedError) or self.closed):
            return None
        tm = self._core.metadata.cache.get(batch.topic)
        if tm is None:
            return None
        tried = (*batch.tried, (batch.broker_id, batch.partition))
        usable = self._core.unavailable.usable(batch.topic, tm.partitions)
        elsewhere = isinstance(exc, BROKER_WIDE)  # the broker refuses every partition of its: another broker only
        candidates = tuple(p for p in usable if p.accept_publish and (p.broker_id, p.partition) not in tried
                           and not (elsewhere and p.broker_id == batch.broker_id))
        if not candidates:
            return None
        try:
            chosen: Partition = self.selector(batch.topic, candidates, Message(batch.topic, b""))
        except MetaqError:
            return None
        return chosen

    def _relocate(self, lane: Lane, batch: ProducerBatch, p: Partition, exc: BaseException) -> None:
        """Move a batch taken out of ``lane`` to partition ``p``: it joins that partition's lane at the end."""
        log.info("moving a batch of %d messages from %s:%d-%d to %s after %s", batch.count, batch.topic,
                 batch.broker_id, batch.partition, p, exc)
        barriers = self._outstanding.pop(batch, None)
        lane.done(batch)
        batch.tried = (*batch.tried, (batch.broker_id, batch.partition))
        batch.key = (batch.topic, p.partition, p.broker_id, batch.acks, True) if batch.delayed else \
            (batch.topic, p.partition, p.broker_id, batch.acks)
        batch.partition, batch.broker_id = p.partition, p.broker_id
        self.rerouted_batches += 1
        self.dispatch(batch)
        if barriers:
            if batch in self._outstanding:
                self._outstanding[batch] = barriers
            else:  # absorbed into the batch waiting there: the flushes wait for that one
                self._reported(barriers)
        if lane.unresolved == 0:
            self.on_idle(lane.key)

    # -- the delivery deadline ------------------------------------------------------------------------

    def _arm_expiry(self, when: float) -> None:
        if self.closed:
            return
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry_at = when
        self._expiry = self._loop.call_at(when, self._expire_due)

    def _expire_due(self) -> None:
        """Fail what is past its deadline: a batch not written now is taken out of its lane; a batch in flight
        gets its result now and stays in its lane's generation until its request ends."""
        self._expiry, self._expiry_at = None, float("inf")
        now = self._loop.time()
        earliest = float("inf")
        due: list[ProducerBatch] = []
        for batch in self._outstanding:
            if batch.expires_s <= now:
                due.append(batch)
            elif batch.expires_s < earliest:
                earliest = batch.expires_s
        touched: dict[Lane, None] = {}
        for batch in due:
            lane = self._lanes[batch.key]
            error = self._timeout_error(batch, batch.error)
            if batch in lane.inflight:
                batch.maybe_written = True
                error.maybe_stored = True
                self._report_error(batch, error)  # retired when its request ends
            elif lane.expire(batch):
                self._report_error(batch, error)
                self._retire(lane, batch)
                touched[lane] = None
            else:  # being written in this step (cannot be): left for the next look
                earliest = min(earliest, now + EXPIRY_TICK_S)
        for lane in touched:
            self._settled(lane)
        if earliest != float("inf"):
            self._arm_expiry(max(earliest, now + EXPIRY_TICK_S))

    # -- results -----------------------------------------------------------------------------------

    def _report_ok(self, batch: ProducerBatch, resp: ProduceResponse | ProducedPartition | None) -> None:
        batch.reported = True
        topic = batch.topic
        if resp is None:  # one-way
            partition, base_offset, base_id = batch.partition, -1, -1
        else:
            partition = resp.partition if resp.partition >= 0 else batch.partition
            base_offset, base_id = resp.base_offset, resp.base_message_id
        if batch.batch_waiter is not None:
            w = batch.batch_waiter
            if not w.done():
                w.set_result(BatchChunk(partition, base_offset, base_id, batch.count, None, batch.broker_id))
        elif resp is not None:
            resolve_batch(batch.waiters, (partition, base_offset, base_id, None, topic, batch.broker_id), self._manys)
        if batch.partition == ANY_PARTITION:
            tm = self._core.metadata.cache.get(topic)
            if tm is None or not tm.partitions:
                self._core.metadata.refresh_soon(topic)  # the broker just created it: learn its partitions
        barriers = self._outstanding.pop(batch, None)
        if barriers:
            self._reported(barriers)

    def _report_error(self, batch: ProducerBatch, exc: BaseException) -> None:
        batch.reported = True
        if batch.batch_waiter is not None:
            w = batch.batch_waiter
            if not w.done():
                w.set_result(BatchChunk(batch.partition, -1, -1, batch.count, exc, batch.broker_id))
        else:
            if batch.acks == 0:
                log.warning("one-way batch of %d messages to %s:%d-%d was dropped: %s", batch.count, batch.topic,
                            batch.broker_id, batch.partition, exc)
            resolve_batch(batch.waiters, (batch.partition, -1, -1, exc, batch.topic, batch.broker_id), self._manys)
        barriers = self._outstanding.pop(batch, None)
        if barriers:
            self._reported(barriers)

    @staticmethod
    def _reported(barriers: list[FlushBarrier]) -> None:
        """A batch's result was given: the flushes that wait for it are told."""
        for barrier in barriers:
            barrier.batch_done()

    def _retire(self, lane: Lane, batch: ProducerBatch) -> None:
        """The batch is out of the producer: its lane no longer counts it and its bytes are free."""
        lane.done(batch)
        self._buffer.release(batch.size_bytes if batch.batch_waiter is not None else batch.size_bytes - HEADER_BYTES)
        if lane.unresolved == 0:
            self.on_idle(lane.key)  # the partition went idle: what accumulated meanwhile leaves now
