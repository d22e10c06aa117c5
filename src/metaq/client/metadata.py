"""What the client knows about brokers and topic partitions, from MetadataRequest.

A partition is ``brokerId-partition`` (:class:`metaq.types.PartitionId`; :class:`Partition` is that
identity plus the broker's publish/subscribe flags). A topic's partitions are kept ordered by (broker
id, partition), as MetaQ's producer orders them before it walks them round robin. The cache is
refreshed on demand (first use of a topic, an entry older than ``metadata_max_age_s``) and after any
broker error whose class says ``refresh_metadata``. Concurrent refreshes of one topic share a single
request.

Several brokers: with standalone brokers (no ZooKeeper) each broker answers only for its own
partitions, so the client asks every server it was given and merges the answers with
:func:`merge_metadata`: a topic's partitions are the union of what the brokers report, a partition
reported by its own broker wins over another broker's report of it, and a topic is unknown only when
no broker knows it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from metaq.client.listeners import ChangeListeners
from metaq.errors import BrokerError, InvalidArgument, UnknownTopicError, error_for_code
from metaq.net.servers import Address
from metaq.protocol.messages import MetadataRequest, MetadataResponse, TopicInfo
from metaq.types import PartitionId, PartitionKey, partition_key


@dataclass(frozen=True, slots=True, eq=False)
class Partition(PartitionId):
    """A partition as a producer sees it: its identity (``brokerId-partition``, a
    :class:`~metaq.types.PartitionId`: equal, hashed and ordered as that id) plus the broker's
    publish/subscribe flags (``metaq topic close|open``), which take no part in equality or ordering.
    """

    accept_publish: bool = field(default=True)
    accept_subscribe: bool = field(default=True)
    publish_refused: str = field(default="")
    """Why the broker refuses publishing by its configuration (acceptPublish=false), what to change; "" else."""


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    topic: str
    partitions: tuple[Partition, ...]
    """Sorted by (broker id, partition); empty when the topic is unknown. Only partitions whose broker answers
    for them now (in cluster mode: whose broker id has a registered master)."""
    error: BrokerError | None
    fetched_at: float
    registered: tuple[Partition, ...] | None = None
    """The key space when it is more than :attr:`partitions` (see :attr:`key_space`); None when it is the same."""

    @property
    def publishable(self) -> tuple[Partition, ...]:
        return tuple(p for p in self.partitions if p.accept_publish)

    @property
    def key_space(self) -> tuple[Partition, ...]:
        """Every partition registered for the topic, reachable now or not: :attr:`partitions`, plus those of
        broker ids that held the topic when last seen and have not answered since (a master down, a broker that
        cannot be reached). What a key hash maps over: a key keeps its partition while the topic's partition
        count is unchanged (docs/producer.md, "the key space"). A topic removed from a broker stays in it for the
        session's life: its keyed sends there wait and fail at their deadline rather than move."""
        return self.partitions if self.registered is None else self.registered

    def find(self, partition: PartitionKey) -> Partition | None:
        """The partition named by a PartitionId, its text ``"1-3"``, or a bare number; None if the topic
        has no such partition. A bare number must be unambiguous: InvalidArgument naming the candidates
        when more than one broker holds a partition with that number."""
        return resolve_partition(self.topic, self.partitions, partition)


P = TypeVar("P", bound=PartitionId)


def resolve_partition(topic: str, partitions: Iterable[P], partition: PartitionKey) -> P | None:
    """See :meth:`TopicMetadata.find` (shared with the blocking client)."""
    key = partition_key(partition)
    if isinstance(key, PartitionId):
        for p in partitions:
            if p == key:
                return p
        return None
    found = [p for p in partitions if p.partition == key]
    if len(found) > 1:
        names = ", ".join(f"'{p}'" for p in found)
        raise InvalidArgument(f"partition {key} of topic {topic!r} is ambiguous: brokers "
                              f"{', '.join(str(p.broker_id) for p in found)} each have one ({names}); "
                              "name it as brokerId-partition")
    return found[0] if found else None


