"""Applying a committed transaction: its batches copied from the transaction log into their partitions.

The Transaction handler (:mod:`metaq.broker.handlers.transactions`) applies a COMMIT when it is asked
for; the core (:meth:`metaq.broker.core.Broker.open`) finishes, at start-up, a transaction whose COMMIT
was logged before a crash but not all applied. The batches go in put order, with no await in between
(one step of the event loop: a consumer of this broker sees all or none of them), each through the
idempotent producer's check so that applying again after a crash stores nothing twice.
"""

from __future__ import annotations

from collections.abc import Awaitable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol

from metaq.broker.appending import check_sequence
from metaq.protocol import messages as m
from metaq.protocol.records import producer_stamp, read_header
from metaq.storage.log import PartitionLog

if TYPE_CHECKING:
    from metaq.broker.stats import BrokerStats
    from metaq.broker.transactions import Transaction, TransactionCoordinator
    from metaq.broker.waiters import FetchWaiters


class ReplicatedAppends(Protocol):
    """What an append needs of sync replication (:class:`metaq.broker.core.ReplicaGroupView`)."""

    def before_append(self, plog: PartitionLog) -> None: ...

    def after_append(self, plog: PartitionLog, end_offset: int) -> Awaitable[None] | None: ...


class CommitTarget(Protocol):
    """What applying a commit needs of the broker core (:class:`metaq.broker.core.Broker`)."""

    @property
    def ha(self) -> ReplicatedAppends | None: ...

    @property
    def stats(self) -> BrokerStats: ...

    @property
    def waiters(self) -> FetchWaiters: ...

    def tx_coordinator(self) -> TransactionCoordinator: ...

    def partition_log(self, topic: str, partition: int) -> tuple[Any, PartitionLog]: ...


def apply_transaction(broker: CommitTarget, tx: Transaction) -> tuple[list[m.CommittedBatch], list[tuple[Any, Any]]]:
    """Append the transaction's batches to their partitions, synchronously (no await): where each went,
    and what each ack waits for. A batch already there (applied before a crash) is not appended again."""
    coordinator = broker.tx_coordinator()
    committed: list[m.CommittedBatch] = []
    waits: list[tuple[Future[None] | None, Any]] = []
    ha = broker.ha
    for put in tx.state.puts:
        batch = coordinator.read_batch(put)
        header = read_header(batch)
        stamp = producer_stamp(batch, header)
        _state, plog = broker.partition_log(put.topic, put.partition)
        if ha is not None:
            ha.before_append(plog)
        original = check_sequence(plog, stamp, header.record_count) if stamp is not None else None
        if original is not None:
            base_offset, last_offset = original.base_offset, original.last_offset
        else:
            result = plog.append(batch, header)
            base_offset, last_offset = result.base_offset, result.last_offset
            counters = broker.stats.partition(put.topic, put.partition)
            counters.put_requests += 1
            counters.put_messages += header.record_count
            counters.put_bytes += header.total_bytes
            broker.waiters.notify(put.topic, put.partition)
            if result.wait_for_durable and not result.durable.done():
                waits.append((result.durable, None))
        replicated = ha.after_append(plog, last_offset + 1) if ha is not None else None
        if replicated is not None:
            waits.append((None, replicated))
        committed.append(m.CommittedBatch(put.topic, put.partition, base_offset, plog.message_id(base_offset),
                                          header.record_count))
    return committed, waits


def reapply_on_open(broker: CommitTarget, tx: Transaction) -> None:
    """At start-up (blocking, before serving): finish a transaction whose COMMIT was logged."""
    _committed, _waits = apply_transaction(broker, tx)
    logs: set[PartitionLog] = {broker.partition_log(p.topic, p.partition)[1] for p in tx.state.puts}
    for plog in logs:
        plog.flush()
    broker.tx_coordinator().finish_commit(tx)
