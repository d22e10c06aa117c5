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

* standalone mode: the group is coordinated by the broker with the lowest id among the session's
  servers (:meth:`ClientCore.coordinator`); the member tells it, in every JoinGroup, which partitions it
  sees on the other brokers, and rejoins when that view changes;
* cluster mode (the session has a ZooKeeper registry): MetaQ's way, members, owner claims and offsets in
  ZooKeeper, each member computing the assignment (:class:`~metaq.client.group.membership.ZooKeeperMembership`).

Each owned partition has a worker task that fetches (long polling, or MetaQ's back-off when
``long_poll`` is off) and hands the batch to the listener *in offset order*. With ``multi_fetch`` (and a
broker that serves MultiFetch) the workers of one broker's partitions hand their fetches to that broker's
:class:`_BrokerFetcher`, which sends them together, in MultiFetch requests over ONE connection (the
group's own: heartbeats share it, since MultiFetch replies may overtake others) and long-polls on all of
them at once; each worker still gets only its partition's result, so delivery below is unchanged;
different partitions run in parallel, at most ``fetch_runner_count`` at once. An ``async def``
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

Failures: a listener that raises, or marks the message rollback-only, gets the message again right
away, up to ``max_fetch_retries`` more times (1 + max_fetch_retries deliveries in all, MetaQ's
maxFetchRetries); then the rejection policy takes it — ``skip`` (logged) or ``recover``: the local
:class:`~metaq.client.group.recover.RecoverStore` keeps it on disk and offers it to the listener again
every ``recover_message_interval_ms`` until accepted — and the partition moves on. ``dead-letter``
produces it to ``%DLQ%<group>`` (:mod:`~metaq.client.group.dead_letter`); the partition moves on only
once that produce is acknowledged, and waits (retrying) while it fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from metaq.client.consumer import (
    DEFAULT_MULTI_FETCH_MAX_BYTES,
    MULTI_FETCH_API_KEY,
    Fetcher,
    FetchResult,
    read_request,
)
from metaq.client.core import ClientCore
from metaq.client.exceptions import ClientClosedError
from metaq.client.group.config import ConsumerConfig
from metaq.client.group.dead_letter import DeadLetterSender
from metaq.client.group.filters import MessageFilter, as_predicate
from metaq.client.group.membership import BrokerMembership, Membership, ZooKeeperMembership, metaq_consumer_id
from metaq.client.group.offsets import (
    BrokerOffsetStorage,
    LocalFileOffsetStorage,
    OffsetStorage,
    ZooKeeperOffsetStorage,
)
from metaq.client.group.recover import RecoverStore
from metaq.client.metadata import Partition
from metaq.client.replicas import ReadReplica
from metaq.errors import (
    BrokerError,
    ConnectionClosedError,
    CorruptRecordError,
    IllegalGenerationError,
    InvalidArgument,
    MetaqError,
    NotCoordinatorError,
    OffsetOutOfRangeError,
    RebalanceInProgressError,
    RequestTimeoutError,
    TooManyRequestsError,
    UnknownMemberError,
)
from metaq.net.connection import BrokerConnection
from metaq.net.retry import RetryPolicy
from metaq.protocol import messages as m
from metaq.types import Message, PartitionId, TopicPartition, validate_topic

log = logging.getLogger("metaq.client.group")

Listener = Callable[..., Any]
"""``listener(message)`` or ``listener(message, ctx)``; a plain function or an ``async def``."""

_ERROR_RETRY = RetryPolicy(initial_delay_s=0.2, max_delay_s=5.0)
"""Joins and fetches that fail wait 0.2 s doubling up to 5 s, and retry until the consumer stops."""
_DAMAGE_RETRY_S = 30.0
"""How often a partition stopped at damaged stored data tries again (and logs the error again)."""


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
        self.auto_ack = bool(on)

    def ack(self) -> None:
        self._ack = True

    def rollback(self) -> None:
        self._rollback = True

    def set_rollback_only(self) -> None:
        self._rollback_only = True

    @property
    def rollback_only(self) -> bool:
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


def empty_fetch_delay_ms(empty_fetches: int, max_delay_ms: int) -> int:
    """MetaQ's back-off without long polling: each empty reply in a row adds a tenth of the max delay."""
    return min(max_delay_ms, empty_fetches * max_delay_ms // 10)


def _wants_ctx(listener: Listener) -> bool:
    try:
        params = list(inspect.signature(listener).parameters.values())
    except (TypeError, ValueError):
        return False
    # Parameters with defaults (``lambda msg, box=box: ...``) are the caller's own, not the context.
    required = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    return len(required) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)


def _is_async(listener: Listener) -> bool:
    return inspect.iscoroutinefunction(listener) or inspect.iscoroutinefunction(
        getattr(listener, "__call__", None))  # noqa: B004 - an object whose __call__ is async


@dataclass(eq=False)
class _Worker:
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


_CALL = "call"
_REJECT = "reject"
MULTI_FETCHES_IN_FLIGHT_MAX = 16
"""MultiFetch requests one consumer keeps in flight per broker; partitions asked meanwhile wait for one to
return. Several are needed: a long poll over idle partitions must not hold up a partition that was just
delivered and has more to read."""
MULTI_FETCH_PARTITIONS_PER_REQUEST = 2000
"""Partitions per MultiFetch request (more queued wait for the next)."""


class _BrokerFetcher:
    """The fetches of one broker's partitions, sent together as MultiFetch requests over one connection.

    A worker calls :meth:`fetch` and awaits its own partition's result. Partitions asked in the same
    event-loop step go in one request; while MULTI_FETCHES_IN_FLIGHT_MAX requests are out, more wait.
    A partition is in at most one request at a time (its worker waits for it), so per-partition order
    is kept. A failure of the whole request (the connection lost, a broker limit) is every worker's
    failure: each handles it as it would a single fetch's.
    """

    def __init__(self, consumer: GroupConsumer, broker_id: int) -> None:
        self.consumer = consumer
        self.broker_id = broker_id
        self.queue: list[tuple[_Worker, int, asyncio.Future[FetchResult]]] = []
        self.in_flight = 0
        self.requests = 0
        """MultiFetch requests sent (for tests and the benchmark)."""
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()

    def fetch(self, w: _Worker, max_bytes: int) -> asyncio.Future[FetchResult]:
        fut: asyncio.Future[FetchResult] = asyncio.get_running_loop().create_future()
        self.queue.append((w, max_bytes, fut))
        self._schedule()
        return fut

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._send)

    def _send(self) -> None:
        self._scheduled = False
        while self.queue and self.in_flight < MULTI_FETCHES_IN_FLIGHT_MAX:
            batch = [entry for entry in self.queue[:MULTI_FETCH_PARTITIONS_PER_REQUEST] if not entry[2].done()]
            del self.queue[:MULTI_FETCH_PARTITIONS_PER_REQUEST]
            if not batch:
                continue
            self.in_flight += 1
            task = asyncio.ensure_future(self._run(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: list[tuple[_Worker, int, asyncio.Future[FetchResult]]]) -> None:
        consumer = self.consumer
        cfg = consumer.config
        try:
            conn = await consumer._fetch_connection(self.broker_id)
            wanted = [(w.tp.topic, w.part, w.position, max_bytes) for w, max_bytes, _f in batch]
            self.requests += 1
            results = await consumer.fetcher.fetch_many(
                conn, wanted, max_wait_ms=cfg.max_delay_fetch_ms if cfg.long_poll else 0,
                max_bytes=max(DEFAULT_MULTI_FETCH_MAX_BYTES, max(m for _w, m, _f in batch)), group=cfg.group,
                columns=True)
        except Exception as exc:  # every worker of the batch handles it (retries, backs off)
            for _w, _m, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
                    fut.exception()  # a worker that gave up never retrieves it
            return
        finally:
            self.in_flight -= 1
            if self.queue:
                self._schedule()
        for (_w, _m, fut), result in zip(batch, results, strict=True):
            if fut.done():
                continue  # the worker stopped (its partition was revoked): nothing was delivered
            if isinstance(result, BaseException):
                fut.set_exception(result)
                fut.exception()
            else:
                fut.set_result(result)

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for _w, _m, fut in self.queue:
            if not fut.done():
                fut.cancel()
        self.queue.clear()


class GroupConsumer:
    """Create it with :func:`create_consumer`. See the module docstring for the delivery contract."""

    def __init__(self, core: ClientCore, config: ConsumerConfig, offset_storage: OffsetStorage | None = None,
                 *, recover_store: RecoverStore | None = None) -> None:
        self._core = core
        self.config = config
        registry = core.registry if not config.broadcast else None
        if registry is not None:
            self.consumer_id = config.consumer_id or metaq_consumer_id(
                config.group, socket.gethostname(), int(time.time() * 1000), random.getrandbits(24))
        else:
            self.consumer_id = config.consumer_id or (socket.gethostname() if config.broadcast
                                                      else core.config.client_id)
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
        """Who decides what this consumer owns: the broker coordinator, or ZooKeeper in cluster mode."""
        if registry is not None:
            def partitions_of(topic: str) -> list[PartitionId]:
                return registry.snapshot().partitions(topic, publish=False)

            self.membership = ZooKeeperMembership(self, registry, partitions_of,
                                                  core.config.zk_session_timeout_ms / 1000)
        else:
            self.membership = BrokerMembership(self)
        if isinstance(offset_storage, BrokerOffsetStorage):
            offset_storage.bind(self._group_request)
        self.storage_group = f"{config.group}-{self.consumer_id}" if config.broadcast else config.group
        """The key offsets are stored under: the group, or group-consumerId for a broadcast member."""
        self.recover = recover_store or RecoverStore(config.recover_dir, self.storage_group)
        self.dead_letters = DeadLetterSender(core, config.group, config.dead_letter_partitions) \
            if config.rejection_policy == "dead-letter" else None
        """The ``dead-letter`` rejection policy's producer (None under the other policies)."""
        self.fetcher = Fetcher(core)
        self.subscriptions: dict[str, Subscription] = {}
        self.workers: dict[TopicPartition, _Worker] = {}
        self.broker_fetchers: dict[int, _BrokerFetcher] = {}
        """MultiFetch batching per broker id (``multi_fetch``)."""
        self.stats = ConsumerStats()
        self.dedup = MessageIdLRU(config.dedup_window)
        self._dedup_high: dict[TopicPartition, int] = {}
        """Per partition, past every offset whose id this consumer put in ``dedup``: a message at or past it
        cannot be a redelivery of one acknowledged here, so the LRU is not asked about it."""
        self.generation = m.NO_GENERATION
        self.member_id = ""
        self._coordinator: int | None = None
        self._coordinator_known = False
        self._reported: dict[str, tuple[PartitionId, ...]] = {}
        """The partitions the last JoinGroup reported, per topic."""
        self._runners = asyncio.Semaphore(config.fetch_runner_count)
        self._threads = ThreadPoolExecutor(max_workers=config.fetch_runner_count, thread_name_prefix="metaq-listener")
        self._tasks: list[asyncio.Task[None]] = []
        self._membership: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._started = False
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.assigned = asyncio.Event()
        """Set whenever the consumer holds a current assignment (possibly empty); cleared while rebalancing."""

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
        self.subscriptions[topic] = Subscription(topic, max_size, listener, predicate, _is_async(listener),
                                                 _wants_ctx(listener))
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

    # -- group membership ---------------------------------------------------------------------------

    @property
    def _channel(self) -> str:
        return f"group:{id(self)}"

    async def _group_request(self, request: Any, timeout_s: float | None = None) -> Any:
        """A request to the group's coordinator (the lowest broker id among the servers)."""
        if not self._coordinator_known:
            self._coordinator = await self._core.coordinator()
            self._coordinator_known = True
        conn = await self._core.connection(self._coordinator, self._channel)
        if self._coordinator is not None and conn.broker_id != self._coordinator:
            # the default broker's connection failed over to another server: that broker does not
            # coordinate this group, and answering it would split the group in two
            raise ConnectionClosedError(f"broker {self._coordinator}, the group's coordinator, cannot be reached")
        return await conn.request(request, timeout_s)

    def _coordinator_id(self) -> int:
        return self._core.default_broker_id if self._coordinator is None else self._coordinator

    async def _view(self, fresh: bool) -> dict[str, tuple[PartitionId, ...]]:
        """The subscribed topics' partitions as this member's metadata has them (``fresh``: asked now,
        else the cache, refreshed in the background when old)."""
        out: dict[str, tuple[PartitionId, ...]] = {}
        for topic in sorted(self.subscriptions):
            tm = None
            if fresh:
                with contextlib.suppress(ConnectionClosedError, RequestTimeoutError, BrokerError):
                    tm = await self._core.metadata.topic(topic)
            else:
                tm = self._core.metadata.cached(topic)
                if tm is None:  # forgotten (a topic created or deleted through this session): ask again
                    self._core.metadata.refresh_soon(topic)
            out[topic] = tuple(p.id for p in tm.partitions) if tm is not None else self._reported.get(topic, ())
        return out

    def _others(self, view: dict[str, tuple[PartitionId, ...]]) -> dict[str, tuple[PartitionId, ...]]:
        """The part of a view the coordinator learns only from its members: other brokers' partitions."""
        coordinator = self._coordinator_id()
        return {t: tuple(p for p in ps if p.broker_id != coordinator) for t, ps in view.items()}

    async def _group_loop(self) -> None:
        cfg = self.config
        backoff = _ERROR_RETRY.start()
        while not self._closed:
            self._reported = await self._view(fresh=True)
            seen = [m.TopicAssignment(t, [m.BrokerPartition(p.broker_id, p.partition) for p in ps])
                    for t, ps in self._reported.items()]
            req = m.JoinGroupRequest(cfg.group, self.member_id, self.consumer_id, cfg.session_timeout_ms,
                                     cfg.rebalance_timeout_ms, sorted(self.subscriptions), cfg.load_balance_strategy,
                                     seen)
            try:
                resp: m.JoinGroupResponse = await self._group_request(
                    req, cfg.rebalance_timeout_ms / 1000 + self._core.config.request_timeout_s)
            except UnknownMemberError:
                self.member_id = ""
                continue
            except (RebalanceInProgressError, NotCoordinatorError, ConnectionClosedError, RequestTimeoutError) as exc:
                log.info("group %s: join failed (%s); retrying", cfg.group, exc)
                await asyncio.sleep(backoff.next_delay_unbounded_s())
                continue
            backoff.reset()
            self.member_id, self.generation = resp.member_id, resp.generation
            owned = [(a.topic, PartitionId(p.broker_id, p.partition)) for a in resp.assignment for p in a.partitions]
            log.info("group %s: member %s generation %d owns %d partitions", cfg.group, self.member_id,
                     self.generation, len(owned))
            try:
                await self._assign(owned)
            except MetaqError as exc:
                log.warning("group %s: cannot start consuming the assignment (%s); rejoining", cfg.group, exc)
                await asyncio.shield(self._revoke(commit=False))
                await asyncio.sleep(backoff.next_delay_unbounded_s())
                continue
            await self._heartbeat_until_rebalance()

    async def _heartbeat_until_rebalance(self) -> None:
        cfg = self.config
        last_ok = time.monotonic()
        while not self._closed:
            await asyncio.sleep(cfg.heartbeat_ms / 1000)
            try:
                await self._group_request(m.HeartbeatRequest(cfg.group, self.generation, self.member_id))
                if self._others(await self._view(fresh=False)) != self._others(self._reported):
                    # Another broker's partitions changed (it came, went, or grew): only the members can
                    # tell a standalone coordinator, by rejoining with what they see now.
                    log.info("group %s: the partitions on other brokers changed; committing and rejoining",
                             cfg.group)
                    await asyncio.shield(self._revoke(commit=True))
                    return
            except (RebalanceInProgressError, IllegalGenerationError) as exc:
                log.info("group %s: rebalance (%s): committing and giving partitions up", cfg.group, exc.name)
                await asyncio.shield(self._revoke(commit=True))
                return
            except UnknownMemberError:
                log.warning("group %s: member %s was dropped from the group (session timeout?)", cfg.group,
                            self.member_id)
                await asyncio.shield(self._revoke(commit=False))
                self.member_id = ""
                return
            except (ConnectionClosedError, RequestTimeoutError, NotCoordinatorError) as exc:
                if time.monotonic() - last_ok > cfg.session_timeout_ms / 1000:
                    # Safe mode: the coordinator has surely given our partitions to others by now.
                    log.warning("group %s: no heartbeat for a session timeout (%s); giving partitions up",
                                cfg.group, exc)
                    await asyncio.shield(self._revoke(commit=False))
                    return
                continue
            last_ok = time.monotonic()

    async def _leave_group(self) -> None:
        """Standalone mode's leave: LeaveGroup to the coordinator, then its connection closes."""
        if self.member_id and not self.config.broadcast:
            with contextlib.suppress(MetaqError):
                await self._group_request(m.LeaveGroupRequest(self.config.group, self.member_id))
        conn = self._core.cached_connection(self._coordinator_id(), self._channel) \
            if self._coordinator_known else None
        if conn is not None:
            conn.close()

    async def _broadcast_loop(self) -> None:
        """Every partition of every subscribed topic; new partitions are picked up as they appear."""
        while not self._closed:
            try:
                owned: list[tuple[str, PartitionId]] = []
                for topic in sorted(self.subscriptions):
                    tm = await self._core.metadata.refresh_topic(topic)
                    owned += [(topic, p.id) for p in tm.partitions]
                if set(owned) != {(tp.topic, tp.partition) for tp in self.workers} or not self.assigned.is_set():
                    await self._assign(owned, keep=True)
            except (ConnectionClosedError, RequestTimeoutError, BrokerError) as exc:
                log.info("broadcast consumer %s: metadata refresh failed (%s)", self.consumer_id, exc)
            await asyncio.sleep(max(self.config.heartbeat_ms, 1000) / 1000)

    # -- assignment ---------------------------------------------------------------------------------

    async def _assign(self, owned: list[tuple[str, PartitionId]], keep: bool = False) -> None:
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

    async def _start_partitions(self, tps: list[TopicPartition]) -> None:
        """Start workers for ``tps`` (cluster mode: claimed already) from their committed offsets."""
        async with self._lock:
            if self._closed:
                return
            wanted = {tp for tp in tps if tp.topic in self.subscriptions and tp not in self.workers}
            stored = await self.offsets.load(self.storage_group, sorted(wanted))
            await self._start_workers(sorted(wanted), stored)
            self.stats.rebalances += 1

    async def _stop_partitions(self, tps: list[TopicPartition], commit: bool) -> None:
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
            w = _Worker(tp, part, self.subscriptions[tp.topic], start, start, committed,
                        PartitionContext(tp.topic, tp.partition))
            self.workers[tp] = w
            w.task = asyncio.ensure_future(self._run_worker(w))

    async def _revoke(self, commit: bool) -> None:
        async with self._lock:
            self.assigned.clear()
            workers = list(self.workers.values())
            self.workers.clear()
            await self._stop_workers(workers, commit=commit)

    async def _stop_workers(self, workers: list[_Worker], commit: bool) -> None:
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

    async def _commit(self, workers: list[_Worker] | None = None) -> None:
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
            if self.assigned.is_set():
                await self._commit()

    # -- fetching -----------------------------------------------------------------------------------

    async def _fetch_connection(self, broker_id: int) -> BrokerConnection:
        """The one connection this consumer fetches a broker's partitions over (its group channel)."""
        conn = await self._core.connection(broker_id, self._channel)
        if conn.broker_id != broker_id:
            raise ConnectionClosedError(f"broker {broker_id} cannot be reached (its connection reached broker "
                                        f"{conn.broker_id})")
        return conn

    async def _fetch(self, w: _Worker, max_bytes: int) -> FetchResult:
        cfg = self.config
        reads_slaves = self._core.reads_slaves_of(w.part.broker_id)
        if cfg.multi_fetch and not reads_slaves:
            broker_id = w.part.broker_id
            shared = await self._fetch_connection(broker_id)
            if shared.supports(MULTI_FETCH_API_KEY):
                fetcher = self.broker_fetchers.get(broker_id)
                if fetcher is None:
                    fetcher = self.broker_fetchers[broker_id] = _BrokerFetcher(self, broker_id)
                return await fetcher.fetch(w, max_bytes)
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

    async def _run_worker(self, w: _Worker) -> None:
        cfg = self.config
        max_bytes = w.sub.max_size
        growths = 0
        backoff = _ERROR_RETRY.start()
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
                        self._ack(w)
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
                    if w.sub.is_async:
                        await self._deliver_async(w, result)
                    else:
                        await self._deliver_in_thread(w, result)
                finally:
                    w.busy = False

    # -- delivering ---------------------------------------------------------------------------------

    def _steps(self, w: _Worker, result: FetchResult) -> Generator[tuple[str, Message], BaseException | None, None]:
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

    def _batch_steps(self, w: _Worker, result: FetchResult,
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
        dedup_below = self._dedup_high.get(w.tp, 0)
        msg = next(items, None)
        while msg is not None:
            if w.stopping or not self.membership.may_fetch():
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
                    self._ack(w, acked_ids)
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
                if not ctx.auto_ack:
                    self._rollback(w)  # a failure inside a transaction rolls it back
                    return
                continue  # deliver the same message again
            del w.retries[msg.offset]
            w.last_error = error
            if (yield (_REJECT, msg)) is not None:
                return  # not dead-lettered before the partition was given up: its next owner gets it again
            self.stats.rejected += 1
            w.position = msg.offset + 1
            if ctx.auto_ack:
                self._ack(w, acked_ids)
            msg = next(items, None)
        if not w.stopping and result.next_offset > w.position and last_offset >= 0 and w.position > last_offset:
            # trailing messages the server-side filter removed
            w.position = result.next_offset
            if ctx.auto_ack:
                self._ack(w, acked_ids)

    def _advance(self, w: _Worker, msg: Message, acked_ids: list[int] | None = None) -> None:
        """Past a message the listener never sees (filtered out, or a duplicate)."""
        w.position = msg.offset + 1
        if w.ctx.auto_ack:
            self._ack(w, acked_ids)

    def _ack(self, w: _Worker, acked_ids: list[int] | None = None) -> None:
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
            if w.acked > self._dedup_high.get(w.tp, 0):
                self._dedup_high[w.tp] = w.acked

    def _rollback(self, w: _Worker) -> None:
        self.stats.rollbacks += 1
        w.position = w.acked
        w.txn_ids.clear()

    async def _reject(self, w: _Worker, msg: Message) -> BaseException | None:
        """Apply the rejection policy; an exception (sent into :meth:`_steps`) if the message must stay."""
        if self.dead_letters is not None:
            sent = await self.dead_letters.send(msg, w.last_error, self.config.max_fetch_retries + 1,
                                                lambda: w.stopping or self._closed)
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

    async def _deliver_async(self, w: _Worker, result: FetchResult) -> None:
        steps = self._steps(w, result)
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

    async def _deliver_in_thread(self, w: _Worker, result: FetchResult) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._threads, self._deliver_sync, w, result, loop)

    def _deliver_sync(self, w: _Worker, result: FetchResult, loop: asyncio.AbstractEventLoop) -> None:
        steps = self._steps(w, result)
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

    # -- recover store ------------------------------------------------------------------------------

    async def _recover_deliver(self, msg: Message) -> bool:
        sub = self.subscriptions.get(msg.topic)
        if sub is None:
            return False
        ctx = PartitionContext(msg.topic, msg.partition_id)
        ctx._begin(msg)
        args = (msg, ctx) if sub.wants_ctx else (msg,)
        if sub.is_async:
            await sub.listener(*args)
        else:
            await asyncio.get_running_loop().run_in_executor(self._threads, lambda: sub.listener(*args))
        if ctx.rollback_only:
            return False
        self.stats.recovered += 1
        return True

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
        await self._revoke(commit=True)
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
