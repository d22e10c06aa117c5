"""The ``metaq`` Spark format: batch and streaming reads, batch and streaming writes.

Where each piece runs matters (see docs/spark.md):

- ``MetaqDataSource`` is built from the options, pickled, and shipped everywhere: keep it plain.
- Driver side: ``partitions()`` of the batch reader; ``initialOffset``/``latestOffset``/``partitions``/
  ``commit`` of the stream reader, in one long-lived Python process per query. They talk to the broker
  with a :class:`~metaq.client.BlockingClient` opened lazily and never pickled.
- Executors: ``read(partition)`` runs on a *different*, unpickled copy of the reader. It opens its own
  client, fetches exactly the partition's [start, end) and yields Arrow batches.

A partition is ``brokerId-partition`` (:class:`~metaq.types.PartitionId`): one Spark input partition per
metaq partition of every broker in ``servers`` (or more with ``minPartitions``), offsets JSON keyed
``"1-3"``, and a ``broker_id`` column beside ``partition``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from metaq.client import BlockingClient, RetryPolicy
from metaq.errors import ConfigError, ConnectionClosedError, RequestTimeoutError, UnknownTopicError
from metaq.spark.brokers import DriverBrokers
from metaq.spark.errors import DataLossError
from metaq.spark.offsets import (
    Bounds,
    OffsetRange,
    batch_ranges,
    cap_to_max_rows,
    parse_stream_offset,
    resolve_spec,
    split_ranges,
    stream_offset,
)
from metaq.spark.options import ReadOptions, WriteOptions
from metaq.types import PartitionId

if TYPE_CHECKING:
    from metaq.spark.exactly_once import TaskTransaction, WriteIdentity
    from metaq.spark.sink import WriteStats

# The read path (metaq.spark.arrow: pyarrow.compute) and the sink (metaq.spark.exactly_once, metaq.spark.sink)
# are imported where they are used: Spark starts a fresh Python process for every streaming query's driver
# side (it imports pyspark from a zip, uncached) and that process only plans offsets.

log = logging.getLogger("metaq.spark")

SCHEMA = StructType([
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("attribute", StringType()),
    StructField("topic", StringType()),
    StructField("broker_id", IntegerType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("message_id", StringType()),
    StructField("headers", ArrayType(StructType([StructField("key", StringType()),
                                                 StructField("value", BinaryType())]))),
])

METADATA_REFRESH_S = 10.0
"""How often a running stream looks for new partitions (latestOffset itself is one round trip)."""
BROKER_DOWN_RETRY_S = 0.2
"""How often a broker that does not answer is tried again (for up to ``timeoutMs``)."""


# -- shared driver-side helpers -------------------------------------------------------------------

def _connect(brokers: DriverBrokers, client_id: str) -> BlockingClient:
    try:
        return BlockingClient(brokers.servers(), client_id=client_id, timeout_s=brokers.opts.timeout_ms / 1000,
                              tls=brokers.opts.tls, username=brokers.opts.user, password=brokers.opts.password)
    except ConnectionClosedError as exc:
        raise ConnectionClosedError(f"option {brokers.option!r}: {exc}") from None


def _partitions(client: BlockingClient, opts: ReadOptions) -> list[PartitionId]:
    try:
        return client.partitions_for(opts.topic)
    except UnknownTopicError:
        where = f"servers {opts.servers!r}" if opts.zk_connect is None else \
            f"the brokers registered in ZooKeeper at {opts.zk_connect} under {opts.zk_root}"
        raise UnknownTopicError(f"option 'topic': topic {opts.topic!r} does not exist on {where}") from None


def _bounds(client: BlockingClient, topic: str, partitions: list[PartitionId]) -> dict[PartitionId, Bounds]:
    replies = client.list_offsets_many(topic, partitions, -1)
    return {p: Bounds(replies[p].log_start_offset, replies[p].log_end_offset) for p in sorted(partitions)}


def _check_schema(schema: StructType | None) -> None:
    if schema is not None and schema != SCHEMA:
        raise ConfigError(f"the metaq source has a fixed schema ({SCHEMA.simpleString()}); do not pass "
                          f"another one (got {schema.simpleString()})")


@dataclass
class MetaqInputPartition(InputPartition):
    """One Spark task: offsets [start, end) of one metaq partition (``brokerId-partition``)."""

    topic: str
    partition: PartitionId
    start: int
    end: int
    new_partition: bool = False
    servers: str = ""
    """The brokers the driver read from ZooKeeper (``zkConnect``), this partition's first; '' with ``servers``."""


