"""The producer's public API: send, send_async, send_async_many, send_oneway, send_batch, flush, close.

How a message travels (docs/producer.md)::

    send / send_async / send_oneway / send_async_many
      -> checks: a Message with bytes data, a valid topic, within max_message_bytes and the buffer
      -> placement: the selector's partition, its open batch (placement.py, batches.py)
      -> sealed: full, its linger up, its partition idle, or a flush
      -> its lane: written when the generation rule allows (lanes.py), by the sender (sender.py)
      -> the reply resolves every message's SendResult: id base+i, offset base+i (results.py)

Failures are results, not exceptions (as MetaQ's SendResult): a broker error, a lost connection or the
delivery deadline gives ``SendResult(success=False, error=...)``, and ``error.maybe_stored`` says whether the
message may have been stored anyway. Only local misuse raises (InvalidArgument for a bad topic or an oversized
message, ClientClosedError after close).

Memory is bounded by ``max_buffered_bytes`` (messages accepted and not yet resolved): ``send`` and
``send_batch`` wait for room; ``send_async`` and ``send_oneway`` never wait and report BufferFullError instead.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from metaq.client.config import ProducerConfig
from metaq.client.core import ClientCore
from metaq.client.delayed import check_delay
from metaq.client.exceptions import BufferFullError, ClientClosedError
from metaq.client.metadata import Partition
from metaq.client.producer.batches import BufferLimit, record_size, too_large
from metaq.client.producer.placement import Placement
from metaq.client.producer.results import BatchChunk, BatchSendResult, Many, ManySendResult, ManyTable
from metaq.client.producer.sender import Sender
from metaq.client.producer.transactions import Transactions
from metaq.client.selectors import PartitionSelector, RoundRobinSelector
from metaq.errors import InvalidArgument, MetaqError, RequestTimeoutError
from metaq.protocol.records import RECORD_OVERHEAD_BYTES, encode_messages, encode_values
from metaq.types import Message, PartitionId, PartitionKey, SendResult, validate_topic

SendCallback = Callable[[SendResult], object]

_PLAIN_TYPES = frozenset({bytes, bytearray, memoryview})


class Producer(Transactions):
    """Sends messages to a session's brokers. Create it with ``MessageSessionFactory.create_producer``."""

    def __init__(self, core: ClientCore, config: ProducerConfig, selector: PartitionSelector | None = None) -> None:
        self._core = core
        self.config = config
        self.selector: PartitionSelector = selector if selector is not None else RoundRobinSelector()
        """Fixed at creation: the hooks and the moving of batches are taken from it."""
        self._loop = asyncio.get_running_loop()
        self._create_future = self._loop.create_future
        self._buffer = BufferLimit(config.max_buffered_bytes)
        self._manys = ManyTable()
        """send_async_many calls not yet resolved."""
        self._sender = Sender(core, config, self.selector, self._buffer, self._manys)
        self._placement = Placement(core, config, self.selector, self._sender, self._buffer, self._manys)
        self._place = self._placement.place
        self._place_plain = self._placement.place_plain
        self._runs = self._placement.runs
        self._run_async = self._placement.run.add_async
        self._run_oneway = self._placement.run.add_oneway
        self._hot = self._placement.hot
        """The topics kept between sends (the placement's, never replaced): in it, a topic was checked and the
        producer is not closing (closing empties it and keeps it empty)."""
        self._oneway_ok: dict[str, SendResult] = {}
        """topic -> the one SendResult every accepted one-way send of it returns (read-only, -1 fields)."""
        self._valid_topics: set[str] = set()
        self._closing = False
        self._closed = False
        Transactions.__init__(self)

    # -- counters and state --------------------------------------------------------------------------

    @property
    def buffered_bytes(self) -> int:
        """Bytes of messages accepted and not yet resolved (or written, for one-way sends)."""
        return self._buffer.used

    @property
    def unsent_batches(self) -> int:
        """Batches not yet written (open, or waiting in their partition's lane), and topics whose messages wait
        (messages sent in this event-loop step and placed at its end count as one)."""
        return len(self._placement.acc) + self._sender.unsent + self._placement.waiting_topics

    @property
    def outstanding_batches(self) -> int:
        """Batches sealed and without a result yet."""
        return self._sender.outstanding

    @property
    def rerouted_batches(self) -> int:
        """Batches moved to another partition after a failure that proved they were not stored."""
        return self._sender.rerouted_batches

    @property
    def multi_produce_requests(self) -> int:
        """MultiProduce requests written (several partitions' batches in one request, ``multi_produce``)."""
        return self._sender.multi_produce_requests

    @property
    def multi_produced_batches(self) -> int:
        """Batches that went in those requests (the others went one Produce each)."""
        return self._sender.multi_produced_batches

    @property
    def request_timeout_s(self) -> float:
        """How long a produce request waits for its reply (``request_timeout_s``, else the session's)."""
        return self._sender.timeout_s

    @property
    def producer_id(self) -> int:
        """Idempotent producer: the id in its batches' producer blocks (-1 otherwise)."""
        return self._sender.producer_id

    # -- sending -------------------------------------------------------------------------------------

    async def send(self, message: Message, timeout_s: float | None = None) -> SendResult:
        """Send one message and wait for its result; waits for buffer room first.

        Never raises for broker or network failures: check ``result.success`` and ``result.error``.
        ``timeout_s`` bounds this call's wait; when it passes the result is a failure with
        RequestTimeoutError, though the message may still be stored later (within ``delivery_timeout_ms``).
        """
        if self._tx is not None:
            return await self._tx.add(message)
        size = self._check(message)
        if not self._buffer.fits(size):
            try:
                await self._buffer.wait(size, timeout_s)
            except TimeoutError:
                return SendResult(False, error=self._full(), topic=message.topic)
        acks = self.config.acks
        if acks == 0:
            self._place(message, None, size, 0)
            return self._oneway_result(message.topic)
        fut: asyncio.Future[SendResult] = self._loop.create_future()
        self._place(message, fut, size, acks)
        if timeout_s is None:
            return await fut
        try:
            async with asyncio.timeout(timeout_s):
                return await asyncio.shield(fut)
        except TimeoutError:
            return SendResult(False, error=RequestTimeoutError(
                f"no result within {timeout_s} s; the message may still be stored"), topic=message.topic)

    def send_async(self, message: Message, callback: SendCallback | None = None) -> asyncio.Future[SendResult]:
        """Queue one message; the future (and ``callback(result)``, on the event loop) gets its SendResult.

        Does not wait: with the buffer full the result is an immediate failure with BufferFullError.
        """
        if self._runs and self._tx is None:
            # a plain message of a kept topic, its selector not reading it: checked in one call (plain_run.py)
            placed = self._run_async(message)
            if placed is not None:
                if callback is not None:
                    placed.add_done_callback(lambda f: None if f.cancelled() else callback(f.result()))
                return placed
        if (type(message) is Message and message.topic in self._hot and type(message.data) is bytes
                and message.key is None and message.attribute is None and not message.headers
                and message.deliver_at is None and message.delay_ms is None and self._tx is None):
            # a plain message of a topic kept between sends (checked already, not closing)
            size = RECORD_OVERHEAD_BYTES + len(message.data)
            if size > self.config.max_message_bytes:
                size = self._check(message)  # raises
            place = self._place_plain
        else:
            if self._tx is not None:
                self._not_in_transaction("send_async")
            size = self._check(message)
            place = self._place
        fut: asyncio.Future[SendResult] = self._create_future()
        if callback is not None:
            fut.add_done_callback(lambda f: None if f.cancelled() else callback(f.result()))
        buffer = self._buffer
        if buffer.used + size > buffer.limit and buffer.used:
            fut.set_result(SendResult(False, error=self._full(), topic=message.topic))
            return fut
        acks = self.config.acks
        if acks == 0:
            place(message, None, size, 0)
            fut.set_result(self._oneway_result(message.topic))
        else:
            place(message, fut, size, acks)
        return fut

    def send_oneway(self, message: Message) -> SendResult:
        """Send without waiting for or getting an acknowledgement (acks=0, MetaQ's async producer).

        The result's partition, offset and message id are -1. ``success`` is False only when the
        message was not even accepted (buffer full); a later failure is counted, never reported.
        """
        if self._runs and self._tx is None and self._run_oneway(message):
            # a plain message of a kept topic, its selector not reading it: checked in one call (plain_run.py)
            result = self._oneway_ok.get(message.topic)
            return result if result is not None else self._oneway_result(message.topic)
        if (type(message) is Message and message.topic in self._hot and type(message.data) is bytes
                and message.key is None and message.attribute is None and not message.headers
                and message.deliver_at is None and message.delay_ms is None and self._tx is None):
            # a plain message of a topic kept between sends (checked already, not closing)
            size = RECORD_OVERHEAD_BYTES + len(message.data)
            if size > self.config.max_message_bytes:
                size = self._check(message)  # raises
            place = self._place_plain
        else:
            if self._tx is not None:
                self._not_in_transaction("send_oneway")
            size = self._check(message)
            place = self._place
        buffer = self._buffer
        if buffer.used + size > buffer.limit and buffer.used:
            return SendResult(False, error=self._full(), topic=message.topic)
        place(message, None, size, 0)
        result = self._oneway_ok.get(message.topic)
        return result if result is not None else self._oneway_result(message.topic)

    def _oneway_result(self, topic: str) -> SendResult:
        """The SendResult of an accepted one-way send: one object per topic, shared by every such send."""
        result = self._oneway_ok.get(topic)
        if result is None:
            result = self._oneway_ok[topic] = SendResult(True, topic=topic)
        return result

    def send_async_many(self, messages: Iterable[Message], callback: Callable[[ManySendResult], object] | None = None
                        ) -> asyncio.Future[ManySendResult]:
        """Queue many messages, each as ``send_async`` would (its partition chosen by the selector, any topic,
        key, attribute, headers or delay), with one future for all of them instead of one per message.

        The future is resolved when every message has its result: a :class:`ManySendResult`, message ``i``'s
        SendResult built when read. ``callback(result)`` runs on the event loop after that. Misuse raises
        before any message is queued (not a Message, data not bytes, a bad topic, over max_message_bytes);
        a selector refusing a message (KeyHashSelector and no key) is that message's failed result. Does not
        wait: with the buffer full every message fails with BufferFullError. Cancelling the future does not
        withdraw the messages.
        """
        if self._tx is not None:
            self._not_in_transaction("send_async_many")
        self._check_open()
        msgs = messages if isinstance(messages, (list, tuple)) else list(messages)
        sizes = [self._check(message) for message in msgs]  # every message is checked before any is queued
        total = sum(sizes)
        fut: asyncio.Future[ManySendResult] = self._loop.create_future()
        if callback is not None:
            fut.add_done_callback(lambda f: None if f.cancelled() else callback(f.result()))
        many = Many(self._manys, len(msgs), fut)
        self._manys.add(many)
        if not msgs:
            many.finish()
            return fut
        if not self._buffer.fits(total):
            full = self._full()
            for i, message in enumerate(msgs):
                many.set_result(i, SendResult(False, error=full, topic=message.topic))
            return fut
        acks = self.config.acks
        if acks == 0:
            for i, message in enumerate(msgs):
                self._place(message, None, sizes[i], 0)
                many.set_result(i, self._oneway_result(message.topic))
            return fut
        tokens = range(many.base, many.base + len(msgs))
        start = 0
        first = msgs[0].topic
        if type(self.selector) is RoundRobinSelector and all(_plain(m) and m.topic == first for m in msgs):
            # One topic, plain messages, the default selector: placed a partition at a time (join_many). The
            # first message finds the topic's partitions, as send_async would.
            hot = self._placement.hot
            if first not in hot:
                self._place(msgs[0], tokens[0], sizes[0], acks)
                start = 1
            partitions = hot.get(first)
            if partitions is not None and start < len(msgs):
                try:
                    self._placement.place_deferred()
                    rest = msgs[start:]
                    stamps = [m.timestamp_ms for m in rest]
                    self._placement.join_many(first, partitions, [m.data for m in rest],
                                              stamps if max(stamps) >= 0 else None, tokens[start:], acks)
                    return fut
                except MetaqError:  # nothing placed: each message below gets its result (or waits)
                    pass
        for token, message, size in zip(tokens[start:], msgs[start:], sizes[start:], strict=True):
            try:
                self._place(message, token, size, acks)
            except MetaqError as exc:  # a selector's refusal (KeyHashSelector, no key): this message's result
                many.set_result(token - many.base, SendResult(False, error=exc, topic=message.topic))
        return fut

    async def send_batch(self, topic: str, items: Iterable[bytes | bytearray | Message], *,
                         partition: PartitionKey | None = None, timeout_s: float | None = None
                         ) -> BatchSendResult:
        """Send many messages of one topic as few frames as possible; the fast path for bulk data.

        Plain bytes payloads are encoded with one shared timestamp and no key (the fastest path);
        Message items keep their key, attribute and headers and must all have ``topic``. Items are
        cut into chunks of at most ``batch_bytes``; each chunk is one frame and goes to ``partition``
        if given, else to the partition the selector picks for the chunk's first message. Order is
        kept within a partition. Waits for buffer room chunk by chunk.
        """
        self._not_in_transaction("send_batch")
        self._check_open()
        self._check_topic(topic)
        values = items if isinstance(items, (list, tuple)) else list(items)
        if not values:
            return BatchSendResult(topic, [])
        chunks = self._chunk(topic, values)
        target: Partition | None = None
        if partition is not None:
            try:
                target = await self._core.partition(topic, partition)
            except InvalidArgument:
                raise
            except MetaqError as exc:  # unknown topic or partition, broker unreachable: a result, as sends
                if isinstance(partition, PartitionId):
                    number, broker = partition.partition, partition.broker_id
                else:
                    number, broker = (partition if isinstance(partition, int) else -1), -1
                return BatchSendResult(topic, [BatchChunk(number, -1, -1, len(c), exc, broker) for c, _ in chunks])
        acks = self.config.acks
        futures: list[asyncio.Future[BatchChunk]] = []
        compression = self.config.compression
        for chunk, size in chunks:
            if not self._buffer.fits(size):
                try:
                    await self._buffer.wait(size, timeout_s)
                except TimeoutError:
                    futures.append(self._done_chunk(BatchChunk(-1, -1, -1, len(chunk), self._full())))
                    continue
            first = chunk[0]
            first_msg = first if isinstance(first, Message) else Message(topic, bytes(first))
            try:
                key = await self._placement.batch_key(topic, first_msg, target, acks)
            except InvalidArgument:
                raise
            except MetaqError as exc:
                futures.append(self._done_chunk(BatchChunk(target.partition if target else -1, -1, -1, len(chunk),
                                                           exc, target.broker_id if target else -1)))
                continue
            now_ms = int(time.time() * 1000)
            if isinstance(first, Message):
                payload = encode_messages(chunk, compression, now_ms)
            else:
                payload = encode_values(chunk, now_ms, compression)
            fut: asyncio.Future[BatchChunk] = self._loop.create_future()
            self._placement.prebuilt(key, payload, len(chunk), fut, size, target is not None)
            futures.append(fut)
        if timeout_s is None:
            done_chunks = await asyncio.gather(*futures)
        else:
            try:
                async with asyncio.timeout(timeout_s):
                    done_chunks = await asyncio.gather(*(asyncio.shield(f) for f in futures))
            except TimeoutError:
                err = RequestTimeoutError(f"send_batch got no result within {timeout_s} s; messages may "
                                          f"still be stored")
                done_chunks = [f.result() if f.done() else BatchChunk(-1, -1, -1, len(c), err)
                               for f, (c, _s) in zip(futures, chunks, strict=True)]
        return BatchSendResult(topic, list(done_chunks))

    def _done_chunk(self, chunk: BatchChunk) -> asyncio.Future[BatchChunk]:
        done: asyncio.Future[BatchChunk] = self._loop.create_future()
        done.set_result(chunk)
        return done

    async def flush(self) -> None:
        """Send everything buffered now and wait until each batch has its result (stored, or failed)."""
        while self._placement.holding.tasks:
            await asyncio.gather(*list(self._placement.holding.tasks), return_exceptions=True)
        self._placement.seal_all()
        await self._sender.flush()

    async def close(self) -> None:
        """Flush, then refuse further sends. Idempotent."""
        if self._closed:
            return
        self._closing = True
        self._placement.close()
        for checker in self._checkers:
            await checker.stop()
        try:
            await self.flush()
        finally:
            self._closed = True
            self._placement.stop_timer()
            self._sender.close()

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- checks made before anything is queued -------------------------------------------------------

    def _check_open(self) -> None:
        if self._closing:
            raise ClientClosedError("the producer is closed")

    def _check_topic(self, topic: str) -> None:
        if topic not in self._valid_topics:
            validate_topic(topic)
            self._valid_topics.add(topic)

    def _check(self, message: Message) -> int:
        """Misuse raises here, before anything is queued; returns the message's size in a batch."""
        if self._closing:
            raise ClientClosedError("the producer is closed")
        if type(message) is not Message and not isinstance(message, Message):
            raise InvalidArgument(f"send takes a metaq Message, not {type(message).__name__}")
        data = message.data
        if type(data) is not bytes and not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidArgument(f"message data must be bytes, not {type(data).__name__}")
        if message.topic not in self._valid_topics:
            self._check_topic(message.topic)
        if message.key is None and message.attribute is None and not message.headers:
            size = RECORD_OVERHEAD_BYTES + len(data)
        else:
            size = record_size(message)
        if message.deliver_at is not None or message.delay_ms is not None:
            size += check_delay(message)
        if size > self.config.max_message_bytes:
            raise InvalidArgument(too_large(size, len(data), self.config.max_message_bytes))
        return size

    def _full(self) -> BufferFullError:
        return BufferFullError(
            f"the producer holds {self._buffer.used} bytes, max_buffered_bytes is {self.config.max_buffered_bytes}; "
            f"await send() (which waits for room) or flush(), or raise max_buffered_bytes")

    def _chunk(self, topic: str, values: Sequence[bytes | bytearray | Message]) -> list[tuple[Sequence[Any], int]]:
        """Cut items into (chunk, bytes) of at most batch_bytes each; checks every item first."""
        max_msg = self.config.max_message_bytes
        if isinstance(values[0], Message):
            sizes: list[int] = []
            for item in values:
                if not isinstance(item, Message):
                    raise InvalidArgument("send_batch items must be all bytes or all Message, not a mix")
                if item.topic != topic:
                    raise InvalidArgument(f"send_batch to {topic!r} got a message for topic {item.topic!r}")
                if item.deliver_at is not None or item.delay_ms is not None:
                    raise InvalidArgument("send_batch does not take delayed messages (deliver_at / delay_ms); send "
                                          "them with send or send_async")
                sizes.append(record_size(item))
        else:
            # Plain payloads: the common bulk case, so the per-item work stays in C (map, max, accumulate).
            if not set(map(type, values)) <= _PLAIN_TYPES:
                for i, item in enumerate(values):
                    if not isinstance(item, (bytes, bytearray, memoryview)):
                        raise InvalidArgument(f"send_batch items must be all bytes or all Message; item {i} is "
                                              f"{type(item).__name__}")
            sizes = list(map(RECORD_OVERHEAD_BYTES.__add__, map(len, values)))  # type: ignore[arg-type]
        biggest = max(sizes)
        if biggest > max_msg:
            i = sizes.index(biggest)
            raise InvalidArgument(f"item {i} is {biggest} bytes encoded; max_message_bytes is {max_msg}")
        ends = list(itertools.accumulate(sizes))  # ends[k]: bytes of items [0, k]
        limit = self.config.batch_bytes
        out: list[tuple[Sequence[Any], int]] = []
        start, base, n = 0, 0, len(values)
        while start < n:
            # The longest run from ``start`` within the limit, and at least one item.
            stop = max(bisect.bisect_right(ends, base + limit, start), start + 1)
            out.append((values[start:stop], ends[stop - 1] - base))
            start, base = stop, ends[stop - 1]
        return out


def _plain(message: Message) -> bool:
    return (type(message.data) is bytes and message.key is None and message.attribute is None and not message.headers
            and message.deliver_at is None and message.delay_ms is None)
