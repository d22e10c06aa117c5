"""The producer: selector -> per-partition batch -> one produce frame -> SendResult per message.

How a message travels::

    send / send_async / send_oneway
      -> partition chosen by the selector over the topic's partitions (metadata)
      -> appended to that partition's open batch (Accumulator)
      -> batch sealed: full, or its deadline passed, or the partition's previous batch came back
      -> queued for its broker; the broker's sender task writes it when the connection has an
         in-flight slot and its write buffer is under the high-water mark
      -> the reply (base offset, base id) resolves every message's SendResult: id base+i, offset base+i

Failures are results, not exceptions (as MetaQ's SendResult): a broker error, a lost connection or a
timeout gives ``SendResult(success=False, error=...)``. Only local misuse raises (InvalidArgument for
a bad topic or an oversized message, ClientClosedError after close).

Memory is bounded by ``max_buffered_bytes`` (messages accepted and not yet acknowledged): ``send`` and
``send_batch`` wait for room; ``send_async`` and ``send_oneway`` never wait and report
BufferFullError instead.

Topics with no known partitions (a topic the broker will create on first use) are sent to partition
-1 on the default broker, which picks a partition (MetaQ's behaviour); after the first success the
topic's metadata is fetched again so later messages go through the selector.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import gc
import itertools
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, overload

from metaq.client.accumulator import Accumulator, BatchKey, ProducerBatch, record_size
from metaq.client.config import ProducerConfig
from metaq.client.core import ClientCore
from metaq.client.delayed import check_delay, delayed_headers
from metaq.client.exceptions import BufferFullError, ClientClosedError
from metaq.client.metadata import Partition, TopicMetadata
from metaq.client.routing import BROKER_UNAVAILABLE, REFUSED_BEFORE_APPEND, not_stored
from metaq.client.selectors import PartitionSelector, RoundRobinSelector, StickyRoundRobinSelector, _Rotation
from metaq.client.transaction import (
    COMMIT,
    ROLLBACK,
    LocalTransaction,
    TransactionChecker,
    TransactionError,
    TransactionResult,
    Xid,
    decide,
)
from metaq.errors import (
    BrokerError,
    ConnectionClosedError,
    DuplicateSequenceError,
    InvalidArgument,
    MetaqError,
    NotMasterError,
    OutOfOrderSequenceError,
    PartitionClosedError,
    ProtocolError,
    RequestTimeoutError,
    UnknownServerError,
    error_for_code,
)
from metaq.net.connection import BrokerConnection
from metaq.net.servers import format_address
from metaq.protocol import messages as m
from metaq.protocol.messages import (
    ANY_PARTITION,
    MultiProduceRequest,
    MultiProduceResponse,
    ProducedPartition,
    ProducePartition,
    ProduceRequest,
    ProduceResponse,
)
from metaq.protocol.records import (
    HEADER_BYTES,
    RECORD_OVERHEAD_BYTES,
    SEQUENCE_LIMIT,
    ProducerStamp,
    encode_messages,
    encode_values,
    with_producer_stamp,
)
from metaq.types import PLAIN_PLACER, SPEEDUPS, Message, PartitionId, PartitionKey, SendResult, validate_topic

log = logging.getLogger(__name__)

SendCallback = Callable[[SendResult], object]

_PLAIN_TYPES = frozenset({bytes, bytearray, memoryview})
_MULTI_PRODUCE = MultiProduceRequest.API_KEY
_MULTI_PRODUCE_MAX_BATCHES = 1000
"""Batches one MultiProduce of this client carries at most (the protocol allows MULTI_PRODUCE_PARTITIONS_MAX)."""
_MULTI_PRODUCE_MAX_BYTES = 1 << 20
"""Their bytes at most, unless one batch is larger (it goes alone): the reply waits for the slowest batch, so
big batches, which pay their request's fixed cost many times over, gain nothing from sharing one."""


class _FlushBarrier:
    """What one :meth:`Producer.flush` waits for: the batches in flight when it was called, counted down as
    each is acknowledged or fails (one future per flush, not one per batch and a gather over them all)."""

    __slots__ = ("future", "left")

    def __init__(self, future: asyncio.Future[None], left: int) -> None:
        self.future = future
        self.left = left

    def batch_done(self) -> None:
        self.left -= 1
        if self.left == 0 and not self.future.done():
            self.future.set_result(None)


class _MultiLimit:
    """``takewhile`` predicate: the batches that fit one MultiProduce, from the first on."""

    __slots__ = ("size",)

    def __init__(self) -> None:
        self.size = 0

    def __call__(self, batch: ProducerBatch) -> bool:
        if not batch.acks or (self.size and self.size + batch.size_bytes > _MULTI_PRODUCE_MAX_BYTES):
            return False
        self.size += batch.size_bytes
        return True


_RECORD_PREFIX = RECORD_OVERHEAD_BYTES

HOT_KEEP_S = 0.1
"""How long a topic's partitions stay cached for the send fast path (Producer._hot) when nothing changes: a
message sent one per event-loop iteration (from a request handler, say) then takes the compiled path too, and
the metadata's age is still looked at (a background refresh started when stale) at least this often."""


def _outcome(fut: asyncio.Future[Any]) -> tuple[Any, BaseException | None]:
    """A produce reply future's response and None, or None and the error that stands for it."""
    if fut.cancelled():
        return None, ConnectionClosedError("the produce request was cancelled")
    err = fut.exception()
    return (fut.result(), None) if err is None else (None, err)


class _Sequence:
    """An idempotent producer's sequence on one partition: the epoch and the next sequence number."""

    __slots__ = ("epoch", "next")

    def __init__(self) -> None:
        self.epoch = 0
        self.next = 0


def _new_producer_id() -> int:
    """A random 62-bit producer id (> 0): two producers share one with odds of about 2**-62 per pair, so
    no broker has to hand ids out (docs/transactions.md)."""
    return secrets.randbits(62) + 1


def _sent_before(a: ProducerStamp, b: ProducerStamp) -> bool:
    """Whether stamp ``a`` was given before ``b`` on the same partition (epochs, then wrapping sequences)."""
    if a.producer_epoch != b.producer_epoch:
        return a.producer_epoch < b.producer_epoch
    return 0 < (b.base_sequence - a.base_sequence) % SEQUENCE_LIMIT < SEQUENCE_LIMIT // 2


def _resolve_ok(waiters: list[Any], start: int, base_id: int, base_offset: int, partition: int, topic: str,
                broker_id: int, manys: _ManyTable | None = None) -> None:
    """Give ``waiters[start:]`` their SendResult (id and offset base+i, or -1 without ids) in one pass; a
    future the caller cancelled is skipped (rare: caught and the pass resumed after it).

    The cyclic GC is paused for the pass (as decode_batch does): a batch allocates thousands of results
    while the caller holds thousands of futures, and collections triggered in the middle of it cost more
    than the resolving (0.36-0.45 us per message against 0.13-0.14 us paused, in a loop of 2,000-result
    batches). set_result only schedules callbacks, so no other code runs while it is paused."""
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        if manys:  # a send_async_many call is unresolved: its messages may be in this batch
            _resolve_mixed(waiters, (partition, base_offset, base_id, None, topic, broker_id), manys)
        else:
            _resolve_ok_pass(waiters, start, base_id, base_offset, partition, topic, broker_id)
    finally:
        if gc_was_enabled:
            gc.enable()


_new_result = SendResult.__new__


def _resolve_ok_pass_py(waiters: list[Any], start: int, base_id: int, base_offset: int, partition: int, topic: str,
                        broker_id: int) -> None:
    """The SendResults are built without ``SendResult.__init__``: an empty instance and its slots assigned
    here (no Python call with 7 arguments per message). Every field of SendResult must be assigned here
    (tests/integration/test_send_results.py checks that). With the compiled SendResult (metaq.types.SPEEDUPS)
    the pass is metaq._speedups.resolve_ok instead, below."""
    i = start
    try:
        if base_id >= 0:
            new, cls = _new_result, SendResult
            for w in itertools.islice(waiters, start, None):
                if w is not None:
                    r = new(cls)
                    r.success = True
                    r.message_id = base_id + i
                    r.partition = partition
                    r.offset = base_offset + i
                    r.error = None
                    r.topic = topic
                    r.broker_id = broker_id
                    w.set_result(r)
                i += 1
        else:
            for w in itertools.islice(waiters, start, None):
                if w is not None:
                    w.set_result(SendResult(True, -1, partition, -1, None, topic, broker_id))
                i += 1
    except asyncio.InvalidStateError:  # this one was cancelled (or resolved) by its caller
        _resolve_ok_pass_py(waiters, i + 1, base_id, base_offset, partition, topic, broker_id)


if SPEEDUPS:
    from metaq._speedups import resolve_ok as _compiled_resolve_ok

    def _resolve_ok_pass_c(waiters: list[Any], start: int, base_id: int, base_offset: int, partition: int,
                           topic: str, broker_id: int) -> None:
        """The same pass in one C call (metaq._speedups.resolve_ok): each result built and its future's
        ``set_result`` called in C; the results are the compiled SendResult, which the cyclic GC never sees."""
        _compiled_resolve_ok(waiters, start, base_id, base_offset, partition, topic, broker_id,
                             asyncio.InvalidStateError)

    _resolve_ok_pass = _resolve_ok_pass_c
else:
    _resolve_ok_pass = _resolve_ok_pass_py


_Outcome = tuple[int, int, int, "BaseException | None", str, int]
"""A batch's outcome as :class:`ManySendResult` keeps it: (partition, base offset, base message id, error,
topic, broker id); the SendResult of message ``i`` of the batch is made from it when read."""