def _read(opts: ReadOptions, part: InputPartition) -> Iterator[Any]:
    """The partition's rows; a broker connection lost midway is re-opened and the read resumes.

    Resuming is safe because a range read is deterministic: it continues after the last offset
    already yielded. The broker may stay unreachable for up to ``timeoutMs`` before the task fails.
    """
    if not isinstance(part, MetaqInputPartition) or part.end <= part.start:
        return
    from metaq.spark.arrow import read_range

    offset = part.start
    new_partition = part.new_partition
    down = _down_retry(opts).start()
    option = "servers" if opts.zk_connect is None else "zkConnect"
    while offset < part.end:
        try:
            with BlockingClient(part.servers or opts.servers, client_id="metaq-spark-reader",
                                timeout_s=opts.timeout_ms / 1000, tls=opts.tls, username=opts.user,
                                password=opts.password) as client:
                for batch in read_range(client, part.topic, part.partition, offset, part.end,
                                        max_bytes=opts.max_bytes_per_fetch,
                                        fail_on_data_loss=opts.fail_on_data_loss, new_partition=new_partition):
                    offset = batch.column("offset")[-1].as_py() + 1
                    down.reset()
                    yield batch
            return
        except (ConnectionClosedError, RequestTimeoutError) as exc:
            delay = down.next_delay_s()
            if delay is None:
                raise ConnectionClosedError(f"option {option!r}: lost the broker while reading "
                                            f"{part.topic}:{part.partition} at offset {offset}: {exc}") from None
            log.warning("metaq source: %s; resuming %s:%s at %d", exc, part.topic, part.partition, offset)
            time.sleep(delay)


def _down_retry(opts: ReadOptions) -> RetryPolicy:
    """A broker that does not answer is tried again every 0.2 s, for up to ``timeoutMs``."""
    return RetryPolicy.constant(BROKER_DOWN_RETRY_S, deadline_s=opts.timeout_ms / 1000)


def _input_partitions(topic: str, ranges: list[OffsetRange], min_partitions: int | None, brokers: DriverBrokers,
                      new: frozenset[PartitionId] | set[PartitionId] = frozenset()) -> list[MetaqInputPartition]:
    zk = brokers.opts.zk_connect is not None
    return [MetaqInputPartition(topic, r.partition, r.start, r.end, r.partition in new,
                                brokers.servers(r.partition.broker_id) if zk else "")
            for r in split_ranges(ranges, min_partitions)]


# -- batch read -----------------------------------------------------------------------------------

class MetaqBatchReader(DataSourceReader):
    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts

    def partitions(self) -> list[InputPartition]:
        opts = self.opts
        brokers = DriverBrokers(opts)
        try:
            with _connect(brokers, "metaq-spark-planner") as client:
                bounds = _bounds(client, opts.topic, _partitions(client, opts))
            return self._plan(bounds, brokers)
        finally:
            brokers.close()

    def _plan(self, bounds: dict[PartitionId, Bounds], brokers: DriverBrokers) -> list[InputPartition]:
        opts = self.opts
        start = resolve_spec(opts.starting, bounds, "startingOffsets")
        end = resolve_spec(opts.ending, bounds, "endingOffsets")
        for p, s in start.items():
            if s > bounds[p].log_end:
                raise ConfigError(f"option 'startingOffsets': offset {s} of partition {p} is beyond the "
                                  f"partition's end ({bounds[p].log_end})")
        for p, e in end.items():
            if e > bounds[p].log_end:
                raise ConfigError(f"option 'endingOffsets': offset {e} of partition {p} is beyond the "
                                  f"partition's end ({bounds[p].log_end})")
        return list(_input_partitions(opts.topic, batch_ranges(start, end), opts.min_partitions, brokers))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(self.opts, partition)


