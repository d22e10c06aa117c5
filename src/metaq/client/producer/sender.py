"""Writing sealed batches to brokers (docs/producer.md); what their outcomes do is outcomes.py.

Each sealed batch joins its :class:`~metaq.client.producer.lanes.Lane` and is written when the lane allows it
(the generation rule), as one Produce or, with others due for the same broker, one MultiProduce. A broker that
cannot be reached, or whose master is being handed over, holds its batches until it can take them or their
delivery deadline passes (:meth:`Sender._send_loop`, :meth:`Sender._await_master`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from metaq.client.config import ProducerConfig
from metaq.client.core import ClientCore
from metaq.client.producer.batches import BatchKey, BufferLimit, ProducerBatch
from metaq.client.producer.lanes import Lane, new_producer_id
from metaq.client.producer.outcomes import FlushBarrier, Outcomes
from metaq.client.producer.results import ManyTable
from metaq.errors import (
    ConnectionClosedError,
    MetaqError,
    UnknownServerError,
)
from metaq.net.connection import BrokerConnection
from metaq.net.servers import format_address
from metaq.protocol.messages import (
    ANY_PARTITION,
    MultiProduceRequest,
    ProducePartition,
    ProduceRequest,
)
from metaq.protocol.records import HEADER_BYTES, with_producer_stamp

log = logging.getLogger("metaq.client.producer")

MULTI_PRODUCE = MultiProduceRequest.API_KEY
MULTI_PRODUCE_MAX_BATCHES = 1000
"""Batches one MultiProduce of this client carries at most (the protocol allows MULTI_PRODUCE_PARTITIONS_MAX)."""
MULTI_PRODUCE_MAX_BYTES = 1 << 20
"""Their bytes at most, unless one batch is larger (it goes alone): the reply waits for the slowest batch, so
big batches, which pay their request's fixed cost many times over, gain nothing from sharing one."""


class _Broker:
    """A broker id's lanes with batches to write, its sender task, and a master handover being waited out."""

    __slots__ = ("master_wait", "ready", "task")

    def __init__(self) -> None:
        self.ready: dict[Lane, None] = {}
        """Lanes that may have a batch to write, in the order they became ready (a dict: an ordered set)."""
        self.task: asyncio.Task[None] | None = None
        self.master_wait: asyncio.Future[None] | None = None
        """Set while a NOT_MASTER refusal's handover is waited out: nothing is written to this broker id."""


class Sender(Outcomes):
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
        self._timeout_ms = int(self.timeout_s * 1000)
        self._compression = config.compression
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

    def gathering(self) -> contextlib.AbstractContextManager[None]:
        """Batches dispatched inside are written at its end, per broker (one MultiProduce each when it serves
        them), and each connection flushed then: the frames leave in this loop step, one write per broker. The paths
        run every event-loop step use :meth:`open_gathering` and :meth:`close_gathering` instead, the same as a
        pair without a context manager's calls."""
        return _Gathering(self)

    def open_gathering(self) -> set[int] | None:
        """Open a gathering; None when one is open already (the outer one writes). Paired with :meth:`close_gathering`
        (:meth:`gathering` does both)."""
        if self._gathering is not None:
            return None
        gathered: set[int] = set()
        self._gathering = gathered
        return gathered

    def close_gathering(self, gathered: set[int] | None, *, flush: bool = True) -> None:
        """Close the gathering :meth:`open_gathering` opened: each broker's ready lanes written on its open connection
        while it has room (a sender task for the rest: no connection yet, a full one), and the connection flushed
        (``flush``; else at the end of the loop step, as usual). What the writing sets off (a one-way batch's lane
        going idle, say) is gathered again and written after it, not inside it."""
        if gathered is None:
            return
        try:
            while gathered:
                later: set[int] = set()
                self._gathering = later
                for broker_id in gathered:
                    state = self._brokers[broker_id]
                    if not state.ready or state.task is not None or state.master_wait is not None:
                        continue
                    conn = self._core.cached_connection(broker_id, "produce")
                    if conn is not None and conn.writable:
                        try:
                            self._drain(conn, state)
                        except ConnectionClosedError:
                            pass  # not written: the sender task reconnects
                        if flush:
                            conn.flush()
                    if state.ready:
                        self._start_sender(broker_id, state)
                gathered = later
        finally:
            self._gathering = None

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
        self._gathering = gathered = {broker_id}  # a gathering of its own: what the writing sets off comes after it
        self.close_gathering(gathered, flush=False)

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
        again when it can). ConnectionClosedError: the batch being written goes back to its lane, first. The
        caller found ``conn`` writable."""
        multi: bool | None = None  # asked only when a second batch could join the request
        ready = state.ready
        while ready:
            group: list[tuple[Lane, ProducerBatch]] = []
            size = 0
            for lane in list(ready):
                batch = lane.next_for(conn)
                if batch is None:
                    ready.pop(lane, None)
                    continue
                if group:
                    if multi is None:
                        multi = self.config.multi_produce and conn.supports(MULTI_PRODUCE)
                    if (not multi or batch.acks == 0 or len(group) >= MULTI_PRODUCE_MAX_BATCHES
                            or size + batch.size_bytes > MULTI_PRODUCE_MAX_BYTES):
                        break
                lane.written(batch, conn)
                group.append((lane, batch))
                size += batch.size_bytes
                ready.pop(lane, None)
                if lane.waiting:
                    ready[lane] = None  # its next batch goes in a later request, after the other lanes'
                if batch.acks == 0 or multi is False:
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
            if not conn.writable:
                return

    def _stamped(self, lane: Lane, batch: ProducerBatch) -> bytes:
        """An idempotent lane's batch as written: its payload with the producer block the lane gives it."""
        payload = batch.build(self.config.compression)
        stamp = lane.stamp(batch)
        if batch.stamped is None:
            batch.stamped = with_producer_stamp(payload, stamp)
        return batch.stamped

    def _write(self, conn: BrokerConnection, lane: Lane, batch: ProducerBatch) -> None:
        """Hand one batch to the connection; ConnectionClosedError means nothing was written. Any other error (a
        frame over the limit, say) fails the batch itself."""
        try:
            request = ProduceRequest(batch.topic, batch.partition, batch.acks, self._timeout_ms,
                                     self._stamped(lane, batch) if lane.checked else batch.build(self._compression))
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
                parts.append(ProducePartition(batch.topic, batch.partition, self._stamped(lane, batch) if lane.checked
                                              else batch.build(self._compression)))
                sent.append(batch)
            except Exception as exc:
                failed.append((batch, exc))
        if sent:
            request = MultiProduceRequest(1, self._timeout_ms, "", parts)
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
                gathered = self.open_gathering()
                try:
                    with contextlib.suppress(ConnectionClosedError):
                        self._drain(conn, state)
                finally:
                    self.close_gathering(gathered)
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


class _Gathering:
    """:meth:`Sender.gathering`'s context manager (a class: entered at the end of every event-loop step that sent,
    where a generator's costs a few microseconds)."""

    __slots__ = ("_gathered", "_sender")

    def __init__(self, sender: Sender) -> None:
        self._sender = sender
        self._gathered: set[int] | None = None

    def __enter__(self) -> None:
        self._gathered = self._sender.open_gathering()

    def __exit__(self, *exc: object) -> None:
        self._sender.close_gathering(self._gathered)
