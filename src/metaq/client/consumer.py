"""Pulling messages by offset: the reusable :class:`Fetcher` and MetaQ's :class:`PullConsumer`.

A fetch asks one partition for the batches from ``offset`` on, up to ``max_bytes``; the broker may
hold it up to ``max_wait_ms`` while nothing is there yet (long polling). The reply is stored batches
as they are on disk: the first may start before ``offset`` and the last may be cut off, so the client
checks every CRC, drops what is below ``offset`` and what is cut off, and computes the next offset.

Replies on a connection come back in order, so a fetch held for long polling delays every reply
queued behind it. :meth:`PullConsumer.get` (no waiting) uses the session's shared connection;
:meth:`PullConsumer.iterate` (long polling) opens a connection of its own for its lifetime.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Literal

from metaq.client.core import ClientCore
from metaq.client.exceptions import ClientClosedError
from metaq.client.metadata import Partition
from metaq.errors import (
    BrokerError,
    ConnectionClosedError,
    InvalidArgument,
    OffsetOutOfRangeError,
    RequestTimeoutError,
    UnknownServerError,
)
from metaq.net.connection import BrokerConnection
from metaq.net.retry import RetryPolicy
from metaq.protocol.messages import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
)
from metaq.protocol.records import decode_fetched
from metaq.types import Message, PartitionKey, partition_key, validate_topic

log = logging.getLogger(__name__)

DEFAULT_FETCH_MAX_BYTES = 1024 * 1024
DEFAULT_MAX_WAIT_MS = 5000
"""MetaQ's default maxDelayFetchTimeInMills is 5 s."""

StartOffset = int | Literal["earliest", "latest"]
OutOfRangePolicy = Literal["raise", "earliest", "latest"]


@dataclass(slots=True)
class FetchResult:
    messages: list[Message]
    """Messages at or after the asked offset, in offset order."""
    next_offset: int
    """The offset to fetch next (after the last whole batch received)."""
    log_start_offset: int
    log_end_offset: int
    """The partition's range when the broker answered (end = the next offset to be written)."""
    reset_offset: int = -1
    """>= 0 when the asked offset was out of range and the broker (updateConsumerOffsets) served from here."""
    partial: bool = False
    """Bytes came back but not one whole batch (max_bytes smaller than the batch): ask for more bytes."""


class Fetcher:
    """One fetch request, checked and decoded. Knows nothing of groups or offsets storage."""

    def __init__(self, core: ClientCore, *, verify_crc: bool = True) -> None:
        self._core = core
        self.verify_crc = verify_crc

    async def fetch(self, topic: str, partition: PartitionKey, offset: int, *,
                    max_bytes: int = DEFAULT_FETCH_MAX_BYTES, max_wait_ms: int = 0, group: str = "",
                    connection: BrokerConnection | None = None) -> FetchResult:
        """Fetch once. Raises OffsetOutOfRangeError carrying ``earliest``/``latest`` when the offset
        is outside the partition (and the broker does not reset it), and the broker's other errors."""
        if max_bytes <= 0:
            raise InvalidArgument(f"max_bytes must be > 0, not {max_bytes}")
        if offset < 0:
            raise InvalidArgument(f"offset must be >= 0, not {offset}")
        p = await self._core.partition(topic, partition)
        conn = connection or await self._core.connection(p.broker_id)
        timeout_s = self._core.config.request_timeout_s + max_wait_ms / 1000.0
        req = FetchRequest(topic, p.partition, offset, max_bytes, max_wait_ms, group)
        try:
            resp: FetchResponse = await conn.request(req, timeout_s)
        except OffsetOutOfRangeError as exc:
            await self._attach_range(exc, topic, p)
            raise
        start = resp.reset_offset if resp.reset_offset >= 0 else offset
        records = resp.records
        if resp.reset_offset >= 0:
            log.warning("offset %d of %s:%s was out of range; the broker served from %d", offset, topic, p,
                        resp.reset_offset)
        messages, next_offset = decode_fetched(records, topic, p.partition, start, self.verify_crc, p.broker_id)
        return FetchResult(messages, next_offset, resp.log_start_offset, resp.log_end_offset, resp.reset_offset,
                           partial=bool(records) and not messages and next_offset == start)

    async def _attach_range(self, exc: OffsetOutOfRangeError, topic: str, p: Partition) -> None:
        if exc.earliest >= 0 and exc.latest >= 0:
            return  # the broker's reply carried the range
        try:
            exc.earliest, exc.latest = await offsets_of(self._core, topic, p)
        except Exception:  # the range is a courtesy; the out-of-range error is what matters
            pass


