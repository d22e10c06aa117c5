"""MetaQ's listener consumer: a group shares topics' partitions; a listener gets every message once or more.

::

    consumer = create_consumer(session, ConsumerConfig(group="billing"))
    consumer.subscribe("orders", 1024 * 1024, on_order)          # several topics may be subscribed
    consumer.subscribe("refunds", 1024 * 1024, on_refund, AttributeFilter("vip"))
    await consumer.complete_subscribe()                           # joins the group, starts fetching
    ...
    await consumer.close()                                        # commits, leaves the group

How it runs
-----------
Partitions are ``brokerId-partition`` (:class:`~metaq.types.PartitionId`): workers, acknowledgements
and committed offsets are keyed by it, and each partition is fetched from its own broker. Which
partitions this member owns is the job of its :class:`~metaq.client.group.membership.Membership`; the
workers, delivery and commits below are the same for both:

* standalone mode: each broker coordinates the group for its own partitions, and keeps their offsets
  (:class:`~metaq.client.group.standalone.BrokerMembership`: no broker is a single point of failure);
* cluster mode (the session has a ZooKeeper registry): MetaQ's way, members, owner claims and offsets in
  ZooKeeper, each member computing the assignment (:class:`~metaq.client.group.membership.ZooKeeperMembership`);
* broadcast: every member owns every partition (:class:`~metaq.client.group.standalone.BroadcastMembership`).

Each owned partition has a worker task that fetches (long polling, or MetaQ's back-off when
``long_poll`` is off) and hands the batch to the listener *in offset order*
(:mod:`~metaq.client.group.delivery`). With ``multi_fetch`` (and a broker that serves MultiFetch) the
workers of one broker's partitions hand their fetches to that broker's
:class:`~metaq.client.multi_fetch.BrokerFetcher`, which sends them together, in MultiFetch requests over
ONE connection (the group's own: heartbeats share it, since MultiFetch replies may overtake others) and
long-polls on all of them at once; each worker still gets only its partition's result, so delivery is
unchanged; different partitions run in parallel, at most ``fetch_runner_count`` at once. An ``async def``
listener runs on the event loop; a plain function runs in a thread pool of ``fetch_runner_count``
threads (a whole batch per hop), so it can block without stalling the loop.

A listener takes ``(message)`` or ``(message, ctx)``; ``ctx`` is the partition's
:class:`PartitionContext` (MetaQ's ``Partition.setAutoAck/ack/rollback`` and
``Message.setRollbackOnly``).

Delivery: at least once, in order per partition
------------------------------------------------
A message is *acknowledged* when its listener call returns without raising and without marking it
rollback-only (auto-ack), or when the listener calls ``ctx.ack()`` (auto-ack off). Acknowledged
offsets are committed every ``commit_offset_period_ms``, before a rebalance gives the partitions up,
and on close. Duplicates come from: a crash or kill (everything consumed since the last commit, at most
one commit period's worth, is delivered again to the next owner), a member that was dropped from the
group while it was still processing (at most the message in hand per partition), and rollbacks (by
design). The LRU of the last ``dedup_window`` acknowledged message ids drops redeliveries that reach
the *same* consumer (a partition that comes back to it after a rebalance).

Failures: a listener that raises, or marks the message rollback-only, gets the message again after a
back-off (``retry_backoff_ms``: MetaQ's delayed fetch, a tenth of ``max_delay_fetch_ms`` more each time),
up to ``max_fetch_retries`` more times (1 + max_fetch_retries deliveries in all, MetaQ's
maxFetchRetries); then the rejection policy takes it — ``skip`` (logged) or ``recover``: the local
:class:`~metaq.client.group.recover.RecoverStore` keeps it on disk and offers it to the listener again
every ``recover_message_interval_ms`` until accepted — and the partition moves on. ``dead-letter``
produces it to ``%DLQ%<group>`` (:mod:`~metaq.client.group.dead_letter`); the partition moves on only
once that produce is acknowledged, and waits (retrying) while it fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from metaq.client.core import ClientCore
from metaq.client.exceptions import ClientClosedError
from metaq.client.fetcher import MULTI_FETCH_API_KEY, Fetcher, FetchResult, read_request
from metaq.client.group.config import ConsumerConfig
from metaq.client.group.dead_letter import DeadLetterSender
from metaq.client.group.delivery import (
    ConsumerStats,
    Delivery,
    Listener,
    MessageIdLRU,
    PartitionContext,
    Subscription,
    Worker,
    is_async,
    wants_ctx,
)
from metaq.client.group.filters import as_predicate
from metaq.client.group.membership import ERROR_RETRY, Membership, ZooKeeperMembership, metaq_consumer_id
from metaq.client.group.offsets import (
    BrokerOffsetStorage,
    LocalFileOffsetStorage,
    OffsetStorage,
    ZooKeeperOffsetStorage,
)
from metaq.client.group.recover import RecoverStore
from metaq.client.group.standalone import BroadcastMembership, BrokerMembership
from metaq.client.metadata import Partition
from metaq.client.multi_fetch import BrokerFetcher
from metaq.errors import (
    BrokerError,
    ConnectionClosedError,
    CorruptRecordError,
    IllegalGenerationError,
    InvalidArgument,
    MetaqError,
    OffsetOutOfRangeError,
    RebalanceInProgressError,
    RequestTimeoutError,
    TooManyRequestsError,
    UnknownMemberError,
)
from metaq.net.connection import BrokerConnection
from metaq.protocol import messages as m
from metaq.types import Message, PartitionId, TopicPartition, validate_topic

log = logging.getLogger("metaq.client.group")

_DAMAGE_RETRY_S = 30.0
"""How often a partition stopped at damaged stored data tries again (and logs the error again)."""


def empty_fetch_delay_ms(empty_fetches: int, max_delay_ms: int) -> int:
    """MetaQ's back-off without long polling: each empty reply in a row adds a tenth of the max delay."""
    return min(max_delay_ms, empty_fetches * max_delay_ms // 10)


class GroupConsumer:
    """Create it with :func:`create_consumer`. See the module docstring for the delivery contract."""

    def __init__(self, core: ClientCore, config: ConsumerConfig, offset_storage: OffsetStorage | None = None,
                 *, recover_store: RecoverStore | None = None) -> None:
        self._core = core
        self.config = config
        registry = core.registry if not config.broadcast else None
        if config.broadcast:
            self.consumer_id = config.consumer_id or socket.gethostname()
        else:  # unique: standalone brokers balance the members by it, so they order them alike
            self.consumer_id = config.consumer_id or metaq_consumer_id(
                config.group, socket.gethostname(), int(time.time() * 1000), random.getrandbits(24))
        self._owns_storage = offset_storage is None
        if offset_storage is None:
            if config.broadcast:
                offset_storage = LocalFileOffsetStorage()
            elif registry is not None:
                offset_storage = ZooKeeperOffsetStorage(registry)
            else:
                offset_storage = BrokerOffsetStorage()
        self.offsets = offset_storage
        self.membership: Membership
        """Who decides what this consumer owns: the brokers, ZooKeeper in cluster mode, or nobody (broadcast)."""
        if registry is not None:
            def partitions_of(topic: str) -> list[PartitionId]:
                return registry.snapshot().partitions(topic, publish=False)

            self.membership = ZooKeeperMembership(self, registry, partitions_of,
                                                  core.config.zk_session_timeout_ms / 1000)
        elif config.broadcast:
            self.membership = BroadcastMembership(self, core)
        else:
            coordinated = BrokerMembership(self, core, self._channel)
            self.membership = coordinated
            if isinstance(offset_storage, BrokerOffsetStorage):
                offset_storage.bind_brokers(coordinated.request_to, coordinated.fence)
        self.storage_group = f"{config.group}-{self.consumer_id}" if config.broadcast else config.group
        """The key offsets are stored under: the group, or group-consumerId for a broadcast member."""
        self.recover = recover_store or RecoverStore(config.recover_dir, self.storage_group)
        self.dead_letters = DeadLetterSender(core, config.group, config.dead_letter_partitions) \
            if config.rejection_policy == "dead-letter" else None
        """The ``dead-letter`` rejection policy's producer (None under the other policies)."""
        self.fetcher = Fetcher(core)
        self.subscriptions: dict[str, Subscription] = {}
        self.workers: dict[TopicPartition, Worker] = {}
        self.broker_fetchers: dict[int, BrokerFetcher] = {}
        """MultiFetch batching per broker id (``multi_fetch``)."""
        self.stats = ConsumerStats()
        self.dedup = MessageIdLRU(config.dedup_window)
        self._runners = asyncio.Semaphore(config.fetch_runner_count)
        self._threads = ThreadPoolExecutor(max_workers=config.fetch_runner_count, thread_name_prefix="metaq-listener")
        self.delivery = Delivery(config, self.stats, self.dedup, self.membership.may_fetch, lambda: self.closed,
                                 self.recover, self.dead_letters, self._threads)
        self._tasks: list[asyncio.Task[None]] = []
        self._membership: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._started = False
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.assigned = asyncio.Event()
        """Set whenever the consumer holds a current assignment (possibly empty); cleared while rebalancing."""
        self.retry_wait: Callable[[float], Awaitable[object]] = asyncio.sleep
        """How a partition waits before redelivering a failed message (a test's fake clock replaces it)."""

    @property
    def _channel(self) -> str:
        """The connections the group's requests and MultiFetches share."""
        return f"group:{id(self)}"

    # -- subscribing ------------------------------------------------------------------------------

    def subscribe(self, topic: str, max_size: int, listener: Listener, message_filter: Any = None) -> GroupConsumer:
        """Subscribe ``topic``: fetch up to ``max_size`` bytes per request, call ``listener`` per message.

        ``message_filter``: ``f(message) -> bool`` or an object with ``accept(group, message)``; refused
        messages are consumed without calling the listener. Call :meth:`complete_subscribe` after the
        last subscribe. Returns the consumer, so calls chain.
        """
        if self._started:
            raise InvalidArgument("subscribe() must come before complete_subscribe()")
        validate_topic(topic)
        if not isinstance(max_size, int) or max_size <= 0:
            raise InvalidArgument(f"max_size must be an int > 0, not {max_size!r}")
        if not callable(listener):
            raise InvalidArgument(f"listener must be callable, not {listener!r}")
        if topic in self.subscriptions:
            raise InvalidArgument(f"topic {topic!r} is already subscribed")
        predicate = as_predicate(self.config.group, message_filter)
        self.subscriptions[topic] = Subscription(topic, max_size, listener, predicate, is_async(listener),
                                                 wants_ctx(listener))
        return self

    async def complete_subscribe(self) -> None:
        """Start: join the group (or, broadcast, take every partition) and begin delivering."""
        if self._closed:
            raise ClientClosedError("the consumer is closed")
        if self._started:
            return
        if not self.subscriptions:
            raise InvalidArgument("subscribe() to at least one topic before complete_subscribe()")
        self._started = True
        self._loop = asyncio.get_running_loop()
        self._membership = asyncio.ensure_future(self.membership.run())
        self._tasks.append(asyncio.ensure_future(self._commit_loop()))
        if self.config.rejection_policy == "recover":
            self._tasks.append(asyncio.ensure_future(self._recover_loop()))

    # -- what a membership drives (GroupSide) ------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def generation(self) -> int:
        """Standalone mode: the group's generation at the lowest broker id where this member holds an
        assignment (-1 otherwise; :attr:`generations` has every broker's)."""
        return getattr(self.membership, "generation", m.NO_GENERATION)

    @property
    def generations(self) -> dict[int, int]:
        """Standalone mode: broker id -> the group's generation there (each broker coordinates its partitions)."""
        return dict(getattr(self.membership, "generations", {}))

    @property
    def member_id(self) -> str:
        """Standalone mode: the member id the lowest broker with an assignment gave this member ('' otherwise)."""
        return getattr(self.membership, "member_id", "")

    # -- assignment ---------------------------------------------------------------------------------

    async def assign(self, owned: list[tuple[str, PartitionId]], keep: bool = False) -> None:
        """Start delivering ``owned`` partitions (its membership calls it after a rebalance; ``keep``: an
        incremental one that keeps the partitions still owned)."""
        async with self._lock:
            if self._closed:
                return
            wanted = {TopicPartition(t, p) for t, p in owned if t in self.subscriptions}
            if keep:
                gone = [tp for tp in self.workers if tp not in wanted]
                if gone:
                    await self._stop_workers([self.workers.pop(tp) for tp in gone], commit=True)
                wanted -= set(self.workers)
            else:
                assert not self.workers, "eager rebalance: everything is revoked before a new assignment"
            stored = await self.offsets.load(self.storage_group, sorted(wanted))
            await self._start_workers(sorted(wanted), stored)
            self.stats.rebalances += 1
            self.assigned.set()

    async def start_partitions(self, tps: list[TopicPartition]) -> None:
        """Start workers for ``tps`` (cluster mode: claimed already) from their committed offsets."""
        async with self._lock:
            if self._closed:
                return
            wanted = {tp for tp in tps if tp.topic in self.subscriptions and tp not in self.workers}
            stored = await self.offsets.load(self.storage_group, sorted(wanted))
            await self._start_workers(sorted(wanted), stored)
            self.stats.rebalances += 1

    async def stop_partitions(self, tps: list[TopicPartition], commit: bool) -> None:
        """Stop the workers of ``tps`` (a listener call in progress finishes first), commit if asked."""
        async with self._lock:
            workers = [self.workers.pop(tp) for tp in tps if tp in self.workers]
            await self._stop_workers(workers, commit=commit)

    async def _start_workers(self, tps: list[TopicPartition], stored: dict[TopicPartition, int]) -> None:
        """Start the workers of ``tps`` from their stored offsets, else from the earliest or latest one.

        Every start position is known before the first worker starts, and those not stored are asked
        together (pipelined ListOffsets): with a thousand partitions, asking them one by one while the
        workers already started deliver took longer than the group's session timeout.
        """
        async def start_of(tp: TopicPartition) -> tuple[Partition, int, int]:
            part = await self._core.partition(tp.topic, tp.partition)
            start = stored.get(tp)
            if start is not None:
                return part, start, start
            resp = await read_request(self._core, tp.topic, part,
                                      m.ListOffsetsRequest(tp.topic, part.partition, m.LATEST_TIMESTAMP))
            earliest, latest = resp.log_start_offset, resp.log_end_offset
            return part, latest if self.config.consume_from_max_offset else earliest, -1

        starts = await asyncio.gather(*(start_of(tp) for tp in tps))
        for tp, (part, start, committed) in zip(tps, starts, strict=True):
            w = Worker(tp, part, self.subscriptions[tp.topic], start, start, committed,
                        PartitionContext(tp.topic, tp.partition))
            self.workers[tp] = w
            w.task = asyncio.ensure_future(self._run_worker(w))

    async def revoke(self, commit: bool) -> None:
        """Stop delivering every partition (its membership calls it before a rebalance), committing first if
        ``commit``."""
        async with self._lock:
            self.assigned.clear()
            workers = list(self.workers.values())
            self.workers.clear()
            await self._stop_workers(workers, commit=commit)

    async def _stop_workers(self, workers: list[Worker], commit: bool) -> None:
        for w in workers:
            w.stopping = True
            if not w.busy and w.task is not None:
                w.task.cancel()  # it is fetching or backing off: nothing of the listener's is lost
        tasks = [w.task for w in workers if w.task is not None]
        if tasks:
            # A listener call in progress finishes first (at most one message per partition).
            _done, pending = await asyncio.wait(tasks, timeout=self.config.rebalance_timeout_ms / 1000)
            for t in pending:
                log.warning("a listener did not return within the rebalance timeout; abandoning its partition")
                t.cancel()
        for w in workers:
            if w.conn is not None:
                w.conn.close()
        if commit:
            await self._commit(workers)

    # -- commits ------------------------------------------------------------------------------------

    async def _commit(self, workers: list[Worker] | None = None) -> None:
        ws = list(self.workers.values()) if workers is None else workers
        due = {w.tp: w.acked for w in ws if w.acked != w.committed and w.acked >= 0}
        if not due:
            return
        if not self.membership.may_fetch():
            # cluster mode, session in doubt: the partitions may have a new owner whose offsets we would rewind
            log.info("group %s: commit skipped: this member's ZooKeeper session is in doubt", self.config.group)
            return
        try:
            await self.offsets.commit(self.storage_group, due, generation=self.generation, member_id=self.member_id)
        except (UnknownMemberError, IllegalGenerationError, RebalanceInProgressError) as exc:
            log.warning("group %s: commit refused (%s): the partitions moved; what was consumed since the last "
                        "commit will be delivered again to their new owner", self.config.group, exc.name)
            return
        except (MetaqError, OSError) as exc:
            log.warning("group %s: commit failed: %s", self.config.group, exc)
            return
        self.stats.commits += 1
        for w in ws:
            if w.tp in due:
                w.committed = due[w.tp]

    async def commit(self) -> None:
        """Commit acknowledged offsets now (the commit period does it anyway)."""
        await self._commit()

    async def _commit_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.config.commit_offset_period_ms / 1000)
            await self._commit()  # what the workers running now acknowledged (each broker fences its own)

    # -- fetching -----------------------------------------------------------------------------------

    async def _fetch_connection(self, broker_id: int) -> BrokerConnection:
        """The one connection this consumer fetches a broker's partitions over (its group channel)."""
        conn = await self._core.connection(broker_id, self._channel)
        if conn.broker_id != broker_id:
            raise ConnectionClosedError(f"broker {broker_id} cannot be reached (its connection reached broker "
                                        f"{conn.broker_id})")
        return conn

    async def _fetch(self, w: Worker, max_bytes: int) -> FetchResult:
        cfg = self.config
        reads_slaves = self._core.reads_slaves_of(w.part.broker_id)
        if cfg.multi_fetch and not reads_slaves:
            broker_id = w.part.broker_id
            shared = await self._fetch_connection(broker_id)
            if shared.supports(MULTI_FETCH_API_KEY):
                fetcher = self.broker_fetchers.get(broker_id)
                if fetcher is None:
                    fetcher = self.broker_fetchers[broker_id] = BrokerFetcher(
                        self.fetcher, broker_id, lambda: self._fetch_connection(broker_id),
                        max_wait_ms=cfg.max_delay_fetch_ms if cfg.long_poll else 0, group=cfg.group)
                return await fetcher.fetch(w.tp.topic, w.part, w.position, max_bytes)
        wait = cfg.max_delay_fetch_ms if cfg.long_poll else 0
        # the master, or a slave (read_from); without either, the Fetcher uses the session's connection
        replica = self._core.read_replica(w.tp.topic, w.part) if wait or reads_slaves else None
        if wait and replica is not None and (w.conn is None or w.conn.closed or w.replica != replica):
            if w.conn is not None:
                w.conn.close()
                w.conn = None
            if w.replica is not None and w.replica != replica:
                log.info("%s: reading from %s from offset %d", w.tp, replica, w.position)
            # Long polls get a connection of their own: replies are ordered per connection.
            w.conn = await self._core.read_connection(replica, own=True)
            w.replica = replica
        conn = w.conn if wait else None
        return await self.fetcher.fetch(w.tp.topic, w.part, w.position, max_bytes=max_bytes, max_wait_ms=wait,
                                        group=cfg.group, connection=conn, replica=replica, columns=True)

    async def _run_worker(self, w: Worker) -> None:
        cfg = self.config
        max_bytes = w.sub.max_size
        growths = 0
        backoff = ERROR_RETRY.start()
        while not w.stopping:
            if not self.membership.may_fetch():
                await self.membership.wait_fetchable()
                continue
            try:
                result = await self._fetch(w, max_bytes)
            except OffsetOutOfRangeError as exc:
                earliest, latest = getattr(exc, "earliest", -1), getattr(exc, "latest", -1)
                if earliest < 0:
                    await asyncio.sleep(backoff.next_delay_unbounded_s())
                    continue
                new = earliest if w.position < earliest else latest
                log.warning("%s: offset %d is out of range %d..%d; continuing from %d", w.tp, w.position, earliest,
                            latest, new)
                w.position = w.acked = new
                continue
            except TooManyRequestsError:
                await asyncio.sleep(backoff.next_delay_unbounded_s())
                continue
            except CorruptRecordError as exc:
                # Never skip on our own: the operator decides (docs/operations.md). Consumption of this
                # partition stays at the damaged offset, retried now and then (the broker's copy may be
                # repaired, or the offset reset past it).
                resume = f"; skipping to offset {exc.resume_offset} would lose {exc.resume_offset - w.position} " \
                    "messages" if exc.resume_offset > w.position else ""
                log.error("%s: stored data is damaged at offset %d: %s%s; consumption of this partition is "
                          "stopped there (retrying every %.0fs; see `metaq admin verify`)", w.tp, w.position, exc,
                          resume, _DAMAGE_RETRY_S)
                if w.conn is not None:
                    w.conn.close()
                    w.conn = None
                await asyncio.sleep(_DAMAGE_RETRY_S)
                continue
            except (ConnectionClosedError, RequestTimeoutError, BrokerError) as exc:
                if isinstance(exc, BrokerError) and exc.refresh_metadata:
                    self._core.metadata.refresh_soon(w.tp.topic)
                if w.conn is not None:
                    w.conn.close()
                    w.conn = None
                delay = backoff.next_delay_unbounded_s()
                log.info("%s: fetch failed (%s); retrying in %.1fs", w.tp, exc, delay)
                await asyncio.sleep(delay)
                continue
            backoff.reset()
            if result.partial:
                if growths < cfg.max_increase_fetch_data_retries:
                    growths += 1
                    max_bytes *= 2
                    log.warning("%s: a message at offset %d is larger than max_size; fetching %d bytes", w.tp,
                                w.position, max_bytes)
                else:
                    log.error("%s: the message at offset %d is larger than %d bytes even after %d increases; "
                              "raise the subscription's max_size", w.tp, w.position, max_bytes, growths)
                    await asyncio.sleep(cfg.max_delay_fetch_ms / 1000)
                continue
            max_bytes, growths = w.sub.max_size, 0
            if not result.messages and not result.batches:
                if result.next_offset > w.position:  # a batch the server-side filter emptied
                    w.position = result.next_offset
                    if w.ctx.auto_ack:
                        self.delivery.ack(w)
                    continue
                w.empty_fetches += 1
                if not cfg.long_poll:
                    await asyncio.sleep(empty_fetch_delay_ms(w.empty_fetches, cfg.max_delay_fetch_ms) / 1000)
                continue
            w.empty_fetches = 0
            if not self.membership.may_fetch():
                continue  # fetched before the lease ran out: the partition may be someone else's now
            async with self._runners:
                if w.stopping:
                    return
                w.busy = True
                try:
                    await self.delivery.deliver(w, result)
                finally:
                    w.busy = False
            if w.retry_delay_s:  # a failed message: back off (a revoke may cancel this), then fetch it again
                delay, w.retry_delay_s = w.retry_delay_s, 0.0
                await self.retry_wait(delay)

    # -- recover store ------------------------------------------------------------------------------

    async def _recover_deliver(self, msg: Message) -> bool:
        sub = self.subscriptions.get(msg.topic)
        return sub is not None and await self.delivery.deliver_recovered(sub, msg)

    async def recover_now(self) -> int:
        """Offer every message of the recover store to its listener once; returns how many were accepted."""
        return await self.recover.recover_once(self._recover_deliver)

    async def _recover_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.config.recover_message_interval_ms / 1000)
            try:
                await self.recover_now()
            except Exception:  # the background recover must keep running
                log.exception("recover store: background recover failed")

    # -- inspection and shutdown --------------------------------------------------------------------

    def assignment(self) -> list[TopicPartition]:
        """The partitions this consumer owns now."""
        return sorted(self.workers)

    def positions(self) -> dict[TopicPartition, tuple[int, int, int]]:
        """partition -> (next offset to deliver, acknowledged up to, committed up to)."""
        return {tp: (w.position, w.acked, w.committed) for tp, w in self.workers.items()}

    async def close(self) -> None:
        """Stop fetching, let listener calls in progress finish, commit, leave the group. Idempotent."""
        if self._closed:
            return
        self._closed = True
        tasks = [t for t in (self._membership, *self._tasks) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await self.revoke(commit=True)
        if self._started:
            await self.membership.leave()
        for broker_id, fetcher in self.broker_fetchers.items():
            fetcher.close()
            conn = self._core.cached_connection(broker_id, self._channel)
            if conn is not None:
                conn.close()
        self.broker_fetchers.clear()
        if self._owns_storage:
            await self.offsets.close()
        self._threads.shutdown(wait=False)
        self.recover.close()
        if self.dead_letters is not None:
            await self.dead_letters.close()

    async def __aenter__(self) -> GroupConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def create_consumer(session: Any, config: ConsumerConfig, offset_storage: OffsetStorage | None = None, *,
                    recover_store: RecoverStore | None = None) -> GroupConsumer:
    """A listener consumer on a :class:`~metaq.client.session.MessageSessionFactory` (MetaQ's
    ``createConsumer(consumerConfig[, offsetStorage])``)."""
    core = session._core if hasattr(session, "_core") else session
    if not isinstance(core, ClientCore):
        raise InvalidArgument(f"create_consumer needs a MessageSessionFactory, not {session!r}")
    return GroupConsumer(core, config, offset_storage, recover_store=recover_store)


__all__ = ["ConsumerStats", "GroupConsumer", "Listener", "MessageIdLRU", "PartitionContext", "create_consumer"]
