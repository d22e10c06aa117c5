"""A producer's local transaction (MetaQ's local transaction; docs/transactions.md).

All messages of a transaction go to one broker: the broker of the first message's partition (later
messages are routed among that broker's partitions of their topic). Messages are gathered per partition
and put into the broker's transaction log as batches (a full ``batch_bytes`` batch leaves at once, the
rest at commit); each batch carries the transaction's own producer id and a sequence from 0 per
partition, so a put that is retried is taken once. Commit makes them all visible at once; rollback,
an exception in ``async with producer.transaction()``, or the broker's timeout makes none visible.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from metaq.client.callbacks import takes_two
from metaq.errors import InvalidArgument, MetaqError
from metaq.protocol import messages as m
from metaq.protocol.records import SEQUENCE_LIMIT, ProducerStamp, decode_batch, encode_messages, with_producer_stamp
from metaq.types import Message, SendResult

if TYPE_CHECKING:
    from metaq.client.config import ProducerConfig
    from metaq.client.core import ClientCore
    from metaq.client.selectors import PartitionSelector

log = logging.getLogger("metaq.client.transaction")


class TransactionProducer(Protocol):
    """What a transaction uses of the producer it belongs to (:class:`metaq.client.Producer` is one): its session,
    settings, selector and message check. Declared here, so that this module does not import the producer, which
    imports it."""

    _core: ClientCore
    config: ProducerConfig
    selector: PartitionSelector

    @property
    def request_timeout_s(self) -> float: ...

    def _check(self, message: Message) -> int: ...


@dataclass(frozen=True, slots=True)
class TransactionResult:
    """What a commit stored: per batch, its partition and offsets (message i of a batch: base_offset + i)."""

    transaction_id: str
    batches: list[m.CommittedBatch] = field(default_factory=list)

    @property
    def count(self) -> int:
        """Messages the transaction stored."""
        return sum(b.record_count for b in self.batches)


@dataclass(frozen=True, slots=True)
class Xid:
    """An XA transaction id in the DB-API shape (``format_id``, ``gtrid``, ``bqual``), like psycopg's
    ``Connection.xid()``; ``key`` is how a broker names it (its transaction id and xid)."""

    format_id: int
    gtrid: str
    bqual: str

    @property
    def key(self) -> str:
        """The text a broker names the branch by: ``format_id:gtrid:bqual``."""
        return f"{self.format_id}:{self.gtrid}:{self.bqual}"

    @classmethod
    def parse(cls, key: str) -> Xid:
        """The Xid of a :attr:`key` (``"format_id:gtrid:bqual"``)."""
        format_id, gtrid, bqual = key.split(":", 2)
        return cls(int(format_id), gtrid, bqual)

    @classmethod
    def of(cls, xid: Any) -> Xid:
        """From an Xid, a psycopg Xid (or any object with format_id/gtrid/bqual), a 3-tuple, or a key."""
        if isinstance(xid, Xid):
            return xid
        if isinstance(xid, str):
            return cls.parse(xid) if xid.count(":") >= 2 else cls(0, xid, "")
        if isinstance(xid, tuple) and len(xid) == 3:
            return cls(int(xid[0]), str(xid[1]), str(xid[2]))
        return cls(int(xid.format_id or 0), str(xid.gtrid), str(xid.bqual or ""))


class TransactionError(MetaqError):
    """Misuse of a producer's transaction (none open, one already open, a message for another broker)."""


class TransactionOutcomeError(TransactionError):
    """A commit or rollback failed. ``transaction_id`` and ``broker_id`` name the transaction, ``cause`` is the
    failure. ``outcome_known`` is False when the request may have been applied anyway (the connection was lost
    with it in flight, or no reply came in time): then ``await producer.transaction_status(exc.transaction_id,
    exc.broker_id)`` says how it ended, so a retry never stores the transaction twice (docs/transactions.md)."""

    def __init__(self, message: str, *, transaction_id: str, broker_id: int | None, cause: BaseException,
                 outcome_known: bool) -> None:
        super().__init__(message)
        self.transaction_id = transaction_id
        self.broker_id = broker_id
        self.cause = cause
        self.outcome_known = outcome_known


