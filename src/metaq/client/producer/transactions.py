"""The producer's transaction facade: local transactions, half messages, XA, and how a transaction ended.

The transactions themselves are :mod:`metaq.client.transaction`'s (docs/transactions.md); this is what the
:class:`~metaq.client.producer.Producer` offers of them. A commit or rollback that fails raises
:class:`~metaq.client.transaction.TransactionOutcomeError` with the transaction's id, and
:meth:`Transactions.transaction_status` asks the broker how it ended: the retry-safe pattern.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

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
from metaq.protocol import messages as m

if TYPE_CHECKING:
    from metaq.client.config import ProducerConfig
    from metaq.client.core import ClientCore
    from metaq.client.selectors import PartitionSelector
    from metaq.types import Message


class TransactionScope:
    """``async with producer.transaction():``: commit on exit, roll back on an exception."""

    def __init__(self, producer: Transactions, timeout_s: float | None, producer_group: str) -> None:
        self.producer, self.timeout_s, self.producer_group = producer, timeout_s, producer_group
        self.result: TransactionResult | None = None

    async def __aenter__(self) -> TransactionScope:
        await self.producer.begin_transaction(self.timeout_s, self.producer_group)
        return self

    @property
    def transaction_id(self) -> str:
        """The id of the transaction this scope opened (to ask :meth:`Transactions.transaction_status` later)."""
        return self.producer._open_tx().transaction_id if self.producer._tx is not None else ""

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if exc_type is None:
            self.result = await self.producer.commit()
        else:
            await self.producer.rollback()


class Transactions:
    """The transaction methods of a Producer (a mixin: what a transaction uses of the producer,
    :class:`~metaq.client.transaction.TransactionProducer`, is the producer's own)."""

    _core: ClientCore
    config: ProducerConfig
    selector: PartitionSelector

    def __init__(self) -> None:
        self._checkers: list[TransactionChecker] = []
        self._tx: LocalTransaction | None = None
        """The open local transaction: ``send`` goes into it (docs/transactions.md)."""

    def _check_open(self) -> None:
        raise NotImplementedError

    def _check(self, message: Message) -> int:
        raise NotImplementedError

    @property
    def request_timeout_s(self) -> float:
        raise NotImplementedError

    @property
    def in_transaction(self) -> bool:
        """Whether a local transaction (or an XA branch) is open on this producer."""
        return self._tx is not None

    # -- local transactions (docs/transactions.md) -----------------------------------------------------

    def transaction(self, timeout_s: float | None = None, producer_group: str = "") -> TransactionScope:
        """``async with producer.transaction(): await producer.send(...)``: commit on exit, roll back on an
        exception. ``timeout_s``: the broker rolls it back if not committed by then (at most the broker's
        maxTxTimeoutInSeconds; None: that maximum)."""
        return TransactionScope(self, timeout_s, producer_group)

    async def begin_transaction(self, timeout_s: float | None = None, producer_group: str = "") -> str:
        """Start a local transaction: ``send`` puts messages into it until :meth:`commit` or :meth:`rollback`.
        Returns its id (what :meth:`transaction_status` takes)."""
        self._check_open()
        if self._tx is not None:
            raise TransactionError("a transaction is already open on this producer")
        self._tx = LocalTransaction(self, timeout_s, producer_group)
        return self._tx.transaction_id

    async def commit(self) -> TransactionResult:
        """Make the transaction's messages visible, all at once; where they were stored. A failure raises
        TransactionOutcomeError naming the transaction (ask :meth:`transaction_status` when its outcome is not
        known)."""
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

    async def transaction_status(self, transaction_id: str, broker_id: int | None = None) -> str:
        """How a transaction ended, as its broker tells (the Transaction status op): ``"open"``, ``"prepared"``,
        ``"committing"``, ``"committed"``, ``"rolled back (<reason>)"``, or ``"unknown"`` (never begun there, or
        finished longer ago than the broker remembers). ``broker_id``: the transaction's broker (a
        TransactionOutcomeError names it); None asks every broker this session knows."""
        if broker_id is not None:
            brokers = [broker_id]
        else:
            await self._core.metadata.refresh_all()
            brokers = sorted(set(self._core.metadata.cache.brokers) | set(self._core.server_ids.values()))
        status = "unknown"
        for b in brokers:
            response = await self._core.request(m.TransactionRequest(m.TX_STATUS, transaction_id), b)
            status = str(response.xids[0]) if response.xids else "unknown"
            if status != "unknown":
                return status
        return status

    # -- half messages (RocketMQ's transactional messages; docs/transactions.md) ------------------------

    async def send_in_transaction(self, message: Any, execute: Callable[..., Any], producer_group: str,
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

    # -- XA: the DB-API two-phase-commit interface (docs/transactions.md, "XA") -------------------------

    async def tpc_begin(self, xid: Any, timeout_s: float | None = None) -> None:
        """Start a transaction branch named by ``xid`` (an :class:`Xid`, psycopg's Xid, a 3-tuple or a
        string); then ``send``, :meth:`tpc_prepare`, :meth:`tpc_commit` / :meth:`tpc_rollback`."""
        self._check_open()
        if self._tx is not None:
            raise TransactionError("a transaction is already open on this producer")
        self._tx = LocalTransaction(self, timeout_s, "", Xid.of(xid).key)

    async def tpc_prepare(self) -> None:
        """XA: prepare the current branch: its messages are stored, still invisible, until :meth:`tpc_commit`."""
        await self._open_tx().prepare()

    async def tpc_commit(self, xid: Any = None) -> None:
        """Without ``xid``: commit the current branch (two-phase after tpc_prepare, else one-phase).
        With one: commit that prepared branch, found with :meth:`tpc_recover` (after a crash)."""
        if xid is None:
            await self.commit()
        else:
            await self._end_recovered(Xid.of(xid), m.TX_COMMIT)

    async def tpc_rollback(self, xid: Any = None) -> None:
        """XA: roll back the current branch, or, with ``xid``, a prepared branch found by :meth:`tpc_recover`."""
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
