"""Broker transactions named by their writer, driven through a :class:`~metaq.client.blocking.BlockingClient`: the
two-phase write of an exactly-once sink (the Spark sink's ``deliveryGuarantee=exactly-once``, docs/spark.md).

A transaction lives on one broker and is named by the caller (``transaction_id``, 1-128 characters, unique). Its
puts go into the broker's transaction log, invisible to consumers; :meth:`NamedTransactions.prepare` makes it
durable there, and :meth:`NamedTransactions.commit` makes every message of it visible at once. Because the name is
the caller's, any process can ask later how a transaction ended (:meth:`NamedTransactions.status`) and commit or
roll back one another process prepared: a writer that dies after preparing loses nothing, and a batch written again
under the same names finds what was committed. The broker remembers finished transactions across restarts
(docs/transactions.md). Each put carries the transaction's own producer id and a sequence per partition
(:class:`ProducerSequences`), so a put sent twice is stored once.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Iterator

from metaq.client.blocking import DEFAULT_WINDOW, BlockingClient
from metaq.protocol import messages as m
from metaq.protocol.records import SEQUENCE_LIMIT, ProducerStamp, with_producer_stamp
from metaq.types import PartitionId

__all__ = ["NamedTransactions", "ProducerSequences"]


def new_producer_id() -> int:
    """A random 62-bit producer id (never 0): two producers share one with odds of about 2**-62 per pair, so no
    broker hands ids out (docs/transactions.md, "Idempotent producer")."""
    return secrets.randbits(62) + 1


class ProducerSequences:
    """A producer id and a sequence per partition from 0: :meth:`stamp` gives a batch its producer block (the id,
    epoch 0 and the sequence of its first record), so that the broker stores a batch sent twice once. The puts of
    one transaction carry one such producer (the broker checks their sequences per partition)."""

    __slots__ = ("_next", "producer_id")

    def __init__(self, producer_id: int | None = None) -> None:
        self.producer_id = new_producer_id() if producer_id is None else producer_id
        self._next: dict[tuple[str, int], int] = {}

    def stamp(self, topic: str, partition: int, records: bytes, count: int) -> bytes:
        """``records`` (one batch of ``count`` records for ``topic``'s partition number ``partition`` on the
        transaction's broker) with the producer block of the partition's next sequence."""
        key = (topic, partition)
        sequence = self._next.get(key, 0)
        self._next[key] = (sequence + count) % SEQUENCE_LIMIT
        return with_producer_stamp(records, ProducerStamp(self.producer_id, 0, sequence))


class NamedTransactions:
    """The transaction operations of a :class:`~metaq.client.blocking.BlockingClient`'s brokers (see the module
    docstring): each names the broker (``broker_id``) and the transaction (``transaction_id``). A refused operation
    raises the broker's error (:class:`~metaq.errors.InvalidTxnStateError` for one the transaction's state does not
    allow: committing one that was rolled back, beginning one that is open)."""

    def __init__(self, client: BlockingClient) -> None:
        self.client = client

    def _op(self, op: int, broker_id: int, transaction_id: str, xid: str = "",
            timeout_ms: int = 0) -> m.TransactionResponse:
        response: m.TransactionResponse = self.client.request(
            m.TransactionRequest(op, transaction_id, xid, timeout_ms), broker_id=broker_id)
        return response

    def status(self, broker_id: int, transaction_id: str) -> str:
        """Where the transaction is on that broker: ``"open"``, ``"prepared"``, ``"committing"`` (another process's
        commit is being applied), ``"committed"``, ``"rolled back (<reason>)"``, or ``"unknown"`` (never begun there,
        or finished so long ago that the broker forgot it)."""
        response = self._op(m.TX_STATUS, broker_id, transaction_id)
        return str(response.xids[0]) if response.xids else "unknown"

    def begin(self, broker_id: int, transaction_id: str, timeout_ms: int = 0) -> None:
        """Open the transaction; the broker rolls it back if it is not committed within ``timeout_ms`` (0: the
        broker's ``maxTxTimeoutInSeconds``, also the most it allows)."""
        self._op(m.TX_BEGIN, broker_id, transaction_id, "", timeout_ms)

    def iter_put(self, puts: Iterable[tuple[str, str, PartitionId, bytes]], *, window: int = DEFAULT_WINDOW,
                 timeout_ms: int | None = None) -> Iterator[m.ProduceResponse]:
        """Put batches into open transactions: ``(transaction_id, topic, partition, records)``, the partition on the
        transaction's broker and the records stamped by the transaction's :class:`ProducerSequences`. Pipelined per
        broker (at most ``window`` unanswered), the replies in order (nothing is sent until iterated; the offsets
        are known at commit); the first refusal raises after the replies in flight are read."""
        tmo = int(self.client.timeout_s * 1000) if timeout_ms is None else timeout_ms
        yield from self.client.iter_requests(
            ((p.broker_id, m.ProduceRequest(topic, p.partition, 1, tmo, transaction_id=transaction_id, records=records))
             for transaction_id, topic, p, records in puts), window=window)

    def prepare(self, broker_id: int, transaction_id: str) -> None:
        """Phase one: every put is on the broker and the transaction durable there, still invisible to consumers;
        only a commit or a rollback (by any process, or the transaction's timeout) ends it now."""
        self._op(m.TX_PREPARE, broker_id, transaction_id, transaction_id)

    def commit(self, broker_id: int, transaction_id: str) -> None:
        """Make every message of the transaction visible at once (from open: one phase; from prepared: phase two)."""
        self._op(m.TX_COMMIT, broker_id, transaction_id)

    def commit_many(self, transactions: Iterable[tuple[int, str]], *, window: int = DEFAULT_WINDOW) -> None:
        """:meth:`commit` each ``(broker_id, transaction_id)``, pipelined (at most ``window`` unanswered per broker);
        the first refusal raises after the replies in flight are read (the commits after it are not sent)."""
        for _response in self.client.iter_requests(((broker_id, m.TransactionRequest(m.TX_COMMIT, transaction_id))
                                                    for broker_id, transaction_id in transactions), window=window):
            pass

    def roll_back(self, broker_id: int, transaction_id: str) -> None:
        """Discard the transaction: none of its messages will be visible."""
        self._op(m.TX_ROLLBACK, broker_id, transaction_id)