class LocalTransaction:
    def __init__(self, producer: TransactionProducer, timeout_s: float | None, producer_group: str,
                 transaction_id: str | None = None) -> None:
        self.producer = producer
        self.transaction_id = transaction_id or uuid.uuid4().hex
        self.prepared = False
        self.timeout_ms = 0 if timeout_s is None else max(1, int(timeout_s * 1000))
        self.producer_group = producer_group
        self.producer_id = _new_id()
        self.broker_id: int | None = None
        self._pending: dict[tuple[str, int], list[Message]] = {}
        self._pending_bytes: dict[tuple[str, int], int] = {}
        self._sequences: dict[tuple[str, int], int] = {}
        self._puts: list[asyncio.Future[Any]] = []
        self.finished = False

    async def add(self, message: Message) -> SendResult:
        """Route one message into the transaction; its offset is known at commit (-1 here)."""
        if self.finished:
            raise TransactionError("the transaction is over")
        if self.prepared:
            raise TransactionError("the transaction is prepared: no more messages")
        if message.deliver_at is not None or message.delay_ms is not None:
            raise InvalidArgument("delayed messages cannot be sent in a transaction")
        producer = self.producer
        size = producer._check(message)
        tm = await producer._core.metadata.topic(message.topic)
        partitions = tm.partitions
        if not partitions:
            raise TransactionError(f"topic {message.topic!r} has no known partitions: a transaction sends to "
                                   "existing topics only (create it first: metaq topic create)")
        if self.broker_id is not None:
            partitions = tuple(p for p in partitions if p.broker_id == self.broker_id)
        if not partitions:
            where = f" on broker {self.broker_id}" if self.broker_id is not None else ""
            raise TransactionError(f"topic {message.topic!r} has no partition{where}: a local transaction stays on "
                                   "the broker of its first message (use XA across brokers)")
        part = producer.selector(message.topic, partitions, message)
        if self.broker_id is None:
            await self._begin(part.broker_id)
        key = (message.topic, part.partition)
        self._pending.setdefault(key, []).append(message)
        self._pending_bytes[key] = self._pending_bytes.get(key, 0) + size
        if self._pending_bytes[key] >= producer.config.batch_bytes:
            self._put(key)
        return SendResult(True, -1, part.partition, -1, None, message.topic, part.broker_id)

    async def _begin(self, broker_id: int) -> None:
        conn = await self.producer._core.connection(broker_id, "produce")
        await conn.request(m.TransactionRequest(m.TX_BEGIN, self.transaction_id, "", self.timeout_ms,
                                                self.producer_group))
        self.broker_id = broker_id

    def _put(self, key: tuple[str, int]) -> None:
        messages = self._pending.pop(key, [])
        self._pending_bytes.pop(key, None)
        if not messages:
            return
        sequence = self._sequences.get(key, 0)
        self._sequences[key] = (sequence + len(messages)) % SEQUENCE_LIMIT
        batch = with_producer_stamp(encode_messages(messages, self.producer.config.compression),
                                    ProducerStamp(self.producer_id, 0, sequence))
        request = m.ProduceRequest(key[0], key[1], 1, int(self.producer.request_timeout_s * 1000),
                                   transaction_id=self.transaction_id, records=batch)
        self._puts.append(asyncio.ensure_future(self._send_put(request)))

    async def _send_put(self, request: m.ProduceRequest) -> None:
        """One put, retried on a lost connection (the broker takes a repeated put once)."""
        assert self.broker_id is not None
        attempts = 0
        while True:
            try:
                conn = await self.producer._core.connection(self.broker_id, "produce")
                await conn.request(request)
                return
            except MetaqError as exc:
                attempts += 1
                if not getattr(exc, "retriable", False) or attempts > self.producer.config.effective_retries + 3:
                    raise
                await asyncio.sleep(self.producer.config.retry_backoff_ms / 1000)

    async def _flush_puts(self) -> None:
        for key in list(self._pending):
            self._put(key)
        puts, self._puts = self._puts, []
        if puts:
            results = await asyncio.gather(*puts, return_exceptions=True)
            for r in results:
                if isinstance(r, BaseException):
                    raise r

    async def _end(self, op: int) -> m.TransactionResponse | None:
        assert self.broker_id is not None
        conn = await self.producer._core.connection(self.broker_id, "produce")
        response: m.TransactionResponse = await conn.request(m.TransactionRequest(op, self.transaction_id))
        return response

    async def prepare(self) -> None:
        """XA phase one: every message is on the broker and the transaction is durable there."""
        if self.finished or self.prepared:
            raise TransactionError("the transaction is over or already prepared")
        if self.broker_id is None:  # nothing was sent: a read-only branch (phase two has nothing to do)
            self.prepared = True
            return
        try:
            await self._flush_puts()
        except BaseException:
            await self._quiet_rollback()
            self.finished = True
            raise
        assert self.broker_id is not None
        conn = await self.producer._core.connection(self.broker_id, "produce")
        await conn.request(m.TransactionRequest(m.TX_PREPARE, self.transaction_id, self.transaction_id))
        self.prepared = True

    async def commit(self) -> TransactionResult:
        if self.finished:
            raise TransactionError("the transaction is over")
        self.finished = True
        if self.broker_id is None:  # nothing was sent: nothing to commit
            return TransactionResult(self.transaction_id)
        try:
            if not self.prepared:
                await self._flush_puts()
        except MetaqError as exc:
            await self._quiet_rollback()
            raise self._outcome_error("commit", exc, known=True, what="a put failed; the transaction was rolled back "
                                      "(or is, at its timeout)") from exc
        except BaseException:
            await self._quiet_rollback()
            raise
        try:
            response = await self._end(m.TX_COMMIT)
        except MetaqError as exc:
            raise self._outcome_error("commit", exc, known=not exc.maybe_stored,
                                      what="the commit may have been applied" if exc.maybe_stored else
                                      "the broker refused the commit") from exc
        assert response is not None
        return TransactionResult(self.transaction_id, list(response.committed))

    async def rollback(self) -> None:
        if self.finished:
            return
        self.finished = True
        for fut in self._puts:
            fut.cancel()
        self._pending.clear()
        if self.broker_id is not None:
            try:
                await self._end(m.TX_ROLLBACK)
            except MetaqError as exc:
                raise self._outcome_error("rollback", exc, known=not exc.maybe_stored,
                                          what="the rollback may have been applied" if exc.maybe_stored else
                                          "the broker refused the rollback") from exc

    def _outcome_error(self, op: str, exc: MetaqError, *, known: bool, what: str) -> TransactionOutcomeError:
        ask = "" if known else (f"; ask producer.transaction_status({self.transaction_id!r}, {self.broker_id}) how "
                                "it ended before sending it again")
        return TransactionOutcomeError(f"{op} of transaction {self.transaction_id} on broker {self.broker_id} failed "
                                       f"({exc}): {what}{ask}", transaction_id=self.transaction_id,
                                       broker_id=self.broker_id, cause=exc, outcome_known=known)

    async def _quiet_rollback(self) -> None:
        for fut in self._puts:
            fut.cancel()
        try:
            await self._end(m.TX_ROLLBACK)
        except MetaqError:
            pass  # the broker's timeout rolls it back


