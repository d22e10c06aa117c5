"""What a produce and a transaction's commit share: the idempotent producer's check before an append, and
waiting for an append's acknowledgement (the flush policy, then sync replication)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from concurrent.futures import Future
from typing import Any, TypeVar

from metaq.errors import (
    CorruptMessageError,
    DuplicateSequenceError,
    InvalidProducerEpochError,
    OutOfOrderSequenceError,
    StorageFailureError,
)
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


