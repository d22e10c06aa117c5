"""MetaQ's :class:`PullConsumer`: reads partitions by offset, the caller keeping the offsets.

Each fetch is a :class:`~metaq.client.fetcher.Fetcher`'s (:mod:`metaq.client.fetcher`: the request, the
checks of the reply, a slave that is behind); here are the pull consumer's ways to use it: one fetch
(:meth:`PullConsumer.get`), many partitions at once (:meth:`PullConsumer.get_many`), and iterators that
long-poll a partition forever (:meth:`PullConsumer.iterate` and its batch and column forms).

Replies on a connection come back in order, so a single-partition fetch held for long polling delays
every reply queued behind it. :meth:`PullConsumer.get` (no waiting) uses the session's shared
connection; :meth:`PullConsumer.iterate` (long polling) opens a connection of its own for its lifetime.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any, Literal

from metaq.client.core import ClientCore
from metaq.client.exceptions import ClientClosedError
from metaq.client.fetcher import (
    DEFAULT_FETCH_MAX_BYTES,
    DEFAULT_MULTI_FETCH_MAX_BYTES,
    MULTI_FETCH_API_KEY,
    Fetcher,
    FetchResult,
    offsets_of,
    read_request,
)
from metaq.client.metadata import Partition
from metaq.client.replicas import ReadReplica
from metaq.errors import (
    BrokerError,
    ConnectionClosedError,
    CorruptRecordError,
    InvalidArgument,
    MetaqError,
    OffsetOutOfRangeError,
    RequestTimeoutError,
)
from metaq.net.connection import BrokerConnection
from metaq.net.retry import RetryPolicy
from metaq.protocol.messages import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    FetchResponse,
    ListOffsetsRequest,
)
from metaq.protocol.records import MessageBatch, iter_batches
from metaq.types import Message, PartitionId, PartitionKey, partition_key, validate_topic

log = logging.getLogger(__name__)

DEFAULT_MAX_WAIT_MS = 5000
"""MetaQ's default maxDelayFetchTimeInMills is 5 s."""

StartOffset = int | Literal["earliest", "latest"]
OutOfRangePolicy = Literal["raise", "earliest", "latest"]


def _whole_batches_end(resp: FetchResponse, offset: int) -> int:
    """The offset after the last whole batch of a fetch reply to ``offset`` (``offset`` when there is none,
    or when the reply is one to read again: reset, or a damaged header, which decoding then reports): where
    the next fetch starts, known from the batch headers before the records are checked."""
    if resp.reset_offset >= 0:
        return offset
    end = offset
    try:
        for _pos, header in iter_batches(resp.records):
            end = max(end, header.next_offset)
    except CorruptRecordError:
        return offset
    return end


def _drop(future: asyncio.Future[Any]) -> None:
    """Forget a fetch sent ahead that is not wanted (its reply is read and discarded when it comes; the
    connection stays in step); its error, if it has one, is nobody's."""
    if future.done():
        if not future.cancelled():
            future.exception()
    else:
        future.cancel()


def _first(batches: list[MessageBatch], count: int) -> list[MessageBatch]:
    """The first ``count`` records of ``batches`` (non-empty views), as views."""
    out = []
    for batch in batches:
        if count <= 0:
            break
        out.append(batch.head(count))
        count -= len(batch)
    return out