async def offsets_of(core: ClientCore, topic: str, partition: Partition) -> tuple[int, int]:
    resp: ListOffsetsResponse = await core.request(
        ListOffsetsRequest(topic, partition.partition, LATEST_TIMESTAMP), partition.broker_id)
    return resp.log_start_offset, resp.log_end_offset


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
        batches = self.iterate_batches(topic, partition, offset, max_wait_ms=max_wait_ms, max_bytes=max_bytes,
                                       max_messages=max_messages, stop_at_end=stop_at_end,
                                       on_out_of_range=on_out_of_range, group=group)
        try:
            async for messages in batches:
                for message in messages:
                    yield message
        finally:
            await batches.aclose()

    async def iterate_batches(self, topic: str, partition: PartitionKey, offset: StartOffset = "earliest", *,
                              max_wait_ms: int = DEFAULT_MAX_WAIT_MS, max_bytes: int = DEFAULT_FETCH_MAX_BYTES,
                              max_messages: int | None = None, stop_at_end: bool = False,
                              on_out_of_range: OutOfRangePolicy = "raise", group: str = ""
                              ) -> AsyncGenerator[list[Message], None]:
        """As :meth:`iterate`, one non-empty list of messages per fetch (cheaper per message)."""
        self._check(topic, partition)
        if max_wait_ms < 0:
            raise InvalidArgument(f"max_wait_ms must be >= 0, not {max_wait_ms}")
        if max_messages is not None and max_messages < 0:
            raise InvalidArgument(f"max_messages must be >= 0, not {max_messages}")
        if on_out_of_range not in ("raise", "earliest", "latest"):
            raise InvalidArgument(f"on_out_of_range must be 'raise', 'earliest' or 'latest', not {on_out_of_range!r}")
        p = await self._core.partition(topic, partition)
        if offset == "earliest" or offset == "latest":
            earliest, latest = await offsets_of(self._core, topic, p)
            position = earliest if offset == "earliest" else latest
        elif isinstance(offset, int) and not isinstance(offset, bool) and offset >= 0:
            position = offset
        else:
            raise InvalidArgument(f"offset must be an int >= 0, 'earliest' or 'latest', not {offset!r}")
        remaining = max_messages
        if remaining == 0:
            return
        conn: BrokerConnection | None = None
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
        try:
            while True:
                wait = 0 if stop_at_end else max_wait_ms
                seen = self._core.snapshots_applied
                try:
                    if conn is None or conn.closed:
                        conn = await self._connect(p.broker_id)
                        self._iterators.add(conn)
                    result = await self.fetcher.fetch(topic, p, position, max_bytes=fetch_bytes,
                                                      max_wait_ms=wait, group=group, connection=conn)
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
            if conn is not None:
                self._iterators.discard(conn)
                conn.close()

    async def _connect(self, broker_id: int) -> BrokerConnection:
        """A connection of the iterator's own to the broker, at its address now (ConnectionClosedError,
        retried, while the broker is not in the metadata: deregistered in cluster mode)."""
        try:
            address = self._core.address(broker_id)
        except UnknownServerError as exc:
            raise ConnectionClosedError(str(exc)) from None
        return await self._core.pool.connect(address)

    async def offsets(self, topic: str, partition: PartitionKey) -> tuple[int, int]:
        """(earliest, latest): the first stored offset and the next offset to be written."""
        self._check(topic, partition)
        return await offsets_of(self._core, topic, await self._core.partition(topic, partition))

    async def offset_for_time(self, topic: str, partition: PartitionKey, timestamp_ms: int) -> int:
        """The first offset whose message timestamp is at or after ``timestamp_ms`` (latest if none)."""
        self._check(topic, partition)
        if timestamp_ms < 0 and timestamp_ms not in (EARLIEST_TIMESTAMP, LATEST_TIMESTAMP):
            raise InvalidArgument(f"timestamp_ms must be >= 0, not {timestamp_ms}")
        p = await self._core.partition(topic, partition)
        resp: ListOffsetsResponse = await self._core.request(ListOffsetsRequest(topic, p.partition, timestamp_ms),
                                                             p.broker_id)
        return resp.offset

    async def close(self) -> None:
        self._closed = True
        for conn in list(self._iterators):
            conn.close()
        self._iterators.clear()

    async def __aenter__(self) -> PullConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