def _resolve_mixed(waiters: list[Any], outcome: _Outcome, manys: _ManyTable) -> None:
    """Resolve a batch whose waiters may include ``send_async_many`` entries (ints, see :class:`_ManyTable`):
    those get the batch's outcome and their position in it, no SendResult; futures get theirs as in
    :func:`_resolve_ok_pass`. Used only while a ``send_async_many`` call is unresolved, and for failures."""
    partition, base_offset, base_id, error, topic, broker_id = outcome
    many: _Many | None = None
    lo = hi = 0
    for i, w in enumerate(waiters):
        if w is None:
            continue
        if type(w) is int:
            if not lo <= w < hi:  # usually the previous message's call
                many = manys.find(w)
                if many is None:
                    continue
                lo, hi = many.base, many.base + len(many.outcomes)
            assert many is not None
            index = w - lo
            if many.outcomes[index] is None:
                many.outcomes[index] = outcome
                many.positions[index] = i
                many.pending -= 1
                if not many.pending:
                    many.finish()
        elif not w.done():
            if error is not None:
                w.set_result(SendResult(False, -1, partition, -1, error, topic, broker_id))
            elif base_id >= 0:
                w.set_result(SendResult(True, base_id + i, partition, base_offset + i, None, topic, broker_id))
            else:
                w.set_result(SendResult(True, -1, partition, -1, None, topic, broker_id))


class ManySendResult(Sequence[SendResult]):
    """The result of :meth:`Producer.send_async_many`: message ``i``'s SendResult is built when read.

    ``success``: every message was stored; ``errors``: the distinct errors of those that were not, in
    message order; ``failures``: how many were not.
    """

    __slots__ = ("_many",)

    def __init__(self, many: _Many) -> None:
        self._many = many

    def __len__(self) -> int:
        return len(self._many.outcomes)

    @property
    def success(self) -> bool:
        return self._many.failures == 0

    @property
    def failures(self) -> int:
        return self._many.failures

    @property
    def errors(self) -> list[BaseException]:
        seen: list[BaseException] = []
        for r in self:
            if r.error is not None and not any(r.error is e for e in seen):
                seen.append(r.error)
        return seen

    @overload
    def __getitem__(self, index: int) -> SendResult: ...

    @overload
    def __getitem__(self, index: slice) -> list[SendResult]: ...

    def __getitem__(self, index: int | slice) -> SendResult | list[SendResult]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        many = self._many
        n = len(many.outcomes)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(index)
        return many.result(index)

    def __iter__(self) -> Iterator[SendResult]:
        result = self._many.result
        for i in range(len(self._many.outcomes)):
            yield result(i)

    def __repr__(self) -> str:
        return f"<ManySendResult {len(self)} messages, {self.failures} failed>"


class _ManyTable:
    """The unresolved ``send_async_many`` calls of a producer. Each call takes the next ``n`` numbers of a
    counter, and message ``i`` waits in its batch as the int ``base + i``: an int is not tracked by the
    cyclic GC, where a per-message tuple or future made collections cost as much as the rest of the call."""

    __slots__ = ("_bases", "_by_base", "_next")

    def __init__(self) -> None:
        self._next = 0
        self._bases: list[int] = []
        self._by_base: dict[int, _Many] = {}

    def __len__(self) -> int:
        return len(self._by_base)

    def add(self, many: _Many) -> None:
        many.base = self._next
        self._next += len(many.outcomes) + 1  # +1: an empty call still gets a base of its own
        self._bases.append(many.base)  # increasing: appended in order
        self._by_base[many.base] = many

    def remove(self, many: _Many) -> None:
        del self._by_base[many.base]
        i = bisect.bisect_left(self._bases, many.base)
        del self._bases[i]

    def find(self, token: int) -> _Many | None:
        i = bisect.bisect_right(self._bases, token) - 1
        if i < 0:
            return None
        many = self._by_base[self._bases[i]]
        return many if token < many.base + len(many.outcomes) else None


class _MasterWait:
    """A broker id whose master answered NOT_MASTER (cluster mode): its batches wait for the new master.

    ``batches``: the refused ones, in the order their refusals came (their send order), put back at the front
    of the broker's queue; nothing of that queue is written until :meth:`Producer._await_master` ends the
    wait, so a partition's later batches cannot overtake them."""

    __slots__ = ("address", "batches", "deadline", "over")

    def __init__(self, address: str, deadline: float, over: asyncio.Future[None]) -> None:
        self.address = address
        self.deadline = deadline
        self.batches: list[ProducerBatch] = []
        self.over = over


class _Many:
    """One ``send_async_many`` call: each message's batch outcome and position, filled in as batches complete
    (``batch.waiters`` holds ``base + index`` for its messages); the future is resolved by the last one."""

    __slots__ = ("base", "failures", "future", "outcomes", "pending", "positions", "table")

    def __init__(self, table: _ManyTable, n: int, future: asyncio.Future[ManySendResult]) -> None:
        self.table = table
        self.base = 0
        self.future = future
        self.outcomes: list[_Outcome | SendResult | None] = [None] * n
        """Per message: its batch's outcome, or its SendResult when it failed before joining a batch."""
        self.positions: list[int] = [0] * n
        self.pending = n
        self.failures = 0

    def set_result(self, index: int, result: SendResult) -> None:
        """A message that failed (or, one-way, was accepted) without a batch outcome."""
        if self.outcomes[index] is None:
            self.outcomes[index] = result
            self.pending -= 1
            if not self.pending:
                self.finish()

    def finish(self) -> None:
        self.table.remove(self)
        failures = 0
        for o in self.outcomes:
            if (o[3] is not None) if type(o) is tuple else not o.success:  # type: ignore[union-attr]
                failures += 1
        self.failures = failures
        if not self.future.done():
            self.future.set_result(ManySendResult(self))

    def result(self, i: int) -> SendResult:
        o = self.outcomes[i]
        if type(o) is not tuple:
            assert isinstance(o, SendResult), "read before the result was complete"
            return o
        partition, base_offset, base_id, error, topic, broker_id = o
        if error is not None:
            return SendResult(False, -1, partition, -1, error, topic, broker_id)
        if base_id >= 0:
            pos = self.positions[i]
            return SendResult(True, base_id + pos, partition, base_offset + pos, None, topic, broker_id)
        return SendResult(True, -1, partition, -1, None, topic, broker_id)


class _TransactionScope:
    def __init__(self, producer: Producer, timeout_s: float | None, producer_group: str) -> None:
        self.producer, self.timeout_s, self.producer_group = producer, timeout_s, producer_group
        self.result: TransactionResult | None = None

    async def __aenter__(self) -> _TransactionScope:
        await self.producer.begin_transaction(self.timeout_s, self.producer_group)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if exc_type is None:
            self.result = await self.producer.commit()
        else:
            await self.producer.rollback()


@dataclass(frozen=True, slots=True)
class BatchChunk:
    """One produce frame of a ``send_batch``: ``count`` messages stored contiguously (or not at all)."""

    partition: int
    base_offset: int
    base_message_id: int
    count: int
    error: BaseException | None = None
    broker_id: int = -1
    """With ``partition``: the partition the chunk was sent to (``brokerId-partition``)."""

    @property
    def success(self) -> bool:
        return self.error is None


class BatchSendResult(Sequence[SendResult]):
    """The result of :meth:`Producer.send_batch`: a sequence of SendResult, built only when read.

    ``chunks`` holds one entry per produce frame; message ``i`` of a chunk has offset
    ``base_offset + i`` and id ``base_message_id + i``. One-way results carry -1 for both.
    """

    __slots__ = ("_starts", "chunks", "topic")

    def __init__(self, topic: str, chunks: list[BatchChunk]) -> None:
        self.topic = topic
        self.chunks = chunks
        starts, n = [], 0
        for c in chunks:
            starts.append(n)
            n += c.count
        starts.append(n)
        self._starts = starts

    @property
    def success(self) -> bool:
        return all(c.error is None for c in self.chunks)

    @property
    def errors(self) -> list[BaseException]:
        return [c.error for c in self.chunks if c.error is not None]

    def __len__(self) -> int:
        return self._starts[-1]

    def _result(self, chunk: BatchChunk, i: int) -> SendResult:
        if chunk.error is not None:
            return SendResult(False, -1, chunk.partition, -1, chunk.error, self.topic, chunk.broker_id)
        base_id = chunk.base_message_id
        return SendResult(True, base_id + i if base_id >= 0 else -1, chunk.partition,
                          chunk.base_offset + i if chunk.base_offset >= 0 else -1, None, self.topic,
                          chunk.broker_id)

    @overload
    def __getitem__(self, index: int) -> SendResult: ...

    @overload
    def __getitem__(self, index: slice) -> list[SendResult]: ...

    def __getitem__(self, index: int | slice) -> SendResult | list[SendResult]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(index)
        k = bisect.bisect_right(self._starts, index) - 1
        return self._result(self.chunks[k], index - self._starts[k])

    def __iter__(self) -> Iterator[SendResult]:
        for chunk in self.chunks:
            for i in range(chunk.count):
                yield self._result(chunk, i)

    def message_ids(self) -> list[int]:
        out: list[int] = []
        for c in self.chunks:
            if c.error is None and c.base_message_id >= 0:
                out.extend(range(c.base_message_id, c.base_message_id + c.count))
            else:
                out.extend([-1] * c.count)
        return out

    def __repr__(self) -> str:
        return f"<BatchSendResult {self.topic} {len(self)} messages, {len(self.chunks)} chunks, success={self.success}>"