class PullConsumer:
    """Reads partitions by offset; the caller keeps the offsets (MetaQ's pull ``get``).

    Create it with ``MessageSessionFactory.create_pull_consumer``.
    """

    def __init__(self, core: ClientCore, *, verify_crc: bool = True) -> None:
        self._core = core
        self.fetcher = Fetcher(core, verify_crc=verify_crc)
        self._iterators: set[BrokerConnection] = set()
        self._closed = False

    def _check(self, topic: str, partition: PartitionKey) -> None:
        if self._closed:
            raise ClientClosedError("the consumer is closed")
        validate_topic(topic)
        partition_key(partition)

    async def get(self, topic: str, partition: PartitionKey, offset: int,
                  max_bytes: int = DEFAULT_FETCH_MAX_BYTES) -> list[Message]:
        """Messages from ``offset`` on, at most about ``max_bytes`` of them; [] at the end. No waiting.

        Raises OffsetOutOfRangeError (with ``earliest``/``latest``) for an offset outside the partition.
        """
        self._check(topic, partition)
        return (await self.fetcher.fetch(topic, partition, offset, max_bytes=max_bytes)).messages

    async def get_many(self, positions: Mapping[tuple[str, PartitionKey], int], *,
                       max_bytes: int = DEFAULT_FETCH_MAX_BYTES, max_wait_ms: int = 0,
                       total_max_bytes: int = DEFAULT_MULTI_FETCH_MAX_BYTES
                       ) -> dict[tuple[str, PartitionId], FetchResult | MetaqError]:
        """Fetch many partitions at once: ``{(topic, partition): offset}`` -> ``{(topic, id): result}``.

        One MultiFetch per broker (at most ``max_bytes`` per partition and ``total_max_bytes`` per
        reply), sent together over the session's connections; with ``max_wait_ms`` each waits until any
        of its partitions has data. A partition's error (an offset out of range, ...) is its value, not
        raised. A broker too old for MultiFetch is asked partition by partition (no waiting).
        """
        if self._closed:
            raise ClientClosedError("the consumer is closed")
        if max_wait_ms < 0:
            raise InvalidArgument(f"max_wait_ms must be >= 0, not {max_wait_ms}")
        if max_bytes <= 0 or total_max_bytes <= 0:
            raise InvalidArgument("max_bytes and total_max_bytes must be > 0")
        by_broker: dict[int, list[tuple[str, Partition, int, int]]] = {}
        for (topic, partition), offset in positions.items():
            self._check(topic, partition)
            if not isinstance(offset, int) or offset < 0:
                raise InvalidArgument(f"offset must be an int >= 0, not {offset!r}")
            p = await self._core.partition(topic, partition)
            by_broker.setdefault(p.broker_id, []).append((topic, p, offset, max_bytes))

        async def one_broker(broker_id: int, wanted: list[tuple[str, Partition, int, int]]
                             ) -> list[FetchResult | MetaqError]:
            conn = await self._core.connection(broker_id)
            if conn.supports(MULTI_FETCH_API_KEY):
                return await self.fetcher.fetch_many(conn, wanted, max_wait_ms=max_wait_ms,
                                                     max_bytes=total_max_bytes)
            out: list[FetchResult | MetaqError] = []
            for topic, p, offset, pmax in wanted:
                try:
                    out.append(await self.fetcher.fetch(topic, p, offset, max_bytes=pmax, connection=conn))
                except (BrokerError, CorruptRecordError) as exc:
                    out.append(exc)
            return out

        groups = list(by_broker.items())
        if len(groups) == 1:  # one broker: awaited here, without gather's task (a loop step per call)
            answers = [await one_broker(*groups[0])]
        else:
            answers = await asyncio.gather(*(one_broker(b, w) for b, w in groups))
        results: dict[tuple[str, PartitionId], FetchResult | MetaqError] = {}
        for (_b, wanted), answer in zip(groups, answers, strict=True):
            for (topic, p, _o, _m), result in zip(wanted, answer, strict=True):
                results[(topic, p.id)] = result
        return results

    async def iterate(self, topic: str, partition: PartitionKey, offset: StartOffset = "earliest", *,
                      max_wait_ms: int = DEFAULT_MAX_WAIT_MS, max_bytes: int = DEFAULT_FETCH_MAX_BYTES,
                      max_messages: int | None = None, stop_at_end: bool = False,
                      on_out_of_range: OutOfRangePolicy = "raise", group: str = ""
                      ) -> AsyncIterator[Message]:
        """Yield the partition's messages in offset order, forever, long polling when caught up.

        ``offset``: a number, ``"earliest"`` or ``"latest"`` (only messages appended from now on).
        Stops after ``max_messages``, or, with ``stop_at_end``, once it has reached the partition's end
        as the broker last reported it. A lost connection is reopened (bounded attempts, as every
        request); ``on_out_of_range`` says what an offset outside the partition does: raise, or jump
        to the earliest or latest offset.
        """
        # Messages are built one at a time from the checked columns of each fetch: one the caller drops
        # is freed at once, so the cyclic GC never scans a fetch's worth of fresh objects.
        fetches = self._iterate(topic, partition, offset, max_wait_ms=max_wait_ms, max_bytes=max_bytes,
                                max_messages=max_messages, stop_at_end=stop_at_end, on_out_of_range=on_out_of_range,
                                group=group, columns=True)
        try:
            async for batches in fetches:
                for batch in batches:
                    for message in batch:
                        yield message
        finally:
            await fetches.aclose()

    async def iterate_batches(self, topic: str, partition: PartitionKey, offset: StartOffset = "earliest", *,
                              max_wait_ms: int = DEFAULT_MAX_WAIT_MS, max_bytes: int = DEFAULT_FETCH_MAX_BYTES,
                              max_messages: int | None = None, stop_at_end: bool = False,
                              on_out_of_range: OutOfRangePolicy = "raise", group: str = ""
                              ) -> AsyncGenerator[list[Message], None]:
        """As :meth:`iterate`, one non-empty list of messages per fetch (cheaper per message)."""
        fetches = self._iterate(topic, partition, offset, max_wait_ms=max_wait_ms, max_bytes=max_bytes,
                                max_messages=max_messages, stop_at_end=stop_at_end, on_out_of_range=on_out_of_range,
                                group=group, columns=False)
        try:
            async for messages in fetches:
                yield messages
        finally:
            await fetches.aclose()

    async def iterate_columns(self, topic: str, partition: PartitionKey, offset: StartOffset = "earliest", *,
                              max_wait_ms: int = DEFAULT_MAX_WAIT_MS, max_bytes: int = DEFAULT_FETCH_MAX_BYTES,
                              max_messages: int | None = None, stop_at_end: bool = False,
                              on_out_of_range: OutOfRangePolicy = "raise", group: str = ""
                              ) -> AsyncGenerator[MessageBatch, None]:
        """As :meth:`iterate`, one :class:`~metaq.protocol.records.MessageBatch` per stored batch: the
        records' columns (offsets, payloads as memoryview slices of the fetched bytes, keys, timestamps...)
        with no Message built until asked for (iterating a MessageBatch gives its Messages). For bulk
        readers. Every batch is checked (CRC, columns) as for :meth:`iterate`; none is empty."""
        fetches = self._iterate(topic, partition, offset, max_wait_ms=max_wait_ms, max_bytes=max_bytes,
                                max_messages=max_messages, stop_at_end=stop_at_end, on_out_of_range=on_out_of_range,
                                group=group, columns=True)
        try:
            async for batches in fetches:
                for batch in batches:
                    yield batch
        finally:
            await fetches.aclose()

    async def _iterate(self, topic: str, partition: PartitionKey, offset: StartOffset, *, max_wait_ms: int,
                       max_bytes: int, max_messages: int | None, stop_at_end: bool,
                       on_out_of_range: OutOfRangePolicy, group: str, columns: bool
                       ) -> AsyncGenerator[list[Any], None]:
        """The fetch loop of the iterators: per fetch, a non-empty list of Messages, or of MessageBatch
        views with ``columns``."""
        self._check(topic, partition)
        if max_wait_ms < 0:
            raise InvalidArgument(f"max_wait_ms must be >= 0, not {max_wait_ms}")
        if max_messages is not None and max_messages < 0:
            raise InvalidArgument(f"max_messages must be >= 0, not {max_messages}")
        if on_out_of_range not in ("raise", "earliest", "latest"):
            raise InvalidArgument(f"on_out_of_range must be 'raise', 'earliest' or 'latest', not {on_out_of_range!r}")
        p = await self._core.partition(topic, partition)
        position: int | None = None
        """None until "earliest"/"latest" is resolved: in the retry loop, as a broker restarting may not answer."""
        if isinstance(offset, int) and not isinstance(offset, bool) and offset >= 0:
            position = offset
        elif offset != "earliest" and offset != "latest":
            raise InvalidArgument(f"offset must be an int >= 0, 'earliest' or 'latest', not {offset!r}")
        remaining = max_messages
        if remaining == 0:
            return
        conn: BrokerConnection | None = None
        replica: ReadReplica | None = None
        """The copy ``conn`` reaches: chosen again before every fetch, so that a slave that leaves or
        comes back is followed at once (``read_from``)."""
        fetch_bytes = max_bytes
        # reconnect_attempts failures in a row are retried; one more ends the iteration. In cluster
        # mode, failures are retried for broker_restart_wait_s instead (a broker restarting, maybe on
        # another port: the connection is made again at its registered address).
        cfg = self._core.config
        if self._core.cluster_mode:
            policy = RetryPolicy(cfg.reconnect_backoff_s, cfg.reconnect_backoff_max_s, jitter=0.5,
                                 deadline_s=cfg.broker_restart_wait_s)
        else:
            policy = cfg.reconnect_retry(cfg.reconnect_attempts + 1)
        backoff = policy.start()
        ahead: asyncio.Future[Any] | None = None
        """The next fetch, written (at ``ahead_offset``) before this one's records are checked and handed out,
        when this reply says more is there (from a master): the broker reads and sends it meanwhile. The
        same request as the one the loop would send next, only earlier; dropped (its reply read and
        discarded) if the loop goes another way."""
        ahead_offset = -1
        try:
            while True:
                wait = 0 if stop_at_end else max_wait_ms
                seen = self._core.snapshots_applied
                try:
                    if position is None:
                        earliest, latest = await self.offsets(topic, p)
                        position = earliest if offset == "earliest" else latest
                    chosen = self._core.read_replica(topic, p)
                    if ahead is not None and (ahead_offset != position or conn is None or conn.closed
                                              or chosen != replica or fetch_bytes != max_bytes):
                        _drop(ahead)
                        ahead = None
                    if conn is None or conn.closed or chosen != replica:
                        if conn is not None:
                            self._iterators.discard(conn)
                            conn.close()
                        if replica is not None and chosen != replica:
                            log.info("%s:%s: reading from %s from offset %d", topic, p, chosen, position)
                        conn = None
                        conn = await self._core.read_connection(chosen, own=True)
                        replica = chosen
                        self._iterators.add(conn)
                    answer: FetchResponse | FetchResult
                    if ahead is not None:
                        pending, ahead = ahead, None
                        answer = await self.fetcher._submitted(pending, topic, p)
                    else:
                        answer, _ = await self.fetcher._response(topic, p, position, fetch_bytes, wait, group, conn,
                                                                 replica)
                    if isinstance(answer, FetchResult):
                        result = answer
                    else:
                        after = _whole_batches_end(answer, position)
                        if (after > position and after < answer.log_end_offset and conn.writable  # not throttled
                                and (replica is None or not replica.is_slave)
                                and (remaining is None or remaining > after - position)):
                            ahead_offset = after
                            ahead = self.fetcher._submit(conn, topic, p, after, max_bytes, wait, group)
                        result = self.fetcher.decode_response(answer, topic, p, position, columns)
                        if ahead is not None and result.next_offset != ahead_offset:
                            _drop(ahead)
                            ahead = None
                except OffsetOutOfRangeError as exc:
                    earliest = getattr(exc, "earliest", -1)
                    latest = getattr(exc, "latest", -1)
                    if on_out_of_range == "raise" or earliest < 0:
                        raise
                    new = earliest if on_out_of_range == "earliest" else latest
                    log.warning("offset %d of %s:%s is out of range %d..%d; continuing from %d", position, topic,
                                p, earliest, latest, new)
                    position = new
                    continue
                except (ConnectionClosedError, RequestTimeoutError, BrokerError) as exc:
                    # Retriable: a lost connection, a timeout, a broker stopping or busy. Anything
                    # else (unknown topic, closed for subscribing, ...) ends the iteration.
                    if isinstance(exc, BrokerError):
                        if exc.refresh_metadata:
                            self._core.metadata.refresh_soon(topic)
                        if not exc.retriable:
                            raise
                    delay = backoff.next_delay_s()
                    if delay is None:
                        raise
                    log.info("fetch from %s:%s failed (%s); retrying", topic, p, exc)
                    if conn is not None:
                        conn.close()
                    conn = None
                    await self._core.cluster_changed(delay, seen)  # a broker registering again ends the wait
                    continue
                backoff.reset()
                if result.partial:
                    fetch_bytes = min(fetch_bytes * 2, self._core.config.max_frame_bytes // 2)
                    log.warning("a batch of %s:%s at offset %d is larger than max_bytes; fetching %d bytes",
                                topic, p, position, fetch_bytes)
                    continue
                fetch_bytes = max_bytes
                position = result.next_offset
                if columns:
                    batches = result.batches
                    if batches:
                        if remaining is not None:
                            count = sum(map(len, batches))
                            if count >= remaining:
                                yield _first(batches, remaining)
                                return
                            remaining -= count
                        yield batches
                else:
                    messages = result.messages
                    if messages:
                        if remaining is not None:
                            if len(messages) >= remaining:
                                yield messages[:remaining]
                                return
                            remaining -= len(messages)
                        yield messages
                if stop_at_end and position >= result.log_end_offset:
                    return
        finally:
            if ahead is not None:
                _drop(ahead)
            if conn is not None:
                self._iterators.discard(conn)
                conn.close()

    async def offsets(self, topic: str, partition: PartitionKey) -> tuple[int, int]:
        """(earliest, latest): the first stored offset and the next offset to be written, of the copy
        this session reads (``read_from``: a slave's latest may be behind its master's)."""
        self._check(topic, partition)
        p = await self._core.partition(topic, partition)
        resp = await read_request(self._core, topic, p, ListOffsetsRequest(topic, p.partition, LATEST_TIMESTAMP))
        return resp.log_start_offset, resp.log_end_offset

    async def offset_for_time(self, topic: str, partition: PartitionKey, timestamp_ms: int) -> int:
        """The first offset whose message timestamp is at or after ``timestamp_ms`` (latest if none)."""
        self._check(topic, partition)
        if timestamp_ms < 0 and timestamp_ms not in (EARLIEST_TIMESTAMP, LATEST_TIMESTAMP):
            raise InvalidArgument(f"timestamp_ms must be >= 0, not {timestamp_ms}")
        p = await self._core.partition(topic, partition)
        return (await read_request(self._core, topic, p, ListOffsetsRequest(topic, p.partition, timestamp_ms))).offset

    async def close(self) -> None:
        """Stop this consumer: the connections of its iterators are closed. The session stays open."""
        self._closed = True
        for conn in list(self._iterators):
            conn.close()
        self._iterators.clear()

    async def __aenter__(self) -> PullConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


__all__ = [  # the fetcher's names with the pull consumer's: one import for code that reads by offset
    "DEFAULT_FETCH_MAX_BYTES", "DEFAULT_MAX_WAIT_MS", "DEFAULT_MULTI_FETCH_MAX_BYTES", "MULTI_FETCH_API_KEY",
    "FetchResult", "Fetcher", "OutOfRangePolicy", "PullConsumer", "StartOffset", "offsets_of", "read_request",
]
