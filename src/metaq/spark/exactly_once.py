"""The exactly-once metaq sink (``deliveryGuarantee=exactly-once``; docs/spark.md, docs/transactions.md).

A write (one micro-batch, or one batch ``df.write``) is committed in two phases:

1. **Tasks** (executors). Task *p* of write *W* sends its rows, per broker they go to, inside one
   transaction named ``spark:<scope>:<batch id>:<p>:<broker id>`` (scope: the streaming query's id, which
   lives in the checkpoint and so survives a restart; a fresh id per batch write). Before it begins,
   it asks the broker the status of that name:

   - committed: an earlier run of this batch was committed there (the driver died after committing it,
     before Spark logged the batch as done): nothing is sent to that broker; the task reports it done;
   - committing: the same, a moment earlier: wait until committed;
   - open or prepared: left by an earlier attempt (a killed task or driver): roll it back, begin again;
   - rolled back or unknown: begin.

   The task puts its batches (stamped with the transaction's producer id and sequences, so a retried
   put is taken once) and **prepares** every transaction: durable on the broker, invisible to readers.
   Its commit message carries the names.
2. **Driver**. ``commit(messages, batchId)`` commits every prepared transaction ("already committed" is
   success); ``abort`` rolls them back. Spark writes the batch into its commit log only after
   ``commit`` returned, so a batch replayed after a driver kill comes back with the same names and
   finds its committed part committed.

What it relies on: the broker remembers finished transactions across restarts (the last
FINISHED_REMEMBERED, carried by its transaction-log checkpoints), and a replayed batch gives each
Spark partition the same rows (true for metaq's own source and Spark's file and rate sources, which
plan a batch from the offsets in the checkpoint; a non-deterministic query breaks it, as it breaks
every exactly-once sink), and no two attempts of one task write at the same time (Spark's
speculative execution off, its default: a zombie attempt's prepare is not fenced off). Prepared
transactions the driver never commits are rolled back after their timeout (``transactionTimeoutMs``,
at most the broker's ``maxTxTimeoutInSeconds``): keep it above the time a micro-batch takes.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from metaq.client import ANY_PARTITION, BlockingClient, NamedTransactions, ProducerSequences
from metaq.errors import ConfigError, InvalidTxnStateError, MetaqError
from metaq.spark import failpoints
from metaq.spark.options import WriteOptions
from metaq.spark.sink import BatchEncoder, WriteStats
from metaq.types import PartitionId, PartitionKey

log = logging.getLogger("metaq.spark.exactly_once")

COMMITTED, COMMITTING, OPEN, PREPARED = "committed", "committing", "open", "prepared"
"""Answers of the Transaction status op (besides "rolled back (reason)" and "unknown")."""
STATUS_POLL_S = 0.05
"""How often a task or the driver asks again about a transaction another process is committing."""


@dataclass(frozen=True, slots=True)
class WriteIdentity:
    """What names a write's transactions: the same on every run of the same batch, and no other."""

    scope: str
    batch_id: int

    def txid(self, spark_partition: int, broker_id: int) -> str:
        return f"spark:{self.scope}:{self.batch_id}:{spark_partition}:{broker_id}"


def new_batch_identity() -> WriteIdentity:
    """A batch ``df.write``: nothing to replay after its driver is gone, so a fresh scope per write."""
    return WriteIdentity(uuid.uuid4().hex, 0)


def streaming_identity(task_context: Any, fallback_scope: str | None) -> WriteIdentity:
    """From the task's local properties, which Spark sets for every micro-batch: the query id (kept
    in the checkpoint's metadata, so the same after a restart) and the batch id."""
    batch = task_context.getLocalProperty("streaming.sql.batchId")
    scope = task_context.getLocalProperty("sql.streaming.queryId") or fallback_scope
    if batch is None or not scope:
        raise ConfigError("option 'deliveryGuarantee': exactly-once needs the streaming query's id and batch id, "
                          "which Spark did not give this task (is this a streaming query with a checkpointLocation?)")
    return WriteIdentity(str(scope), int(batch))


