"""How a group consumer learns which partitions it owns: the seam between membership and delivery.

The :class:`~metaq.client.group.consumer.GroupConsumer` owns the workers (fetch, deliver, acknowledge,
commit); a :class:`Membership` decides which partitions they run and when they may fetch, driving the
consumer through the :class:`GroupSide` it offers:

* :class:`~metaq.client.group.standalone.BrokerMembership` (standalone mode): the brokers coordinate
  the group (JoinGroup / Heartbeat / LeaveGroup).
* :class:`~metaq.client.group.standalone.BroadcastMembership`: every member owns every partition.
* :class:`ZooKeeperMembership` (cluster mode, ``session.registry`` set): MetaQ's way, no coordinator.

Cluster mode, MetaQ's way
-------------------------
Each member registers ``<root>/consumers/<group>/ids/<consumerId>`` (ephemeral, its topics) and
watches the group's members and the subscribed topics' partitions (brokers joining or leaving). Any
change cues a *rebalance*; a burst of changes is coalesced into one. Every member computes the same
assignment with the same function (:func:`metaq.cluster.assignment.assign_topics`, the strategy of the
config) from the members and the partitions of the cached cluster snapshot, then:

1. stops the workers of the partitions it loses, commits their offsets and deletes its
   ``owners/<topic>/<brokerId-partition>`` nodes;
2. claims each partition it gains (an ephemeral owner node holding its consumer id) **before** a
   worker fetches it. A partition still held by its previous owner (which has not rebalanced yet, or
   was killed and its session has not expired) is retried with back-off until it is released; a new
   cue meanwhile starts the rebalance over.

Fetch lease: a member fetches only while it is sure its session (and so its claims) is alive: each
successful round trip to ZooKeeper (every third of the session timeout) extends the lease to two
thirds of the session timeout after the request was *sent*, which the server's own expiry cannot
precede. A process paused past its session timeout (SIGSTOP, a long GC, a frozen VM) therefore fetches
and commits nothing when it wakes until ZooKeeper confirms the session; if the session expired, it
gives up every partition without committing (its claims died with the session) and rebalances.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from metaq.client.group.config import ConsumerConfig
from metaq.cluster.assignment import assign_topics
from metaq.cluster.registry import GroupRegistry
from metaq.net.retry import RetryPolicy, wait_event
from metaq.types import PartitionId, TopicPartition

log = logging.getLogger("metaq.client.group")

COALESCE_S = 0.02
"""After a cue, wait this long for more (a broker's topics arrive as several znode events)."""
_CLAIM_RETRY = RetryPolicy(initial_delay_s=0.02, max_delay_s=1.0)
ERROR_RETRY = RetryPolicy(initial_delay_s=0.2, max_delay_s=5.0)
"""Joins, registrations and fetches that fail wait 0.2 s doubling up to 5 s, and retry until the consumer stops."""


class GroupSide(Protocol):
    """What a membership drives: the consumer's workers, started and stopped per partition."""

    config: ConsumerConfig
    consumer_id: str
    assigned: asyncio.Event
    """Set whenever the consumer holds a current assignment (possibly empty); cleared while rebalancing."""

    @property
    def subscriptions(self) -> Mapping[str, Any]:
        """The subscribed topics."""

    @property
    def workers(self) -> Mapping[TopicPartition, Any]:
        """The partitions being consumed now."""

    @property
    def closed(self) -> bool:
        """True once the consumer is closing: loops end."""

    async def assign(self, owned: list[tuple[str, PartitionId]], keep: bool = False) -> None:
        """Consume exactly ``owned`` (``keep``: stop only what is no longer owned; else nothing runs yet)."""

    async def revoke(self, commit: bool) -> None:
        """Stop every worker (a listener call in progress finishes first), commit if asked."""

    async def start_partitions(self, tps: list[TopicPartition]) -> None:
        """Start consuming ``tps`` from their committed offsets."""

    async def stop_partitions(self, tps: list[TopicPartition], commit: bool) -> None:
        """Stop consuming ``tps``, commit if asked."""


class Membership(abc.ABC):
    """Runs the group's side of a consumer: which partitions it owns, and whether it may fetch now."""

    @abc.abstractmethod
    async def run(self) -> None:
        """Join and follow the group until cancelled."""

    @abc.abstractmethod
    async def leave(self) -> None:
        """After the consumer stopped its workers and committed: leave the group (close)."""

    def may_fetch(self) -> bool:
        """False while this member cannot be sure it still owns its partitions: fetch nothing, commit nothing."""
        return True

    async def wait_fetchable(self) -> None:  # noqa: B027 - optional hook: fetching is always allowed here
        """Return when :meth:`may_fetch` holds (a worker waits here rather than fetch unowned data)."""


def metaq_consumer_id(group: str, host: str, now_ms: int, rand: int) -> str:
    """MetaQ's consumer id shape: ``<group>_<host>-<time ms>-<random>`` (unique per process start)."""
    return f"{group}_{host}-{now_ms}-{rand:06x}"


class ZooKeeperMembership(Membership):
    """Cluster mode: members, owners and rebalancing through a :class:`GroupRegistry` (see the module docstring)."""

    def __init__(self, consumer: GroupSide, registry: GroupRegistry,
                 partitions_of: Callable[[str], list[PartitionId]], session_timeout_s: float) -> None:
        self.consumer = consumer
        self.registry = registry
        self.partitions_of = partitions_of
        """topic -> its partitions serving consumers now (the watched snapshot; no I/O)."""
        self.session_timeout_s = session_timeout_s
        self.group = consumer.config.group
        self.consumer_id = consumer.consumer_id
        self.claimed: set[TopicPartition] = set()
        """Partitions whose owner node this member holds (a worker runs only for these)."""
        self.rebalances = 0
        self.settled_at: float | None = None
        """time.monotonic() when the last rebalance finished: every partition of the plan claimed and
        fetching (None while one is in progress)."""
        self.cued_at: float | None = None
        """time.monotonic() of the first cue of the rebalance in progress."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cue = asyncio.Event()
        self._renew = asyncio.Event()
        self._renewed = asyncio.Event()
        self._lease_until = 0.0
        self._session_lost = False
        self._closed = False
        self._lease_task: asyncio.Task[None] | None = None
        self._zk = ThreadPoolExecutor(1, thread_name_prefix="metaq-group-zk")
        """Registrations, claims and releases run in order on one thread: a claim still running when the
        consumer closes is done before the leave's releases, so none is left behind."""

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._zk, fn, *args)

    # -- cues from the registry's threads (never block there) ---------------------------------------

    def _hop(self, fn: Callable[[], None]) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed() and not self._closed:
            with contextlib.suppress(RuntimeError):  # the loop is closing
                loop.call_soon_threadsafe(fn)

    def _poke(self) -> None:
        self._hop(self._cue_now)

    def _cue_now(self) -> None:
        if self.cued_at is None:
            self.cued_at = time.monotonic()
        self.settled_at = None
        self._cue.set()

    def _on_session(self, state: str) -> None:
        if state == "lost":
            self._hop(self._lost)
        elif state == "connected":
            self._hop(self._renew.set)

    def _lost(self) -> None:
        log.warning("group %s: %s's ZooKeeper session expired: its claims are gone; it stops fetching and "
                    "rebalances", self.group, self.consumer_id)
        self._session_lost = True
        self._lease_until = 0.0
        self._cue_now()

    # -- the fetch lease ----------------------------------------------------------------------------

    def may_fetch(self) -> bool:
        return not self._session_lost and time.monotonic() < self._lease_until

    async def wait_fetchable(self) -> None:
        while not self.may_fetch():
            self._renewed.clear()
            self._renew.set()
            await self._renewed.wait()

    async def _lease_loop(self) -> None:
        period = self.session_timeout_s / 3
        backoff = ERROR_RETRY.start()
        while not self._closed:
            await wait_event(self._renew, period)
            self._renew.clear()
            sent = time.monotonic()
            try:
                ok = await asyncio.to_thread(self.registry.alive, self.group, self.consumer_id)
            except Exception as exc:  # ZooKeeper unreachable: the lease runs out, fetching pauses
                log.info("group %s: cannot renew the fetch lease (%s)", self.group, exc)
                await asyncio.sleep(backoff.next_delay_unbounded_s())
                continue
            backoff.reset()
            if ok and not self._session_lost:
                self._lease_until = sent + self.session_timeout_s * 2 / 3
                self._renewed.set()
            elif not ok:
                self._cue_now()  # our member node is gone: register again

    # -- the loop -----------------------------------------------------------------------------------

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        topics = sorted(self.consumer.subscriptions)
        self.registry.add_session_listener(self._on_session)
        self._lease_task = asyncio.ensure_future(self._lease_loop())
        backoff = ERROR_RETRY.start()
        while True:
            try:
                sent = time.monotonic()
                await self._call(self._join, topics)
                self._lease_until = sent + self.session_timeout_s * 2 / 3
                break
            except Exception as exc:
                log.warning("group %s: cannot register in ZooKeeper (%s); retrying", self.group, exc)
                await asyncio.sleep(backoff.next_delay_unbounded_s())
        self._cue_now()
        while True:
            await self._cue.wait()
            await asyncio.sleep(COALESCE_S)  # coalesce a burst of cues into one rebalance
            self._cue.clear()
            try:
                done = await self._rebalance(topics)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                delay = backoff.next_delay_unbounded_s()
                log.warning("group %s: rebalance failed (%s); again in %.1fs", self.group, exc, delay)
                await asyncio.sleep(delay)
                self._cue.set()
                continue
            backoff.reset()
            if done:
                self.settled_at = time.monotonic()
                took = self.settled_at - (self.cued_at or self.settled_at)
                self.cued_at = None
                self.rebalances += 1
                log.info("group %s: %s owns %d partitions (rebalanced in %.3fs)", self.group, self.consumer_id,
                         len(self.claimed), took)

    def _join(self, topics: list[str]) -> None:
        self.registry.register_member(self.group, self.consumer_id, topics)
        self.registry.watch_members(self.group, self._poke)
        for topic in topics:
            self.registry.watch_topic_partitions(topic, self._poke)

    def plan(self, members: dict[str, list[str]]) -> set[TopicPartition]:
        """What this member owns when ``members`` (consumer id -> topics) share the partitions."""
        subscribed = set(self.consumer.subscriptions)
        split = assign_topics(self.consumer.config.load_balance_strategy, members, self.partitions_of)
        return {TopicPartition(t, p) for t, ps in split.get(self.consumer_id, {}).items() if t in subscribed
                for p in ps}

    async def _rebalance(self, topics: list[str]) -> bool:
        """One rebalance; False when a new cue interrupted the claims (the loop starts over)."""
        c = self.consumer
        if self._session_lost:
            # Our owner nodes died with the session and others may fetch those partitions now: stop
            # without committing (a stale offset would rewind the new owner).
            await c.stop_partitions(sorted(self.claimed), commit=False)
            self.claimed.clear()
            await self._call(self.registry.register_member, self.group, self.consumer_id, topics)
            self._session_lost = False
            self._renew.set()
        members = await self._call(self.registry.members, self.group)
        if self.consumer_id not in members:
            await self._call(self.registry.register_member, self.group, self.consumer_id, topics)
            members[self.consumer_id] = topics
        mine = self.plan(members)
        lost = sorted(self.claimed - mine)
        if lost:
            await c.stop_partitions(lost, commit=True)
            for tp in lost:
                await self._call(self.registry.release, self.group, tp.topic, tp.partition, self.consumer_id)
                self.claimed.discard(tp)
        pending = sorted(mine - self.claimed)
        backoff = _CLAIM_RETRY.start()
        while pending:
            got = [tp for tp in pending if await self._call(
                self.registry.claim, self.group, tp.topic, tp.partition, self.consumer_id)]
            if got:
                self.claimed.update(got)
                try:
                    await c.start_partitions(got)
                except Exception:
                    # cannot start them (their broker does not answer): give the claims back for now
                    await c.stop_partitions(got, commit=False)
                    for tp in got:
                        await self._call(self.registry.release, self.group, tp.topic, tp.partition,
                                         self.consumer_id)
                        self.claimed.discard(tp)
                    raise
            pending = [tp for tp in pending if tp not in self.claimed]
            if pending:
                if self._cue.is_set():
                    return False
                log.debug("group %s: %d partitions still held by their previous owners; retrying", self.group,
                          len(pending))
                await wait_event(self._cue, backoff.next_delay_unbounded_s())
                if self._cue.is_set():
                    return False
        c.assigned.set()
        return True

    async def leave(self) -> None:
        """Release every claim, then the member node (MetaQ's order: offsets were committed already)."""
        self._closed = True
        if self._lease_task is not None:
            self._lease_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._lease_task
        self.registry.remove_session_listener(self._on_session)
        claimed = sorted(self.claimed)
        self.claimed.clear()

        def drop() -> None:
            for tp in claimed:
                self.registry.release(self.group, tp.topic, tp.partition, self.consumer_id)
            self.registry.release_all(self.group, self.consumer_id)  # a claim the cancelled rebalance made
            self.registry.unregister_member(self.group, self.consumer_id)

        try:
            await self._call(drop)
        except Exception as exc:  # ZooKeeper unreachable: the session's end removes them anyway
            log.warning("group %s: cannot leave cleanly (%s); the session's end releases the claims", self.group, exc)
        finally:
            self._zk.shutdown(wait=False)