def _new_id() -> int:
    import secrets

    return secrets.randbits(62) + 1


COMMIT, ROLLBACK, UNKNOWN = "commit", "rollback", "unknown"
Decision = str
"""What a local transaction or a checker says: ``"commit"``, ``"rollback"`` or ``"unknown"``."""
Checker = Callable[..., "Decision | Awaitable[Decision]"]
"""``check(message, transaction_id)`` (RocketMQ's checkLocalTransaction: the half message itself), or
``check(transaction_id)``; either may be a coroutine function."""


async def decide(fn: Callable[..., Any], *args: Any) -> Decision:
    """Call a user's decision function (a coroutine function, or a plain one run in a worker thread);
    anything but "commit" / "rollback" (an exception too) is "unknown": the broker asks again later."""
    try:
        if inspect.iscoroutinefunction(fn):
            result = await fn(*args)
        else:
            result = await asyncio.get_running_loop().run_in_executor(None, fn, *args)
            if inspect.isawaitable(result):
                result = await result
    except Exception:
        log.warning("a transaction decision function failed; the transaction stays undecided", exc_info=True)
        return UNKNOWN
    result = str(getattr(result, "value", result)).lower()
    return result if result in (COMMIT, ROLLBACK) else UNKNOWN


def wants_message(check: Checker) -> bool:
    """Whether ``check`` takes the half message and the transaction id, rather than the id alone."""
    return takes_two(check)


