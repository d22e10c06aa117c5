"""What sends return: per-message SendResults, ``send_batch``'s BatchSendResult and ``send_async_many``'s
ManySendResult, and giving a batch's waiters their results when its outcome is known.

A batch's waiter per message is an asyncio future (``send``, ``send_async``), None (one-way), or an int
naming a ``send_async_many`` message (:class:`ManyTable`): an int is not tracked by the cyclic GC, where a
per-message future or tuple made collections cost as much as the rest of the call.
"""

from __future__ import annotations

import asyncio
import bisect
import gc
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

from metaq import _compiled
from metaq.types import SendResult

Outcome = tuple[int, int, int, "BaseException | None", str, int]
"""A batch's outcome as :class:`ManySendResult` keeps it: (partition, base offset, base message id, error,
topic, broker id); the SendResult of message ``i`` of the batch is made from it when read."""


def resolve_batch(waiters: list[Any], outcome: Outcome, manys: ManyTable) -> None:
    """Give each waiter of a batch its result: message ``i`` of a success has id and offset base + i (-1 when the
    broker gave none: one-way, a duplicate too old for its offsets); a failure gives every one the error.

    The cyclic GC is paused for the pass (as decode_batch does): a batch allocates thousands of results while the
    caller holds thousands of futures, and collections triggered in the middle of it cost more than the resolving.
    ``set_result`` only schedules callbacks, so no other code runs while it is paused."""
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        if manys or outcome[3] is not None or outcome[2] < 0:
            _resolve(waiters, outcome, manys)
        else:  # the common case: a success whose waiters are futures (or None)
            partition, base_offset, base_id, _error, topic, broker_id = outcome
            resolve_successes(waiters, base_id, base_offset, partition, topic, broker_id)
    finally:
        if gc_was_enabled:
            gc.enable()


def resolve_successes_py(waiters: list[Any], base_id: int, base_offset: int, partition: int, topic: str,
                         broker_id: int) -> None:
    """A stored batch's futures (``waiters[i]``: a future, or None for nothing to tell) get their results: record
    ``i`` has message id ``base_id + i`` and offset ``base_offset + i``. A future already done (its caller cancelled
    it) is left as it is. The reference of ``metaq._speedups.resolve_successes``."""
    for i, waiter in enumerate(waiters):
        if waiter is not None and not waiter.done():
            waiter.set_result(SendResult(True, base_id + i, partition, base_offset + i, None, topic, broker_id))


resolve_successes = (_compiled.speedups.resolve_successes if _compiled.speedups is not None
                     else resolve_successes_py)
"""The compiled pass when the module is in use (metaq._compiled): the same results, each a compiled SendResult."""


def _resolve(waiters: list[Any], outcome: Outcome, manys: ManyTable) -> None:
    partition, base_offset, base_id, error, topic, broker_id = outcome
    many: Many | None = None
    lo = hi = 0
    for i, w in enumerate(waiters):
        if w is None:
            continue
        if type(w) is int:  # a send_async_many message: its call keeps the outcome, no SendResult
            if not lo <= w < hi:  # usually the previous message's call
                many = manys.find(w)
                if many is None:
                    continue
                lo, hi = many.base, many.base + len(many.outcomes)
            assert many is not None
            many.take(w - lo, outcome, i)
        elif not w.done():  # a future the caller cancelled (or resolved) is skipped
            if error is not None:
                w.set_result(SendResult(False, -1, partition, -1, error, topic, broker_id))
            elif base_id >= 0:
                w.set_result(SendResult(True, base_id + i, partition, base_offset + i, None, topic, broker_id))
            else:
                w.set_result(SendResult(True, -1, partition, -1, None, topic, broker_id))


def resolve_one(waiter: Any, result: SendResult, manys: ManyTable) -> None:
    """A message that got its result before joining a batch (refused by its selector, held past its deadline)."""
    if type(waiter) is int:
        many = manys.find(waiter)
        if many is not None:
            many.set_result(waiter - many.base, result)
    elif waiter is not None and not waiter.done():
        waiter.set_result(result)


class ManySendResult(Sequence[SendResult]):
    """The result of :meth:`Producer.send_async_many`: message ``i``'s SendResult is built when read.

    ``success``: every message was stored; ``errors``: the distinct errors of those that were not, in
    message order; ``failures``: how many were not.
    """

    __slots__ = ("_many",)

    def __init__(self, many: Many) -> None:
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
        n = len(self._many.outcomes)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(index)
        return self._many.result(index)

    def __iter__(self) -> Iterator[SendResult]:
        result = self._many.result
        for i in range(len(self._many.outcomes)):
            yield result(i)

    def __repr__(self) -> str:
        return f"<ManySendResult {len(self)} messages, {self.failures} failed>"


class ManyTable:
    """The unresolved ``send_async_many`` calls of a producer. Each call takes the next ``n`` numbers of a
    counter, and message ``i`` waits in its batch as the int ``base + i``."""

    __slots__ = ("_bases", "_by_base", "_next")

    def __init__(self) -> None:
        self._next = 0
        self._bases: list[int] = []
        self._by_base: dict[int, Many] = {}

    def __len__(self) -> int:
        return len(self._by_base)

    def add(self, many: Many) -> None:
        many.base = self._next
        self._next += len(many.outcomes) + 1  # +1: an empty call still gets a base of its own
        self._bases.append(many.base)  # increasing: appended in order
        self._by_base[many.base] = many

    def remove(self, many: Many) -> None:
        del self._by_base[many.base]
        i = bisect.bisect_left(self._bases, many.base)
        del self._bases[i]

    def find(self, token: int) -> Many | None:
        i = bisect.bisect_right(self._bases, token) - 1
        if i < 0:
            return None
        many = self._by_base[self._bases[i]]
        return many if token < many.base + len(many.outcomes) else None


class Many:
    """One ``send_async_many`` call: each message's batch outcome and position, filled in as batches complete;
    the future is resolved by the last one."""

    __slots__ = ("base", "failures", "future", "outcomes", "pending", "positions", "table")

    def __init__(self, table: ManyTable, n: int, future: asyncio.Future[ManySendResult]) -> None:
        self.table = table
        self.base = 0
        self.future = future
        self.outcomes: list[Outcome | SendResult | None] = [None] * n
        """Per message: its batch's outcome, or its SendResult when it failed before joining a batch."""
        self.positions: list[int] = [0] * n
        self.pending = n
        self.failures = 0

    def take(self, index: int, outcome: Outcome, position: int) -> None:
        """Message ``index`` is record ``position`` of a batch whose outcome this is."""
        if self.outcomes[index] is None:
            self.outcomes[index] = outcome
            self.positions[index] = position
            self.pending -= 1
            if not self.pending:
                self.finish()

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
        """Whether every message of the batch was stored."""
        return all(c.error is None for c in self.chunks)

    @property
    def errors(self) -> list[BaseException]:
        """The errors of the chunks that failed (empty when :attr:`success`)."""
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
        """Every message's id in send order; -1 for the messages of a chunk that failed."""
        out: list[int] = []
        for c in self.chunks:
            if c.error is None and c.base_message_id >= 0:
                out.extend(range(c.base_message_id, c.base_message_id + c.count))
            else:
                out.extend([-1] * c.count)
        return out

    def __repr__(self) -> str:
        return f"<BatchSendResult {self.topic} {len(self)} messages, {len(self.chunks)} chunks, success={self.success}>"
