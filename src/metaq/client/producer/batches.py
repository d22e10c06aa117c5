"""Per-partition batches: records wait in their partition's open batch until it is full or its linger is up.

Pure logic, no event loop: time comes from the ``clock`` given, and the placement asks
:meth:`Accumulator.expired` when the earliest linger deadline passes. Each open batch belongs to one
:data:`BatchKey` (topic, partition, broker, acks) and becomes exactly one produce frame.

:class:`ProducerBatch` is a subclass of the producer's :class:`~metaq.client.producer.columns.PlainColumns`, whose
``append`` (one record) and ``extend`` (a run of plain records) are the only places where a message joins a batch;
:meth:`ProducerBatch.add` keeps a record's key, attribute and headers beside them.

A batch is sealed (taken out to be sent)

* as soon as it reaches ``batch_bytes``, or when the next record would take it past that;
* when its linger deadline passes -- the placement gives a new batch a deadline of *now* when the partition
  has nothing in flight (send at the end of this event-loop step) and of *now + linger* otherwise;
* when the placement seals it explicitly (flush, close, or the partition's previous batch completing).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from metaq.client.producer.columns import PlainColumns
from metaq.errors import InvalidArgument
from metaq.protocol.delayed import mark_delayed
from metaq.protocol.records import HEADER_BYTES, RECORD_OVERHEAD_BYTES, Compression, ProducerStamp, encode_columns
from metaq.types import Message

BatchKey = tuple[str, int, int, int] | tuple[str, int, int, int, bool]
"""(topic, partition or -1 for any, broker id, acks), and True for delayed messages (docs/delayed.md): they
travel in batches of their own, with attribute bit 7 set."""


def record_size(message: Message) -> int:
    """Bytes the message takes inside a batch (what the broker compares with maxMessageSize)."""
    return size_of(message.data, message.key, message.attribute, message.headers)


def size_of(value: bytes, key: bytes | None, attribute: str | None,
            headers: Sequence[tuple[str, bytes]] | None) -> int:
    size = RECORD_OVERHEAD_BYTES + len(value)
    if key is not None:
        size += len(key)
    if attribute is not None:
        size += len(attribute.encode())
    if headers:
        for name, hvalue in headers:
            size += 6 + len(name.encode()) + len(hvalue)
    return size


class ProducerBatch(PlainColumns):
    """Records for one partition that will travel in one produce frame: its plain columns (payloads, timestamps,
    waiters, count, bytes) are its base class's (columns.py), keys, attributes and headers its own.

    ``waiters[i]`` is what learns the result of record ``i``: an asyncio future (send_async, send), None
    (one-way), or an int naming a ``send_async_many`` call's message (results.ManyTable).
    A batch from ``send_batch`` has ``payload`` built up front and a single ``batch_waiter`` instead.
    """

    __slots__ = ("__dict__", "acks", "broker_id", "due_s", "expires_s", "key", "order", "partition", "payload", "plain",
                 "reported", "stamp", "stamped", "topic")

    # What most batches keep as it is: a class-level default, the batch's own value only once one is set (in its
    # __dict__, made then), so opening a batch -- once per batch at low rates -- sets only the fields above.
    delayed: bool = False
    """Its messages are delayed (the key's fifth field): attribute bit 7 is set when it is built."""
    keys: list[bytes | None] | None = None
    """None while no record of the batch has a key (likewise attributes and headers): the fast path."""
    attributes: list[str | None] | None = None
    headers: list[Sequence[tuple[str, bytes]] | None] | None = None
    batch_waiter: Any = None
    """A batch from send_batch: what learns the batch's result (the records have no waiters of their own)."""
    attempts: int = 0
    """Resends after a failure that may have stored it (what ``retries`` bounds)."""
    maybe_written: bool = False
    """An attempt may have stored it (it was written and its outcome is not a refusal)."""
    error: BaseException | None = None
    """The last failure met (a resend's cause; a delivery timeout names it)."""
    pinned: bool = False
    """The caller named the partition (send_batch(partition=...)): never moved to another one."""
    tried: tuple[tuple[int, int], ...] = ()
    """(broker id, partition) of the partitions this batch was moved away from (metaq.client.routing)."""

    def __init__(self, key: BatchKey, due_s: float, expires_s: float) -> None:
        self.key = key
        self.topic, self.partition, self.broker_id, self.acks = key[0], key[1], key[2], key[3]
        if len(key) > 4:
            self.delayed = True
        _columns_init(self, time.time_ns() // 1_000_000, HEADER_BYTES)
        self.due_s = due_s
        """When its linger is up: it leaves then, full or not."""
        self.expires_s = expires_s
        """Its delivery deadline (``delivery_timeout_ms`` after its first message was sent): its result by then."""
        self.plain = True
        """No record has a key, attribute or headers (keys, attributes and headers are None): a plain record may
        join through :meth:`append` alone."""
        self.payload: bytes | None = None
        self.reported = False
        """Its result was given (a batch in flight past its deadline stays in its lane until its request ends)."""
        self.order = 0
        """Its place in its lane's send order (lanes.Lane)."""
        self.stamp: ProducerStamp | None = None
        """Idempotent producer: the producer id, epoch and first sequence given at the batch's first write."""
        self.stamped: bytes | None = None
        """The payload with its producer block: what every attempt sends."""

    @classmethod
    def prebuilt(cls, key: BatchKey, payload: bytes, count: int, waiter: Any, now_s: float,
                 expires_s: float) -> ProducerBatch:
        batch = cls(key, now_s, expires_s)
        batch.payload = payload
        batch.count = count
        batch.size_bytes = len(payload)
        batch.batch_waiter = waiter
        return batch

    def add(self, timestamp_ms: int, value: bytes, key: bytes | None, attribute: str | None,
            headers: Sequence[tuple[str, bytes]] | None, waiter: Any, size: int) -> None:
        """Append one record, its key, attribute and headers included; a negative ``timestamp_ms`` means "now" (the
        batch's creation time, read once per batch instead of once per message). A plain record of a plain batch
        costs :meth:`append` alone."""
        i = self.count
        if key is not None or self.keys is not None:
            if self.keys is None:
                self.keys = [None] * i
                self.plain = False
            self.keys.append(key)
        if attribute is not None or self.attributes is not None:
            if self.attributes is None:
                self.attributes = [None] * i
                self.plain = False
            self.attributes.append(attribute)
        if headers or self.headers is not None:
            if self.headers is None:
                self.headers = [None] * i
                self.plain = False
            self.headers.append(headers)
        self.append(timestamp_ms, value, waiter, size)

    def absorb(self, other: ProducerBatch) -> None:
        """Take ``other``'s records after this batch's own (both unbuilt, same key): batches sealed while their
        partition could not be written travel as one frame instead of one frame each."""
        n, m = self.count, other.count
        if self.keys is not None or other.keys is not None:
            keys: list[bytes | None] = list(self.keys) if self.keys is not None else [None] * n
            keys.extend(other.keys if other.keys is not None else [None] * m)
            self.keys = keys
        if self.attributes is not None or other.attributes is not None:
            attributes: list[str | None] = list(self.attributes) if self.attributes is not None else [None] * n
            attributes.extend(other.attributes if other.attributes is not None else [None] * m)
            self.attributes = attributes
        if self.headers is not None or other.headers is not None:
            headers: list[Sequence[tuple[str, bytes]] | None] = (
                list(self.headers) if self.headers is not None else [None] * n)
            headers.extend(other.headers if other.headers is not None else [None] * m)
            self.headers = headers
        self.plain = self.plain and other.plain
        self.extend(other.values, other.timestamps, other.waiters, other.size_bytes - HEADER_BYTES)
        self.expires_s = min(self.expires_s, other.expires_s)

    def build(self, compression: Compression) -> bytes:
        if self.payload is None:
            self.payload = encode_columns(self.values, self.timestamps, keys=self.keys, attributes=self.attributes,
                                          headers=self.headers, compression=compression)
            if self.delayed:
                self.payload = mark_delayed(self.payload)
            self.drop_payloads()
            if not self.plain:
                self.keys, self.attributes, self.headers = None, None, None
        return self.payload

    def __repr__(self) -> str:
        return (f"<ProducerBatch {self.topic}-{self.partition}@{self.broker_id} {self.count} records "
                f"{self.size_bytes} bytes>")


_columns_init = PlainColumns.__init__
"""The columns' own __init__, called directly (cheaper than through super())."""

_NONE: tuple[ProducerBatch, ...] = ()


class Accumulator:
    """The open batches, one per key, and their linger deadlines."""

    def __init__(self, *, batch_bytes: int, max_message_bytes: int, delivery_timeout_s: float = 120.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.batch_bytes = batch_bytes
        self.max_message_bytes = max_message_bytes
        self.delivery_timeout_s = delivery_timeout_s
        self._clock = clock
        self.batches: dict[BatchKey, ProducerBatch] = {}
        """The open batches. The placement appends to one here and pops it when full, without telling the
        accumulator; a batch counts while this holds it."""
        self._by_linger: dict[float, deque[ProducerBatch]] = {}
        """The batches opened here, in the order they opened, one queue per linger time: on a clock that does not
        go back, each queue is in deadline order too (a producer uses two lingers, its own and 0). A batch popped
        from :attr:`batches` elsewhere stays queued until it reaches the front, and is dropped then. A heap did the
        same with a log n cost per batch and was slower."""

    def __len__(self) -> int:
        return len(self.batches)

    def open_batch(self, key: BatchKey) -> ProducerBatch | None:
        return self.batches.get(key)

    def append(self, key: BatchKey, timestamp_ms: int, value: bytes, msg_key: bytes | None,
               attribute: str | None, headers: Sequence[tuple[str, bytes]] | None, waiter: Any,
               linger_s: float, size: int | None = None, expires_s: float | None = None) -> Sequence[ProducerBatch]:
        """Add one record; return the batches this sealed (usually none).

        ``linger_s`` is the deadline, from now, of a batch this append opens (0 = send as soon as the placement
        next looks). ``size`` is the record's size in a batch when the caller already knows it
        (:func:`record_size`); ``expires_s`` the message's delivery deadline when it was sent earlier than now
        (held back before it joined a batch). Raises InvalidArgument for a record over max_message_bytes.
        """
        if size is None:
            size = size_of(value, msg_key, attribute, headers)
        if size > self.max_message_bytes:
            raise InvalidArgument(too_large(size, len(value), self.max_message_bytes))
        batch = self.batches.get(key)
        if batch is not None and batch.size_bytes + size > self.batch_bytes:
            del self.batches[key]
            batch2 = self.open(key, linger_s)
            batch2.add(timestamp_ms, value, msg_key, attribute, headers, waiter, size)
            return (batch, *self._settle(batch2, expires_s))
        if batch is None:
            batch = self.open(key, linger_s)
        batch.add(timestamp_ms, value, msg_key, attribute, headers, waiter, size)
        return self._settle(batch, expires_s)

    def open(self, key: BatchKey, linger_s: float) -> ProducerBatch:
        """A new open batch for ``key`` (which must have none), due ``linger_s`` from now."""
        now = self._clock()
        batch = ProducerBatch(key, now + linger_s, now + self.delivery_timeout_s)
        self.batches[key] = batch
        queue = self._by_linger.get(linger_s)
        if queue is None:
            queue = self._by_linger[linger_s] = deque()
        queue.append(batch)
        return batch

    def _settle(self, batch: ProducerBatch, expires_s: float | None) -> Sequence[ProducerBatch]:
        if expires_s is not None and expires_s < batch.expires_s:
            batch.expires_s = expires_s
        if batch.size_bytes >= self.batch_bytes:
            del self.batches[batch.key]
            return (batch,)
        return _NONE

    def next_deadline(self) -> float | None:
        """The earliest linger deadline of an open batch, or None when nothing is open."""
        batches = self.batches
        if not batches:
            for queue in self._by_linger.values():
                queue.clear()
            return None
        earliest: float | None = None
        for queue in self._by_linger.values():
            while queue:
                batch = queue[0]
                if batches.get(batch.key) is batch:
                    if earliest is None or batch.due_s < earliest:
                        earliest = batch.due_s
                    break
                queue.popleft()
        return earliest

    def expired(self, now_s: float | None = None) -> list[ProducerBatch]:
        """Seal and return every open batch whose linger deadline is at or before ``now_s`` (in no particular
        order). Costs the batches due (and those closed since they opened), not every open one."""
        now = self._clock() if now_s is None else now_s
        batches = self.batches
        due: list[ProducerBatch] = []
        for queue in self._by_linger.values():
            while queue and queue[0].due_s <= now:
                batch = queue.popleft()
                if batches.get(batch.key) is batch:
                    del batches[batch.key]
                    due.append(batch)
        return due

    def seal(self, key: BatchKey) -> ProducerBatch | None:
        return self.batches.pop(key, None)

    def seal_all(self) -> list[ProducerBatch]:
        batches = list(self.batches.values())
        self.batches.clear()
        for queue in self._by_linger.values():
            queue.clear()
        return batches


class BufferLimit:
    """``max_buffered_bytes``: bytes of messages accepted and not yet resolved, and the sends waiting for room."""

    __slots__ = ("limit", "used", "waiters")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.waiters: deque[asyncio.Future[None]] = deque()

    def fits(self, size: int) -> bool:
        """Whether ``size`` more bytes may be taken now (a message larger than the limit goes when nothing is held)."""
        return self.used + size <= self.limit or not self.used

    def release(self, size: int) -> None:
        self.used -= size
        if self.waiters:
            self.wake()

    def wake(self) -> None:
        waiters, self.waiters = self.waiters, deque()
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def wait(self, size: int, timeout_s: float | None) -> None:
        """Until ``size`` bytes fit (TimeoutError after ``timeout_s``)."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(timeout_s):
            while not self.fits(size):
                w: asyncio.Future[None] = loop.create_future()
                self.waiters.append(w)
                await w


def too_large(size: int, payload_bytes: int, max_message_bytes: int) -> str:
    return (f"message is {size} bytes encoded (payload {payload_bytes} bytes); max_message_bytes is "
            f"{max_message_bytes}. Split it, or raise max_message_bytes together with the broker's maxMessageSize")