def half_message(half: m.HalfTransaction, broker_id: int) -> Message | None:
    """The half message a checker is shown: the first message of the transaction (a half transaction of
    ``send_in_transaction`` holds one), not yet stored in its partition (offset and id -1). None when
    the broker sent the transaction without its messages (a reply past CHECK_REPLY_BYTES_MAX)."""
    for batch in half.batches:
        for message in decode_batch(batch.records, batch.topic, batch.partition, broker_id=broker_id):
            message.offset = message.id = message.append_time_ms = -1
            return message
    return None


class TransactionChecker:
    """A producer group's checker (RocketMQ's check-back): long-polls every broker for the group's half
    transactions that nobody finished, asks ``check(message, transaction_id)`` (or ``check(transaction_id)``,
    by the function's parameters), and commits or rolls back as it says (``"unknown"``: the broker asks
    again after transactionCheckInterval, up to transactionCheckMax checks)."""

    def __init__(self, producer: TransactionProducer, producer_group: str, check: Checker, *,
                 poll_ms: int = 5000) -> None:
        self.producer, self.producer_group, self.check, self.poll_ms = producer, producer_group, check, poll_ms
        self.decisions: dict[str, Decision] = {}
        """transaction id -> what the checker decided (its last answer)."""
        self._with_message = wants_message(check)
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> TransactionChecker:
        """Start long-polling every broker the session knows for the group's undecided half messages."""
        core = self.producer._core
        await core.metadata.refresh_all()
        for broker_id in sorted(set(core.metadata.cache.brokers) | set(core.server_ids.values())):
            self._tasks.append(asyncio.ensure_future(self._poll(broker_id)))
        return self

    async def _poll(self, broker_id: int) -> None:
        core = self.producer._core
        while True:
            try:
                response = await core.request(m.CheckTransactionsRequest(self.producer_group, self.poll_ms, 100),
                                              broker_id, channel="tx-check", timeout_s=self.poll_ms / 1000 + 30)
                halves = {half.transaction_id: half for half in response.transactions}
                for txid in response.transaction_ids:
                    if self._with_message:
                        half = halves.get(txid)
                        message = half_message(half, broker_id) if half is not None else None
                        decision = await decide(self.check, message, txid)
                    else:
                        decision = await decide(self.check, txid)
                    self.decisions[txid] = decision
                    log.info("checker of %r: transaction %s -> %s", self.producer_group, txid, decision)
                    if decision != UNKNOWN:
                        op = m.TX_COMMIT if decision == COMMIT else m.TX_ROLLBACK
                        await core.request(m.TransactionRequest(op, txid), broker_id)
            except asyncio.CancelledError:
                raise
            except MetaqError as exc:
                log.warning("checker of %r on broker %d: %s; retrying", self.producer_group, broker_id, exc)
                await asyncio.sleep(1.0)

    async def stop(self) -> None:
        """Stop answering check-backs (the brokers ask another checker of the group, or wait)."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
