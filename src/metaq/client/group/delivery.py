"""Delivery: a fetched batch handed to the listener in offset order, with retries, acks and rejection.

The :class:`~metaq.client.group.consumer.GroupConsumer` fetches each owned partition in a
:class:`Worker`; :class:`Delivery` takes one fetched batch of a worker to the listener. The logic is one
generator (:meth:`Delivery.steps`) driven either on the event loop (an ``async def`` listener) or in a
thread of the listener pool (a plain function, a whole batch per hop), so both kinds of listener get
the same retries, acknowledgements and rejections.

A message is *acknowledged* when its listener call returns without raising and without marking it
rollback-only (auto-ack), or when the listener calls ``ctx.ack()`` (auto-ack off); everything before
``Worker.acked`` is what a commit stores. A failed message is delivered again, up to
``max_fetch_retries`` more times, then handed to the rejection policy (skip, the recover store, or the
dead-letter topic). Before each redelivery the partition backs off (MetaQ's delayed fetch:
:meth:`~metaq.client.group.config.ConsumerConfig.retry_delay_ms`): delivery stops at the failed
message and sets ``Worker.retry_delay_s``; the worker waits that long outside the listener slots, then
fetches again from the failed message. The LRU of the last ``dedup_window`` acknowledged message ids drops redeliveries
that reach the same consumer (a partition that came back to it from an older commit).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from metaq.client.callbacks import takes_two
from metaq.client.exceptions import ClientClosedError
from metaq.client.fetcher import FetchResult
from metaq.client.group.config import ConsumerConfig
from metaq.client.group.dead_letter import DeadLetterSender
from metaq.client.group.filters import MessageFilter
from metaq.client.group.recover import RecoverStore
from metaq.client.metadata import Partition
from metaq.client.replicas import ReadReplica
from metaq.net.connection import BrokerConnection
from metaq.types import Message, PartitionId, TopicPartition

log = logging.getLogger("metaq.client.group")


Listener = Callable[..., Any]
"""``listener(message)`` or ``listener(message, ctx)``; a plain function or an ``async def``."""


class PartitionContext:
    """What a two-argument listener gets: acknowledgement control of the message's partition.

    With auto-ack on (the default) a message is acknowledged when the listener returns. Turn it off
    (``ctx.set_auto_ack(False)``) to consume in transactions: nothing is acknowledged — so nothing is
    committed — until ``ctx.ack()``, which acknowledges every message delivered so far on the
    partition; ``ctx.rollback()`` delivers again everything since the last ack. ``ctx.set_rollback_only()``
    marks the current message failed: it is redelivered as if the listener had raised.
    """

    def __init__(self, topic: str, partition: PartitionId) -> None:
        self.topic = topic
        self.partition_id = partition
        """The partition, ``brokerId-partition`` (MetaQ's Partition)."""
        self.broker_id = partition.broker_id
        self.partition = partition.partition
        self.auto_ack = True
        self.message: Message | None = None
        self._ack = False
        self._rollback = False
        self._rollback_only = False

    def set_auto_ack(self, on: bool) -> None:
        """``False``: acknowledge only on :meth:`ack` (consume in transactions); ``True``: when the listener returns."""
        self.auto_ack = bool(on)

    def ack(self) -> None:
        """Acknowledge every message delivered so far on the partition (committed with the next commit)."""
        self._ack = True

    def rollback(self) -> None:
        """Deliver again everything since the last :meth:`ack`."""
        self._rollback = True

    def set_rollback_only(self) -> None:
        """Mark the current message failed: it is redelivered as if the listener had raised."""
        self._rollback_only = True

    @property
    def rollback_only(self) -> bool:
        """Whether :meth:`set_rollback_only` was called for the current message."""
        return self._rollback_only

    def _begin(self, message: Message) -> None:
        self.message = message
        self._ack = self._rollback = self._rollback_only = False


class MessageIdLRU:
    """The last ``capacity`` acknowledged message ids (thread safe: sync listeners run in threads)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._ids: OrderedDict[int, None] = OrderedDict()
        self._lock = threading.Lock()

    def seen(self, message_id: int) -> bool:
        if self.capacity <= 0 or message_id < 0:
            return False
        with self._lock:
            return message_id in self._ids

    def add(self, message_id: int) -> None:
        self.add_many((message_id,))

    def add_many(self, message_ids: Iterable[int]) -> None:
        """Add the ids of a batch under one lock (it was a lock, a move and a length check per message)."""
        if self.capacity <= 0:
            return
        ids = self._ids
        with self._lock:
            for message_id in message_ids:
                if message_id < 0:
                    continue
                if message_id in ids:
                    ids.move_to_end(message_id)
                else:
                    ids[message_id] = None
            for _ in range(len(ids) - self.capacity):
                ids.popitem(last=False)


@dataclass
class Subscription:
    topic: str
    max_size: int
    listener: Listener
    filter: MessageFilter | None
    is_async: bool
    wants_ctx: bool


@dataclass
class ConsumerStats:
    """Counters of a group consumer since it started (``consumer.stats``)."""

    delivered: int = 0
    """Listener calls (retries included)."""
    acked: int = 0
    failures: int = 0
    rejected: int = 0
    recovered: int = 0
    duplicates_dropped: int = 0
    filtered: int = 0
    rollbacks: int = 0
    commits: int = 0
    rebalances: int = 0


def wants_ctx(listener: Listener) -> bool:
    """Whether ``listener`` takes the partition context as its second argument."""
    return takes_two(listener)


def is_async(listener: Listener) -> bool:
    return inspect.iscoroutinefunction(listener) or inspect.iscoroutinefunction(
        getattr(listener, "__call__", None))  # noqa: B004 - an object whose __call__ is async


@dataclass(eq=False)
class Worker:
    """One owned partition: its position, what is acknowledged, what is committed."""

    tp: TopicPartition
    part: Partition
    sub: Subscription
    position: int
    """The next offset to hand to the listener (and to fetch)."""
    acked: int
    """Everything before it is acknowledged: what a commit stores."""
    committed: int
    ctx: PartitionContext
    retries: dict[int, int] = field(default_factory=dict)
    txn_ids: list[int] = field(default_factory=list)
    stopping: bool = False
    busy: bool = False
    """In a listener call: a revoke waits for it instead of cancelling the task."""
    task: asyncio.Task[None] | None = None
    conn: BrokerConnection | None = None
    replica: ReadReplica | None = None
    """The copy (master or slave) ``conn`` reaches."""
    empty_fetches: int = 0
    last_error: BaseException | None = None
    """The failure of the message being rejected (None: it was marked rollback-only)."""
    retry_delay_s: float = 0.0
    """Set when delivery stopped at a failed message: wait this long, then fetch again from it."""


_CALL = "call"
_REJECT = "reject"


class Delivery:
    """Delivers the fetched batches of a consumer's workers (see the module docstring).

    ``may_fetch`` says whether the consumer still owns its partitions (a lease that ran out mid-batch
    stops delivery); ``closed`` whether the consumer is closing (a dead letter not yet sent stays).
    """

    def __init__(self, config: ConsumerConfig, stats: ConsumerStats, dedup: MessageIdLRU,
                 may_fetch: Callable[[], bool], closed: Callable[[], bool], recover: RecoverStore,
                 dead_letters: DeadLetterSender | None, threads: ThreadPoolExecutor) -> None:
        self.config = config
        self.stats = stats
        self.dedup = dedup
        self.may_fetch = may_fetch
        self.closed = closed
        self.recover = recover
        self.dead_letters = dead_letters
        self.threads = threads
        self.dedup_high: dict[TopicPartition, int] = {}
        """Per partition, past every offset whose id this consumer put in ``dedup``: a message at or past it
        cannot be a redelivery of one acknowledged here, so the LRU is not asked about it."""

    async def deliver(self, w: Worker, result: FetchResult) -> None:
        """Hand one fetched batch to the worker's listener (on the loop, or in the listener threads)."""
        if w.sub.is_async:
            await self._deliver_async(w, result)
        else:
            await asyncio.get_running_loop().run_in_executor(self.threads, self._deliver_sync, w, result,
                                                             asyncio.get_running_loop())

    def steps(self, w: Worker, result: FetchResult) -> Generator[tuple[str, Message], BaseException | None, None]:
        """The delivery logic for one fetched batch, shared by the async and the thread driver.

        Yields ("call", message) — the driver calls the listener and sends back the exception or None —
        and ("reject", message) for the rejection policy. Only this partition's worker touches ``w``.
        """
        acked_ids: list[int] = []
        try:
            yield from self._batch_steps(w, result, acked_ids)
        finally:  # the batch's acknowledged ids go into the LRU together
            if acked_ids:
                self.dedup.add_many(acked_ids)

    def _batch_steps(self, w: Worker, result: FetchResult,
                     acked_ids: list[int]) -> Generator[tuple[str, Message], BaseException | None, None]:
        cfg = self.config
        ctx = w.ctx
        # Messages are built one at a time from the fetch's column views (FetchResult.batches): one that
        # has been delivered is freed at once, so the cyclic GC never scans a fetch's worth of them.
        if result.messages:
            items: Iterator[Message] = iter(result.messages)
            last_offset = result.messages[-1].offset
        else:
            items = chain.from_iterable(result.batches)
            last_offset = result.batches[-1].offsets[-1] if result.batches else -1
        dedup_below = self.dedup_high.get(w.tp, 0)
        msg = next(items, None)
        while msg is not None:
            if w.stopping or not self.may_fetch():
                return  # (the lease ran out mid-batch: the rest waits at the worker's gate, from w.position)
            if msg.offset < w.position:
                msg = next(items, None)
                continue
            if w.sub.filter is not None and not w.sub.filter(msg):
                self.stats.filtered += 1
                self._advance(w, msg, acked_ids)
                msg = next(items, None)
                continue
            if msg.offset < dedup_below and self.dedup.seen(msg.id):
                self.stats.duplicates_dropped += 1
                self._advance(w, msg, acked_ids)
                msg = next(items, None)
                continue
            ctx._begin(msg)
            self.stats.delivered += 1
            error = yield (_CALL, msg)
            if error is None and not ctx._rollback_only:
                w.retries.pop(msg.offset, None)
                w.position = msg.offset + 1
                if ctx.auto_ack or ctx._ack:
                    w.txn_ids.append(msg.id)
                    self.ack(w, acked_ids)
                elif ctx._rollback:
                    self._rollback(w)
                    return
                else:
                    w.txn_ids.append(msg.id)
                msg = next(items, None)
                continue
            # failed: the listener raised or marked the message rollback-only
            self.stats.failures += 1
            if error is not None:
                log.warning("%s: listener failed on offset %d (delivery %d of %d): %r", w.tp, msg.offset,
                            w.retries.get(msg.offset, 0) + 1, cfg.max_fetch_retries + 1, error)
            tries = w.retries[msg.offset] = w.retries.get(msg.offset, 0) + 1
            if tries <= cfg.max_fetch_retries:
                w.retry_delay_s = cfg.retry_delay_ms(tries) / 1000
                if not ctx.auto_ack:
                    self._rollback(w)  # a failure inside a transaction rolls it back
                    return
                if w.retry_delay_s > 0:
                    return  # the worker backs off, then fetches again from this message
                continue  # deliver the same message again at once
            del w.retries[msg.offset]
            w.last_error = error
            if (yield (_REJECT, msg)) is not None:
                return  # not dead-lettered before the partition was given up: its next owner gets it again
            self.stats.rejected += 1
            w.position = msg.offset + 1
            if ctx.auto_ack:
                self.ack(w, acked_ids)
            msg = next(items, None)
        if not w.stopping and result.next_offset > w.position and last_offset >= 0 and w.position > last_offset:
            # trailing messages the server-side filter removed
            w.position = result.next_offset
            if ctx.auto_ack:
                self.ack(w, acked_ids)

    def _advance(self, w: Worker, msg: Message, acked_ids: list[int] | None = None) -> None:
        """Past a message the listener never sees (filtered out, or a duplicate)."""
        w.position = msg.offset + 1
        if w.ctx.auto_ack:
            self.ack(w, acked_ids)

    def ack(self, w: Worker, acked_ids: list[int] | None = None) -> None:
        """Everything before ``w.position`` is acknowledged (what a commit stores); the ids go into the
        dedup LRU now, or into ``acked_ids`` for the end of the batch being delivered."""
        w.acked = w.position
        txn_ids = w.txn_ids
        if txn_ids:
            if acked_ids is None:
                self.dedup.add_many(txn_ids)
            else:
                acked_ids.extend(txn_ids)
            self.stats.acked += len(txn_ids)
            txn_ids.clear()
            if w.acked > self.dedup_high.get(w.tp, 0):
                self.dedup_high[w.tp] = w.acked

    def _rollback(self, w: Worker) -> None:
        self.stats.rollbacks += 1
        w.position = w.acked
        w.txn_ids.clear()

    async def _reject(self, w: Worker, msg: Message) -> BaseException | None:
        """Apply the rejection policy; an exception (sent into :meth:`_steps`) if the message must stay."""
        if self.dead_letters is not None:
            sent = await self.dead_letters.send(msg, w.last_error, self.config.max_fetch_retries + 1,
                                                lambda: w.stopping or self.closed())
            return None if sent else ClientClosedError("the partition was given up before the dead letter was sent")
        if self.config.rejection_policy == "recover":
            try:
                if await self.recover.put(msg):
                    log.warning("%s:%d-%d: offset %d failed %d times; kept in the recover store", msg.topic,
                                msg.broker_id, msg.partition, msg.offset, self.config.max_fetch_retries + 1)
                    return None
            except OSError as exc:
                log.error("recover store: cannot keep %s:%d-%d@%d: %s", msg.topic, msg.broker_id, msg.partition,
                          msg.offset, exc)
        log.error("%s:%d-%d: offset %d failed %d times; skipped (rejection policy)", msg.topic, msg.broker_id,
                  msg.partition, msg.offset, self.config.max_fetch_retries + 1)
        return None

    async def _deliver_async(self, w: Worker, result: FetchResult) -> None:
        steps = self.steps(w, result)
        listener = w.sub.listener
        try:
            action, msg = next(steps)
            while True:
                if action == _REJECT:
                    action, msg = steps.send(await self._reject(w, msg))
                    continue
                err: BaseException | None = None
                try:
                    if w.sub.wants_ctx:
                        await listener(msg, w.ctx)
                    else:
                        await listener(msg)
                except Exception as exc:  # the listener's failure is a redelivery, not our crash
                    err = exc
                action, msg = steps.send(err)
        except StopIteration:
            pass

    def _deliver_sync(self, w: Worker, result: FetchResult, loop: asyncio.AbstractEventLoop) -> None:
        steps = self.steps(w, result)
        listener = w.sub.listener
        wants_ctx = w.sub.wants_ctx
        try:
            action, msg = next(steps)
            while True:
                if action == _REJECT:
                    action, msg = steps.send(asyncio.run_coroutine_threadsafe(self._reject(w, msg), loop).result())
                    continue
                err: BaseException | None = None
                try:
                    if wants_ctx:
                        listener(msg, w.ctx)
                    else:
                        listener(msg)
                except Exception as exc:  # the listener's failure is a redelivery, not our crash
                    err = exc
                action, msg = steps.send(err)
        except StopIteration:
            pass

    async def deliver_recovered(self, sub: Subscription, msg: Message) -> bool:
        """Offer a message of the recover store to its listener once: True if it was accepted."""
        ctx = PartitionContext(msg.topic, msg.partition_id)
        ctx._begin(msg)
        args = (msg, ctx) if sub.wants_ctx else (msg,)
        if sub.is_async:
            await sub.listener(*args)
        else:
            await asyncio.get_running_loop().run_in_executor(self.threads, lambda: sub.listener(*args))
        if ctx.rollback_only:
            return False
        self.stats.recovered += 1
        return True

