"""The broker's transactions: their states, timeouts and the transaction log (docs/transactions.md).

A transaction lives on one broker (MetaQ's local transaction). Its batches are put into the
transaction log (:mod:`metaq.storage.txlog`), never into a partition; commit copies them into their
partitions (:mod:`metaq.broker.handlers.transactions`). States::

    open --prepare--> prepared --commit--> committed (COMMIT logged) --applied--> gone
      \\----------------commit (one phase)----^
    open / prepared --rollback, timeout--> gone (ROLLBACK logged)

This module keeps the states and writes the log; it never touches a partition. Everything runs on the
broker's event loop, except the fsyncs and checkpoints the caller sends to a worker thread.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from metaq.errors import (
    ConcurrentTransactionsError,
    InvalidArgument,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
)
from metaq.protocol.records import SEQUENCE_LIMIT, ProducerStamp
from metaq.storage.txlog import (
    CHECKPOINT_BYTES,
    COMMITTED,
    HOW_CHARS_MAX,
    ROLLED_BACK,
    TransactionLog,
    TxPut,
    TxState,
)

log = logging.getLogger("metaq.broker.transactions")

MAX_TXID_CHARS = 128
MAX_TRANSACTION_BYTES = 256 << 20
"""Bytes of batches one transaction may hold (they sit in the transaction log until it ends)."""
FINISHED_REMEMBERED = 100_000
"""Finished transactions remembered with how they ended: a late commit is told why it failed, and
"was transaction X committed?" (the Transaction status op; the exactly-once Spark sink asks it after a
driver restart) is answered for the last this-many finished transactions, across broker restarts
too (the transaction log's checkpoints carry them). About 100 bytes of memory each."""

OPEN, PREPARED, COMMITTING, UNKNOWN = "open", "prepared", "committing", "unknown"
"""What the status op answers besides "committed" and "rolled back (reason)"."""


@dataclass(slots=True)
class Transaction:
    state: TxState
    deadline_s: float
    """time.monotonic() at which it is rolled back unless committed."""
    producer_id: int = 0
    """The producer id every batch of the transaction is stamped with (0: no batch yet)."""
    sequences: dict[tuple[str, int], list[tuple[int, int]]] = field(default_factory=dict)
    """(topic, partition) -> the (first, last) sequences put, in order: a retried put is taken once."""
    committing: bool = False
    next_check_s: float = 0.0
    """Half messages: when the producer group's checker is next asked (0: never; not a half transaction)."""
    checks: int = 0

    @property
    def txid(self) -> str:
        return self.state.txid


class TransactionCoordinator:
    def __init__(self, txlog: TransactionLog, *, max_timeout_s: int, capacity: int, flush_at_commit: int,
                 checkpoint_interval_ms: int, check_interval_ms: int = 6000, check_max: int = 15,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.txlog = txlog
        self.max_timeout_ms = max_timeout_s * 1000
        self.capacity = capacity
        self.flush_at_commit = flush_at_commit
        self.checkpoint_interval_s = checkpoint_interval_ms / 1000
        self._clock = clock
        self.live: dict[str, Transaction] = {}
        self._deadlines: list[tuple[float, str]] = []
        self.finished: OrderedDict[str, str] = OrderedDict()
        """txid -> how it ended ("committed", "rolled back: ...")."""
        self._last_checkpoint_s = clock()
        self.check_interval_s = check_interval_ms / 1000
        self.check_max = check_max
        self._checks_due: dict[str, OrderedDict[str, None]] = {}
        """producer group -> half transactions its checker should decide, in the order they fell due."""
        self._check_events: dict[str, asyncio.Event] = {}
        self.checks_offered = 0
        self.committed = 0
        self.rolled_back = 0
        self.timed_out = 0

    # -- start-up ------------------------------------------------------------------------------

    def open(self) -> list[Transaction]:
        """Replay the log. Open transactions are rolled back (their client is gone with the broker's
        connections); prepared ones stay, with a fresh timeout; committed-but-not-applied ones are
        returned, for the caller to apply again. Finished ones are remembered as before the restart."""
        to_apply: list[Transaction] = []
        live = self.txlog.open()
        self.finished = OrderedDict(self.txlog.finished)
        self._forget_oldest()
        for state in live.values():
            tx = self._track(state, state.timeout_ms or self.max_timeout_ms)  # 0: its BEGIN was lost to damage
            for put in state.puts:
                tx.sequences.setdefault((put.topic, put.partition), [])
            if state.damaged is not None:  # never applied in part: what it lost may have been one of its batches
                how = "committed" if state.committed else "prepared" if state.xid is not None else "open"
                log.error("%s transaction %s (xid %s) rolled back at start: %s; its messages are not delivered",
                          how, state.txid, state.xid, state.damaged)
                self.rollback(state.txid, f"damaged in the transaction log: {state.damaged}")
            elif state.committed:
                to_apply.append(tx)
            elif state.xid is None:
                self.rollback(state.txid, "the broker restarted before it was prepared or committed")
            else:
                log.info("prepared transaction %s (xid %s) recovered: waiting for its coordinator", state.txid,
                         state.xid)
                if state.producer_group:
                    tx.next_check_s = self._clock()  # a half message: ask its group's checker soon
        return to_apply

    # -- requests ------------------------------------------------------------------------------

    def begin(self, txid: str, timeout_ms: int, producer_group: str, owner: str = "") -> Transaction:
        if not txid or len(txid) > MAX_TXID_CHARS:
            raise InvalidArgument(f"a transaction id has 1-{MAX_TXID_CHARS} characters; got {len(txid)}")
        if timeout_ms < 0 or timeout_ms > self.max_timeout_ms:
            raise InvalidTransactionTimeoutError(
                f"transaction timeout {timeout_ms} ms is outside 0..{self.max_timeout_ms} (maxTxTimeoutInSeconds)")
        how = self.finished.get(txid)
        if txid in self.live or (how is not None and not how.startswith(ROLLED_BACK)):
            raise InvalidTxnStateError(f"transaction {txid} was begun before ({self.status(txid)}); a transaction "
                                       "id is used once (again only after a rollback)")
        if len(self.live) >= self.capacity:
            raise ConcurrentTransactionsError(f"{len(self.live)} transactions are open on this broker "
                                              f"(maxTxTimeoutTimerCapacity={self.capacity})")
        timeout_ms = timeout_ms or self.max_timeout_ms
        state = TxState(txid, timeout_ms, int(time.time() * 1000), producer_group, owner=owner)
        self.txlog.begin(state)
        self.finished.pop(txid, None)
        return self._track(state, timeout_ms)

    def _track(self, state: TxState, timeout_ms: int) -> Transaction:
        tx = Transaction(state, self._clock() + timeout_ms / 1000)
        self.live[state.txid] = tx
        heapq.heappush(self._deadlines, (tx.deadline_s, state.txid))
        return tx

    def get(self, txid: str, *, for_change: bool = True) -> Transaction:
        tx = self.live.get(txid)
        if tx is None:
            how = self.finished.get(txid)
            if how is not None:
                raise InvalidTxnStateError(f"transaction {txid} is over: {how}")
            raise InvalidTxnStateError(f"transaction {txid} is unknown on this broker (never begun here, or lost "
                                       "with a restart before it was prepared)")
        if for_change and tx.committing:
            raise InvalidTxnStateError(f"transaction {txid} is committing")
        return tx

    def put(self, txid: str, topic: str, partition: int, batch: bytes | memoryview, stamp: ProducerStamp | None,
            record_count: int) -> bool:
        """Log a batch of the transaction; False for a retried put already taken."""
        tx = self.get(txid)
        if tx.state.xid is not None:
            raise InvalidTxnStateError(f"transaction {txid} is prepared: no more batches")
        if stamp is None:
            raise InvalidArgument("a transaction's batch needs a producer block (the transaction's producer id and "
                                  "a sequence from 0 per partition): see docs/transactions.md")
        if tx.producer_id and stamp.producer_id != tx.producer_id:
            raise InvalidArgument(f"transaction {txid} takes batches of producer {tx.producer_id}, not "
                                  f"{stamp.producer_id}")
        puts = tx.sequences.setdefault((topic, partition), [])
        first, last = stamp.base_sequence, stamp.last_sequence(record_count)
        if (first, last) in puts:
            return False
        expected = (puts[-1][1] + 1) % SEQUENCE_LIMIT if puts else 0
        if first != expected:
            raise OutOfOrderSequenceError(f"transaction {txid} expects sequence {expected} on {topic}-{partition}, "
                                          f"got {first}")
        if tx.state.size_bytes + len(batch) > MAX_TRANSACTION_BYTES:
            raise InvalidArgument(f"transaction {txid} would hold more than {MAX_TRANSACTION_BYTES} bytes")
        self.txlog.put(tx.state, topic, partition, batch)
        tx.producer_id = stamp.producer_id
        puts.append((first, last))
        return True

    def prepare(self, txid: str, xid: str) -> Transaction:
        tx = self.get(txid)
        if tx.state.xid is not None:
            if tx.state.xid == xid:
                return tx  # a retried prepare
            raise InvalidTxnStateError(f"transaction {txid} is already prepared as {tx.state.xid}")
        if not xid:
            raise InvalidArgument("prepare needs an xid")
        self.txlog.prepare(tx.state, xid)
        if tx.state.producer_group:  # a half message: its group's checker decides if the producer does not
            tx.next_check_s = self._clock() + self.check_interval_s
        return tx

    def start_commit(self, txid: str) -> Transaction:
        """Log COMMIT (the caller then syncs per flushTxLogAtCommit and applies the batches)."""
        tx = self.get(txid)
        self.txlog.commit(tx.state)  # a failure (a full disk) leaves it as it was: the commit can be retried
        tx.committing = True
        return tx

    def finish_commit(self, tx: Transaction) -> None:
        self.txlog.applied(tx.txid)
        self._end(tx.txid, COMMITTED)
        self.committed += 1

    def rollback(self, txid: str, reason: str) -> None:
        tx = self.get(txid)
        self.txlog.rollback(txid, reason)
        self._end(tx.txid, f"{ROLLED_BACK} ({reason})")
        self.rolled_back += 1

    def status(self, txid: str) -> str:
        """Where a transaction is: open, prepared, committing, committed, "rolled back (reason)", or
        unknown (never begun here, or finished longer ago than the last FINISHED_REMEMBERED)."""
        tx = self.live.get(txid)
        if tx is not None:
            return COMMITTING if tx.committing else PREPARED if tx.state.xid is not None else OPEN
        return self.finished.get(txid, UNKNOWN)

    def recover(self, owner: str | None = None) -> list[str]:
        """The prepared transactions' xids (``owner``: only those that principal began)."""
        return sorted(tx.state.xid for tx in self.live.values() if tx.state.xid is not None and not tx.committing
                      and (owner is None or tx.state.owner == owner))

    def _end(self, txid: str, how: str) -> None:
        self.live.pop(txid, None)
        self.finished.pop(txid, None)
        self.finished[txid] = how[:HOW_CHARS_MAX]  # as the log keeps it: the same answer after a restart
        self._forget_oldest()

    def _forget_oldest(self) -> None:
        while len(self.finished) > FINISHED_REMEMBERED:
            self.finished.popitem(last=False)

    # -- timers and checkpoints ----------------------------------------------------------------

    def expire(self) -> list[str]:
        """Roll back the transactions past their timeout (open or prepared); their txids."""
        now = self._clock()
        gone = []
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, txid = heapq.heappop(self._deadlines)
            tx = self.live.get(txid)
            if tx is None or tx.deadline_s != deadline or tx.committing:
                continue
            what = "prepared" if tx.state.xid is not None else "open"
            self.rollback(txid, f"timed out: {what} for longer than its timeout of {tx.state.timeout_ms} ms")
            self.timed_out += 1
            log.warning("transaction %s rolled back: %s for longer than %d ms", txid, what, tx.state.timeout_ms)
            gone.append(txid)
        return gone

    def offer_checks(self) -> None:
        """Half transactions due for a check go to their group's queue (a checker long-polls it); past
        ``check_max`` checks without a decision, they are rolled back."""
        now = self._clock()
        give_up = []
        for tx in self.live.values():
            if not tx.next_check_s or tx.next_check_s > now or tx.committing:
                continue
            group = tx.state.producer_group
            if tx.checks >= self.check_max:
                give_up.append(tx)
                continue
            tx.checks += 1
            tx.next_check_s = now + self.check_interval_s
            self._checks_due.setdefault(group, OrderedDict())[tx.txid] = None
            self.checks_offered += 1
            event = self._check_events.get(group)
            if event is not None:
                event.set()
        for tx in give_up:
            reason = f"no decision after {tx.checks} checks of producer group {tx.state.producer_group!r}"
            log.warning("half transaction %s rolled back: %s", tx.txid, reason)
            self.rollback(tx.txid, reason)

    def take_checks(self, group: str, limit: int, owner: str | None = None) -> list[str]:
        """Half transactions of ``group`` due for a check (``owner``: only those that principal began; the
        others stay due for their own principal's checker)."""
        due = self._checks_due.get(group)
        out: list[str] = []
        if owner is not None and due:
            for txid in [t for t in due if (tx := self.live.get(t)) is None or tx.state.owner == owner][:limit]:
                del due[txid]
                if txid in self.live:
                    out.append(txid)
            return out
        while due and len(out) < limit:
            txid, _ = due.popitem(last=False)
            if txid in self.live:
                out.append(txid)
        return out

    def check_event(self, group: str) -> asyncio.Event:
        event = self._check_events.get(group)
        if event is None:
            event = self._check_events[group] = asyncio.Event()
        return event

    def checkpoint_due(self) -> bool:
        return (self.txlog.size_bytes > CHECKPOINT_BYTES
                or self._clock() - self._last_checkpoint_s >= self.checkpoint_interval_s)

    def checkpoint(self) -> None:
        """Blocking (the caller decides where): a new log generation with only the live transactions."""
        self.txlog.checkpoint([tx.state for tx in self.live.values()], self.finished.items())
        self._last_checkpoint_s = self._clock()

    def read_batch(self, put: TxPut) -> bytes:
        return self.txlog.read_batch(put)

    def describe(self) -> dict[str, object]:
        return {"open": sum(1 for t in self.live.values() if t.state.xid is None),
                "prepared": sum(1 for t in self.live.values() if t.state.xid is not None),
                "committed": self.committed, "rolled_back": self.rolled_back, "timed_out": self.timed_out,
                "log_bytes": self.txlog.size_bytes, "checkpoints": self.txlog.checkpoints}