class Producer:
    """Sends messages to a session's brokers. Create it with ``MessageSessionFactory.create_producer``."""

    def __init__(self, core: ClientCore, config: ProducerConfig, selector: PartitionSelector | None = None) -> None:
        self._core = core
        self.config = config
        self.selector: PartitionSelector = selector if selector is not None else RoundRobinSelector()
        """Fixed at creation: the hooks, rerouting and the compiled placement below are taken from it."""
        self._loop = asyncio.get_running_loop()
        self._acc = Accumulator(batch_bytes=config.batch_bytes, max_message_bytes=config.max_message_bytes,
                                clock=self._loop.time)
        self._linger_s = config.linger_ms / 1000.0
        self._max_message_bytes = config.max_message_bytes
        self._max_buffered = config.max_buffered_bytes
        self._acks = config.acks
        self._batch_bytes = config.batch_bytes
        self._oneway_ok: dict[str, SendResult] = {}
        """topic -> the one SendResult every accepted one-way send of it returns (read-only, -1 fields)."""
        self._manys = _ManyTable()
        """send_async_many calls not yet resolved: while any is, batches are resolved by _resolve_mixed."""
        self._timeout_s = config.request_timeout_s or core.config.request_timeout_s
        self._timeout_ms = int(self._timeout_s * 1000)
        self._buffered = 0
        self._room_waiters: deque[asyncio.Future[None]] = deque()
        self._busy: dict[BatchKey, int] = {}
        self._queues: dict[int, deque[ProducerBatch]] = {}
        self._senders: dict[int, asyncio.Task[None]] = {}
        self._timer: asyncio.TimerHandle | asyncio.Handle | None = None
        self._timer_when = 0.0
        self._queued_last: dict[BatchKey, ProducerBatch] = {}
        """The last batch of each key queued for its broker (not yet written): where a batch sealed while the
        connection has no room (max_in_flight replies owed, its buffer full) is merged instead of queueing
        behind it, so a slow broker (fsync per ack) gets fewer, fuller frames rather than a growing queue."""
        self._gathered: dict[BrokerConnection, list[ProducerBatch]] | None = None
        """While :meth:`_on_timer` dispatches (or a MultiProduce reply releases partitions): the batches that
        would be written at once, per connection, written together at the end (one MultiProduce each when
        the broker serves it) and each connection flushed then."""
        self._multi = config.multi_produce
        self._cold: dict[str, list[tuple[Message, Any, int, int]]] = {}
        self._cold_tasks: set[asyncio.Task[None]] = set()
        self._outstanding: dict[ProducerBatch, list[_FlushBarrier] | None] = {}
        """The batches in flight, each with the flushes waiting for it (None: none yet)."""
        self._valid_topics: set[str] = set()
        self._unavailable = core.unavailable
        self._reroutable = bool(getattr(self.selector, "reroutable", False))
        """Round robin and random: unreachable partitions are left out and a batch certainly not
        stored is moved to another partition (metaq.client.routing). Key hash and custom selectors: no."""
        self._usable: dict[str, tuple[Sequence[Partition], int, Sequence[Partition]]] = {}
        """topic -> (metadata's partitions, Unavailable version, the usable ones): recomputed only when
        either changes, so the hot path does not filter per message."""
        self._hot: dict[str, Sequence[Partition]] = {}
        """topic -> the partitions its messages choose from, as :meth:`_queue` found them: the messages after the
        first skip the metadata lookup, its clock read and the Unavailable check (send_async's and send_oneway's
        compiled path takes only hot topics). Emptied when the metadata cache or the set of partitions left out
        changes (their listeners call :meth:`_end_hot` at once), after HOT_KEEP_S in any case, and at the end of
        the event-loop iteration while some partition is left out (that ends by the clock, with nobody told)."""
        self._hot_reset: asyncio.Handle | None = None
        core.metadata.cache.listeners.add(self._end_hot)
        self._unavailable.listeners.add(self._end_hot)
        self._batch_done: Callable[[str, int, int], object] | None = getattr(self.selector, "batch_done", None)
        """A sticky selector's hook: told when a batch it placed leaves (StickyRoundRobinSelector)."""
        self._fast_async = self._plain_placer(self._acks) if self._acks else None
        self._fast_oneway = self._plain_placer(0)
        """send_async's and send_oneway's common case in one compiled call each (:meth:`_plain_placer`), or None."""
        self.rerouted_batches = 0
        """Batches moved to another partition after a failure that proved they were not stored."""
        self.multi_produce_requests = 0
        """MultiProduce requests written (several partitions' batches in one request, ``multi_produce``)."""
        self.multi_produced_batches = 0
        """Batches that went in those requests (the others went one Produce each)."""
        self._retries = config.effective_retries
        self._idempotent = config.enable_idempotence
        self.producer_id = _new_producer_id() if self._idempotent else -1
        """Idempotent producer: the id in every batch's producer block (-1 otherwise)."""
        self._any_partition_id = _new_producer_id() if self._idempotent else -1
        """The id used for batches the broker places (partition -1: a topic with no known partitions yet),
        whose sequences the broker keeps on the partition it picks for this id."""
        self._sequences: dict[tuple[int, str, int], _Sequence] = {}
        self._checkers: list[TransactionChecker] = []
        self._tx: LocalTransaction | None = None
        """The open local transaction: ``send`` goes into it (docs/transactions.md)."""
        self._closed = False
        self._closing = False
        self._master_waits: dict[int, _MasterWait] = {}
        """Cluster mode: broker ids whose batches wait for a new master (NOT_MASTER), see :meth:`_wait_for_master`."""
        self._releasing_held = False
        """While :meth:`_await_open` routes the messages it held: a refusal is their result, not a new wait."""

    # -- public API ---------------------------------------------------------------------------

    # -- local transactions (docs/transactions.md) -----------------------------------------------

    def transaction(self, timeout_s: float | None = None, producer_group: str = "") -> _TransactionScope:
        """``async with producer.transaction(): await producer.send(...)``: commit on exit, roll back on an
        exception. ``timeout_s``: the broker rolls it back if not committed by then (at most the broker's
        maxTxTimeoutInSeconds; None: that maximum)."""
        return _TransactionScope(self, timeout_s, producer_group)

    async def begin_transaction(self, timeout_s: float | None = None, producer_group: str = "") -> None:
        """Start a local transaction: ``send`` puts messages into it until :meth:`commit` or :meth:`rollback`."""
        self._check_open()
        if self._tx is not None:
            raise TransactionError("a transaction is already open on this producer")
        self._tx = LocalTransaction(self, timeout_s, producer_group)

    async def commit(self) -> TransactionResult:
        """Make the transaction's messages visible, all at once; where they were stored."""
        tx = self._open_tx()
        try:
            return await tx.commit()
        finally:
            self._tx = None

    async def rollback(self) -> None:
        """Drop the transaction's messages; none is ever visible."""
        tx = self._open_tx()
        try:
            await tx.rollback()
        finally:
            self._tx = None

    # -- half messages (RocketMQ's transactional messages; docs/transactions.md) ----------------------

    async def send_in_transaction(self, message: Message, execute: Callable[..., Any], producer_group: str,
                                  timeout_s: float | None = None) -> tuple[str, str]:
        """Send ``message`` as a half message (stored on the broker, invisible), run
        ``execute(message, transaction_id)`` (your local transaction: returns "commit", "rollback" or
        "unknown"; may be a coroutine function), and commit or roll back the message as it says.
        "unknown" (or an exception) leaves the decision to the producer group's checker
        (:meth:`start_transaction_checker`). Returns (transaction id, decision)."""
        await self.begin_transaction(timeout_s, producer_group)
        tx = self._open_tx()
        try:
            await tx.add(message)
            await tx.prepare()
        except BaseException:
            await self.rollback()
            raise
        decision = await decide(execute, message, tx.transaction_id)
        if decision == COMMIT:
            await self.commit()
        elif decision == ROLLBACK:
            await self.rollback()
        else:
            tx.finished = True
            self._tx = None
        return tx.transaction_id, decision

    async def start_transaction_checker(self, producer_group: str, check: Callable[[str], Any]) -> TransactionChecker:
        """Answer the brokers' check-backs for ``producer_group``'s undecided half messages with
        ``check(transaction_id)`` -> "commit" / "rollback" / "unknown". Stop it with ``await checker.stop()``."""
        checker = await TransactionChecker(self, producer_group, check).start()
        self._checkers.append(checker)
        return checker

    # -- XA: the DB-API two-phase-commit interface (docs/transactions.md, "XA") -------------------

    async def tpc_begin(self, xid: Any, timeout_s: float | None = None) -> None:
        """Start a transaction branch named by ``xid`` (an :class:`Xid`, psycopg's Xid, a 3-tuple or a
        string); then ``send``, :meth:`tpc_prepare`, :meth:`tpc_commit` / :meth:`tpc_rollback`."""
        self._check_open()
        if self._tx is not None:
            raise TransactionError("a transaction is already open on this producer")
        self._tx = LocalTransaction(self, timeout_s, "", Xid.of(xid).key)

    async def tpc_prepare(self) -> None:
        await self._open_tx().prepare()

    async def tpc_commit(self, xid: Any = None) -> None:
        """Without ``xid``: commit the current branch (two-phase after tpc_prepare, else one-phase).
        With one: commit that prepared branch, found with :meth:`tpc_recover` (after a crash)."""
        if xid is None:
            await self.commit()
        else:
            await self._end_recovered(Xid.of(xid), m.TX_COMMIT)

    async def tpc_rollback(self, xid: Any = None) -> None:
        if xid is None:
            await self.rollback()
        else:
            await self._end_recovered(Xid.of(xid), m.TX_ROLLBACK)

    async def tpc_recover(self) -> list[Xid]:
        """The prepared branches on every broker this session knows (MetaQ's recover())."""
        return [Xid.parse(key) for _broker, key in await self._prepared()]

    async def _prepared(self) -> list[tuple[int, str]]:
        await self._core.metadata.refresh_all()
        found: list[tuple[int, str]] = []
        for broker_id in sorted(set(self._core.metadata.cache.brokers) | set(self._core.server_ids.values())):
            response = await self._core.request(m.TransactionRequest(m.TX_RECOVER), broker_id)
            found.extend((broker_id, key) for key in response.xids)
        return found

    async def _end_recovered(self, xid: Xid, op: int) -> None:
        holders = [b for b, key in await self._prepared() if key == xid.key]
        if not holders:
            raise TransactionError(f"no broker holds a prepared transaction {xid.key} (finished already, or "
                                   "rolled back after maxTxTimeoutInSeconds)")
        for broker_id in holders:
            await self._core.request(m.TransactionRequest(op, xid.key), broker_id)

    def _not_in_transaction(self, what: str) -> None:
        if self._tx is not None:
            raise TransactionError(f"{what} cannot be used inside a transaction: use send (docs/transactions.md)")

    def _open_tx(self) -> LocalTransaction:
        if self._tx is None:
            raise TransactionError("no transaction is open on this producer (begin_transaction first)")
        return self._tx

    @property
    def buffered_bytes(self) -> int:
        """Bytes of messages accepted and not yet acknowledged (or written, for one-way sends)."""
        return self._buffered

    @property
    def unsent_batches(self) -> int:
        """Batches not yet handed to a connection (open, or queued for a broker)."""
        return len(self._acc) + sum(len(q) for q in self._queues.values()) + sum(
            1 for pending in self._cold.values() if pending)

    @property
    def outstanding_batches(self) -> int:
        """Batches sealed and not yet acknowledged or failed."""
        return len(self._outstanding)

    async def send(self, message: Message, timeout_s: float | None = None) -> SendResult:
        """Send one message and wait for its result; waits for buffer room first.

        Never raises for broker or network failures: check ``result.success`` and ``result.error``.
        ``timeout_s`` bounds the whole wait; when it passes the result is a failure with
        RequestTimeoutError, though the message may still be stored later.
        """
        if self._tx is not None:
            return await self._tx.add(message)
        acks = self.config.acks
        size = self._check(message)
        if self._buffered + size > self.config.max_buffered_bytes and self._buffered:
            try:
                await self._wait_room(size, timeout_s)
            except TimeoutError:
                return SendResult(False, error=self._full(), topic=message.topic)
        if acks == 0:
            return self._enqueue(message, None, size, 0)
        fut: asyncio.Future[SendResult] = self._loop.create_future()
        self._queue(message, fut, size, acks)
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
        fast = self._fast_async
        if fast is not None:  # the common case in one compiled call: what the code below does for it
            placed = fast.place(message)
            if placed is not None:
                if callback is not None:
                    placed.add_done_callback(lambda f: None if f.cancelled() else callback(f.result()))
                return placed
        if self._tx is not None:
            self._not_in_transaction("send_async")
        if (type(message) is Message and type(message.data) is bytes and message.key is None
                and message.attribute is None and not message.headers and message.deliver_at is None
                and message.delay_ms is None):
            partitions = self._hot.get(message.topic)
            # _check for the common case: a topic already used in this loop iteration is valid, and the
            # producer is not closing (close() empties _hot, and _queue does not fill it while closing)
            size = _RECORD_PREFIX + len(message.data)
            if partitions is None or size > self._max_message_bytes:
                size = self._check(message)  # raises for misuse
        else:
            partitions = None
            size = self._check(message)
        fut: asyncio.Future[SendResult] = self._loop.create_future()
        if callback is not None:
            fut.add_done_callback(lambda f: None if f.cancelled() else callback(f.result()))
        if self._buffered + size > self._max_buffered and self._buffered:
            fut.set_result(SendResult(False, error=self._full(), topic=message.topic))
            return fut
        acks = self._acks
        if acks == 0:
            fut.set_result(self._enqueue(message, None, size, 0))
            return fut
        if partitions is None:
            self._queue(message, fut, size, acks)
            return fut
        self._place_plain(message, partitions, fut, size, acks)  # a plain message of a hot topic
        return fut

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
        msgs = messages if isinstance(messages, (list, tuple)) else list(messages)
        # Every message is checked before any is queued; for a plain message of a topic already checked,
        # _check comes down to its size.
        self._check_open()
        valid, prefix, max_bytes, check = self._valid_topics, _RECORD_PREFIX, self._max_message_bytes, self._check
        sizes: list[int] = []
        total = plain = 0
        first_topic = msgs[0].topic if msgs and type(msgs[0]) is Message else None
        for message in msgs:
            if (type(message) is Message and type(message.data) is bytes and message.key is None
                    and message.attribute is None and not message.headers and message.deliver_at is None
                    and message.delay_ms is None and message.topic in valid):
                size = prefix + len(message.data)
                if size > max_bytes:
                    size = check(message)
                if message.topic == first_topic:
                    plain += 1
            else:
                size = check(message)
            sizes.append(size)
            total += size
        fut: asyncio.Future[ManySendResult] = self._loop.create_future()
        if callback is not None:
            fut.add_done_callback(lambda f: None if f.cancelled() else callback(f.result()))
        many = _Many(self._manys, len(msgs), fut)
        self._manys.add(many)
        if not msgs:
            many.finish()
            return fut
        if self._buffered + total > self._max_buffered and self._buffered:
            full = self._full()
            for i, message in enumerate(msgs):
                many.set_result(i, SendResult(False, error=full, topic=message.topic))
            return fut
        acks = self._acks
        if acks == 0:
            for i, message in enumerate(msgs):
                self._queue(message, None, sizes[i], 0)
                many.set_result(i, self._oneway_result(message.topic))
            return fut
        hot = self._hot
        start = 0
        if plain == len(msgs) and type(self.selector) is RoundRobinSelector:
            # One topic, plain messages, the default selector: placed a partition at a time (_place_many)
            assert first_topic is not None
            if first_topic not in hot:  # the first message finds the topic's partitions, as send_async would
                self._queue(msgs[0], many.base, sizes[0], acks)
                start = 1
            partitions = hot.get(first_topic)
            if partitions is not None:
                try:
                    self._place_many(first_topic, partitions, msgs, sizes, many, start)
                    return fut
                except PartitionClosedError:  # nothing placed: each message below gets its result (or waits)
                    pass
        # Anything else (several topics, keys, delays, another selector): one message at a time, as send_async
        for token, message, size in zip(range(many.base + start, many.base + len(msgs)), msgs[start:], sizes[start:],
                                        strict=True):
            topic = message.topic
            partitions = hot.get(topic)
            try:
                if (partitions is None or message.key is not None or message.attribute is not None
                        or message.headers or message.deliver_at is not None or message.delay_ms is not None):
                    self._queue(message, token, size, acks)
                else:
                    self._place_plain(message, partitions, token, size, acks)
            except MetaqError as exc:  # a selector's refusal (KeyHashSelector, no key): this message's result
                many.set_result(token - many.base, SendResult(False, error=exc, topic=topic))
        return fut

    def _place_many(self, topic: str, partitions: Sequence[Partition], msgs: Sequence[Message], sizes: list[int],
                    many: _Many, start: int) -> None:
        """``msgs[start:]`` (plain, one topic) placed as RoundRobinSelector would place them one by one: message
        ``j`` to candidate ``(first + j) % k``; each partition's share is appended to its open batch a run at a
        time (list slices and extends, no call per message), a batch that fills leaving as in :meth:`_place`."""
        assert isinstance(self.selector, RoundRobinSelector)
        count = len(msgs) - start
        if count <= 0:
            return
        candidates, first = self.selector.reserve(topic, partitions, count)
        k = len(candidates)
        batches, batch_bytes, acks = self._acc.batches, self._batch_bytes, self._acks
        base = many.base + start
        for r in range(min(k, count)):
            p = candidates[(first + r) % k]
            key: BatchKey = (topic, p.partition, p.broker_id, acks)
            sub = msgs[start + r::k]
            sub_sizes = sizes[start + r::k]
            tokens = range(base + r, base + count, k)
            ends = list(itertools.accumulate(sub_sizes))  # ends[i]: bytes of sub[0..i]
            stamps = [m.timestamp_ms for m in sub]
            stamped = max(stamps) >= 0  # usually none: every record takes its batch's creation time
            i, m = 0, len(sub)
            while i < m:
                batch = batches.get(key)
                if batch is None or batch.keys is not None or batch.attributes is not None or batch.headers is not None:
                    if batch is not None:  # not plain: it leaves first, in order
                        self._dispatch(batches.pop(key))
                    self._place_at(sub[i], partitions, key, None, tokens[i], sub_sizes[i], acks)  # opens a batch
                    i += 1
                    continue
                before = ends[i - 1] if i else 0
                j = bisect.bisect_right(ends, before + batch_bytes - batch.size_bytes, i)
                if j == i:  # full for the next message: it leaves, the next round opens a new one
                    self._dispatch(batches.pop(key))
                    continue
                n = j - i
                batch.values.extend([msg.data for msg in sub[i:j]])
                if stamped:
                    created = batch.created_ms
                    batch.timestamps.extend([t if t >= 0 else created for t in stamps[i:j]])
                else:
                    batch.timestamps.extend(itertools.repeat(batch.created_ms, n))
                batch.waiters.extend(tokens[i:j])
                batch.count += n
                added = ends[j - 1] - before
                batch.size_bytes += added
                self._buffered += added
                if batch.size_bytes >= batch_bytes:
                    self._dispatch(batches.pop(key))
                i = j

    def send_oneway(self, message: Message) -> SendResult:
        """Send without waiting for or getting an acknowledgement (acks=0, MetaQ's async producer).

        The result's partition, offset and message id are -1. ``success`` is False only when the
        message was not even accepted (buffer full); a later failure is counted, never reported.
        """
        fast = self._fast_oneway
        if fast is not None and fast.place(message) is not None:  # the common case in one compiled call
            result = self._oneway_ok.get(message.topic)
            return result if result is not None else self._oneway_result(message.topic)
        self._not_in_transaction("send_oneway")
        if (type(message) is Message and type(message.data) is bytes and message.key is None
                and message.attribute is None and not message.headers and message.deliver_at is None
                and message.delay_ms is None):
            topic = message.topic
            partitions = self._hot.get(topic)
            size = _RECORD_PREFIX + len(message.data)
            if partitions is None or size > self._max_message_bytes:
                size = self._check(message)  # raises for misuse
        else:
            topic = message.topic
            partitions = None
            size = self._check(message)
        if self._buffered + size > self._max_buffered and self._buffered:
            return SendResult(False, error=self._full(), topic=topic)
        if partitions is not None:
            self._place_plain(message, partitions, None, size, 0)
        else:
            self._queue(message, None, size, 0)
        result = self._oneway_ok.get(topic)
        return result if result is not None else self._oneway_result(topic)

    def _oneway_result(self, topic: str) -> SendResult:
        """The SendResult of an accepted one-way send: one object per topic, shared by every such send."""
        result = self._oneway_ok.get(topic)
        if result is None:
            result = self._oneway_ok[topic] = SendResult(True, topic=topic)
        return result

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
        if any(type(v) is Message and (v.deliver_at is not None or v.delay_ms is not None) for v in values):
            raise InvalidArgument("send_batch does not take delayed messages (deliver_at / delay_ms); send them "
                                  "with send or send_async")
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
            if self._buffered + size > self.config.max_buffered_bytes and self._buffered:
                try:
                    await self._wait_room(size, timeout_s)
                except TimeoutError:
                    done_full: asyncio.Future[BatchChunk] = self._loop.create_future()
                    done_full.set_result(BatchChunk(-1, -1, -1, len(chunk), self._full()))
                    futures.append(done_full)
                    continue
            first = chunk[0]
            first_msg = first if isinstance(first, Message) else Message(topic, bytes(first))
            try:
                key = await self._batch_key(topic, first_msg, target, acks)
            except InvalidArgument:
                raise
            except MetaqError as exc:
                done: asyncio.Future[BatchChunk] = self._loop.create_future()
                done.set_result(BatchChunk(target.partition if target else -1, -1, -1, len(chunk), exc,
                                           target.broker_id if target else -1))
                futures.append(done)
                continue
            now_ms = int(time.time() * 1000)
            if isinstance(first, Message):
                payload = encode_messages(chunk, compression, now_ms)
            else:
                payload = encode_values(chunk, now_ms, compression)
            fut: asyncio.Future[BatchChunk] = self._loop.create_future()
            batch = ProducerBatch.prebuilt(key, payload, len(chunk), fut, self._loop.time())
            batch.size_bytes = size
            batch.pinned = target is not None
            # Keep this producer's order within the partition: what is already waiting goes first.
            earlier = self._acc.seal(key)
            if earlier is not None:
                self._dispatch(earlier)
            self._buffered += size
            self._dispatch(batch)
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

    async def flush(self) -> None:
        """Send everything buffered now and wait until each batch is acknowledged or has failed."""
        while self._cold_tasks:
            await asyncio.gather(*list(self._cold_tasks), return_exceptions=True)
        for batch in self._acc.seal_all():
            self._dispatch(batch)
        outstanding = self._outstanding
        if not outstanding:
            return
        barrier = _FlushBarrier(self._loop.create_future(), len(outstanding))
        for batch, barriers in outstanding.items():
            if barriers is None:
                outstanding[batch] = [barrier]
            else:
                barriers.append(barrier)
        await barrier.future

    async def close(self) -> None:
        """Flush, then refuse further sends. Idempotent."""
        if self._closed:
            return
        self._closing = True
        self._end_hot()  # send_async's fast path takes only hot topics: from now on every send goes to _check
        self._core.metadata.cache.listeners.remove(self._end_hot)
        self._unavailable.listeners.remove(self._end_hot)
        for checker in self._checkers:
            await checker.stop()
        try:
            await self.flush()
        finally:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- accepting messages -------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed or self._closing:
            raise ClientClosedError("the producer is closed")

    def _check_topic(self, topic: str) -> None:
        if topic not in self._valid_topics:
            validate_topic(topic)
            self._valid_topics.add(topic)

    def _check(self, message: Message) -> int:
        """Misuse raises here, before anything is queued; returns the message's size in a batch."""
        if self._closed or self._closing:
            raise ClientClosedError("the producer is closed")
        if not isinstance(message, Message):
            raise InvalidArgument(f"send takes a metaq Message, not {type(message).__name__}")
        if not isinstance(message.data, (bytes, bytearray, memoryview)):
            raise InvalidArgument(f"message data must be bytes, not {type(message.data).__name__}")
        topic = message.topic
        if topic not in self._valid_topics:
            validate_topic(topic)
            self._valid_topics.add(topic)
        if message.key is None and message.attribute is None and not message.headers:
            size = RECORD_OVERHEAD_BYTES + len(message.data)
        else:
            size = record_size(message)
        if message.deliver_at is not None or message.delay_ms is not None:
            size += check_delay(message)
        if size > self.config.max_message_bytes:
            raise InvalidArgument(
                f"message is {size} bytes encoded (payload {len(message.data)} bytes); max_message_bytes is "
                f"{self.config.max_message_bytes}. Split it, or raise max_message_bytes together with the "
                f"broker's maxMessageSize")
        return size

    def _full(self) -> BufferFullError:
        return BufferFullError(
            f"the producer holds {self._buffered} bytes, max_buffered_bytes is {self.config.max_buffered_bytes}; "
            f"await send() (which waits for room) or flush(), or raise max_buffered_bytes")

    async def _wait_room(self, size: int, timeout_s: float | None) -> None:
        limit = self.config.max_buffered_bytes
        async with asyncio.timeout(timeout_s):
            while self._buffered + size > limit and self._buffered:
                w: asyncio.Future[None] = self._loop.create_future()
                self._room_waiters.append(w)
                await w

    def _enqueue(self, message: Message, waiter: Any, size: int, acks: int) -> SendResult:
        """Queue a message; the SendResult returned is what a one-way send reports (-1 fields)."""
        self._queue(message, waiter, size, acks)
        return self._oneway_result(message.topic)

    def _queue(self, message: Message, waiter: Any, size: int, acks: int) -> None:
        """Queue a message for its partition's batch (the hot path: creates nothing per message)."""
        topic = message.topic
        partitions = self._hot.get(topic)
        if partitions is not None:
            self._place(message, partitions, waiter, size, acks)
            return
        if topic in self._cold:
            self._cold[topic].append((message, waiter, size, acks))
            self._buffered += size
            return
        tm = self._core.metadata.cached(topic)
        if tm is None:
            self._cold[topic] = [(message, waiter, size, acks)]
            self._buffered += size
            task = asyncio.ensure_future(self._warm(topic))
            self._cold_tasks.add(task)
            task.add_done_callback(self._cold_tasks.discard)
            return
        if tm.partitions:
            partitions = self._usable_partitions(topic, tm.partitions) if self._reroutable else tm.partitions
            if not self._closing:  # closing: every send must reach _check (send_async's fast path skips it)
                self._hot[topic] = partitions
                if self._hot_reset is None:
                    if self._reroutable and self._unavailable.avoiding():
                        self._hot_reset = self._loop.call_soon(self._end_hot)
                    else:
                        self._hot_reset = self._loop.call_later(HOT_KEEP_S, self._end_hot)
            self._place(message, partitions, waiter, size, acks)
            return
        self._route(message, tm, waiter, size, acks)

    def _end_hot(self) -> None:
        """Forget the hot topics: their next send looks their partitions up again (:meth:`_queue`)."""
        reset, self._hot_reset = self._hot_reset, None
        if reset is not None:
            reset.cancel()  # told by a listener before its time (harmless when it is the running callback)
        self._hot.clear()

    async def _warm(self, topic: str) -> None:
        """First messages of a topic wait here, in order, for its metadata."""
        try:
            tm: TopicMetadata | None = await self._core.metadata.topic(topic)
            error: BaseException | None = None
        except Exception as exc:
            tm, error = None, exc
        self._route_waiting(topic, tm, error)

    def _route_waiting(self, topic: str, tm: TopicMetadata | None, error: BaseException | None) -> None:
        """The topic's messages waiting in ``_cold``, in order: routed with ``tm``, or failed with ``error``."""
        for message, waiter, size, acks in self._cold.pop(topic, []):
            self._buffered -= size
            if tm is None:
                assert error is not None
                self._resolve(waiter, SendResult(False, error=error, topic=topic))
                continue
            try:
                self._route(message, tm, waiter, size, acks)
            except Exception as exc:
                self._resolve(waiter, SendResult(False, error=exc, topic=topic))
        self._release_room()

    def _route(self, message: Message, tm: TopicMetadata, waiter: Any, size: int, acks: int) -> None:
        topic = message.topic
        partitions: Sequence[Partition] = tm.partitions
        if partitions:
            if self._reroutable:
                partitions = self._usable_partitions(topic, partitions)
            self._place(message, partitions, waiter, size, acks)
            return
        self._append(message, (topic, ANY_PARTITION, self._core.default_broker_id, acks), waiter, size)

    def _refused(self, message: Message, waiter: Any, size: int, acks: int, exc: MetaqError) -> None:
        """The selector took no partition for ``message``: its failed result, except in cluster mode when
        every partition of the topic is closed for publishing. That is how a master's handover looks
        between the old master's topic node going and the new one's coming (docs/cluster.md), so the
        message waits for the view to change (:meth:`_hold`), as a Kafka producer waits for a leader."""
        if (isinstance(exc, PartitionClosedError) and self._core.registry is not None and not self._closing
                and not self._releasing_held):
            self._hold(message, waiter, size, acks)
            return
        self._resolve(waiter, SendResult(False, error=exc, topic=message.topic))

    def _hold(self, message: Message, waiter: Any, size: int, acks: int) -> None:
        """Keep ``message`` back, in order with its topic's later messages, until a partition of its topic
        opens or the producer's request timeout passes (then it fails with PartitionClosedError)."""
        topic = message.topic
        self._hot.pop(topic, None)  # the topic's next sends go through _queue, behind this one
        self._buffered += size
        held = self._cold.get(topic)
        if held is not None:
            held.append((message, waiter, size, acks))
            return
        self._cold[topic] = [(message, waiter, size, acks)]
        task = asyncio.ensure_future(self._await_open(topic))
        self._cold_tasks.add(task)
        task.add_done_callback(self._cold_tasks.discard)

    async def _await_open(self, topic: str) -> None:
        """:meth:`_hold`'s wait: on every cluster change applied, until the topic has an open partition."""
        core, loop = self._core, self._loop
        deadline = loop.time() + self._timeout_s
        while True:
            since = core.snapshots_applied
            tm = core.metadata.cache.get(topic)
            if tm is None:  # dropped from the cache (an admin call, a refused request): a snapshot leaves it out
                with contextlib.suppress(MetaqError):
                    tm = await core.metadata.refresh_topic(topic)
            if tm is not None and any(p.accept_publish for p in tm.partitions):
                break
            remaining = deadline - loop.time()
            if remaining <= 0 or self._closing:
                tm = None
                break
            await core.cluster_changed(remaining, since)
        error = None if tm is not None else PartitionClosedError(
            f"every partition of topic {topic!r} stayed closed for publishing for {self._timeout_s:g} s "
            "(request_timeout_s)")
        self._releasing_held = True  # a message refused again now gets its failure, not another wait
        try:
            self._route_waiting(topic, tm, error)
        finally:
            self._releasing_held = False

    def _plain_placer(self, acks: int) -> Any:
        """metaq._speedups.PlainPlacer for sends of ``acks`` (0: one-way), or None: no compiled module, or a
        selector other than the round robin and the sticky one. Its ``place(message)`` does what send_async
        (send_oneway) and :meth:`_place_plain` do for a plain message of a hot topic that fits into the batch
        open at the partition the selector picks; for any other message it changes nothing and returns None, and
        the Python code runs (tests/unit/client/test_plain_placer.py holds the two to the same outcome)."""
        selector = self.selector
        if PLAIN_PLACER is None:
            return None
        if type(selector) is RoundRobinSelector:
            table: dict[str, Any] = selector.rotations
        elif type(selector) is StickyRoundRobinSelector:
            table = selector.current
        else:
            return None
        return PLAIN_PLACER(self, self._loop.create_future if acks else None, self._hot, self._acc.batches, table,
                            type(selector) is StickyRoundRobinSelector, acks, self._batch_bytes,
                            self._max_message_bytes, self._max_buffered, _RECORD_PREFIX, ProducerBatch, _Rotation)

    def _place(self, message: Message, partitions: Sequence[Partition], waiter: Any, size: int, acks: int) -> None:
        """The selector's partition, then its open batch. The common case -- no key, attribute, headers or
        delay, and room in an open batch without keys -- appends to the batch's columns right here."""
        topic = message.topic
        try:
            p = self.selector(topic, partitions, message)
        except InvalidArgument:
            raise
        except MetaqError as exc:
            self._refused(message, waiter, size, acks, exc)
            return
        key: BatchKey = (topic, p.partition, p.broker_id, acks)
        self._place_at(message, partitions, key, self._acc.batches.get(key), waiter, size, acks)

    def _place_plain(self, message: Message, partitions: Sequence[Partition], waiter: Any, size: int,
                     acks: int) -> None:
        """:meth:`_place` for a message known to have no key, attribute, headers or delay (send_async,
        send_async_many and send_oneway of a hot topic): the selector's partition, then its open batch."""
        topic = message.topic
        try:
            p = self.selector(topic, partitions, message)
        except InvalidArgument:
            raise
        except MetaqError as exc:
            self._refused(message, waiter, size, acks, exc)
            return
        key: BatchKey = (topic, p.partition, p.broker_id, acks)
        batch = self._acc.batches.get(key)
        if (batch is not None and batch.size_bytes + size <= self._batch_bytes and batch.keys is None
                and batch.attributes is None and batch.headers is None):
            batch.values.append(message.data)
            ts = message.timestamp_ms
            batch.timestamps.append(ts if ts >= 0 else batch.created_ms)
            batch.waiters.append(waiter)
            batch.count += 1
            batch.size_bytes += size
            self._buffered += size
            if batch.size_bytes >= self._batch_bytes:
                self._dispatch(self._acc.batches.pop(key))
        else:
            self._place_at(message, partitions, key, batch, waiter, size, acks)

    def _place_at(self, message: Message, partitions: Sequence[Partition], key: BatchKey, batch: ProducerBatch | None,
                  waiter: Any, size: int, acks: int) -> None:
        """:meth:`_place` once the selector chose ``key``'s partition; ``batch``: the batch open there, if any."""
        if batch is not None and message.deliver_at is None and message.delay_ms is None:  # delayed: own batches
            if batch.size_bytes + size <= self._acc.batch_bytes:
                if (message.key is None and message.attribute is None and not message.headers
                        and batch.keys is None and batch.attributes is None and batch.headers is None):
                    # ProducerBatch.add, inlined for the common case
                    batch.values.append(message.data)
                    ts = message.timestamp_ms
                    batch.timestamps.append(ts if ts >= 0 else batch.created_ms)
                    batch.waiters.append(waiter)
                    batch.count += 1
                    batch.size_bytes += size
                    self._buffered += size
                    if batch.size_bytes >= self._acc.batch_bytes:
                        self._dispatch(self._acc.batches.pop(key))
                    return
            elif self._batch_done is not None:
                # Full for this message: it leaves now, and a sticky selector moves on (KIP-480: the message
                # that would open a new batch goes to the next partition instead).
                self._dispatch(self._acc.batches.pop(key))
                topic = message.topic
                try:
                    p = self.selector(topic, partitions, message)
                except InvalidArgument:
                    raise
                except MetaqError as exc:
                    self._refused(message, waiter, size, acks, exc)
                    return
                key = (topic, p.partition, p.broker_id, acks)
        self._append(message, key, waiter, size)

    def _append(self, message: Message, key: BatchKey, waiter: Any, size: int) -> None:
        acc = self._acc
        headers = message.headers
        if message.deliver_at is not None or message.delay_ms is not None:  # a batch of its own, bit 7
            key = (*key, True)
            headers = delayed_headers(message)
        # a message without a timestamp gets its batch's creation time (ProducerBatch.add)
        sealed = acc.append(key, message.timestamp_ms, message.data, message.key, message.attribute,
                            headers, waiter, self._linger_s if self._busy.get(key) else 0.0, size)
        self._buffered += size
        for batch in sealed:
            self._dispatch(batch)
        opened = acc.open_batch(key)
        if opened is not None and (self._timer is None or opened.deadline_s < self._timer_when):
            self._arm(opened.deadline_s)

    async def _batch_key(self, topic: str, message: Message, target: Partition | None, acks: int) -> BatchKey:
        if target is not None:
            return (topic, target.partition, target.broker_id, acks)
        tm = await self._core.metadata.topic(topic)
        if not tm.partitions:
            return (topic, ANY_PARTITION, self._core.default_broker_id, acks)
        partitions = self._usable_partitions(topic, tm.partitions) if self._reroutable else tm.partitions
        p = self.selector(topic, partitions, message)
        return (topic, p.partition, p.broker_id, acks)

    def _usable_partitions(self, topic: str, partitions: Sequence[Partition]) -> Sequence[Partition]:
        """The partitions without those left out for a while; all of them when every one is."""
        version = self._unavailable.current_version()
        cached = self._usable.get(topic)
        if cached is not None and cached[0] is partitions and cached[1] == version:
            return cached[2]
        usable = self._unavailable.usable(topic, partitions) or partitions
        self._usable[topic] = (partitions, version, usable)
        return usable

    def _chunk(self, topic: str, values: Sequence[bytes | bytearray | Message]
               ) -> list[tuple[Sequence[Any], int]]:
        """Cut items into (chunk, bytes) of at most batch_bytes each; checks every item first."""
        max_msg = self.config.max_message_bytes
        if isinstance(values[0], Message):
            sizes: list[int] = []
            for item in values:
                if not isinstance(item, Message):
                    raise InvalidArgument("send_batch items must be all bytes or all Message, not a mix")
                if item.topic != topic:
                    raise InvalidArgument(f"send_batch to {topic!r} got a message for topic {item.topic!r}")
                sizes.append(record_size(item))
        else:
            # Plain payloads: the common bulk case, so the per-item work stays in C (map, max, accumulate).
            if not set(map(type, values)) <= _PLAIN_TYPES:
                for i, item in enumerate(values):
                    if not isinstance(item, (bytes, bytearray, memoryview)):
                        raise InvalidArgument(f"send_batch items must be all bytes or all Message; item {i} is "
                                              f"{type(item).__name__}")
            sizes = list(map(_RECORD_PREFIX.__add__, map(len, values)))  # type: ignore[arg-type]
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

    # -- timers and dispatch -------------------------------------------------------------------

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
        # A little slack: a timer may fire a hair before its time, and re-arming for 0.1 ms is waste.
        expired = self._acc.expired(self._loop.time() + 0.0005)
        if expired:
            # Every batch due now is gathered first, then written per connection (one MultiProduce for a
            # broker's batches) and each connection flushed: the frames leave in one write per broker in
            # this loop step, not one step later (linger_ms=0 latency).
            gathered = self._gather()
            try:
                for batch in expired:
                    self._dispatch(batch)
            finally:
                self._write_gathered(gathered)
        nxt = self._acc.next_deadline()
        if nxt is not None:
            self._arm(nxt)

    def _dispatch(self, batch: ProducerBatch) -> None:
        key = batch.key
        if self._batch_done is not None and not batch.pinned:
            self._batch_done(batch.topic, batch.broker_id, batch.partition)
        last = self._queued_last.get(key)
        if last is not None:
            if (last.payload is None and last.key == key and last in self._outstanding and batch.payload is None
                    and last.size_bytes + batch.size_bytes - HEADER_BYTES <= self.config.batch_bytes):
                last.absorb(batch)
                return
            del self._queued_last[key]
        self._busy[key] = self._busy.get(key, 0) + 1
        self._outstanding[batch] = None
        broker_id = batch.broker_id
        queue = self._queues.get(broker_id)
        if queue is None:
            queue = self._queues[broker_id] = deque()
        if not queue and broker_id not in self._senders:
            # Fast path: nothing waits for this broker and its connection has room -- write now,
            # without a task hop.
            conn = self._core.cached_connection(broker_id, "produce")
            if conn is not None and conn.writable:
                gathered = self._gathered
                if gathered is not None:  # written with the others at the end of the gathering
                    pending = gathered.get(conn)
                    if pending is None:
                        gathered[conn] = [batch]
                    else:
                        pending.append(batch)
                    return
                try:
                    self._write(conn, batch)
                    return
                except ConnectionClosedError:
                    pass  # not written: the sender below reconnects
        queue.append(batch)
        if batch.payload is None and batch.batch_waiter is None:
            self._queued_last[key] = batch
        if broker_id not in self._senders:
            self._senders[broker_id] = asyncio.ensure_future(self._send_loop(broker_id, queue))

    def _write(self, conn: BrokerConnection, batch: ProducerBatch) -> None:
        """Hand one batch to the connection; ConnectionClosedError means nothing was written.

        Any other error (a frame over the limit, say) fails the batch itself.
        """
        if self._queued_last.get(batch.key) is batch:
            del self._queued_last[batch.key]  # leaving: nothing more may join it
        try:
            payload = batch.build(self.config.compression)
            if self._idempotent and batch.acks and not batch.delayed:  # a delayed batch never meets a partition's
                payload = self._stamped(batch, payload)               # sequence: the delay store appends it later
            request = ProduceRequest(batch.topic, batch.partition, batch.acks, self._timeout_ms, payload)
            if batch.acks == 0:
                conn.send_oneway(request)
                reply = None
            else:
                reply = conn.submit(request, self._timeout_s)
        except ConnectionClosedError:
            raise
        except Exception as exc:
            self._complete_error(batch, exc)
            return
        if reply is None:
            self._complete_ok(batch, None)
        else:
            reply.add_done_callback(partial(self._on_reply, batch, conn.address))

    def _gather(self) -> dict[BrokerConnection, list[ProducerBatch]] | None:
        """Start gathering the batches dispatched from now on; None when a gathering is already open (the
        outer one writes them). Always paired with :meth:`_write_gathered`."""
        if self._gathered is not None:
            return None
        gathered: dict[BrokerConnection, list[ProducerBatch]] = {}
        self._gathered = gathered
        return gathered

    def _write_gathered(self, gathered: dict[BrokerConnection, list[ProducerBatch]] | None) -> None:
        """End the gathering :meth:`_gather` opened: each connection's batches written, then flushed."""
        if gathered is None:
            return
        self._gathered = None
        for conn, batches in gathered.items():
            with contextlib.suppress(ConnectionClosedError):
                while batches and conn.writable:
                    self._write_some(conn, batches)
            if batches:
                # not written (the connection closed, or it has no room: max_in_flight replies owed, its buffer
                # full): they go first in the broker's queue, whose sender waits for room or reconnects
                broker_id = batches[0].broker_id
                queue = self._queues.setdefault(broker_id, deque())
                queue.extendleft(reversed(batches))
                if broker_id not in self._senders:
                    self._senders[broker_id] = asyncio.ensure_future(self._send_loop(broker_id, queue))
            conn.flush()

    def _write_some(self, conn: BrokerConnection, batches: list[ProducerBatch] | deque[ProducerBatch]) -> None:
        """Write the first batch of ``batches`` (removed from it), or the first several as one MultiProduce
        when the broker serves it; ConnectionClosedError leaves the unwritten ones in ``batches``, in order."""
        first = batches[0]
        if len(batches) == 1 or not first.acks or not self._multi or not conn.supports(_MULTI_PRODUCE):
            group = [first]
        else:
            group = list(itertools.takewhile(_MultiLimit(), itertools.islice(batches, _MULTI_PRODUCE_MAX_BATCHES)))
        for _ in group:  # taken out before writing: a completion inside may queue more behind them
            if isinstance(batches, deque):
                batches.popleft()
            else:
                del batches[0]
        try:
            if len(group) == 1:
                self._write(conn, first)
            else:
                self._write_multi(conn, group)
        except ConnectionClosedError:
            if isinstance(batches, deque):
                batches.extendleft(reversed(group))
            else:
                batches[:0] = group
            raise

    def _write_multi(self, conn: BrokerConnection, group: list[ProducerBatch]) -> None:
        """Hand several batches (acks=1, one broker) to the connection as one MultiProduce. A batch that cannot
        be built fails alone; ConnectionClosedError means nothing was written (``group`` is then the batches
        still to send)."""
        parts: list[ProducePartition] = []
        sent: list[ProducerBatch] = []
        for batch in group:
            if self._queued_last.get(batch.key) is batch:
                del self._queued_last[batch.key]  # leaving: nothing more may join it
            try:
                payload = batch.build(self.config.compression)
                if self._idempotent and not batch.delayed:
                    payload = self._stamped(batch, payload)
            except Exception as exc:
                self._complete_error(batch, exc)
                continue
            parts.append(ProducePartition(batch.topic, batch.partition, payload))
            sent.append(batch)
        group[:] = sent
        if not sent:
            return
        try:
            reply = conn.submit(MultiProduceRequest(1, self._timeout_ms, "", parts), self._timeout_s)
        except ConnectionClosedError:
            raise
        except Exception as exc:
            for batch in sent:
                self._complete_error(batch, exc)
            return
        self.multi_produce_requests += 1
        self.multi_produced_batches += len(sent)
        reply.add_done_callback(partial(self._on_multi_reply, sent, conn.address))

    def _stamped(self, batch: ProducerBatch, payload: bytes) -> bytes:
        """The batch with its producer block: given at its first write, the same bytes on every retry (so
        the broker knows a retry), and given anew only after a proof that the batch was not stored."""
        seq = self._sequences.get((batch.broker_id, batch.topic, batch.partition))
        if seq is None:
            seq = self._sequences[(batch.broker_id, batch.topic, batch.partition)] = _Sequence()
        if batch.stamped is not None and batch.stamp is not None and batch.stamp.producer_epoch == seq.epoch:
            return batch.stamped
        pid = self._any_partition_id if batch.partition == ANY_PARTITION else self.producer_id
        batch.stamp = ProducerStamp(pid, seq.epoch, seq.next)
        seq.next = (seq.next + batch.count) % SEQUENCE_LIMIT
        batch.stamped = with_producer_stamp(payload, batch.stamp)
        return batch.stamped

    def _sequence_broken(self, batch: ProducerBatch) -> None:
        """A stamped batch failed for good: its sequence number will never be stored, so the partition
        starts a new epoch at sequence 0 (the broker takes a newer epoch from 0). Batches in flight with
        the old epoch are refused as out of order and re-stamped; none can be stored twice."""
        stamp = batch.stamp
        seq = self._sequences.get((batch.broker_id, batch.topic, batch.partition))
        if stamp is None or seq is None or stamp.producer_epoch != seq.epoch:
            return
        seq.epoch += 1
        seq.next = 0
        if seq.epoch >= 1 << 15:  # epochs are 15 bits: a new id starts over
            self.producer_id, self._any_partition_id = _new_producer_id(), _new_producer_id()
            self._sequences.clear()
        log.warning("idempotent producer %d: a batch to %s:%d-%d failed for good; that partition's sequence "
                    "starts again with epoch %d", self.producer_id, batch.topic, batch.broker_id, batch.partition,
                    seq.epoch)

    async def _send_loop(self, broker_id: int, queue: deque[ProducerBatch]) -> None:
        """Write the broker's queued batches in order, as fast as the connection takes them."""
        core = self._core
        closed_in_a_row = 0
        try:
            while queue:
                waiting = self._master_waits.get(broker_id)
                if waiting is not None:
                    await waiting.over
                    continue
                try:
                    # The pool reconnects with bounded, backed-off attempts; past those, give up.
                    conn = await core.connection(broker_id, "produce")
                except MetaqError as exc:
                    self._fail_unwritten(broker_id, queue, exc)
                    return
                if not conn.writable:
                    try:
                        await conn.wait_writable()
                    except ConnectionClosedError as exc:
                        closed_in_a_row += 1
                        if closed_in_a_row > core.config.reconnect_attempts:
                            self._fail_unwritten(broker_id, queue, exc)
                            return
                        continue
                if broker_id in self._master_waits:  # began while this loop waited for the connection
                    continue
                try:
                    self._write_some(conn, queue)  # the first batch, or the first several as one MultiProduce
                    closed_in_a_row = 0
                except ConnectionClosedError as exc:  # never written (back in the queue): safe to send again
                    closed_in_a_row += 1
                    if closed_in_a_row > core.config.reconnect_attempts:
                        self._fail_unwritten(broker_id, queue, exc)
                        return
        finally:
            del self._senders[broker_id]

    def _fail_unwritten(self, broker_id: int, queue: deque[ProducerBatch], exc: BaseException) -> None:
        """The broker cannot be reached: none of these batches was written, so each may move to
        another partition (a spreading selector's batch); the others fail with ``exc``."""
        if isinstance(exc, (ConnectionClosedError, UnknownServerError)):
            self._unavailable.avoid_broker(broker_id)
        while queue:
            batch = queue.popleft()
            if not self._reroute(batch, exc):
                self._complete_error(batch, exc)

    def _wait_for_master(self, batch: ProducerBatch, address: str) -> bool:
        """NOT_MASTER from ``address`` (cluster mode): the broker id's master is being handed over (a promote, a
        failover), and the batch was certainly not stored. It goes back to the front of its broker's queue, in
        order with the others refused, to be sent again to the master ZooKeeper names (:meth:`_await_master`),
        within the request timeout counted from the batch's creation. False (the refusal is the result):
        standalone mode, a closed producer, a one-way batch, or that time passed."""
        if self._core.registry is None or self._closed or batch.acks == 0:
            return False
        deadline = batch.created_s + self._timeout_s
        if self._loop.time() >= deadline:
            return False
        broker_id = batch.broker_id
        queue = self._queues.setdefault(broker_id, deque())
        waiting = self._master_waits.get(broker_id)
        if waiting is None:
            waiting = self._master_waits[broker_id] = _MasterWait(address, deadline, self._loop.create_future())
            task = asyncio.ensure_future(self._await_master(broker_id, waiting, queue))
            self._cold_tasks.add(task)
            task.add_done_callback(self._cold_tasks.discard)
            log.info("broker %d: %s is no longer its master; its batches wait for the next one", broker_id, address)
        queue.insert(len(waiting.batches), batch)
        waiting.batches.append(batch)
        if broker_id not in self._senders:  # it waits for the new master, then sends them first
            self._senders[broker_id] = asyncio.ensure_future(self._send_loop(broker_id, queue))
        return True

    async def _await_master(self, broker_id: int, waiting: _MasterWait, queue: deque[ProducerBatch]) -> None:
        """Until ZooKeeper names a master at another address, or, when one is named, a retry back-off has passed
        (a master just named may refuse for a moment while it takes over); then the batches go (to whichever
        address is named). Past the deadline they fail with NotMasterError."""
        core, loop = self._core, self._loop
        backoff_s = self.config.retry_backoff_ms / 1000.0
        waited = False
        try:
            while True:
                since = core.snapshots_applied
                current = core.metadata.cache.address(broker_id)
                if current is not None and (waited or format_address(current) != waiting.address):
                    return
                remaining = waiting.deadline - loop.time()
                if remaining <= 0:
                    error = NotMasterError(f"broker {broker_id}: no master took the batch within "
                                           f"{self._timeout_s:g} s (request_timeout_s; {waiting.address} refused it)")
                    for batch in waiting.batches:
                        with contextlib.suppress(ValueError):
                            queue.remove(batch)
                            self._complete_error(batch, error)
                    return
                await core.cluster_changed(min(remaining, backoff_s), since)
                waited = True
        finally:
            del self._master_waits[broker_id]
            waiting.over.set_result(None)

    def _reroute(self, batch: ProducerBatch, exc: BaseException) -> bool:
        """Move a batch that was certainly not stored to another usable partition it has not tried.

        False (the failure is the result) for a pinned or key-hash batch, a topic without known
        partitions, or when no other partition is left."""
        if (batch.pinned or not self._reroutable or batch.partition == ANY_PARTITION
                or batch.stamp is not None or isinstance(exc, ClientClosedError)):
            return False
        tm = self._core.metadata.cache.get(batch.topic)
        if tm is None:
            return False
        tried = (*batch.tried, (batch.broker_id, batch.partition))
        usable = self._unavailable.usable(batch.topic, tm.partitions)
        candidates = tuple(p for p in usable if p.accept_publish and (p.broker_id, p.partition) not in tried)
        if not candidates:
            return False
        try:
            p = self.selector(batch.topic, candidates, Message(batch.topic, b""))
        except MetaqError:
            return False
        log.info("moving a batch of %d messages from %s:%d-%d to %s after %s", batch.count, batch.topic,
                 batch.broker_id, batch.partition, p, exc)
        barriers = self._outstanding.pop(batch, None)
        old_key = batch.key
        batch.tried = tried
        batch.key = (batch.topic, p.partition, p.broker_id, batch.acks, True) if batch.delayed else \
            (batch.topic, p.partition, p.broker_id, batch.acks)
        batch.partition, batch.broker_id = p.partition, p.broker_id
        self.rerouted_batches += 1
        self._dispatch(batch)
        if barriers:
            self._outstanding[batch] = barriers
        self._release(old_key)
        return True

    # -- results ------------------------------------------------------------------------------

    def _on_reply(self, batch: ProducerBatch, address: str, fut: asyncio.Future[ProduceResponse]) -> None:
        resp, exc = _outcome(fut)
        if resp is not None:
            if not resp.error_code:
                self._complete_ok(batch, resp)
                return
            exc = error_for_code(resp.error_code, resp.error_message or "")
        assert exc is not None
        self._on_failure(batch, address, exc)

    def _on_multi_reply(self, batches: list[ProducerBatch], address: str,
                        fut: asyncio.Future[MultiProduceResponse]) -> None:
        """A MultiProduce's reply: each batch's entry is what a Produce reply of it would have said. The
        partitions it releases send what waited for them in one gathering (one MultiProduce again)."""
        resp, exc = _outcome(fut)
        if resp is not None:
            if not resp.error_code and len(resp.partitions) == len(batches):
                gathered = self._gather()
                try:
                    for batch, entry in zip(batches, resp.partitions, strict=True):
                        if not entry.error_code:
                            self._complete_ok(batch, entry)
                        else:
                            self._on_failure(batch, address, error_for_code(entry.error_code,
                                                                            entry.error_message or ""))
                finally:
                    self._write_gathered(gathered)
                return
            exc = error_for_code(resp.error_code, resp.error_message or "") if resp.error_code else \
                ProtocolError(f"a MultiProduce reply from {address} has {len(resp.partitions)} results for "
                              f"{len(batches)} batches")
        assert exc is not None
        gathered = self._gather()
        try:
            for batch in batches:
                self._on_failure(batch, address, exc)
        finally:
            self._write_gathered(gathered)

    def _on_failure(self, batch: ProducerBatch, address: str, exc: BaseException) -> None:
        """A batch's request failed, or the broker refused the batch: retried, moved, or its result."""
        if isinstance(exc, DuplicateSequenceError):  # stored before; its offsets are forgotten
            log.warning("idempotent producer: %s (a retry of a batch stored long ago)", exc)
            self._complete_ok(batch, ProduceResponse(partition=batch.partition))
            return
        if isinstance(exc, BrokerError) and exc.refresh_metadata:
            self._core.metadata.refresh_soon(batch.topic)
        if isinstance(exc, NotMasterError) and self._wait_for_master(batch, address):
            return
        if batch.partition != ANY_PARTITION:
            if isinstance(exc, (ConnectionClosedError, *BROKER_UNAVAILABLE)):
                self._unavailable.avoid_broker(batch.broker_id)
            elif isinstance(exc, REFUSED_BEFORE_APPEND):
                self._unavailable.avoid_partition(batch.topic, PartitionId(batch.broker_id, batch.partition))
        if not_stored(exc, written=True) and self._reroute(batch, exc):
            return
        if isinstance(exc, OutOfOrderSequenceError) and batch.stamp is not None:
            seq = self._sequences.get((batch.broker_id, batch.topic, batch.partition))
            if seq is not None and seq.epoch != batch.stamp.producer_epoch:
                batch.stamped = None  # proven not stored, from an epoch given up: stamped anew when resent
        if batch.attempts < self._retries and getattr(exc, "retriable", False) and not self._closed:
            batch.attempts += 1
            log.debug("retrying %r after %s (attempt %d)", batch, exc, batch.attempts)
            self._loop.call_later(self.config.retry_backoff_ms / 1000.0, self._retry, batch)
            return
        self._complete_error(batch, exc)

    def _retry(self, batch: ProducerBatch) -> None:
        queue = self._queues.setdefault(batch.broker_id, deque())
        if batch.stamp is None:
            queue.appendleft(batch)
        else:  # before the partition's later batches and after its earlier retries: in sequence order
            position = 0
            for i, other in enumerate(queue):
                if other.key != batch.key:
                    continue
                if other.stamp is None or not _sent_before(other.stamp, batch.stamp):
                    break
                position = i + 1
            queue.insert(position, batch)
        if batch.broker_id not in self._senders:
            self._senders[batch.broker_id] = asyncio.ensure_future(self._send_loop(batch.broker_id, queue))

    def _complete_ok(self, batch: ProducerBatch, resp: ProduceResponse | ProducedPartition | None) -> None:
        topic = batch.topic
        if resp is None:  # one-way
            partition, base_offset, base_id = batch.partition, -1, -1
        else:
            partition = resp.partition if resp.partition >= 0 else batch.partition
            base_offset, base_id = resp.base_offset, resp.base_message_id
        if batch.batch_waiter is not None:
            w = batch.batch_waiter
            if not w.done():
                w.set_result(BatchChunk(partition, base_offset, base_id, batch.count, None, batch.broker_id))
        elif resp is not None:
            _resolve_ok(batch.waiters, 0, base_id, base_offset, partition, topic, batch.broker_id,
                        self._manys)
        if batch.partition == ANY_PARTITION:
            tm = self._core.metadata.cache.get(topic)
            if tm is None or not tm.partitions:
                self._core.metadata.refresh_soon(topic)  # the broker just created it: learn its partitions
        self._finish(batch)

    def _complete_error(self, batch: ProducerBatch, exc: BaseException) -> None:
        topic = batch.topic
        if batch.stamp is not None:
            self._sequence_broken(batch)
        if batch.batch_waiter is not None:
            w = batch.batch_waiter
            if not w.done():
                w.set_result(BatchChunk(batch.partition, -1, -1, batch.count, exc, batch.broker_id))
        else:
            if batch.acks == 0:
                log.warning("one-way batch of %d messages to %s:%d-%d was dropped: %s", batch.count, topic,
                            batch.broker_id, batch.partition, exc)
            _resolve_mixed(batch.waiters, (batch.partition, -1, -1, exc, topic, batch.broker_id), self._manys)
        self._finish(batch)

    def _resolve(self, waiter: Any, result: SendResult) -> None:
        if type(waiter) is int:  # a send_async_many message
            many = self._manys.find(waiter)
            if many is not None:
                many.set_result(waiter - many.base, result)
        elif waiter is not None and not waiter.done():
            waiter.set_result(result)

    def _finish(self, batch: ProducerBatch) -> None:
        self._buffered -= batch.size_bytes if batch.batch_waiter is not None else batch.size_bytes - HEADER_BYTES
        barriers = self._outstanding.pop(batch, None)
        if barriers:
            for barrier in barriers:
                barrier.batch_done()
        if self._room_waiters:
            self._release_room()
        self._release(batch.key)

    def _release(self, key: BatchKey) -> None:
        """One batch of ``key`` is no longer in flight there."""
        n = self._busy[key] - 1
        if n:
            self._busy[key] = n
            return
        del self._busy[key]
        # The partition went idle: what accumulated meanwhile leaves now instead of lingering.
        waiting = self._acc.seal(key)
        if waiting is not None:
            self._dispatch(waiting)

    def _release_room(self) -> None:
        waiters, self._room_waiters = self._room_waiters, deque()
        for w in waiters:
            if not w.done():
                w.set_result(None)
