"""The broker's transactions: their states, timeouts and the transaction log (docs/transactions.md).

A transaction lives on one broker (MetaQ's local transaction). Its batches are put into the
transaction log (:mod:`metaq.storage.txlog`), never into a partition; commit copies them into their
partitions (:mod:`metaq.broker.handlers.transactions`). States::

    open --prepare--> prepared --commit--> committed (COMMIT logged) --applied--> gone
      \\----------------commit (one phase)----^
    open / prepared --rollback, timeout--> gone (ROLLBACK logged)

This module keeps the states and writes the log; it never touches a partition. Everything runs on the
broker's event loop, except the fsyncs and checkpoints the caller sends to a worker thread.

Half messages (RocketMQ's check-back)
-------------------------------------
A transaction prepared with a producer group is a *half transaction*: its producer decides it, or the
group's checker does when asked. ``maxTxTimeoutInSeconds`` does not apply to it once prepared (a
producer whose local transaction committed must not see the broker roll the message back because no
checker happened to be running). It is first due for a check ``transactionTimeOut`` ms after its
prepare, then every ``transactionCheckInterval`` ms; a due transaction waits in its group's queue until
a checker of the group takes it (:meth:`TransactionCoordinator.take_checks`, the CheckTransactions long
poll). Only a check handed to a checker counts: a group with no checker connected never uses up its
transactions' checks. Due again after ``transactionCheckMax`` checks without a decision, it is rolled
back. Every transaction the broker decides by itself (a timeout, or checks exhausted) is logged at
ERROR with what it held, counted (``timed_out``), and kept in :attr:`TransactionCoordinator.timed_out_recent`
for ``metaq admin transactions``.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from metaq.errors import (
    ConcurrentTransactionsError,
    InvalidArgument,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
)
from metaq.protocol.records import SEQUENCE_LIMIT, ProducerStamp, decode_batch, read_header
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
TIMED_OUT_REMEMBERED = 1000
"""Transactions the broker decided by itself (timeout, checks exhausted) listed with their details."""
KEYS_NAMED_MAX = 10
"""Message keys an ERROR about a timed-out transaction names (then "and N more")."""


@dataclass(frozen=True, slots=True)
class TimedOut:
    """A transaction the broker rolled back by itself: what ``metaq admin transactions`` lists."""

    txid: str
    producer_group: str
    xid: str | None
    reason: str
    begun_ms: int
    ended_ms: int
    messages: int
    partitions: tuple[str, ...]
    """``topic-partition`` of each batch it held."""


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
    """Half messages: when the transaction is next due for a check (0: never; not a half transaction)."""
    checks: int = 0
    """Half messages: checks handed to a checker of its group (only those count toward transactionCheckMax)."""
    queued: bool = False
    """Half messages: due, waiting in its group's queue for a checker to take it."""
    messages: int = 0
    """Messages put (counted from the batches' headers)."""

    @property
    def half(self) -> bool:
        """A half message (RocketMQ's): prepared with a producer group, decided by its producer or checker."""
        return bool(self.state.producer_group) and self.state.xid is not None

    @property
    def txid(self) -> str:
        return self.state.txid


