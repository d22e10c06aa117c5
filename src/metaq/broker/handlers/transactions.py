"""Transaction (API 21) and Produce v1 into a transaction: begin, put, prepare, commit, roll back, recover.

The states and the log are :mod:`metaq.broker.transactions`; a commit's batches are copied into their
partitions by :mod:`metaq.broker.committing` (all in one step of the event loop, each through the
idempotent producer's check). The answer to a commit waits for the partitions' flush policy and sync
replication, as a produce does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from metaq.broker.appending import await_ack
from metaq.broker.committing import apply_transaction
from metaq.broker.session import Session
from metaq.errors import (
    InvalidRequestError,
    PartitionClosedError,
    StorageFailureError,
    TransactionAuthorizationError,
    UnknownPartitionError,
)
from metaq.protocol import messages as m
from metaq.protocol.records import ProducerStamp

log = logging.getLogger("metaq.broker.transactions")

if TYPE_CHECKING:
    from metaq.broker.core import Broker, Handler
    from metaq.broker.transactions import Transaction


def scoped_owner(broker: Broker, session: Session | None) -> str | None:
    """The principal whose transactions alone ``session`` may see and use (aclEnabled), or None: all of them
    (ACLs off, a super-user, or a principal with admin on the cluster)."""
    if not broker.config.acl_enabled or session is None or session.principal is None:
        return None
    principal = session.principal
    if broker.acls.allows(principal, "cluster", "cluster", "admin"):
        return None
    return principal


def check_owner(broker: Broker, txid: str, session: Session | None) -> None:
    """TRANSACTIONAL_ID_AUTHORIZATION_FAILED when another principal began transaction ``txid``."""
    owner = scoped_owner(broker, session)
    if owner is None:
        return
    tx = broker.tx_coordinator().live.get(txid)
    if tx is not None and tx.state.owner != owner:
        assert session is not None
        broker.audit(owner, "produce", f"transaction:{txid}", "denied", session.peer,
                     f"begun by {tx.state.owner or 'an unknown principal'}")
        raise TransactionAuthorizationError(f"transaction {txid!r} was begun by another principal; {owner} may "
                                            "use only the transactions it began")


def put_into_transaction(broker: Broker, transaction_id: str, topic: str, partition: int, records: bytes | memoryview,
                         header: Any, stamp: ProducerStamp | None, session: Session | None = None) -> Any:
    """A Produce v1 with ``transaction_id`` (or a MultiProduce's batch): the batch goes into the transaction log."""
    check_owner(broker, transaction_id, session)
    if partition < 0:
        raise UnknownPartitionError("a transaction's batch names its partition (-1 is not taken)")
    state, _plog = broker.partition_log(topic, partition)
    if partition in state.closed:
        raise PartitionClosedError(f"partition {broker.config.broker_id}-{partition} of topic {topic!r} is closed for "
                                   "publishing")
    broker.tx_coordinator().put(transaction_id, topic, partition, records, stamp, header.record_count)
    return m.ProduceResponse(partition=partition)


def handle_transaction(broker: Broker, req: m.TransactionRequest, session: Session | None) -> Any:
    coordinator = broker.tx_coordinator()
    op = req.op
    if op == m.TX_RECOVER:
        return m.TransactionResponse(xids=coordinator.recover(scoped_owner(broker, session)))
    if op != m.TX_BEGIN:
        check_owner(broker, req.transaction_id, session)
    if op == m.TX_STATUS:
        return m.TransactionResponse(xids=[coordinator.status(req.transaction_id)])
    broker.refuse_writes_on_slave("transactions")
    if op == m.TX_BEGIN:
        principal = session.principal if session is not None and session.principal is not None else ""
        coordinator.begin(req.transaction_id, req.timeout_ms, req.producer_group, principal)
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


def _limit(value: int, what: str) -> int:
    if not 1 <= value <= m.CHECK_TRANSACTIONS_MAX:
        raise InvalidRequestError(f"{what}.max_transactions must be 1..{m.CHECK_TRANSACTIONS_MAX}; got {value}")
    return value


async def handle_check_transactions(broker: Broker, req: m.CheckTransactionsRequest, session: Session | None
                                    ) -> m.CheckTransactionsResponse:
    """A producer group's checker long-polls for half transactions that need its decision; each it is
    handed counts as one check (docs/transactions.md, "Half messages")."""
    if not req.producer_group:
        raise InvalidRequestError("CheckTransactions needs the producer group")
    limit = _limit(req.max_transactions, "CheckTransactions")
    coordinator = broker.tx_coordinator()
    owner = scoped_owner(broker, session)  # a checker sees only its own principal's half transactions
    found = coordinator.take_checks(req.producer_group, limit, owner)
    if not found and req.max_wait_ms > 0:
        event = coordinator.check_event(req.producer_group)
        event.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(req.max_wait_ms, 60_000) / 1000):
                await event.wait()
        found = coordinator.take_checks(req.producer_group, limit, owner)
    budget = m.CHECK_REPLY_BYTES_MAX
    halves = []
    for tx in found:
        size = tx.state.size_bytes
        batches = []
        if size <= budget:
            budget -= size
            batches = [m.HalfBatch(put.topic, put.partition, coordinator.read_batch(put)) for put in tx.state.puts]
        halves.append(m.HalfTransaction(tx.txid, tx.checks, tx.state.begun_ms, batches))
    return m.CheckTransactionsResponse(transaction_ids=[tx.txid for tx in found], transactions=halves)


CHECKER_SEEN_S = 60.0
"""ListTransactions names the producer groups whose checker asked within this many seconds."""


def handle_list_transactions(broker: Broker, req: m.ListTransactionsRequest, _session: object
                             ) -> m.ListTransactionsResponse:
    """`metaq admin transactions`: the live transactions and the last ones the broker decided by itself."""
    limit = _limit(req.max_transactions, "ListTransactions")
    coordinator = broker.transactions
    if coordinator is None:  # no transaction ever on this broker: nothing to open a log for
        return m.ListTransactionsResponse()
    group = req.producer_group
    now_s, now_ms = coordinator.clock(), int(time.time() * 1000)

    def wall(at_s: float) -> int:
        return now_ms + int((at_s - now_s) * 1000)

    live = []
    for tx in sorted(coordinator.live.values(), key=lambda t: t.state.begun_ms):
        state = tx.state
        if group and state.producer_group != group:
            continue
        live.append(m.TransactionInfo(
            tx.txid, coordinator.status(tx.txid), state.producer_group, state.xid, state.begun_ms, -1,
            -1 if tx.half else wall(tx.deadline_s), wall(tx.next_check_s) if tx.next_check_s else -1, tx.checks,
            tx.messages, list(dict.fromkeys(f"{p.topic}-{p.partition}" for p in state.puts))))
        if len(live) >= limit:
            break
    timed_out = [m.TransactionInfo(t.txid, f"rolled back ({t.reason})", t.producer_group, t.xid, t.begun_ms,
                                   t.ended_ms, -1, -1, 0, t.messages, list(t.partitions))
                 for t in reversed(coordinator.timed_out_recent) if not group or t.producer_group == group][:limit]
    checkers = sorted(g for g, seen in coordinator.checker_seen_s.items()
                      if now_s - seen <= CHECKER_SEEN_S)
    return m.ListTransactionsResponse(live=live, timed_out=timed_out, checkers=checkers)


HANDLERS: dict[type, Handler] = {m.TransactionRequest: handle_transaction,
                                 m.CheckTransactionsRequest: handle_check_transactions,
                                 m.ListTransactionsRequest: handle_list_transactions}