# -- streaming read -------------------------------------------------------------------------------

def _persist_once(path: str, doc: dict[str, Any]) -> dict[str, Any]:
    """Write ``doc`` to ``path`` unless it exists; either way return what the file holds.

    The file is written whole to a temporary name, fsynced and hard-linked into place (linking fails
    if another writer got there first), so a crash never leaves a torn or half-resolved start.
    """
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    finally:
        os.unlink(tmp)
    with open(path) as f:
        return json.load(f)


class MetaqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reads with admission control (maxOffsetsPerTrigger) and Trigger.AvailableNow."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self._brokers = DriverBrokers(opts)
        self._client: BlockingClient | None = None
        self._partition_list: list[PartitionId] | None = None
        self._partitions_at = 0.0
        self._target: dict[PartitionId, int] | None = None
        self._latest: dict[PartitionId, int] | None = None
        self._down = _down_retry(opts).start()

    def __getstate__(self) -> dict[str, Any]:
        # executors get a copy of the reader: only the options travel, never a socket or driver state
        return {"opts": self.opts}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["opts"])  # type: ignore[misc]

    # driver-side broker access, reconnecting once if the broker went away in between
    def _call(self, fn: Any) -> Any:
        for attempt in (1, 2):
            if self._client is None:
                self._client = _connect(self._brokers, "metaq-spark-stream")
            try:
                return fn(self._client)
            except (ConnectionClosedError, RequestTimeoutError):
                self._client.close()
                self._client = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _bounds(self, refresh: bool = False) -> dict[PartitionId, Bounds]:
        now = time.monotonic()
        if refresh or self._partition_list is None or now - self._partitions_at > METADATA_REFRESH_S:
            self._partition_list = self._call(lambda c: _partitions(c, self.opts))
            self._partitions_at = now
        parts = self._partition_list
        return self._call(lambda c: _bounds(c, self.opts.topic, parts))

    def initialOffset(self) -> dict[str, Any]:
        """The resolved start; with checkpointLocation, resolved once and read back ever after."""
        opts = self.opts
        path = opts.start_file()
        if path is not None and os.path.exists(path):
            with open(path) as f:
                doc = json.load(f)
            return stream_offset(opts.topic, parse_stream_offset(doc, opts.topic))
        positions = resolve_spec(opts.starting, self._bounds(refresh=True), "startingOffsets")
        doc = stream_offset(opts.topic, positions)
        if path is not None:
            doc = _persist_once(path, doc)
            log.info("metaq source: starting offsets %s kept in %s", doc, path)
        return stream_offset(opts.topic, parse_stream_offset(doc, opts.topic))

    def _current(self) -> tuple[dict[PartitionId, Bounds], dict[PartitionId, int]]:
        bounds = self._bounds()
        latest = {p: b.log_end for p, b in bounds.items()}
        self._latest = latest
        return bounds, latest

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """The end of the next micro-batch: one pipelined ListOffsets round trip (metadata every 10 s).

        A broker that cannot be reached means "no new data" for up to ``timeoutMs`` (a broker restart
        should not kill the query); after that the query fails, naming the servers.
        """
        opts = self.opts
        begin = parse_stream_offset(start, opts.topic)
        try:
            bounds, latest = self._current()
        except (ConnectionClosedError, RequestTimeoutError) as exc:
            delay = self._down.next_delay_s()
            if delay is None:
                raise
            log.warning("metaq source: broker unreachable (%s); no new data for now", exc)
            time.sleep(delay)
            return stream_offset(opts.topic, begin)
        self._down.reset()
        if self._target is not None:
            latest = {p: min(latest[p], self._target[p]) if p in self._target else begin.get(p, bounds[p].log_start)
                      for p in latest}
        effective_start: dict[PartitionId, int] = {}
        for p, b in bounds.items():
            s = begin.get(p)
            if s is None:  # a partition added since the query started: read it from its beginning
                effective_start[p] = b.log_start
                continue
            if s > b.log_end:
                if opts.fail_on_data_loss:
                    raise DataLossError(
                        f"{opts.topic}:{p}: the query is at offset {s}, beyond the partition's end ({b.log_end}); "
                        "the topic was truncated or recreated. Set failOnDataLoss=false to continue from its end")
                log.warning("metaq source: %s:%s went back from %d to %d; continuing from there",
                            opts.topic, p, s, b.log_end)
            elif s < b.log_start and opts.fail_on_data_loss:
                raise DataLossError(
                    f"{opts.topic}:{p}: offsets {s}..{b.log_start - 1} were deleted before the query read them "
                    "(retention?). Set failOnDataLoss=false to skip to the earliest message")
            effective_start[p] = s
        end = dict(latest)
        for p, s in begin.items():
            end.setdefault(p, s)  # a partition that vanished from metadata stays where it was
            effective_start.setdefault(p, s)
        if isinstance(limit, ReadMaxRows):
            end = cap_to_max_rows(effective_start, end, limit.max_rows)
        return stream_offset(opts.topic, end)

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_offsets_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return None if self._latest is None else stream_offset(self.opts.topic, self._latest)

    def prepareForTriggerAvailableNow(self) -> None:
        _bounds, latest = self._current()
        self._target = latest

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        begin = parse_stream_offset(start, self.opts.topic)
        stop = parse_stream_offset(end, self.opts.topic)
        ranges = [OffsetRange(p, begin.get(p, 0), e) for p, e in sorted(stop.items())]
        new = set(stop) - set(begin)
        return list(_input_partitions(self.opts.topic, ranges, self.opts.min_partitions, self._brokers, new))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(self.opts, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the checkpoint is the only record of progress (metaq keeps no group offset)."""

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        self._brokers.close()


# -- writes ---------------------------------------------------------------------------------------

@dataclass
class MetaqCommitMessage(WriterCommitMessage):
    """What one write task appended: rows, batches and [first, last] offsets per topic-partition;
    exactly-once: the task's transactions as [broker id, txid, committed before], for the driver."""

    rows: int
    batches: int
    ranges: dict[str, list[int]]
    transactions: list[list[Any]] = dataclasses.field(default_factory=list)
    skipped_rows: int = 0


def _commit_message(stats: WriteStats, transactions: list[TaskTransaction] | None = None) -> MetaqCommitMessage:
    txs = [[tx.broker_id, tx.txid, tx.done] for tx in transactions or ()]
    return MetaqCommitMessage(stats.rows, stats.batches, stats.ranges, txs, stats.skipped_rows)


def _prepared(messages: list[WriterCommitMessage | None]) -> list[tuple[int, str]]:
    """The transactions the tasks prepared (not those an earlier run of the batch committed)."""
    return [(int(b), str(txid)) for msg in messages if isinstance(msg, MetaqCommitMessage)
            for b, txid, done in msg.transactions if not done]


def _summary(messages: list[WriterCommitMessage | None]) -> str:
    rows = sum(m.rows for m in messages if isinstance(m, MetaqCommitMessage))
    skipped = sum(m.skipped_rows for m in messages if isinstance(m, MetaqCommitMessage))
    again = f" ({skipped} more committed by an earlier run)" if skipped else ""
    return f"{rows} rows{again} from {len(messages)} tasks"


def _write_task(iterator: Iterator[Any], opts: WriteOptions, identity: WriteIdentity | None) -> MetaqCommitMessage:
    if not opts.exactly_once:
        from metaq.spark.sink import write_arrow

        return _commit_message(write_arrow(iterator, opts))
    from pyspark import TaskContext

    from metaq.spark.exactly_once import streaming_identity, write_prepared

    context = TaskContext.get()
    spark_partition = context.partitionId() if context is not None else 0
    if identity is None:
        identity = streaming_identity(context, opts.checkpoint_scope)
    stats, transactions = write_prepared(iterator, opts, identity, spark_partition)
    return _commit_message(stats, transactions)


class MetaqWriter(DataSourceArrowWriter):
    def __init__(self, opts: WriteOptions) -> None:
        from metaq.spark.exactly_once import new_batch_identity

        self.opts = opts
        self.identity = new_batch_identity() if opts.exactly_once else None
        """Exactly-once: made on the driver, so that every task (and its retries) names the same write."""

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return _write_task(iterator, self.opts, self.identity)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.opts.exactly_once:
            from metaq.spark.exactly_once import commit_prepared

            commit_prepared(_prepared(messages), self.opts, 0)
        log.info("metaq sink: wrote %s", _summary(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.opts.exactly_once:
            from metaq.spark.exactly_once import roll_back_prepared

            roll_back_prepared(_prepared(messages), self.opts)
            log.warning("metaq sink: write aborted; the transactions of %s were rolled back", _summary(messages))
            return
        # Appends cannot be taken back: what the successful tasks sent stays in the topic.
        log.warning("metaq sink: write aborted after %s had been appended", _summary(messages))


class MetaqStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return _write_task(iterator, self.opts, None)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.opts.exactly_once:
            from metaq.spark.exactly_once import commit_prepared

            commit_prepared(_prepared(messages), self.opts, batchId)
        log.info("metaq sink: batch %d wrote %s", batchId, _summary(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.opts.exactly_once:
            from metaq.spark.exactly_once import roll_back_prepared

            roll_back_prepared(_prepared(messages), self.opts)
            log.warning("metaq sink: batch %d aborted; the transactions of %s were rolled back", batchId,
                        _summary(messages))
            return
        log.warning("metaq sink: batch %d aborted after %s had been appended", batchId, _summary(messages))


# -- the data source ------------------------------------------------------------------------------

def _write_options(options: Mapping[str, str], schema: StructType, overwrite: bool) -> WriteOptions:
    if overwrite:
        raise ConfigError("metaq topics are append-only: use mode('append') (overwrite is not possible)")
    from pyspark.sql.pandas.types import to_arrow_schema

    from metaq.spark.sink import check_input_schema

    opts = WriteOptions.parse(options)
    check_input_schema(to_arrow_schema(schema, timezone="UTC"), opts)
    if opts.zk_connect is not None:  # the driver reads the brokers once; tasks get their addresses
        brokers = DriverBrokers(opts)
        try:
            opts = dataclasses.replace(opts, servers=brokers.servers())
        finally:
            brokers.close()
    return opts


class MetaqDataSource(DataSource):
    """``spark.read.format("metaq")`` / ``readStream`` / ``write`` / ``writeStream``."""

    @classmethod
    def name(cls) -> str:
        return "metaq"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        _check_schema(schema)
        return MetaqBatchReader(ReadOptions.parse(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        _check_schema(schema)
        return MetaqStreamReader(ReadOptions.parse(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> MetaqWriter:
        return MetaqWriter(_write_options(self.options, schema, overwrite))

    def streamWriter(self, schema: StructType, overwrite: bool) -> MetaqStreamWriter:
        return MetaqStreamWriter(_write_options(self.options, schema, overwrite))


__all__ = [
    "SCHEMA",
    "DataLossError",
    "MetaqBatchReader",
    "MetaqCommitMessage",
    "MetaqDataSource",
    "MetaqInputPartition",
    "MetaqStreamReader",
    "MetaqStreamWriter",
    "MetaqWriter",
]