def merge_metadata(responses: Sequence[tuple[int, MetadataResponse]]) -> MetadataResponse:
    """One MetadataResponse from the answers of several brokers, as ``(answering broker id, response)``.

    Brokers: the union (the broker's own entry wins for its id). Topics: the union of the partitions
    reported, each partition taken from its own broker's answer when it has one (its flags are the
    authority) and otherwise from the first answer naming it; a topic's error is kept only when no
    broker reports partitions for it. The merge is a pure function of the answers, in any order.
    """
    if len(responses) == 1:
        return responses[0][1]
    brokers: dict[int, Any] = {}
    refused: dict[tuple[str, int], Any] = {}
    topics: dict[str, dict[tuple[int, int], Any]] = {}
    from_owner: set[tuple[str, int, int]] = set()
    errors: dict[str, int] = {}
    for source, resp in sorted(responses, key=lambda r: r[0]):
        for b in resp.brokers:
            if b.broker_id not in brokers or b.broker_id == source:
                brokers[b.broker_id] = b
        for r in resp.publish_refused:
            if (r.topic, r.broker_id) not in refused or r.broker_id == source:
                refused[(r.topic, r.broker_id)] = r
        for t in resp.topics:
            if t.error_code:
                errors.setdefault(t.name, t.error_code)
            parts = topics.setdefault(t.name, {})
            for p in t.partitions:
                key = (p.broker_id, p.partition)
                if (t.name, *key) in from_owner:
                    continue
                if key not in parts or p.broker_id == source:
                    parts[key] = p
                if p.broker_id == source:
                    from_owner.add((t.name, *key))
    out_topics = []
    for name in sorted(topics):
        merged = [topics[name][k] for k in sorted(topics[name])]
        out_topics.append(TopicInfo(name, 0 if merged else errors.get(name, 0), merged))
    return MetadataResponse(brokers=[brokers[b] for b in sorted(brokers)], topics=out_topics,
                            publish_refused=[refused[k] for k in sorted(refused)])


class KeySpace(Generic[P]):
    """Per topic, each broker id's partitions as last reported: what a key hash maps over. A broker id that does
    not report the topic now keeps its partitions -- its master may be down, or being handed over (the old master's
    topic node gone, the new one's not there yet), which ZooKeeper cannot tell from a topic removed there -- for
    the life of this object (a session's); one that reports it replaces its count (an admin grew or shrank it)."""

    def __init__(self) -> None:
        self._known: dict[str, dict[int, tuple[P, ...]]] = {}

    def update(self, topic: str, parts: Sequence[P]) -> tuple[P, ...] | None:
        """The topic's key space after an answer reporting ``parts`` (sorted); None when it is ``parts`` itself."""
        known = self._known.get(topic)
        by_broker: dict[int, list[P]] = {}
        for p in parts:
            by_broker.setdefault(p.broker_id, []).append(p)
        if known is None:
            if not parts:
                return None
            known = self._known[topic] = {}
        known.update((b, tuple(ps)) for b, ps in by_broker.items())
        if known.keys() == by_broker.keys():
            return None
        return tuple(sorted(p for ps in known.values() for p in ps))


_STALE_REFRESH_RETRIES = 3
"""How many times a topic's refresh is asked again when the topic was invalidated while it was out."""


