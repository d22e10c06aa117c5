"""Which partition a message goes to, and its partition's open batch (docs/producer.md).

:meth:`Placement.place` is every send's way in: the selector picks a partition among the topic's partitions
(round robin, sticky and random: the ones reachable now; key hash and custom selectors: the topic's key space,
so a key keeps its partition while its master is down), and :meth:`Placement.join` puts the message into that
partition's open batch -- the one place where a message joins a batch. A topic whose metadata is not known
yet, or with no partition open or reachable (a master being handed over), has its messages held, in order,
until it is or their deadline passes (:class:`~metaq.client.producer.holding.Holding`). Sealed batches go to the
:class:`~metaq.client.producer.sender.Sender`.

A topic's partitions are kept between sends (:attr:`Placement.hot`) until anything they depend on changes:
the metadata (its listeners), the partitions left out after a failure, or :data:`HOT_KEEP_S` in any case
(so a stale entry is still refreshed). In cluster mode a send refused because every partition is closed waits
too: that is how a master's handover looks for a moment.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
from collections.abc import Callable, Sequence
from typing import Any

from metaq.client.config import ProducerConfig
from metaq.client.core import ClientCore
from metaq.client.delayed import delayed_headers
from metaq.client.metadata import Partition, TopicMetadata
from metaq.client.producer.batches import Accumulator, BatchKey, BufferLimit, ProducerBatch
from metaq.client.producer.holding import Holding
from metaq.client.producer.plain_run import PlainRun
from metaq.client.producer.results import ManyTable
from metaq.client.producer.sender import Sender
from metaq.client.selectors import RoundRobinSelector, promises
from metaq.errors import InvalidArgument, MetaqError, PartitionClosedError
from metaq.protocol.messages import ANY_PARTITION
from metaq.protocol.records import HEADER_BYTES, RECORD_OVERHEAD_BYTES
from metaq.types import Message

DEFERRED_MAX = 1024
"""Deferred messages placed at once at most: more are placed as they come, so a long burst in one loop step keeps
a short list (its messages leave memory as their payloads join batches, and stay in the caches meanwhile)."""
DEFERRED_PARTITIONS_MAX = 64
"""Topics with more partitions than this are placed message by message: a run of round robin's is spread so
thin over many partitions that placing it a partition at a time costs more than one at a time."""

HOT_KEEP_S = 0.1
"""How long a topic's partitions stay kept between sends when nothing changes: a message sent one per event-loop
iteration (from a request handler, say) skips the lookup too, and the metadata's age is still looked at (a
background refresh started when stale) at least this often."""

class Placement:
    """The selector, the open batches and the messages held before they join one."""

    def __init__(self, core: ClientCore, config: ProducerConfig, selector: Any, sender: Sender, buffer: BufferLimit,
                 manys: ManyTable) -> None:
        self._core = core
        self.config = config
        self.selector = selector
        self._sender = sender
        self._buffer = buffer
        self._manys = manys
        self._loop = asyncio.get_running_loop()
        self._delivery_s = config.delivery_timeout_ms / 1000.0
        self.acc = Accumulator(batch_bytes=config.batch_bytes, max_message_bytes=config.max_message_bytes,
                               delivery_timeout_s=self._delivery_s, clock=self._loop.time)
        self._opens_for = min(config.max_message_bytes, config.batch_bytes - HEADER_BYTES)
        """The largest record :meth:`place_one` opens a batch for (a larger one: :meth:`join` decides)."""
        self._reroutable = bool(getattr(selector, "reroutable", False))
        """Round robin, sticky and random choose among the partitions reachable now; key hash and custom
        selectors over the key space (metaq.client.routing, docs/producer.md)."""
        self._batch_done: Callable[[str, int, int], object] | None = getattr(selector, "batch_done", None)
        self._stays = promises(selector, "stays", False) and self._batch_done is not None
        """A sticky selector: its choice for a topic stays until its batch there is done (selectors.py)."""
        self._filling: dict[str, ProducerBatch] = {}
        """Under a sticky selector, topic -> the open batch its plain messages join now (:meth:`place_one`): used,
        instead of asking the selector again, while it is still open and the topic kept (:attr:`hot` unchanged)."""
        self.hot: dict[str, Sequence[Partition]] = {}
        self.deferrable: set[str] = set()
        """The kept topics whose plain messages :attr:`run` takes (the round robin, few partitions)."""
        """topic -> the partitions its messages choose from, as :meth:`place` found them (see the module docstring)."""
        self._hot_reset: asyncio.Handle | None = None
        self._usable: dict[str, tuple[Sequence[Partition], int, Sequence[Partition]]] = {}
        """topic -> (metadata's partitions, Unavailable version, the usable ones): recomputed only when either
        changes, so the hot path does not filter per message."""
        self.holding = Holding(core, config, sender, buffer, manys, self._route, self._choices, self._forget,
                               lambda: self.closing)
        """The messages waiting for their topic's metadata or for an open partition, in send order."""
        self._timer: asyncio.TimerHandle | asyncio.Handle | None = None
        self._timer_when = 0.0
        self.closing = False
        self.defers = type(selector) is RoundRobinSelector
        """The default round robin: a plain message of a kept topic is placed with the others of its event-loop
        step, at the step's end (:meth:`defer`)."""
        self.runs = not promises(selector, "reads_message", True)
        """The selector never looks at the message: a plain message of a kept topic goes through :attr:`run` (the
        checks and its future in one call), then to :meth:`place_one` without one."""
        self.run = PlainRun(Message, self.deferrable, self.hot, buffer, self._loop.create_future, self._run_started,
                            self.place_deferred, self.place_one, config.acks, config.max_message_bytes, DEFERRED_MAX,
                            RECORD_OVERHEAD_BYTES)
        """The round robin's plain messages of a kept topic: ``Producer.send_async`` and ``send_oneway`` hand them to
        it (plain_run.py). A deferrable topic's are kept, placed at the end of the event-loop step
        (:meth:`place_deferred`); another kept topic's are placed as they come (:meth:`place_one`)."""
        self._end_scheduled = False
        sender.on_idle = self._idle
        core.metadata.cache.listeners.add(self.end_hot)
        core.unavailable.listeners.add(self.end_hot)

    def close(self) -> None:
        self.closing = True
        self.end_hot()
        self._core.metadata.cache.listeners.remove(self.end_hot)
        self._core.unavailable.listeners.remove(self.end_hot)

    def stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    @property
    def waiting_topics(self) -> int:
        """Topics whose messages wait to join a batch (messages deferred to the end of this step count as one)."""
        return self.holding.topics + bool(self.run)

    # -- where a message goes ----------------------------------------------------------------------

    def place(self, message: Message, waiter: Any, size: int, acks: int) -> None:
        """Queue a checked message for its partition's batch; its buffer bytes are counted from here. A plain
        message takes :meth:`place_one`'s short path (whatever the selector: it is given the message);
        :meth:`join` does the rest."""
        if (message.key is None and message.attribute is None and not message.headers
                and message.deliver_at is None and message.delay_ms is None):
            self.place_plain(message, waiter, size, acks)
            return
        if self.run:  # the messages sent before this one go first
            self.place_deferred()
        self._place(message, waiter, size, acks)

    def place_plain(self, message: Message, waiter: Any, size: int, acks: int) -> None:
        """:meth:`place` for a message the caller found plain (no key, attribute, headers or delay)."""
        if self.run:  # the messages sent before this one go first
            self.place_deferred()
        self.place_one(message.topic, message.data, message.timestamp_ms, waiter, size, acks, message)

    def _place(self, message: Message, waiter: Any, size: int, acks: int) -> None:
        partitions = self.hot.get(message.topic)
        if partitions is None:
            partitions = self._lookup(message, waiter, size, acks)
            if partitions is None:
                return
        p = self._choose(message, partitions, waiter, size, acks, None)
        if p is not None:
            self.join(message, (message.topic, p.partition, p.broker_id, acks), partitions, waiter, size, None)

    def place_one(self, topic: str, data: bytes, stamp: int, waiter: Any, size: int, acks: int,
                  message: Message | None = None) -> None:
        """A checked plain message (no key, attribute, headers or delay): ``message`` itself when the caller has one
        (the selector is given it), else None, which only a selector that does not read messages is given
        (:attr:`runs`). The common case -- a kept topic, the partition's open batch plain with room for it, or no
        batch open there -- joins it in one call (:meth:`ProducerBatch.append`) without building a Message; the
        rest goes through :meth:`join` (or the general path when the topic is not kept, or the selector refuses).
        The run's direct case calls it (plain_run.py); the run was placed before, so the order of sends holds."""
        partitions = self.hot.get(topic)
        if partitions is not None:
            acc = self.acc
            if self._stays:
                batch = self._filling.get(topic)
                if (batch is not None and batch.acks == acks and acc.batches.get(batch.key) is batch and batch.plain
                        and batch.size_bytes + size <= acc.batch_bytes):  # where the selector would put it again
                    self._buffer.used += size
                    batch.append(stamp, data, waiter, size)
                    if batch.size_bytes >= acc.batch_bytes:
                        self._sender.dispatch(acc.batches.pop(batch.key))
                    return
            try:
                p: Partition | None = self.selector(topic, partitions, message)
            except MetaqError:
                p = None  # a refusal: the general path asks again and handles it
            if p is not None:
                key = (topic, p.partition, p.broker_id, acks)
                batch = acc.batches.get(key)
                if batch is None and size <= self._opens_for:
                    batch = self._open(key)
                if batch is not None and batch.plain and batch.size_bytes + size <= acc.batch_bytes:
                    self._buffer.used += size
                    batch.append(stamp, data, waiter, size)
                    if batch.size_bytes >= acc.batch_bytes:
                        self._sender.dispatch(acc.batches.pop(key))
                    elif self._stays:
                        self._filling[topic] = batch
                    return
                self.join(message or Message(topic, data, timestamp_ms=stamp), key, partitions, waiter, size, None)
                return
        self._place(message or Message(topic, data, timestamp_ms=stamp), waiter, size, acks)

    def _run_started(self) -> None:
        """A message started the deferred run (:attr:`run`): it is placed at the end of this event-loop step, with
        the others sent in it, a partition's share at a time (:meth:`join_many`), to the partitions the round robin
        gives them one by one. A run is one topic and acks, and at most DEFERRED_MAX messages; any other send, a
        flush or a send_batch places it first, so the order of sends holds."""
        if not self._end_scheduled:
            self._end_scheduled = True
            self._loop.call_soon(self._end_of_step)

    def place_deferred(self, *, step_end: bool = False) -> None:
        """Place the deferred run, if any. Its bytes were counted when its messages were sent, and are counted again
        as they join their batches."""
        if not self.run:
            return
        topic, acks, values, stamps, waiters, nbytes = self.run.take()
        if step_end and len(values) == 1:
            # One send in this event-loop step (an application sending from callbacks or request handlers):
            # deferring costs a step-end call a message and buys nothing, so the topic's next sends are placed as
            # they come until its partitions are looked up again (HOT_KEEP_S at most), which makes it deferrable.
            self.deferrable.discard(topic)
        if not waiters:  # a one-way run
            waiters = [None] * len(values)
        self._buffer.used -= nbytes
        partitions = self.hot.get(topic)
        sender = self._sender
        gathered = sender.open_gathering()  # (the pair, not the context manager: once an event-loop step)
        try:
            # A run of one (a send per event-loop step) is cheaper placed as one message than as a share.
            if partitions is not None and topic not in self.holding.held and len(values) > 1:
                try:
                    self.join_many(topic, partitions, values, stamps, waiters, acks)
                    return
                except PartitionClosedError:  # every partition closed: nothing placed; each is held below
                    pass
            for data, stamp, waiter in zip(values, stamps or itertools.repeat(-1), waiters, strict=False):
                self.place_one(topic, data, stamp, waiter, RECORD_OVERHEAD_BYTES + len(data), acks)
        finally:
            sender.close_gathering(gathered)

    def _end_of_step(self) -> None:
        """The end of the step the first deferred message was sent in: they are placed, and the batches due now
        (an idle partition's) leave in this step, not the next."""
        self._end_scheduled = False
        sender = self._sender
        gathered = sender.open_gathering()
        try:
            self.place_deferred(step_end=True)
            if self._timer is not None and self._timer_when <= self._loop.time():
                self._timer.cancel()
                self._on_timer()
        finally:
            sender.close_gathering(gathered)

    def _lookup(self, message: Message, waiter: Any, size: int, acks: int) -> Sequence[Partition] | None:
        """The partitions a topic's message chooses from, kept for the next sends; None when the message waits
        (for the topic's metadata, behind earlier ones) or went elsewhere (no partition known)."""
        topic = message.topic
        holding = self.holding
        if topic in holding.held:
            holding.hold(message, waiter, size, acks)
            return None
        tm = self._core.metadata.cached(topic)
        if tm is None:
            holding.hold(message, waiter, size, acks)
            holding.spawn(holding.warm(topic))
            return None
        partitions = self._choices(topic, tm)
        if not partitions:
            self._route(message, tm, waiter, size, acks, None)
            return None
        if not self.closing:  # closing: every send must find the topic anew (the producer checks it then)
            self._keep_hot(topic, partitions)
        return partitions

    def _choose(self, message: Message, partitions: Sequence[Partition], waiter: Any, size: int, acks: int,
                expires_s: float | None) -> Partition | None:
        """The selector's partition for ``message``; None when it refused (the refusal is handled: the message's
        failed result, or it waits for a partition to open). Misuse (InvalidArgument) raises to the caller."""
        try:
            return self.selector(message.topic, partitions, message)
        except InvalidArgument:
            raise
        except MetaqError as exc:
            self.holding.refused(message, waiter, size, acks, exc, expires_s)
            return None

    def _choices(self, topic: str, tm: TopicMetadata) -> Sequence[Partition]:
        """What the selector chooses from: the reachable partitions for a spreading selector (all of them when every
        one is left out), the key space for the others."""
        if not self._reroutable:
            return tm.key_space
        partitions = tm.partitions
        if not partitions:
            return partitions
        version = self._core.unavailable.current_version()
        cached = self._usable.get(topic)
        if cached is not None and cached[0] is partitions and cached[1] == version:
            return cached[2]
        usable = self._core.unavailable.usable(topic, partitions) or partitions
        self._usable[topic] = (partitions, version, usable)
        return usable

    def _keep_hot(self, topic: str, partitions: Sequence[Partition]) -> None:
        self.hot[topic] = partitions
        if self.defers and len(partitions) <= DEFERRED_PARTITIONS_MAX:
            self.deferrable.add(topic)
        if self._hot_reset is None:
            if self._reroutable and self._core.unavailable.avoiding():
                self._hot_reset = self._loop.call_soon(self.end_hot)  # being left out ends by the clock
            else:
                self._hot_reset = self._loop.call_later(HOT_KEEP_S, self.end_hot)

    def _forget(self, topic: str) -> None:
        """Forget what is kept of ``topic``: its next sends go through :meth:`place` (behind held ones)."""
        self.hot.pop(topic, None)
        self.deferrable.discard(topic)
        self._filling.pop(topic, None)

    def end_hot(self) -> None:
        """Forget the kept topics: their next send looks their partitions up again (:meth:`place`)."""
        reset, self._hot_reset = self._hot_reset, None
        if reset is not None:
            reset.cancel()  # told by a listener before its time (harmless when it is the running callback)
        self.hot.clear()
        self.deferrable.clear()
        self._filling.clear()

    def _route(self, message: Message, tm: TopicMetadata, waiter: Any, size: int, acks: int,
               expires_s: float | None) -> None:
        topic = message.topic
        partitions = self._choices(topic, tm)
        if partitions:
            p = self._choose(message, partitions, waiter, size, acks, expires_s)
            if p is not None:
                self.join(message, (topic, p.partition, p.broker_id, acks), partitions, waiter, size, expires_s)
        elif tm.key_space:  # known partitions, none reachable now: wait for one (a master being handed over)
            self.holding.refused(message, waiter, size, acks, PartitionClosedError(
                f"no partition of topic {topic!r} is reachable now"), expires_s, unreachable=True)
        else:  # a topic the brokers do not know (yet): the default broker picks, and may create it
            self.join(message, (topic, ANY_PARTITION, self._core.default_broker_id, acks), (), waiter, size,
                      expires_s)

    # -- joining a batch: the one place -------------------------------------------------------------

    def join(self, message: Message, key: BatchKey, partitions: Sequence[Partition], waiter: Any, size: int,
             expires_s: float | None) -> None:
        """Put ``message`` into the open batch of ``key``'s partition (a batch opens when none is). A full batch
        leaves at once; with a sticky selector, the message that would not fit goes to the next partition."""
        acc = self.acc
        batch = acc.batches.get(key)
        if message.deliver_at is not None or message.delay_ms is not None:  # a batch of its own, bit 7
            key = (*key, True)
            batch = acc.batches.get(key)
            headers: Sequence[tuple[str, bytes]] | None = delayed_headers(message)
        else:
            headers = message.headers
            if batch is not None and batch.size_bytes + size > acc.batch_bytes and self._batch_done is not None:
                # Full for this message: it leaves now, and the sticky selector moves on (KIP-480: the message that
                # would open a new batch goes to the next partition instead).
                self._sender.dispatch(acc.batches.pop(key))
                p = self._choose(message, partitions, waiter, size, key[3], expires_s)
                if p is None:
                    return
                key = (message.topic, p.partition, p.broker_id, key[3])
                batch = acc.batches.get(key)
        self._buffer.used += size
        if batch is not None and batch.size_bytes + size <= acc.batch_bytes:
            batch.add(message.timestamp_ms, message.data, message.key, message.attribute, headers, waiter, size)
            if expires_s is not None and expires_s < batch.expires_s:
                batch.expires_s = expires_s
            if batch.size_bytes >= acc.batch_bytes:
                self._sender.dispatch(acc.batches.pop(key))
            return
        linger_s = self.config.linger_ms / 1000.0 if self._sender.busy(key) else 0.0
        try:
            sealed = acc.append(key, message.timestamp_ms, message.data, message.key, message.attribute, headers,
                                waiter, linger_s, size, expires_s)
        except InvalidArgument:
            self._buffer.used -= size
            raise
        for full in sealed:
            self._sender.dispatch(full)
        opened = acc.batches.get(key)
        if opened is not None and (self._timer is None or opened.due_s < self._timer_when):
            self._arm(opened.due_s)

    def join_many(self, topic: str, partitions: Sequence[Partition], values: Sequence[bytes],
                  stamps: Sequence[int] | None, waiters: Sequence[Any], acks: int) -> None:
        """Plain messages of one topic (their payloads, their timestamps or None when none is given, their
        waiters), placed as the round robin would place them one by one: message ``j`` to candidate
        ``(first + j) % k``. Each partition's share joins its open batch a run at a time
        (:meth:`ProducerBatch.extend`: list slices, no call per message), a batch that fills leaving as in
        :meth:`join`. PartitionClosedError (every partition closed): nothing placed."""
        count = len(values)
        candidates, first = self.selector.reserve(topic, partitions, count)
        k = len(candidates)
        acc, dispatch = self.acc, self._sender.dispatch
        limit, prefix = acc.batch_bytes, RECORD_OVERHEAD_BYTES
        for r in range(min(k, count)):
            p = candidates[(first + r) % k]
            key: BatchKey = (topic, p.partition, p.broker_id, acks)
            sub = values[r::k] if k > 1 else values
            sub_waiters = waiters[r::k] if k > 1 else waiters
            sub_stamps = None if stamps is None else stamps[r::k]
            n = len(sub)
            total = prefix * n + sum(map(len, sub))
            ends: list[int] | None = None  # ends[i]: bytes of sub[..i], summed only when the share is cut
            i = 0
            while i < n:
                batch = acc.batches.get(key)
                if batch is None or not batch.plain:
                    if batch is not None:  # not plain: it leaves first, in order
                        dispatch(acc.batches.pop(key))
                    batch = self._open(key)
                if ends is None and batch.size_bytes + total <= limit:  # the whole share fits (i is 0)
                    j, added = n, total
                else:
                    if ends is None:
                        ends = list(itertools.accumulate(map(prefix.__add__, map(len, sub))))
                    before = ends[i - 1] if i else 0
                    j = bisect.bisect_right(ends, before + limit - batch.size_bytes, i)
                    if j == i:
                        if batch.count:  # full for the next message: it leaves, and a new one opens
                            dispatch(acc.batches.pop(key))
                            continue
                        j = i + 1  # a record larger than a batch travels alone
                    added = ends[j - 1] - before
                batch.extend(sub[i:j], None if sub_stamps is None else sub_stamps[i:j], sub_waiters[i:j], added)
                self._buffer.used += added
                if batch.size_bytes >= limit:
                    dispatch(acc.batches.pop(key))
                i = j

    def _open(self, key: BatchKey) -> ProducerBatch:
        """A new open batch for ``key``: due now when its partition is idle, else after linger_ms."""
        batch = self.acc.open(key, self.config.linger_ms / 1000.0 if self._sender.busy(key) else 0.0)
        if self._timer is None or batch.due_s < self._timer_when:
            self._arm(batch.due_s)
        return batch

    # -- open batches and their linger --------------------------------------------------------------

    def _idle(self, key: BatchKey) -> None:
        """The partition has nothing unresolved left: what accumulated meanwhile leaves now instead of lingering."""
        waiting = self.acc.batches.pop(key, None)
        if waiting is not None:
            self._sender.dispatch(waiting)

    def seal(self, key: BatchKey) -> None:
        """What is open for ``key`` leaves now (before a batch built elsewhere, to keep the order)."""
        self._idle(key)

    def seal_all(self) -> None:
        self.place_deferred()
        for batch in self.acc.seal_all():
            self._sender.dispatch(batch)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_when = when
        loop = self._loop
        if when <= loop.time():
            self._timer = loop.call_soon(self._on_timer)  # end of this loop step: cheaper than a timer
        else:
            self._timer = loop.call_at(when, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self.run:
            self.place_deferred(step_end=True)  # what was sent in this step joins its batches before they are sealed
        # A little slack: a timer may fire a hair before its time, and re-arming for 0.1 ms is waste.
        expired = self.acc.expired(self._loop.time() + 0.0005)
        if expired:
            # Every batch due now is gathered first, then written per connection (one MultiProduce for a broker's
            # batches): the frames leave in one write per broker in this loop step (linger_ms=0 latency).
            sender = self._sender
            gathered = sender.open_gathering()
            try:
                for batch in expired:
                    sender.dispatch(batch)
            finally:
                sender.close_gathering(gathered)
        nxt = self.acc.next_deadline()
        if nxt is not None:
            self._arm(nxt)

    def prebuilt(self, key: BatchKey, payload: bytes, count: int, waiter: Any, size: int, pinned: bool) -> None:
        """A batch ``send_batch`` built: after what is open for its partition (this producer's order)."""
        now = self._loop.time()
        batch = ProducerBatch.prebuilt(key, payload, count, waiter, now, now + self._delivery_s)
        batch.size_bytes = size
        batch.pinned = pinned
        self.place_deferred()
        self.seal(key)
        self._buffer.used += size
        self._sender.dispatch(batch)

    async def batch_key(self, topic: str, message: Message, target: Partition | None, acks: int) -> BatchKey:
        if target is not None:
            return (topic, target.partition, target.broker_id, acks)
        tm = await self._core.metadata.topic(topic)
        partitions = self._choices(topic, tm)
        if not partitions:
            return (topic, ANY_PARTITION, self._core.default_broker_id, acks)
        p = self.selector(topic, partitions, message)
        return (topic, p.partition, p.broker_id, acks)

