"""Writing sealed batches to brokers and acting on their outcomes (docs/producer.md).

Each sealed batch joins its :class:`~metaq.client.producer.lanes.Lane` and is written when the lane allows it
(the generation rule), as one Produce or, with others due for the same broker, one MultiProduce. Its reply
resolves its messages; a failure is resent, moved to another partition, or the send's result, as
:meth:`Sender._failed` decides. A broker that cannot be reached, or whose master is being handed over, holds
its batches until it can take them or their delivery deadline passes (:meth:`Sender._send_loop`,
:meth:`Sender._await_master`); one timer fails what is past its deadline (:meth:`Sender._expire_due`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from metaq.client.config import ProducerConfig
from metaq.client.core import ClientCore
from metaq.client.exceptions import ClientClosedError
from metaq.client.metadata import Partition
from metaq.client.producer.batches import BatchKey, BufferLimit, ProducerBatch
from metaq.client.producer.lanes import Lane, new_producer_id
from metaq.client.producer.results import BatchChunk, ManyTable, resolve_batch
from metaq.client.routing import BROKER_UNAVAILABLE, REFUSED_BEFORE_APPEND, maybe_stored, not_stored
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
    UnknownServerError,
    WouldReorderError,
    error_for_code,
)
from metaq.net.connection import BrokerConnection
from metaq.net.servers import format_address
from metaq.protocol.messages import (
    ANY_PARTITION,
    MultiProduceRequest,
    MultiProduceResponse,
    ProducedPartition,
    ProducePartition,
    ProduceRequest,
    ProduceResponse,
)
from metaq.protocol.records import HEADER_BYTES, with_producer_stamp
from metaq.types import Message, PartitionId

log = logging.getLogger("metaq.client.producer")

MULTI_PRODUCE = MultiProduceRequest.API_KEY
MULTI_PRODUCE_MAX_BATCHES = 1000
"""Batches one MultiProduce of this client carries at most (the protocol allows MULTI_PRODUCE_PARTITIONS_MAX)."""
MULTI_PRODUCE_MAX_BYTES = 1 << 20
"""Their bytes at most, unless one batch is larger (it goes alone): the reply waits for the slowest batch, so
big batches, which pay their request's fixed cost many times over, gain nothing from sharing one."""
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


class _Broker:
    """A broker id's lanes with batches to write, its sender task, and a master handover being waited out."""

    __slots__ = ("master_wait", "ready", "task")

    def __init__(self) -> None:
        self.ready: dict[Lane, None] = {}
        """Lanes that may have a batch to write, in the order they became ready (a dict: an ordered set)."""
        self.task: asyncio.Task[None] | None = None
        self.master_wait: asyncio.Future[None] | None = None
        """Set while a NOT_MASTER refusal's handover is waited out: nothing is written to this broker id."""


def _outcome(fut: asyncio.Future[Any]) -> tuple[Any, BaseException | None]:
    """A produce reply future's response and None, or None and the error that stands for it."""
    if fut.cancelled():
        return None, ConnectionClosedError("the produce request was cancelled")
    err = fut.exception()
    return (fut.result(), None) if err is None else (None, err)