@dataclass
class TaskTransaction:
    broker_id: int
    txid: str
    done: bool = False
    """Committed by an earlier run of the batch: this task sent nothing to that broker."""
    sequences: ProducerSequences = field(default_factory=ProducerSequences)
    """The transaction's producer id and its sequences: a put sent twice is stored once."""


def _wait_committed(transactions: NamedTransactions, broker_id: int, txid: str, timeout_ms: int) -> str:
    """The status once it is no longer "committing" (another process's commit is being applied)."""
    deadline = time.monotonic() + timeout_ms / 1000
    status = transactions.status(broker_id, txid)
    while status == COMMITTING and time.monotonic() < deadline:
        time.sleep(STATUS_POLL_S)
        status = transactions.status(broker_id, txid)
    return status


class _TaskWriter:
    """One task's transactions, one per broker its rows go to, begun on first use."""

    def __init__(self, opts: WriteOptions, identity: WriteIdentity, spark_partition: int,
                 control: BlockingClient) -> None:
        self.opts, self.identity, self.spark_partition, self.control = opts, identity, spark_partition, control
        self.named = NamedTransactions(control)
        self.transactions: dict[int, TaskTransaction] = {}
        self._spread: dict[str, int] = {}

    def transaction(self, broker_id: int) -> TaskTransaction:
        tx = self.transactions.get(broker_id)
        if tx is not None:
            return tx
        tx = TaskTransaction(broker_id, self.identity.txid(self.spark_partition, broker_id))
        status = _wait_committed(self.named, broker_id, tx.txid, self.opts.timeout_ms)
        if status == COMMITTED:
            log.info("metaq sink: %s was committed by an earlier run of batch %d: not written again", tx.txid,
                     self.identity.batch_id)
            tx.done = True
        else:
            if status in (OPEN, PREPARED):  # an earlier attempt's, never committed: start over
                self.named.roll_back(broker_id, tx.txid)
            self.named.begin(broker_id, tx.txid, self.opts.transaction_timeout_ms)
        self.transactions[broker_id] = tx
        return tx

    def target(self, topic: str, part: PartitionKey) -> PartitionId:
        """A transaction's batch names its partition: -1 (any) becomes one of the topic's partitions,
        in turn, starting at one that depends on the Spark partition (tasks spread their rows)."""
        if part != ANY_PARTITION:
            return self.control.resolve(topic, part)
        parts = self.control.partitions_for(topic)
        turn = self._spread.get(topic, self.spark_partition)
        self._spread[topic] = turn + 1
        return parts[turn % len(parts)]

    def prepare(self) -> None:
        for tx in self.transactions.values():
            if not tx.done:
                self.named.prepare(tx.broker_id, tx.txid)

    def roll_back_quietly(self) -> None:
        for tx in self.transactions.values():
            if not tx.done:
                try:
                    self.named.roll_back(tx.broker_id, tx.txid)
                except MetaqError as exc:  # its timeout rolls it back; a retry of the task does too
                    log.warning("metaq sink: could not roll back %s: %s", tx.txid, exc)


