"""Writing Arrow batches of rows into metaq: rows -> record batches -> pipelined produce requests.

Input columns (by name; any other column is ignored):

===========  ==========================================  =============================================
column       type                                        meaning
===========  ==========================================  =============================================
value        binary or string (required, not null)       the payload
key          binary or string                            the message key
attribute    string                                      MetaQ's attribute (what consumers filter on)
topic        string                                      target topic; null -> the ``topic`` option
broker_id    any integer type                            with ``partition``: the target is brokerId-partition
partition    any integer type                            target partition; null -> see below
timestamp    timestamp                                   the message timestamp; null -> now
headers      array<struct<key: string, value: binary>>   message headers (map<string, binary> works too)
===========  ==========================================  =============================================

A row with a ``partition`` and a ``broker_id`` goes to that ``brokerId-partition``; with a ``partition``
only, to the one partition of that number (an error when several brokers have one). A row without a
partition goes to ``crc32(key) % partitions`` over the topic's partitions on every broker in (broker id,
partition) order when it has a key (the client's :func:`~metaq.client.key_partition`, KeyHashSelector's
rule: the same key always lands in the same partition, so its messages stay in order; the topic must
exist), else to partition -1 of the first server: the broker picks an open partition per batch (and
creates the topic if it allows dynamic topics), as MetaQ does.

Batches are built with the public client API (:class:`~metaq.client.BatchBuilder`, or
:func:`~metaq.client.value_batches` for rows that carry only a value) and sent through a
:class:`~metaq.client.BlockingClient`, pipelined.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import pyarrow as pa

from metaq.client import ANY_PARTITION, BatchBuilder, BlockingClient, key_partition, value_batches
from metaq.errors import ConfigError, InvalidArgument, UnknownTopicError
from metaq.spark.options import WriteOptions
from metaq.types import PartitionId, PartitionKey

OPTIONAL_COLUMNS = ("key", "attribute", "topic", "broker_id", "partition", "timestamp", "headers")


@dataclass
class WriteStats:
    """What one task wrote: rows, batches, and [first, last] offsets per topic-partition (``"topic:b-p"``)."""

    rows: int = 0
    batches: int = 0
    ranges: dict[str, list[int]] = field(default_factory=dict)
    skipped_rows: int = 0
    """Exactly-once: rows not sent because an earlier run of the batch committed them."""

    def add(self, topic: str, partition: PartitionId | None, base_offset: int, count: int) -> None:
        self.rows += count
        self.batches += 1
        if base_offset < 0 or partition is None:
            return
        key = f"{topic}:{partition}"
        last = base_offset + count - 1
        seen = self.ranges.get(key)
        if seen is None:
            self.ranges[key] = [base_offset, last]
        else:
            seen[0] = min(seen[0], base_offset)
            seen[1] = max(seen[1], last)


def _is_binary_or_string(t: pa.DataType) -> bool:
    return (pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_string(t)
            or pa.types.is_large_string(t))


def check_input_schema(schema: pa.Schema, opts: WriteOptions) -> None:
    """Refuse a DataFrame the sink cannot write, naming the column (run on the driver)."""
    names = schema.names
    if "value" not in names:
        raise ConfigError(f"metaq sink: the DataFrame needs a 'value' column (binary or string); it has {names}")
    checks = {
        "value": _is_binary_or_string,
        "key": _is_binary_or_string,
        "attribute": lambda t: pa.types.is_string(t) or pa.types.is_large_string(t),
        "topic": lambda t: pa.types.is_string(t) or pa.types.is_large_string(t),
        "broker_id": pa.types.is_integer,
        "partition": pa.types.is_integer,
        "timestamp": pa.types.is_timestamp,
        "headers": lambda t: pa.types.is_list(t) or pa.types.is_map(t),
    }
    for name, ok in checks.items():
        if name in names and not ok(schema.field(name).type):
            raise ConfigError(f"metaq sink: column {name!r} has type {schema.field(name).type}, which the sink "
                              "cannot write (see docs/spark.md for the column types)")
    if opts.topic is None and "topic" not in names:
        raise ConfigError("option 'topic': required unless the DataFrame has a 'topic' column")


def _bytes_list(column: pa.Array | pa.ChunkedArray) -> list[bytes | None]:
    if pa.types.is_string(column.type):
        column = column.cast(pa.binary())
    elif pa.types.is_large_string(column.type):
        column = column.cast(pa.large_binary())
    return column.to_pylist()


def _headers_list(column: pa.Array) -> list[list[tuple[str, bytes]] | None]:
    out: list[list[tuple[str, bytes]] | None] = []
    for item in column.to_pylist():
        if not item:
            out.append(None)
            continue
        pairs = []
        for h in item:
            k, v = (h["key"], h["value"]) if isinstance(h, dict) else h
            pairs.append((k, v.encode() if isinstance(v, str) else bytes(v if v is not None else b"")))
        out.append(pairs)
    return out


class BatchEncoder:
    """Turns Arrow batches of rows into (topic, partition, record batch, count) produce items; the
    partition is a PartitionId, a bare number (the ``partition`` column alone) or -1 (any)."""

    def __init__(self, opts: WriteOptions, partitions_of: Callable[[str], list[PartitionId]]) -> None:
        self.opts = opts
        self.partitions_of = partitions_of
        self._partitions: dict[str, list[PartitionId]] = {}

    def _key_space(self, topic: str) -> list[PartitionId]:
        """The topic's partitions a key is hashed over, asked once per topic."""
        try:
            parts = self._partitions[topic] = sorted(self.partitions_of(topic))
        except UnknownTopicError:
            raise UnknownTopicError(
                f"metaq sink: topic {topic!r} does not exist yet, and rows with a key go to partition "
                "crc32(key) % partitions, which needs its partitions: create the topic first "
                "(or give the rows a 'partition', or no key)") from None
        return parts

    def encode(self, batches: Iterable[pa.RecordBatch]) -> Iterator[tuple[str, PartitionKey, bytes, int]]:
        for rb in batches:
            if rb.num_rows:
                yield from self._encode_one(rb)

    def _encode_one(self, rb: pa.RecordBatch) -> Iterator[tuple[str, PartitionKey, bytes, int]]:
        names = rb.schema.names
        now_ms = int(time.time() * 1000)
        values = _bytes_list(rb.column(names.index("value")))
        if any(v is None for v in values):
            raise ConfigError("metaq sink: column 'value' has a null; every message needs a payload")
        cols = {n: rb.column(names.index(n)) for n in OPTIONAL_COLUMNS if n in names}
        cols = {n: c for n, c in cols.items() if c.null_count < len(c)}  # all-null columns do not matter
        if not cols:
            assert self.opts.topic is not None
            yield from self._plain(self.opts.topic, values, now_ms)  # type: ignore[arg-type]
            return
        n = len(values)
        keys = _bytes_list(cols["key"]) if "key" in cols else [None] * n
        attrs = cols["attribute"].to_pylist() if "attribute" in cols else [None] * n
        topics = cols["topic"].to_pylist() if "topic" in cols else [None] * n
        parts = cols["partition"].to_pylist() if "partition" in cols else [None] * n
        brokers = cols["broker_id"].to_pylist() if "broker_id" in cols else [None] * n
        if "timestamp" in cols:
            micros = cols["timestamp"].cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_pylist()
            stamps = [now_ms if t is None else t // 1000 for t in micros]
        else:
            stamps = [now_ms] * n
        headers = _headers_list(cols["headers"]) if "headers" in cols else [None] * n
        builders: dict[tuple[str, PartitionKey], BatchBuilder] = {}
        key_spaces = self._partitions
        for i in range(n):
            topic = topics[i] or self.opts.topic
            if topic is None:
                raise ConfigError("option 'topic': a row has a null 'topic' and the option is not set")
            number, broker_id, key = parts[i], brokers[i], keys[i]
            part: PartitionKey
            if number is None:
                if key is None:
                    part = ANY_PARTITION
                else:  # the key space looked up here, not in a method: a keyed row costs one call, the rule
                    part = key_partition(key_spaces.get(topic) or self._key_space(topic), key)
            elif broker_id is not None:
                part = _partition_id(broker_id, number)
            else:
                part = number
            target = (topic, part)
            builder = builders.get(target)
            if builder is None:
                builder = builders[target] = BatchBuilder(self.opts.batch_bytes, self.opts.compression)
            if not builder.try_append(stamps[i], values[i], key, attrs[i], headers[i]):  # type: ignore[arg-type]
                yield topic, part, builder.build(), len(builder)
                builder = builders[target] = BatchBuilder(self.opts.batch_bytes, self.opts.compression)
                builder.try_append(stamps[i], values[i], key, attrs[i], headers[i])  # type: ignore[arg-type]
        for (topic, part), builder in builders.items():
            if len(builder):
                yield topic, part, builder.build(), len(builder)

    def _plain(self, topic: str, values: list[bytes], now_ms: int) -> Iterator[tuple[str, PartitionKey, bytes, int]]:
        """The fast path: payloads only, cut into batches of about ``batch_bytes``."""
        for records, count in value_batches(values, now_ms, self.opts.batch_bytes, self.opts.compression):
            yield topic, ANY_PARTITION, records, count


def write_arrow(batches: Iterable[pa.RecordBatch], opts: WriteOptions,
                client_id: str = "metaq-spark-writer") -> WriteStats:
    """Send every row of ``batches``; returns once the broker acknowledged all of them (acks=1)."""
    stats = WriteStats()
    with BlockingClient(opts.servers, client_id=client_id, timeout_s=opts.timeout_ms / 1000, tls=opts.tls,
                        username=opts.user, password=opts.password) as client:
        encoder = BatchEncoder(opts, client.partitions_for)
        sent: deque[tuple[str, PartitionKey, int]] = deque()

        def items() -> Iterator[tuple[str, PartitionKey, bytes]]:
            for topic, part, batch, count in encoder.encode(batches):
                sent.append((topic, part, count))
                yield topic, part, batch

        if opts.acks == 0:
            client.produce_many(items(), acks=0)
            for topic, _part, count in sent:
                stats.add(topic, None, -1, count)
            return stats
        for resp in client.iter_produce(items(), acks=1, window=opts.max_in_flight, timeout_ms=opts.timeout_ms):
            topic, part, count = sent.popleft()
            # -1 went to the first server, which picked the partition; anything else to its own broker
            broker_id = client.broker_id if part == ANY_PARTITION else client.resolve(topic, part).broker_id
            stats.add(topic, PartitionId(broker_id, resp.partition), resp.base_offset, count)
    return stats


def _partition_id(broker_id: int, partition: int) -> PartitionId:
    try:
        return PartitionId(broker_id, partition)
    except InvalidArgument as exc:
        raise ConfigError(f"metaq sink: columns 'broker_id' and 'partition' ({broker_id}, {partition}) do not "
                          f"name a partition: {exc}") from None