class MetadataCache:
    """The pure part: applies MetadataResponses, answers lookups. No I/O."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.brokers: dict[int, Address] = {}
        """broker id -> advertised (host, port)."""
        self.known_addresses: dict[int, Address] = {}
        """broker id -> the address this client actually reached it at (wins over the advertised one,
        which may be a wildcard or a name only resolvable elsewhere)."""
        self.topics: dict[str, TopicMetadata] = {}
        self.invalidations: dict[str, int] = {}
        """Per topic, how many times :meth:`invalidate` dropped it: a refresh asked before the last one may
        answer what the change that invalidated it replaced (Metadata._refresh asks again then)."""
        self.listeners = ChangeListeners()
        """Told after every update and invalidation (a producer's partitions cached between sends are dropped)."""
        self.key_spaces: KeySpace[Partition] = KeySpace()
        """What :attr:`TopicMetadata.key_space` is made of, kept for the session's life."""

    def update(self, response: MetadataResponse, asked: Iterable[str] | None = None) -> dict[str, TopicMetadata]:
        now = self._clock()
        for b in response.brokers:
            self.brokers[b.broker_id] = (b.host, b.port)
        got: dict[str, TopicMetadata] = {}
        refused = {(r.topic, r.broker_id): r.reason for r in response.publish_refused}
        for t in response.topics:
            error = error_for_code(t.error_code, f"topic {t.name!r}") if t.error_code else None
            parts = tuple(sorted(Partition(p.broker_id, p.partition, p.accept_publish, p.accept_subscribe,
                                           refused.get((t.name, p.broker_id), "") if refused else "")
                                 for p in t.partitions if p.error_code == 0))
            got[t.name] = TopicMetadata(t.name, parts, error, now, self.key_spaces.update(t.name, parts))
        for name in asked or ():
            if name not in got:
                got[name] = TopicMetadata(name, (), UnknownTopicError(f"topic {name!r} is not on any broker"), now,
                                          self.key_spaces.update(name, ()))
        if asked is None:
            # A full listing: topics it no longer names are gone.
            self.topics = got
        else:
            self.topics.update(got)
        self.listeners.changed()
        return got

    def get(self, topic: str) -> TopicMetadata | None:
        return self.topics.get(topic)

    def is_fresh(self, topic: str, max_age_s: float) -> bool:
        tm = self.topics.get(topic)
        return tm is not None and self._clock() - tm.fetched_at < max_age_s

    def invalidate(self, topic: str) -> None:
        self.topics.pop(topic, None)
        self.invalidations[topic] = self.invalidations.get(topic, 0) + 1
        self.listeners.changed()

    def address(self, broker_id: int) -> Address | None:
        return self.known_addresses.get(broker_id) or self.brokers.get(broker_id)


class Metadata:
    """The cache plus refreshing it through ``fetch`` (one MetadataRequest -> MetadataResponse)."""

    def __init__(self, fetch: Callable[[MetadataRequest], Awaitable[MetadataResponse]], *, max_age_s: float,
                 min_interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.cache = MetadataCache(clock)
        self._fetch = fetch
        self._clock = clock
        self.max_age_s = max_age_s
        self.min_interval_s = min_interval_s
        self._inflight: dict[str, asyncio.Task[TopicMetadata]] = {}
        self._last_refresh: dict[str, float] = {}
        self._background: set[asyncio.Task[object]] = set()
        self._delayed: dict[str, asyncio.TimerHandle] = {}

    async def topic(self, topic: str) -> TopicMetadata:
        """The topic's metadata, fetched if unknown or older than max_age_s."""
        tm = self.cache.get(topic)
        if tm is not None and self._clock() - tm.fetched_at < self.max_age_s:
            return tm
        return await self.refresh_topic(topic)

    def cached(self, topic: str) -> TopicMetadata | None:
        """The cached entry (maybe stale: then a background refresh starts); None if never fetched."""
        tm = self.cache.get(topic)
        if tm is not None and self._clock() - tm.fetched_at >= self.max_age_s:
            self.refresh_soon(topic)
        return tm

    async def refresh_topic(self, topic: str) -> TopicMetadata:
        task = self._inflight.get(topic)
        if task is None:
            self._last_refresh[topic] = self._clock()
            task = asyncio.ensure_future(self._refresh(topic))
            self._inflight[topic] = task
            task.add_done_callback(lambda t: self._refreshed(topic, t))
        # Shielded: a caller that gives up does not cancel the request others are waiting on.
        return await asyncio.shield(task)

    async def _refresh(self, topic: str) -> TopicMetadata:
        # A topic invalidated while the request was out (an admin call that changed it, e.g. reopened its
        # partitions) may have been answered from before that change: caching the answer would undo the
        # invalidation until a later refresh. Ask again (a few times at most, then take the last answer).
        for _ in range(_STALE_REFRESH_RETRIES):
            asked_after = self.cache.invalidations.get(topic, 0)
            resp = await self._fetch(MetadataRequest([topic]))
            if self.cache.invalidations.get(topic, 0) == asked_after:
                break
        return self.cache.update(resp, [topic])[topic]

    def _refreshed(self, topic: str, task: asyncio.Task[TopicMetadata]) -> None:
        if self._inflight.get(topic) is task:
            del self._inflight[topic]
        if not task.cancelled():
            task.exception()  # retrieved here so an unawaited failure is not logged as lost

    def refresh_soon(self, topic: str) -> None:
        """Refresh in the background (after an error that asks for it, or a topic's first send).

        At most one refresh per topic every ``min_interval_s``: a call inside that window schedules
        one refresh at its end instead of being dropped.
        """
        if topic in self._inflight or topic in self._delayed:
            return
        last = self._last_refresh.get(topic)
        wait = 0.0 if last is None else self.min_interval_s - (self._clock() - last)
        loop = asyncio.get_running_loop()
        if wait > 0:
            self._delayed[topic] = loop.call_later(wait, self._start_background, topic)
        else:
            self._start_background(topic)

    def _start_background(self, topic: str) -> None:
        self._delayed.pop(topic, None)
        if topic in self._inflight:
            return
        task: asyncio.Task[object] = asyncio.ensure_future(self._quiet_refresh(topic))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _quiet_refresh(self, topic: str) -> object:
        try:
            return await self.refresh_topic(topic)
        except Exception:
            return None  # the next user of the topic sees the failure itself

    async def refresh_all(self) -> dict[str, TopicMetadata]:
        resp = await self._fetch(MetadataRequest(None))
        return self.cache.update(resp)

    def close(self) -> None:
        for handle in self._delayed.values():
            handle.cancel()
        self._delayed.clear()
        for task in self._background:
            task.cancel()
