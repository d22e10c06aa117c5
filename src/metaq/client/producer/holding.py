"""Messages held before they join a batch (docs/producer.md).

A topic's messages wait here, in send order, while its metadata is not known yet (:meth:`Holding.warm`), or
while none of its partitions is open or reachable, as a master's handover looks for a moment
(:meth:`Holding.refused`, then :meth:`Holding._await_open`). They go on to their partitions through the
placement's route when the wait ends, or fail at their delivery deadline (certainly not stored).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from metaq.client.config import ProducerConfig
from metaq.client.core import ClientCore
from metaq.client.metadata import Partition, TopicMetadata
from metaq.client.producer.batches import BufferLimit
from metaq.client.producer.results import ManyTable, resolve_one
from metaq.client.producer.sender import Sender
from metaq.errors import DeliveryTimeoutError, MetaqError, PartitionClosedError
from metaq.types import Message, SendResult

Waiting = tuple[Message, Any, int, int, float]
"""A message waiting before it joins a batch: (message, waiter, size, acks, its delivery deadline)."""
Route = Callable[[Message, TopicMetadata, Any, int, int, "float | None"], None]


class Holding:
    """Per topic, the messages waiting to join a batch, and the tasks that wait for them."""

    def __init__(self, core: ClientCore, config: ProducerConfig, sender: Sender, buffer: BufferLimit,
                 manys: ManyTable, route: Route, choices: Callable[[str, TopicMetadata], Sequence[Partition]],
                 forget: Callable[[str], None], closing: Callable[[], bool]) -> None:
        self._core = core
        self.config = config
        self._sender = sender
        self._buffer = buffer
        self._manys = manys
        self._route = route
        """The placement's way to a partition for a message whose topic's metadata is ``tm``."""
        self._choices = choices
        self._forget = forget
        """Forget what the placement keeps of a topic: its next sends come here, behind the held ones."""
        self._closing = closing
        self._loop = asyncio.get_running_loop()
        self._delivery_s = config.delivery_timeout_ms / 1000.0
        self.held: dict[str, list[Waiting]] = {}
        """Per topic, its held messages in send order (a topic is here only while it has some)."""
        self.tasks: set[asyncio.Task[None]] = set()
        self._releasing = False
        """While :meth:`_await_open` routes the messages it held: a refusal is their result, not a new wait."""

    @property
    def topics(self) -> int:
        """Topics with messages held now."""
        return sum(1 for held in self.held.values() if held)

    def hold(self, message: Message, waiter: Any, size: int, acks: int, expires_s: float | None = None) -> None:
        """Hold ``message`` behind its topic's others until ``expires_s`` (by default its delivery deadline)."""
        self._buffer.used += size
        if expires_s is None:
            expires_s = self._loop.time() + self._delivery_s
        self.held.setdefault(message.topic, []).append((message, waiter, size, acks, expires_s))

    def spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def warm(self, topic: str) -> None:
        """A topic's first messages wait here, in order, for its metadata: asked again (after a back-off, or at once
        when the cluster view changes) while the brokers cannot answer, until the messages' deadline."""
        core = self._core
        backoff_s = self.config.retry_backoff_ms / 1000.0
        while True:
            since = core.snapshots_applied
            try:
                tm: TopicMetadata | None = await core.metadata.topic(topic)
                error: BaseException | None = None
            except Exception as exc:
                tm, error = None, exc
            held = self.held.get(topic)
            if tm is not None or not held or self._closing() or not getattr(error, "retriable", False) \
                    or self._loop.time() + backoff_s >= held[0][4]:
                break
            await core.cluster_changed(backoff_s, since)
        self._release(topic, tm, error)

    def _release(self, topic: str, tm: TopicMetadata | None, error: BaseException | None) -> None:
        """The topic's waiting messages, in order: routed with ``tm``, or failed (``error``; past their deadline a
        DeliveryTimeoutError, certainly not stored, naming it)."""
        now = self._loop.time()
        with self._sender.gathering():
            for message, waiter, size, acks, expires_s in self.held.pop(topic, []):
                self._buffer.used -= size
                if expires_s <= now:
                    failure: BaseException = DeliveryTimeoutError(
                        f"a message to {topic} waited delivery_timeout_ms={self.config.delivery_timeout_ms:g} for its "
                        f"topic's metadata or an open partition ({error}); it was certainly not stored",
                        maybe_stored=False, cause=error)
                elif tm is None:
                    assert error is not None
                    failure = error
                else:
                    try:
                        self._route(message, tm, waiter, size, acks, expires_s)
                    except Exception as exc:
                        resolve_one(waiter, SendResult(False, error=exc, topic=topic), self._manys)
                    continue
                resolve_one(waiter, SendResult(False, error=failure, topic=topic), self._manys)
        self._buffer.wake()

    def refused(self, message: Message, waiter: Any, size: int, acks: int, exc: MetaqError,
                expires_s: float | None, *, unreachable: bool = False) -> None:
        """The selector took no partition for ``message``: its failed result, unless the refusal says every
        partition of the topic is closed or unreachable. That is how a master's handover looks from here (the old
        master's topic node gone, the new one's not yet there, docs/cluster.md), so the message waits, in order
        with its topic's later ones, for the view to change (:meth:`_await_open`), as a Kafka producer waits for a
        partition leader."""
        if (isinstance(exc, PartitionClosedError) and (unreachable or self._core.registry is not None)
                and not self._closing() and not self._releasing):
            topic = message.topic
            self._forget(topic)
            first = topic not in self.held
            self.hold(message, waiter, size, acks, expires_s)
            if first:
                self.spawn(self._await_open(topic))
            return
        resolve_one(waiter, SendResult(False, error=exc, topic=message.topic), self._manys)

    async def _await_open(self, topic: str) -> None:
        """:meth:`refused`'s wait: on every cluster change (or a back-off), until the topic has an open reachable
        partition, or the first held message's deadline passes (they fail then, certainly not stored)."""
        core = self._core
        backoff_s = self.config.retry_backoff_ms / 1000.0
        tm: TopicMetadata | None = None
        while True:
            since = core.snapshots_applied
            tm = core.metadata.cache.get(topic)
            if tm is None or core.registry is None:  # dropped from the cache, or standalone: ask the brokers
                with contextlib.suppress(MetaqError):
                    tm = await core.metadata.refresh_topic(topic)
            if tm is not None and any(p.accept_publish for p in self._choices(topic, tm)):
                break
            held = self.held.get(topic)
            if not held or self._closing():
                break
            remaining = held[0][4] - self._loop.time()
            if remaining <= 0:
                break
            await core.cluster_changed(min(remaining, backoff_s if core.registry is None else remaining), since)
        self._releasing = True  # a message refused again now gets its failure, not another wait
        try:
            self._release(topic, tm, PartitionClosedError(
                f"every partition of topic {topic!r} stayed closed for publishing or unreachable"))
        finally:
            self._releasing = False
