"""Partition selectors: which partition of a topic a message goes to (MetaQ's PartitionSelector).

A selector is any callable ``(topic, partitions, message) -> Partition``. ``partitions`` is every
partition of the topic the client knows, ordered by (broker id, partition), closed ones included
(``Partition.accept_publish`` says which are open): for a selector with ``reroutable`` the ones reachable
now, for any other the topic's key space (those whose broker cannot be reached now included). The producer
calls it once per message on the sending task (fewer times when the selector allows a shortcut:
``reads_message``, ``stays``, below), so it must be fast and must not block.

* :class:`RoundRobinSelector` (the default): the open partitions in order, from the start again after
  the last, as MetaQ's producer walks its sorted partition list.
* :class:`StickyRoundRobinSelector`: round robin by *batch* instead of by message (Kafka's KIP-480
  sticky partitioner): every message goes to one open partition until the batch the producer fills
  there is full or leaves, then to the next partition in the same order. Over time every open partition
  gets its turn; at a moment, one partition takes the messages, so requests carry whole batches even
  when a topic has thousands of partitions.
* :class:`RandomSelector`: an open partition at random.
* :class:`KeyHashSelector`: ``crc32(message.key) % len(partitions)`` over *all* partitions, for
  ordered messages. The producer passes it the topic's key space: every registered partition, including
  those whose master is down (docs/producer.md), so one key keeps its partition while the topic's
  partition count is unchanged; a send to a partition that cannot take it waits (for a master) or fails,
  it never moves. Closed partitions are not skipped either: a send to one fails (PARTITION_CLOSED).
  Stable across processes and restarts (zlib.crc32, not Python's salted ``hash()``).

A selector raises InvalidArgument for misuse (a message without a key under KeyHashSelector) and
PartitionClosedError when no partition is open; the producer reports the latter in the SendResult.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Sequence
from typing import ClassVar, Protocol, TypeVar

from metaq.client.metadata import Partition
from metaq.errors import InvalidArgument, PartitionClosedError
from metaq.types import Message


class PartitionSelector(Protocol):
    """``reroutable`` (optional attribute, False when absent): the producer may move a batch this
    selector placed to another partition when its broker cannot be reached (docs/cluster.md#routing),
    and leaves unreachable partitions out of the ``partitions`` it passes.

    ``batch_done(topic, broker_id, partition)`` (optional method): the producer calls it when a batch of
    ``topic`` leaves for that partition, or when the next message would not fit into the batch open there
    (and then asks the selector again for that message). Sticky selectors move on when it is called.

    ``stays`` (optional attribute, False when absent; with ``batch_done``): True says the choice for a topic stays
    the same until ``batch_done`` is called for that partition or the ``partitions`` passed change, so the
    producer may put a topic's messages where the selector last put them without asking it again.

    ``reads_message`` (optional attribute, True when absent): False says the choice never depends on the
    message, so the producer may pass None for it (a plain message of a kept topic then goes from the send
    call to its batch without a Message being looked at again).

    Both are promises about how the class chooses, so they count only where the selector's own class says them
    (:func:`promises`): a subclass that chooses otherwise does not inherit them."""

    def __call__(self, topic: str, partitions: Sequence[Partition], message: Message) -> Partition: ...


def promises(selector: object, name: str, default: bool) -> bool:
    """The selector's ``stays`` or ``reads_message``, as its own class declares it (``default`` when it does not)."""
    return bool(type(selector).__dict__.get(name, default))


def _all_closed(topic: str, partitions: Sequence[Partition]) -> str:
    """Why no partition of ``topic`` takes messages, and what to do: the brokers' own words for those closed
    by acceptPublish=false (metadata v1), `metaq topic open` only for those closed with `metaq topic close`."""
    reasons = sorted({p.publish_refused for p in partitions if p.publish_refused})
    closed = [str(p) for p in partitions if not p.publish_refused]
    text = f"every partition of topic {topic!r} is closed for publishing: " + "; ".join(reasons)
    if not closed:
        return text
    if reasons:
        return (f"{text}; partitions {', '.join(closed)} were closed with metaq topic close "
                "(metaq topic open reopens them)")
    # the broker did not say why (cluster mode, or an older broker): either cause is possible
    return (f"every partition of topic {topic!r} is closed for publishing: closed with metaq topic close "
            f"(metaq topic open {topic} reopens them), or the broker's server.ini sets acceptPublish=false for it "
            "(set it to true and reload the broker)")


def _open(topic: str, partitions: Sequence[Partition]) -> Sequence[Partition]:
    for p in partitions:
        if not p.accept_publish:
            break
    else:
        if partitions:
            return partitions  # the common case: nothing closed, no copy
    open_ = [p for p in partitions if p.accept_publish]
    if not open_:
        if partitions:
            raise PartitionClosedError(_all_closed(topic, partitions))
        raise InvalidArgument(f"topic {topic!r} has no partitions to choose from")
    return open_


def _open_cached(cache: dict[str, tuple[Sequence[Partition], Sequence[Partition]]], topic: str,
                 partitions: Sequence[Partition]) -> Sequence[Partition]:
    """:func:`_open`, kept per topic against the partitions sequence it was computed from: metadata hands
    out the same tuple until it refreshes, so the filtering runs once per refresh, not per message."""
    cached = cache.get(topic)
    if cached is not None and cached[0] is partitions:
        return cached[1]
    candidates = _open(topic, partitions)
    cache[topic] = (partitions, candidates)
    return candidates


class _Rotation:
    """A topic's round robin: the open partitions of one partitions sequence, and the counter of the next
    message (kept when the sequence is replaced, so the rotation goes on where it was)."""

    __slots__ = ("candidates", "count", "next", "partitions")

    def __init__(self, partitions: Sequence[Partition], candidates: Sequence[Partition], next_: int) -> None:
        self.partitions = partitions
        self.candidates = candidates
        self.count = len(candidates)
        self.next = next_


class RoundRobinSelector:
    """Open partitions in (broker id, partition) order, one after the other; a counter per topic."""

    __slots__ = ("_rotations",)
    reroutable: ClassVar[bool] = True
    reads_message: ClassVar[bool] = False

    def __init__(self) -> None:
        # topic -> its rotation. Metadata hands out the same partitions tuple until it refreshes, so the
        # open ones are filtered once per refresh, and a message costs one dict lookup.
        self._rotations: dict[str, _Rotation] = {}

    def _rotation(self, topic: str, partitions: Sequence[Partition]) -> _Rotation:
        rotation = self._rotations.get(topic)
        if rotation is None or rotation.partitions is not partitions:
            rotation = self._rotations[topic] = _Rotation(partitions, _open(topic, partitions),
                                                          0 if rotation is None else rotation.next)
        return rotation

    def __call__(self, topic: str, partitions: Sequence[Partition], message: Message) -> Partition:
        rotation = self._rotations.get(topic)
        if rotation is None or rotation.partitions is not partitions:
            rotation = self._rotation(topic, partitions)
        n = rotation.next
        rotation.next = n + 1
        return rotation.candidates[n % rotation.count]

    def reserve(self, topic: str, partitions: Sequence[Partition], count: int) -> tuple[Sequence[Partition], int]:
        """``count`` calls at once, for messages that need no look at: the open partitions and the counter of
        the first; message ``j`` goes to ``candidates[(first + j) % len(candidates)]``, as ``count`` calls
        would have chosen (the producer's send_async_many places a plain list this way)."""
        rotation = self._rotation(topic, partitions)
        first = rotation.next
        rotation.next = first + count
        return rotation.candidates, first


class StickyRoundRobinSelector:
    """Round robin by batch (KIP-480): one open partition per topic takes every message until the producer
    says its batch is done (:meth:`batch_done`: full, or sent), then the next one in (broker id, partition)
    order takes over. The producer calls :meth:`batch_done` itself; used elsewhere (a plain function call
    per message, no producer) it stays on one partition."""

    __slots__ = ("_counters", "_current", "_open")
    reroutable: ClassVar[bool] = True
    reads_message: ClassVar[bool] = False
    stays: ClassVar[bool] = True

    def __init__(self) -> None:
        self._counters: dict[str, int] = {}
        self._current: dict[str, tuple[Sequence[Partition], Partition]] = {}
        """topic -> (the partitions sequence it was chosen from, the partition taking messages now)"""
        self._open: dict[str, tuple[Sequence[Partition], Sequence[Partition]]] = {}

    def __call__(self, topic: str, partitions: Sequence[Partition], message: Message) -> Partition:
        current = self._current.get(topic)
        if current is not None and current[0] is partitions:
            return current[1]
        # First message, or the candidates changed (metadata refreshed, a broker left out): next partition.
        candidates = _open_cached(self._open, topic, partitions)
        n = self._counters.get(topic, 0)
        self._counters[topic] = n + 1
        chosen = candidates[n % len(candidates)]
        self._current[topic] = (partitions, chosen)
        return chosen

    def batch_done(self, topic: str, broker_id: int, partition: int) -> None:
        """The batch on that partition is full or sent: the topic's next message goes to the next partition
        (nothing changes when another partition's batch is meant)."""
        current = self._current.get(topic)
        if current is not None and current[1].partition == partition and current[1].broker_id == broker_id:
            del self._current[topic]


class RandomSelector:
    """An open partition chosen at random (``rng`` injectable for tests)."""

    __slots__ = ("_rng",)
    reroutable: ClassVar[bool] = True
    reads_message: ClassVar[bool] = False

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def __call__(self, topic: str, partitions: Sequence[Partition], message: Message) -> Partition:
        candidates = _open(topic, partitions)
        return candidates[self._rng.randrange(len(candidates))]


def key_hash(key: bytes) -> int:
    """The stable 32-bit hash KeyHashSelector uses (CRC-32 of the key bytes)."""
    return zlib.crc32(key)


_P = TypeVar("_P")


def key_partition(partitions: Sequence[_P], key: bytes) -> _P:
    """The partition of ``partitions`` (every partition of the topic, in (broker id, partition) order) that ``key``
    goes to: ``partitions[crc32(key) % len(partitions)]``, the rule of :class:`KeyHashSelector`, for code that
    places keyed records without a producer (the Spark sink): one key, one partition, wherever it is computed."""
    return partitions[zlib.crc32(key) % len(partitions)]


class KeyHashSelector:
    """``partitions[crc32(key) % len(partitions)]``: every message with one key lands in one partition.

    A message without a key is refused with InvalidArgument, unless ``fallback`` (another selector,
    e.g. RoundRobinSelector()) is given for them: silently spreading key-less messages would hide a
    bug in code that expects ordering.
    """

    __slots__ = ("_fallback",)
    reroutable: ClassVar[bool] = False
    """A key's messages stay in one partition: a failure there is the send's result, never a move."""

    def __init__(self, fallback: PartitionSelector | None = None) -> None:
        self._fallback = fallback

    def batch_done(self, topic: str, broker_id: int, partition: int) -> None:
        """Passed on to ``fallback`` (a sticky fallback moves on for key-less messages)."""
        done = getattr(self._fallback, "batch_done", None)
        if done is not None:
            done(topic, broker_id, partition)

    def __call__(self, topic: str, partitions: Sequence[Partition], message: Message) -> Partition:
        key = message.key
        if key is None:
            if self._fallback is not None:
                return self._fallback(topic, partitions, message)
            raise InvalidArgument(f"KeyHashSelector needs message.key (topic {topic!r}); set a key, or "
                                  f"pass KeyHashSelector(fallback=RoundRobinSelector())")
        if not partitions:
            raise InvalidArgument(f"topic {topic!r} has no partitions to choose from")
        return key_partition(partitions, key)


SelectorLike = PartitionSelector | Callable[[str, Sequence[Partition], Message], Partition]