class Sender:
    """The producer's batches from sealed to resolved: lanes, writing, replies, resends, moves, deadlines."""

    def __init__(self, core: ClientCore, config: ProducerConfig, selector: Any, buffer: BufferLimit,
                 manys: ManyTable) -> None:
        self._core = core
        self.config = config
        self._loop = asyncio.get_running_loop()
        self.selector = selector
        self._buffer = buffer
        self._manys = manys
        self.timeout_s = config.request_timeout_s or core.config.request_timeout_s
        self._reroutable = bool(getattr(selector, "reroutable", False))
        self._batch_done: Callable[[str, int, int], object] | None = getattr(selector, "batch_done", None)
        """A sticky selector's hook: told when a batch it placed leaves (StickyRoundRobinSelector)."""
        self.on_idle: Callable[[BatchKey], object] = lambda key: None
        """Told when a lane has nothing unresolved left (the placement then sends what it holds open for it)."""
        self.idempotent = config.enable_idempotence
        self.producer_id = new_producer_id() if self.idempotent else -1
        """Idempotent producer: the id in every batch's producer block (-1 otherwise)."""
        self._any_partition_id = new_producer_id() if self.idempotent else -1
        """The id used for batches the broker places (partition -1: a topic with no known partitions yet),
        whose sequences the broker keeps on the partition it picks for this id."""
        self._lanes: dict[BatchKey, Lane] = {}
        self._brokers: dict[int, _Broker] = {}
        self._outstanding: dict[ProducerBatch, list[FlushBarrier] | None] = {}
        """The batches sealed and without a result yet, each with the flushes waiting for it (None: none yet)."""
        self._gathering: set[int] | None = None
        """While :meth:`gathering` is open: the broker ids with batches to write at its end (one MultiProduce)."""
        self._expiry: asyncio.TimerHandle | None = None
        self._expiry_at = float("inf")
        self._tasks: set[asyncio.Task[None]] = set()
        self.closed = False
        self.rerouted_batches = 0
        """Batches moved to another partition after a failure that proved they were not stored."""
        self.multi_produce_requests = 0
        """MultiProduce requests written (several partitions' batches in one request, ``multi_produce``)."""
        self.multi_produced_batches = 0
        """Batches that went in those requests (the others went one Produce each)."""

    # -- state the producer reads ------------------------------------------------------------------

    def busy(self, key: BatchKey) -> bool:
        """Whether the lane of ``key`` has a batch without its result (a new batch there lingers)."""
        lane = self._lanes.get(key)
        return lane is not None and lane.unresolved > 0

    @property
    def outstanding(self) -> int:
        return len(self._outstanding)

    @property
    def unsent(self) -> int:
        return sum(len(lane.waiting) + len(lane.resend) for lane in self._lanes.values())

    async def flush(self) -> None:
        """Wait until every batch sealed so far has its result."""
        outstanding = self._outstanding
        if not outstanding:
            return
        barrier = FlushBarrier(self._loop.create_future(), len(outstanding))
        for batch, barriers in outstanding.items():
            if barriers is None:
                outstanding[batch] = [barrier]
            else:
                barriers.append(barrier)
        await barrier.future

    def close(self) -> None:
        self.closed = True
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        for task in list(self._tasks):
            task.cancel()

    # -- sealed batches in -----------------------------------------------------------------------

    def dispatch(self, batch: ProducerBatch) -> None:
        """A sealed batch: into its lane, written now when the lane and its broker's connection allow."""
        key = batch.key
        if self._batch_done is not None and not batch.pinned:
            self._batch_done(batch.topic, batch.broker_id, batch.partition)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lane(key)
        elif lane.waiting:
            last = lane.waiting[-1]
            if (last.payload is None and batch.payload is None and last.stamp is None and not last.maybe_written
                    and last.size_bytes + batch.size_bytes - HEADER_BYTES <= self.config.batch_bytes):
                last.absorb(batch)  # one fuller frame instead of a queue of small ones behind a slow partition
                return
        lane.add(batch)
        self._outstanding[batch] = None
        if batch.expires_s < self._expiry_at:
            self._arm_expiry(batch.expires_s)
        self._wake(lane)

    def _lane(self, key: BatchKey) -> Lane:
        checked = self.idempotent and key[3] != 0 and len(key) == 4  # a delayed batch never meets a sequence
        lane = Lane(key, checked=checked,
                    producer_id=self._any_partition_id if key[1] == ANY_PARTITION else self.producer_id)
        self._lanes[key] = lane
        return lane

    @contextlib.contextmanager
    def gathering(self) -> Iterator[None]:
        """Batches dispatched inside are written at its end, per broker (one MultiProduce each when it serves
        them), and each connection flushed then: the frames leave in this loop step, one write per broker."""
        gathered = self._gather()
        try:
            yield
        finally:
            self._write_gathered(gathered)

    def _gather(self) -> set[int] | None:
        """Open a gathering; None when one is open already (the outer one writes). Paired with _write_gathered."""
        if self._gathering is not None:
            return None
        gathered: set[int] = set()
        self._gathering = gathered
        return gathered

    def _write_gathered(self, gathered: set[int] | None) -> None:
        if gathered is None:
            return
        self._gathering = None
        for broker_id in gathered:
            state = self._brokers.get(broker_id)
            if state is not None:
                conn = self._drain_now(broker_id, state)
                if conn is not None:
                    conn.flush()

    def _wake(self, lane: Lane) -> None:
        """``lane`` may have a batch to write: its broker writes it now, at the end of the gathering, or from
        its sender task (no connection yet, a full one, a handover under way)."""
        broker_id = lane.key[2]
        state = self._brokers.get(broker_id)
        if state is None:
            state = self._brokers[broker_id] = _Broker()
        state.ready[lane] = None
        if state.task is not None or state.master_wait is not None:
            return
        if self._gathering is not None:
            self._gathering.add(broker_id)
            return
        self._drain_now(broker_id, state)

    def _drain_now(self, broker_id: int, state: _Broker) -> BrokerConnection | None:
        """Write what the broker's ready lanes allow on its open connection; a sender task for the rest. What the
        writing sets off (a one-way batch's lane going idle, say) is written after it, not inside it."""
        if not state.ready or state.task is not None or state.master_wait is not None:
            return None
        gathered = self._gather()
        try:
            conn = self._core.cached_connection(broker_id, "produce")
            if conn is not None and conn.writable:
                with contextlib.suppress(ConnectionClosedError):  # not written: the sender task reconnects
                    self._drain(conn, state)
            if state.ready:
                self._start_sender(broker_id, state)
        finally:
            self._write_gathered(gathered)
        return conn

    def _start_sender(self, broker_id: int, state: _Broker) -> None:
        if state.task is None and not self.closed:
            state.task = self._spawn(self._send_loop(broker_id, state))

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- writing ---------------------------------------------------------------------------------

    def _drain(self, conn: BrokerConnection, state: _Broker) -> None:
        """Write the ready lanes' batches on ``conn`` while it has room: one batch per lane per request, several
        lanes' batches in one MultiProduce. A lane that cannot write now leaves the ready set (it is woken
        again when it can). ConnectionClosedError: the batch being written goes back to its lane, first."""
        multi = self.config.multi_produce and conn.supports(MULTI_PRODUCE)
        ready = state.ready
        while ready and conn.writable:
            group: list[tuple[Lane, ProducerBatch]] = []
            size = 0
            for lane in list(ready):
                batch = lane.next_for(conn)
                if batch is None:
                    ready.pop(lane, None)
                    continue
                if group and (not multi or batch.acks == 0 or len(group) >= MULTI_PRODUCE_MAX_BATCHES
                              or size + batch.size_bytes > MULTI_PRODUCE_MAX_BYTES):
                    break
                lane.written(batch, conn)
                group.append((lane, batch))
                size += batch.size_bytes
                ready.pop(lane, None)
                if lane.waiting:
                    ready[lane] = None  # its next batch goes in a later request, after the other lanes'
                if not multi or batch.acks == 0:
                    break
            if not group:
                return
            try:
                if len(group) == 1:
                    self._write(conn, *group[0])
                else:
                    self._write_multi(conn, group)
            except ConnectionClosedError:
                for lane, batch in reversed(group):
                    lane.unwritten(batch)
                    ready[lane] = None
                raise

    def _payload(self, lane: Lane, batch: ProducerBatch) -> bytes:
        payload = batch.build(self.config.compression)
        if not lane.checked:
            return payload
        stamp = lane.stamp(batch)
        if batch.stamped is None:
            batch.stamped = with_producer_stamp(payload, stamp)
        return batch.stamped

    def _write(self, conn: BrokerConnection, lane: Lane, batch: ProducerBatch) -> None:
        """Hand one batch to the connection; ConnectionClosedError means nothing was written. Any other error (a
        frame over the limit, say) fails the batch itself."""
        try:
            request = ProduceRequest(batch.topic, batch.partition, batch.acks, int(self.timeout_s * 1000),
                                     self._payload(lane, batch))
            if batch.acks == 0:
                conn.send_oneway(request)
                reply = None
            else:
                reply = conn.submit(request, self.timeout_s)
        except ConnectionClosedError:
            raise
        except Exception as exc:  # it cannot be built or framed: its failure is its result
            self._give_up(lane, batch, exc, in_lane=True)
            return
        if reply is None:
            self._stored(batch, None)
        else:
            reply.add_done_callback(partial(self._on_reply, batch, conn.address))

    def _write_multi(self, conn: BrokerConnection, group: list[tuple[Lane, ProducerBatch]]) -> None:
        """Several batches (acks=1, one broker) as one MultiProduce. A batch that cannot be built fails alone;
        ConnectionClosedError means nothing was written."""
        parts: list[ProducePartition] = []
        sent: list[ProducerBatch] = []
        failed: list[tuple[ProducerBatch, Exception]] = []
        for lane, batch in group:
            try:
                parts.append(ProducePartition(batch.topic, batch.partition, self._payload(lane, batch)))
                sent.append(batch)
            except Exception as exc:
                failed.append((batch, exc))
        if sent:
            request = MultiProduceRequest(1, int(self.timeout_s * 1000), "", parts)
            try:
                reply = conn.submit(request, self.timeout_s)
            except ConnectionClosedError:
                raise
            except Exception as error:
                failed.extend((batch, error) for batch in sent)
                sent = []
            else:
                self.multi_produce_requests += 1
                self.multi_produced_batches += len(sent)
                reply.add_done_callback(partial(self._on_multi_reply, sent, conn.address))
        for batch, cause in failed:
            self._give_up(self._lanes[batch.key], batch, cause, in_lane=True)

    async def _send_loop(self, broker_id: int, state: _Broker) -> None:
        """Write the broker's ready lanes as its connection takes them. A broker that cannot be reached holds its
        batches (the movable ones move to another partition) and is tried again when the cluster view changes or
        after a back-off, until they have all gone or passed their deadline."""
        core = self._core
        backoff_s = self.config.retry_backoff_ms / 1000.0
        try:
            while state.ready and not self.closed:
                if state.master_wait is not None:
                    await state.master_wait
                    continue
                since = core.snapshots_applied
                try:
                    conn = await core.connection(broker_id, "produce")
                except (MetaqError, OSError) as exc:  # the pool tried its reconnects with back-off already
                    self._unreachable(broker_id, state, exc)
                    if state.ready:
                        await core.cluster_changed(backoff_s, since)
                    continue
                if not conn.writable:
                    with contextlib.suppress(ConnectionClosedError):
                        await conn.wait_writable()
                    continue
                if state.master_wait is not None:  # began while this loop waited for the connection
                    continue
                gathered = self._gather()
                try:
                    with contextlib.suppress(ConnectionClosedError):
                        self._drain(conn, state)
                finally:
                    self._write_gathered(gathered)
                conn.flush()
        finally:
            state.task = None
            if state.ready and not self.closed and state.master_wait is None:
                self._start_sender(broker_id, state)

    def _unreachable(self, broker_id: int, state: _Broker, exc: BaseException) -> None:
        """The broker cannot be reached: it is left out of new placements for a while, and the waiting batches of
        its ready lanes that a spreading selector placed move to another partition (none of them was stored)."""
        if isinstance(exc, (ConnectionClosedError, UnknownServerError, OSError)):
            self._core.unavailable.avoid_broker(broker_id)
        for lane in list(state.ready):
            if lane.inflight or lane.resolving:
                continue
            while lane.waiting:
                batch = lane.waiting[0]
                batch.error = exc
                target = self._move_target(batch, exc)
                if target is None:
                    break
                lane.waiting.popleft()
                self._relocate(lane, batch, target, exc)
            if not lane.waiting:
                del state.ready[lane]

    # -- outcomes --------------------------------------------------------------------------------

    def _on_reply(self, batch: ProducerBatch, address: str, fut: asyncio.Future[ProduceResponse]) -> None:
        resp, exc = _outcome(fut)
        if resp is not None:
            if not resp.error_code:
                self._stored(batch, resp)
                return
            exc = error_for_code(resp.error_code, resp.error_message or "")
        assert exc is not None
        self._failed(batch, address, exc, written=True)

    def _on_multi_reply(self, batches: list[ProducerBatch], address: str,
                        fut: asyncio.Future[MultiProduceResponse]) -> None:
        """A MultiProduce's reply: each batch's entry is what a Produce reply of it would have said. What the
        outcomes release is written in one gathering (one MultiProduce again)."""
        resp, exc = _outcome(fut)
        with self.gathering():
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

    def _stored(self, batch: ProducerBatch, resp: ProduceResponse | ProducedPartition | None) -> None:
        lane = self._lanes[batch.key]
        doomed = lane.stored(batch)
        if not batch.reported:
            self._report_ok(batch, resp)
        self._retire(lane, batch)
        for other in doomed:
            self._give_up(lane, other, WouldReorderError(
                f"a batch of {other.count} messages to {other.topic}:{other.broker_id}-{other.partition} was refused "
                f"({other.error}) and a later batch of that partition was stored first: it was not stored, and is "
                "not sent again (that would store it behind the later one)", cause=other.error))
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
        for other in doomed:
            self._give_up(lane, other, WouldReorderError(
                f"a batch of {other.count} messages to {other.topic}:{other.broker_id}-{other.partition} was refused "
                f"({other.error}) and a later batch of that partition may have been stored ({exc}): it was not stored, "
                "and is not sent again (that could store it behind the later one)", cause=other.error))
        self._settled(lane)

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
        candidates = tuple(p for p in usable if p.accept_publish and (p.broker_id, p.partition) not in tried)
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
                for barrier in barriers:
                    barrier.batch_done()
        self._after_done(lane)

    # -- a master being handed over (cluster mode) --------------------------------------------------

    def _hold_for_master(self, broker_id: int, address: str) -> None:
        """NOT_MASTER from ``address``: the broker id's master is being handed over (a promote, a failover). Nothing
        more is written to it until ZooKeeper names a master elsewhere, or, when one is named, a back-off passed
        (a master just named may refuse for a moment while it takes over)."""
        state = self._brokers.get(broker_id)
        if state is None:
            state = self._brokers[broker_id] = _Broker()
        if state.master_wait is not None or self.closed:
            return
        state.master_wait = self._loop.create_future()
        log.info("broker %d: %s is no longer its master; its batches wait for the next one", broker_id, address)
        self._spawn(self._await_master(broker_id, state, address))

    async def _await_master(self, broker_id: int, state: _Broker, address: str) -> None:
        core = self._core
        backoff_s = self.config.retry_backoff_ms / 1000.0
        waited = False
        try:
            while not self.closed:
                since = core.snapshots_applied
                current = core.metadata.cache.address(broker_id)
                if current is not None and (waited or format_address(current) != address):
                    return
                await core.cluster_changed(backoff_s, since)
                waited = True
        finally:
            wait, state.master_wait = state.master_wait, None
            if wait is not None and not wait.done():
                wait.set_result(None)
            if state.ready:
                self._start_sender(broker_id, state)

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
        self._reported(batch)

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
        self._reported(batch)

    def _reported(self, batch: ProducerBatch) -> None:
        barriers = self._outstanding.pop(batch, None)
        if barriers:
            for barrier in barriers:
                barrier.batch_done()

    def _retire(self, lane: Lane, batch: ProducerBatch) -> None:
        """The batch is out of the producer: its lane no longer counts it and its bytes are free."""
        lane.done(batch)
        self._buffer.release(batch.size_bytes if batch.batch_waiter is not None else batch.size_bytes - HEADER_BYTES)
        self._after_done(lane)

    def _after_done(self, lane: Lane) -> None:
        if lane.unresolved == 0:
            self.on_idle(lane.key)  # the partition went idle: what accumulated meanwhile leaves now
