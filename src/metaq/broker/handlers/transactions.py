"""Transaction (API 21) and Produce v1 into a transaction: begin, put, prepare, commit, roll back, recover.

The states and the log are :mod:`metaq.broker.transactions`; this module applies a commit: the
transaction's batches are copied from the transaction log into their partitions, in put order, with
no await in between (one step of the event loop: a consumer of this broker sees all or none of them),
each through the idempotent producer's check so that applying again after a crash stores nothing
twice. The answer waits for the partitions' flush policy and sync replication, as a produce does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from metaq.broker.handlers.appending import await_ack, check_sequence
from metaq.errors import (
    InvalidRequestError,
    PartitionClosedError,
    StorageFailureError,
    UnknownPartitionError,
)
from metaq.protocol import messages as m
from metaq.protocol.records import ProducerStamp, producer_stamp, read_header
from metaq.storage.log import PartitionLog

log = logging.getLogger("metaq.broker.transactions")

if TYPE_CHECKING:
    from metaq.broker.core import Broker, Handler
    from metaq.broker.transactions import Transaction


def put_into_transaction(broker: Broker, transaction_id: str, topic: str, partition: int, records: bytes | memoryview,
                         header: Any, stamp: ProducerStamp | None) -> Any:
    """A Produce v1 with ``transaction_id`` (or a MultiProduce's batch): the batch goes into the transaction log."""
    if partition < 0:
        raise UnknownPartitionError("a transaction's batch names its partition (-1 is not taken)")
    state, _plog = broker.partition_log(topic, partition)
    if partition in state.closed:
        raise PartitionClosedError(f"partition {topic}-{partition} is closed for publishing")
    broker.tx_coordinator().put(transaction_id, topic, partition, records, stamp, header.record_count)
    return m.ProduceResponse(partition=partition)


def handle_transaction(broker: Broker, req: m.TransactionRequest, _session: object) -> Any:
    coordinator = broker.tx_coordinator()
    op = req.op
    if op == m.TX_RECOVER:
        return m.TransactionResponse(xids=coordinator.recover())
    if op == m.TX_STATUS:
        return m.TransactionResponse(xids=[coordinator.status(req.transaction_id)])
    broker.refuse_writes_on_slave("transactions")
    if op == m.TX_BEGIN:
        coordinator.begin(req.transaction_id, req.timeout_ms, req.producer_group)
        return m.TransactionResponse()
    if op == m.TX_ROLLBACK:
        tx = coordinator.get(req.transaction_id)
        checked = f" (its producer group's checker, after {tx.checks} checks)" if tx.checks else ""
        coordinator.rollback(req.transaction_id, "rolled back by the client" + checked)
        if tx.checks:
            log.info("half transaction %s of group %r rolled back by its checker", tx.txid, tx.state.producer_group)
        return m.TransactionResponse()
    if op == m.TX_PREPARE:
        coordinator.prepare(req.transaction_id, req.xid)
        return _synced(broker, m.TransactionResponse())  # a prepare is always made durable
    if op == m.TX_COMMIT:
        return _commit(broker, req.transaction_id)
    raise InvalidRequestError(f"unknown transaction op {op}; 0 begin, 1 prepare, 2 commit, 3 rollback, 4 recover, "
                              "5 status")


async def _synced(broker: Broker, response: m.TransactionResponse) -> m.TransactionResponse:
    try:
        await asyncio.get_running_loop().run_in_executor(None, broker.tx_coordinator().txlog.sync)
    except Exception as exc:
        raise StorageFailureError(f"the transaction log could not be made durable: {exc}") from exc
    return response


def _commit(broker: Broker, txid: str) -> Any:
    coordinator = broker.tx_coordinator()
    tx = coordinator.get(txid)
    if tx.checks:
        log.info("half transaction %s of group %r committed by its checker", tx.txid, tx.state.producer_group)
    for put in tx.state.puts:  # refused before COMMIT is logged: the transaction stays open
        state, _plog = broker.partition_log(put.topic, put.partition)
        if put.partition in state.closed:
            raise PartitionClosedError(f"partition {put.topic}-{put.partition} is closed for publishing; the "
                                       f"transaction is still open (roll it back, or commit after reopening)")
    coordinator.start_commit(txid)
    # Applied in a task of its own, not the request's: the connection's loss cancels the request, and a COMMIT
    # logged must be applied and finished now, not left "committing" until the next start (a client whose
    # reply was lost asks the status, and must get "committed").
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # called outside the broker's loop (a test drives the handler): applied when awaited
        return _apply_after_sync(broker, tx)
    applying = asyncio.ensure_future(_apply_after_sync(broker, tx))
    _APPLYING.add(applying)
    applying.add_done_callback(_applied)
    return _reply_when_applied(applying)


def _applied(applying: asyncio.Future[m.TransactionResponse]) -> None:
    _APPLYING.discard(applying)
    if not applying.cancelled():
        applying.exception()  # retrieved: its request may be gone, and the failure was answered (or logged) there


_APPLYING: set[asyncio.Future[m.TransactionResponse]] = set()
"""Commits being applied (held here: the loop keeps only weak references to tasks)."""


async def _reply_when_applied(applying: asyncio.Future[m.TransactionResponse]) -> m.TransactionResponse:
    return await asyncio.shield(applying)


async def _apply_after_sync(broker: Broker, tx: Transaction) -> m.TransactionResponse:
    coordinator = broker.tx_coordinator()
    if coordinator.flush_at_commit == 1:
        await _synced(broker, m.TransactionResponse())
    committed, waits = apply_transaction(broker, tx)
    for durable, replicated in waits:
        await await_ack(durable, replicated, m.ProduceResponse())
    coordinator.finish_commit(tx)
    return m.TransactionResponse(committed=committed)


def apply_transaction(broker: Broker, tx: Transaction) -> tuple[list[m.CommittedBatch], list[tuple[Any, Any]]]:
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


def reapply_on_open(broker: Broker, tx: Transaction) -> None:
    """At start-up (blocking, before serving): finish a transaction whose COMMIT was logged."""
    _committed, _waits = apply_transaction(broker, tx)
    logs: set[PartitionLog] = {broker.partition_log(p.topic, p.partition)[1] for p in tx.state.puts}
    for plog in logs:
        plog.flush()
    broker.tx_coordinator().finish_commit(tx)


async def handle_check_transactions(broker: Broker, req: m.CheckTransactionsRequest, _session: object
                                    ) -> m.CheckTransactionsResponse:
    """A producer group's checker long-polls for half transactions that need its decision."""
    if not req.producer_group:
        raise InvalidRequestError("CheckTransactions needs the producer group")
    limit = max(1, min(req.max_transactions, 10_000))
    coordinator = broker.tx_coordinator()
    found = coordinator.take_checks(req.producer_group, limit)
    if not found and req.max_wait_ms > 0:
        event = coordinator.check_event(req.producer_group)
        event.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(req.max_wait_ms, 60_000) / 1000):
                await event.wait()
        found = coordinator.take_checks(req.producer_group, limit)
    return m.CheckTransactionsResponse(transaction_ids=found)


HANDLERS: dict[type, Handler] = {m.TransactionRequest: handle_transaction,
                                 m.CheckTransactionsRequest: handle_check_transactions}