class TransactionCoordinator:
    def __init__(self, txlog: TransactionLog, *, max_timeout_s: int, capacity: int, flush_at_commit: int,
                 checkpoint_interval_ms: int, check_first_ms: int = 6000, check_interval_ms: int = 60_000,
                 check_max: int = 15, clock: Callable[[], float] = time.monotonic,
                 wall_ms: Callable[[], int] = lambda: int(time.time() * 1000)) -> None:
        self.txlog = txlog
        self.max_timeout_ms = max_timeout_s * 1000
        self.capacity = capacity
        self.flush_at_commit = flush_at_commit
        self.checkpoint_interval_s = checkpoint_interval_ms / 1000
        self.clock = clock
        self.live: dict[str, Transaction] = {}
        self._deadlines: list[tuple[float, str]] = []
        self.finished: OrderedDict[str, str] = OrderedDict()
        """txid -> how it ended ("committed", "rolled back: ...")."""
        self._last_checkpoint_s = clock()
        self._wall_ms = wall_ms
        self.check_first_s = check_first_ms / 1000
        self.check_interval_s = check_interval_ms / 1000
        self.check_max = check_max
        self._checks_due: dict[str, OrderedDict[str, None]] = {}
        """producer group -> half transactions its checker should decide, in the order they fell due."""
        self._check_events: dict[str, asyncio.Event] = {}
        self.checker_seen_s: dict[str, float] = {}
        """producer group -> when a checker of the group last asked (CheckTransactions)."""
        self.checks_offered = 0
        """Checks handed to checkers."""
        self.committed = 0
        self.rolled_back = 0
        self.timed_out = 0
        """Transactions the broker rolled back by itself: past their timeout, or half ones out of checks."""
        self.timed_out_recent: deque[TimedOut] = deque(maxlen=TIMED_OUT_REMEMBERED)

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
                tx.messages = sum(self._records_of(put) for put in state.puts)
                if state.producer_group:
                    tx.next_check_s = self.clock()  # a half message: ask its group's checker soon
        return to_apply


    # -- requests ------------------------------------------------------------------------------

    def begin(self, txid: str, timeout_ms: int, producer_group: str) -> Transaction:
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
        state = TxState(txid, timeout_ms, int(time.time() * 1000), producer_group)
        self.txlog.begin(state)
        self.finished.pop(txid, None)
        return self._track(state, timeout_ms)

    def _track(self, state: TxState, timeout_ms: int) -> Transaction:
        tx = Transaction(state, self.clock() + timeout_ms / 1000)
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
        tx.messages += record_count
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
            tx.next_check_s = self.clock() + self.check_first_s
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

    def recover(self) -> list[str]:
        return sorted(tx.state.xid for tx in self.live.values() if tx.state.xid is not None and not tx.committing)

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
        now = self.clock()
        gone = []
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, txid = heapq.heappop(self._deadlines)
            tx = self.live.get(txid)
            if tx is None or tx.deadline_s != deadline or tx.committing or tx.half:
                continue  # (a half message, once prepared, is decided by its producer or checker)
            what = "prepared" if tx.state.xid is not None else "open"
            self._time_out(tx, f"timed out: {what} for longer than its timeout of {tx.state.timeout_ms} ms")
            gone.append(txid)
        return gone

    def _time_out(self, tx: Transaction, reason: str) -> None:
        """The broker decides by itself: roll back, count, keep for the listing, and say it loudly."""
        state = tx.state
        partitions = tuple(dict.fromkeys(f"{p.topic}-{p.partition}" for p in state.puts))
        self.rollback(tx.txid, reason)
        self.timed_out += 1
        self.timed_out_recent.append(TimedOut(tx.txid, state.producer_group, state.xid, reason, state.begun_ms,
                                              self._wall_ms(), tx.messages, partitions))
        log.error("transaction %s%s rolled back by the broker: %s. Its %d message(s), never visible: %s%s",
                  tx.txid, _whose(state), reason, tx.messages, ", ".join(partitions) or "none",
                  self._keys_named(state))

    def _records_of(self, put: TxPut) -> int:
        try:
            return read_header(self.txlog.read_batch(put)).record_count
        except Exception:  # only a count for listings: a batch that cannot be read is found at commit
            return 0

    def _keys_named(self, state: TxState) -> str:
        keys: list[str] = []
        total = 0
        for put in state.puts:
            try:
                found = [m.key for m in decode_batch(self.txlog.read_batch(put), verify=False) if m.key is not None]
            except Exception as exc:  # the ERROR must be logged even if the batch cannot be read back
                return f" (their keys could not be read: {exc})"
            total += len(found)
            keys += [k.decode(errors="replace") for k in found[:KEYS_NAMED_MAX - len(keys)]]
        if not keys:
            return ""
        more = f" and {total - len(keys)} more" if total > len(keys) else ""
        return f" (keys: {', '.join(repr(k) for k in keys)}{more})"

    def offer_checks(self) -> None:
        """Half transactions due for a check wait in their group's queue for a checker to take them (a
        checker long-polls it); one due again after ``check_max`` checks handed out is rolled back."""
        now = self.clock()
        give_up = []
        for tx in self.live.values():
            if not tx.next_check_s or tx.next_check_s > now or tx.committing or tx.queued:
                continue
            if tx.checks >= self.check_max:
                give_up.append(tx)
                continue
            group = tx.state.producer_group
            tx.queued = True
            self._checks_due.setdefault(group, OrderedDict())[tx.txid] = None
            event = self._check_events.get(group)
            if event is not None:
                event.set()
        for tx in give_up:
            self._time_out(tx, f"no decision after {tx.checks} checks by producer group "
                               f"{tx.state.producer_group!r}'s checker (transactionCheckMax={self.check_max})")

    def take_checks(self, group: str, limit: int) -> list[Transaction]:
        """Hand up to ``limit`` due half transactions of ``group`` to a checker that asked now: each counts
        as one check, and is due again ``transactionCheckInterval`` later unless decided."""
        now = self.clock()
        self.checker_seen_s[group] = now
        due = self._checks_due.get(group)
        out: list[Transaction] = []
        while due and len(out) < limit:
            txid, _ = due.popitem(last=False)
            tx = self.live.get(txid)
            if tx is None or tx.committing:
                continue
            tx.queued = False
            tx.checks += 1
            tx.next_check_s = now + self.check_interval_s
            self.checks_offered += 1
            out.append(tx)
        return out

    def check_event(self, group: str) -> asyncio.Event:
        event = self._check_events.get(group)
        if event is None:
            event = self._check_events[group] = asyncio.Event()
        return event

    def checkpoint_due(self) -> bool:
        return (self.txlog.size_bytes > CHECKPOINT_BYTES
                or self.clock() - self._last_checkpoint_s >= self.checkpoint_interval_s)

    def checkpoint(self) -> None:
        """Blocking (the caller decides where): a new log generation with only the live transactions."""
        self.txlog.checkpoint([tx.state for tx in self.live.values()], self.finished.items())
        self._last_checkpoint_s = self.clock()

    def read_batch(self, put: TxPut) -> bytes:
        return self.txlog.read_batch(put)

    def describe(self) -> dict[str, object]:
        return {"open": sum(1 for t in self.live.values() if t.state.xid is None),
                "prepared": sum(1 for t in self.live.values() if t.state.xid is not None),
                "half_prepared": sum(1 for t in self.live.values() if t.half),
                "committed": self.committed, "rolled_back": self.rolled_back, "timed_out": self.timed_out,
                "checks": self.checks_offered, "log_bytes": self.txlog.size_bytes,
                "checkpoints": self.txlog.checkpoints}


def _whose(state: TxState) -> str:
    parts = [f"producer group {state.producer_group!r}"] if state.producer_group else []
    if state.xid is not None and state.xid != state.txid:
        parts.append(f"xid {state.xid}")
    return f" ({', '.join(parts)})" if parts else ""
