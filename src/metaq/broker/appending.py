"""What a produce and a transaction's commit share: the idempotent producer's check before an append, and
waiting for an append's acknowledgement (the flush policy, then sync replication)."""

from __future__ import annotations

import asyncio
import functools
import weakref
from collections import deque
from collections.abc import Awaitable
from concurrent.futures import Future
from typing import Any, TypeVar

from metaq.broker.error_mapping import error_response
from metaq.broker.session import DeferredReply
from metaq.errors import (
    CorruptMessageError,
    DuplicateSequenceError,
    InvalidProducerEpochError,
    OutOfOrderSequenceError,
    StorageFailureError,
    UnknownProducerIdError,
)
from metaq.protocol import messages as m
from metaq.protocol.records import ProducerStamp
from metaq.storage.log import PartitionLog
from metaq.storage.producers import StoredBatch

R = TypeVar("R")


def check_sequence(plog: PartitionLog, stamp: ProducerStamp, record_count: int) -> StoredBatch | None:
    """None when the stamped batch may be appended; the stored original of a duplicate; raises otherwise."""
    if stamp.producer_id <= 0 or stamp.producer_epoch < 0 or stamp.base_sequence < 0:
        raise CorruptMessageError(f"producer block {tuple(stamp)} is out of range (id > 0, epoch and sequence >= 0)")
    verdict = plog.producers.check(stamp, record_count)
    if verdict.kind == "append":
        return None
    if verdict.kind == "duplicate":
        return verdict.original
    if verdict.kind == "out-of-order":
        raise OutOfOrderSequenceError(verdict.detail)
    if verdict.kind == "fenced":
        raise InvalidProducerEpochError(verdict.detail)
    if verdict.kind == "unknown-producer":
        raise UnknownProducerIdError(verdict.detail)
    raise DuplicateSequenceError(verdict.detail)


async def await_ack(durable: Future[Any] | None, replicated: Awaitable[None] | None,
                     response: R) -> R:
    """Durable on the master (its flush policy), then held by the in-sync slaves (sync replication)."""
    if durable is not None:
        try:
            await asyncio.wrap_future(durable)
        except Exception as exc:
            raise StorageFailureError(f"the batch was written but not made durable: {exc}") from exc
    if replicated is not None:
        await replicated
    return response




def ack_when_durable(durable: Future[Any], response: m.ProduceResponse) -> DeferredReply:
    """The produce's ack as a :class:`DeferredReply`, resolved on the event loop once ``durable`` is (its
    fsync done): what :func:`await_ack` does for a produce with no sync replication, without a task.

    The acks whose fsyncs finish together (one flusher round) are answered from ONE loop callback, woken
    by one ``call_soon_threadsafe``: not one wake-up, then one task step, per ack."""
    reply = DeferredReply()
    acks = _DURABLE_ACKS.get(loop := asyncio.get_running_loop())
    if acks is None:
        acks = _DURABLE_ACKS[loop] = _DurableAcks(loop)
    durable.add_done_callback(functools.partial(acks.done, reply, response))
    return reply


class _DurableAcks:
    """Durable futures completed in the flusher's threads, handed to the loop in batches."""

    __slots__ = ("__weakref__", "_loop", "_ready", "_scheduled")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._ready: deque[tuple[DeferredReply, m.ProduceResponse, Future[Any]]] = deque()
        self._scheduled = False

    def done(self, reply: DeferredReply, response: m.ProduceResponse, durable: Future[Any]) -> None:
        """In the thread that completed ``durable``: queue the ack, wake the loop unless already woken."""
        self._ready.append((reply, response, durable))
        if not self._scheduled:
            self._scheduled = True  # two threads racing here wake the loop twice: harmless
            try:
                self._loop.call_soon_threadsafe(self._answer)
            except RuntimeError:  # the loop is closed (the broker stopped): nobody is left to answer
                pass

    def _answer(self) -> None:
        self._scheduled = False  # before draining: an ack queued from now on wakes the loop again
        ready = self._ready
        while ready:
            reply, response, durable = ready.popleft()
            exc = durable.exception()
            if exc is None:
                reply.resolve(response)
            else:
                failed = error_response(m.ProduceRequest.API_KEY, StorageFailureError(
                    f"the batch was written but not made durable: {exc}"))
                failed.partition = response.partition
                reply.resolve(failed)


_DURABLE_ACKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _DurableAcks] = weakref.WeakKeyDictionary()
"""One per event loop (a test process runs several brokers, each on its own loop)."""