def write_prepared(batches: Iterable[pa.RecordBatch], opts: WriteOptions, identity: WriteIdentity,
                   spark_partition: int) -> tuple[WriteStats, list[TaskTransaction]]:
    """Phase one for one task: every row in a prepared transaction (or in one an earlier run of the
    batch committed); returns what was written and the transactions, for the driver to commit."""
    stats = WriteStats()
    client_args: dict[str, Any] = {"timeout_s": opts.timeout_ms / 1000, "tls": opts.tls, "username": opts.user,
                                   "password": opts.password}
    with BlockingClient(opts.servers, client_id="metaq-spark-eos-control", **client_args) as control, \
            BlockingClient(opts.servers, client_id="metaq-spark-eos-writer", **client_args) as data:
        writer = _TaskWriter(opts, identity, spark_partition, control)
        encoder = BatchEncoder(opts, control.partitions_for)
        sent: deque[tuple[str, PartitionId, int]] = deque()

        def puts() -> Iterator[tuple[str, str, PartitionId, bytes]]:
            for topic, part, batch, count in encoder.encode(batches):
                target = writer.target(topic, part)
                tx = writer.transaction(target.broker_id)
                if tx.done:
                    stats.skipped_rows += count
                    continue
                records = tx.sequences.stamp(topic, target.partition, batch, count)
                sent.append((topic, target, count))
                yield tx.txid, topic, target, records

        try:
            for _resp in NamedTransactions(data).iter_put(puts(), window=opts.max_in_flight,
                                                          timeout_ms=opts.timeout_ms):
                topic, target, count = sent.popleft()
                stats.add(topic, target, -1, count)  # offsets are known at commit
                if stats.batches == 1:
                    failpoints.reach("write", identity.batch_id)
            writer.prepare()
        except BaseException:
            writer.roll_back_quietly()
            raise
    return stats, list(writer.transactions.values())


def _commit_one(transactions: NamedTransactions, broker_id: int, txid: str, timeout_ms: int) -> None:
    try:
        transactions.commit(broker_id, txid)
        return
    except InvalidTxnStateError as exc:
        status = _wait_committed(transactions, broker_id, txid, timeout_ms)
        if status == COMMITTED:  # committed before: by this driver before a lost reply, or a killed one
            return
        raise InvalidTxnStateError(
            f"metaq sink: transaction {txid} on broker {broker_id} cannot be committed ({status}): {exc}. The batch "
            "fails; restart the query and it is written again, once (raise transactionTimeoutMs or the broker's "
            "maxTxTimeoutInSeconds if the batch took longer than the timeout)") from None


def commit_prepared(transactions: list[tuple[int, str]], opts: WriteOptions, batch_id: int) -> int:
    """Phase two, on the driver: commit every prepared (broker id, txid); how many it committed."""
    failpoints.reach("commit", batch_id)
    if not transactions:
        return 0
    with BlockingClient(opts.servers, client_id="metaq-spark-eos-commit", timeout_s=opts.timeout_ms / 1000,
                        tls=opts.tls, username=opts.user, password=opts.password) as client:
        named = NamedTransactions(client)
        (first_broker, first), rest = transactions[0], transactions[1:]
        _commit_one(named, first_broker, first, opts.timeout_ms)
        failpoints.reach("mid-commit", batch_id)
        try:  # the rest pipelined: a window of commits per round trip, not one
            named.commit_many(rest, window=opts.max_in_flight)
        except MetaqError:  # one was refused: go through them one by one ("committed" is success)
            for broker_id, txid in rest:
                _commit_one(named, broker_id, txid, opts.timeout_ms)
    return len(transactions)


def roll_back_prepared(transactions: list[tuple[int, str]], opts: WriteOptions) -> None:
    """The driver's abort: roll back what the successful tasks prepared (failed tasks rolled back their
    own; anything missed here is rolled back by its timeout, or by the batch's next run)."""
    if not transactions:
        return
    try:
        with BlockingClient(opts.servers, client_id="metaq-spark-eos-abort", timeout_s=opts.timeout_ms / 1000,
                            tls=opts.tls, username=opts.user, password=opts.password) as client:
            named = NamedTransactions(client)
            for broker_id, txid in transactions:
                try:
                    named.roll_back(broker_id, txid)
                except MetaqError as exc:
                    log.warning("metaq sink: could not roll back %s: %s", txid, exc)
    except MetaqError as exc:
        log.warning("metaq sink: could not roll back %d prepared transactions: %s (their timeout will)",
                    len(transactions), exc)
