"""Pulling messages by offset: the reusable :class:`Fetcher` and MetaQ's :class:`PullConsumer`.

A fetch asks one partition for the batches from ``offset`` on, up to ``max_bytes``; the broker may
hold it up to ``max_wait_ms`` while nothing is there yet (long polling). The reply is stored batches
as they are on disk: the first may start before ``offset`` and the last may be cut off, so the client
checks every CRC, drops what is below ``offset`` and what is cut off, and computes the next offset.

Replies on a connection come back in order, so a single-partition fetch held for long polling delays
every reply queued behind it. :meth:`PullConsumer.get` (no waiting) uses the session's shared
connection; :meth:`PullConsumer.iterate` (long polling) opens a connection of its own for its lifetime.

A multi-partition fetch (:meth:`Fetcher.fetch_many`, :meth:`PullConsumer.get_many`; the MultiFetch API
of brokers that serve it) asks many partitions of one broker in one request and long-polls until any
of them has data; its reply may overtake other replies, so it shares a connection without holding it up.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from metaq.client.core import ClientCore
from metaq.client.exceptions import ClientClosedError
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
from metaq.net.codec import raise_for_error
from metaq.net.connection import BrokerConnection
from metaq.net.retry import RetryPolicy
from metaq.protocol.messages import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    FetchedPartition,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    MultiFetchRequest,
    MultiFetchResponse,
)
from metaq.protocol.records import MessageBatch, decode_fetched, decode_fetched_batches, iter_batches
from metaq.types import Message, PartitionId, PartitionKey, partition_key, validate_topic

log = logging.getLogger(__name__)

DEFAULT_FETCH_MAX_BYTES = 1024 * 1024
DEFAULT_MULTI_FETCH_MAX_BYTES = 4 * 1024 * 1024
"""A multi-partition fetch's whole reply (each partition is capped by its own max_bytes too)."""
MULTI_FETCH_API_KEY = MultiFetchRequest.API_KEY
DEFAULT_MAX_WAIT_MS = 5000
"""MetaQ's default maxDelayFetchTimeInMills is 5 s."""
BEHIND_POLL_MIN_S = 0.02
BEHIND_POLL_MAX_S = 0.5
"""A slave behind the consumer's offset is asked again after 20 ms, doubling up to 0.5 s (it cannot
long-poll an offset past its log end: it answers OFFSET_OUT_OF_RANGE at once)."""

StartOffset = int | Literal["earliest", "latest"]
OutOfRangePolicy = Literal["raise", "earliest", "latest"]


@dataclass(slots=True)
class FetchResult:
    """One fetch's answer (:meth:`Fetcher.fetch <metaq.client.Fetcher.fetch>`): the messages and where to fetch next."""

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
    behind: bool = False
    """Read from a slave whose log still ends before the asked offset (``log_end_offset`` is the slave's):
    nothing to read there yet; fetch the same offset again."""
    batches: list[MessageBatch] = field(default_factory=list)
    """With ``fetch(..., columns=True)``: the records as checked :class:`MessageBatch` views, in offset
    order (``messages`` is then empty: iterate the views for Messages)."""


class Fetcher:
    """One fetch request, checked and decoded. Knows nothing of groups or offsets storage."""

    def __init__(self, core: ClientCore, *, verify_crc: bool = True) -> None:
        self._core = core
        self.verify_crc = verify_crc

    async def fetch(self, topic: str, partition: PartitionKey, offset: int, *,
                    max_bytes: int = DEFAULT_FETCH_MAX_BYTES, max_wait_ms: int = 0, group: str = "",
                    connection: BrokerConnection | None = None, replica: ReadReplica | None = None,
                    columns: bool = False) -> FetchResult:
        """Fetch once. Raises OffsetOutOfRangeError carrying ``earliest``/``latest`` when the offset
        is outside the partition (and the broker does not reset it), and the broker's other errors.

        ``replica``: the copy ``connection`` reaches (None: the master, or, with no ``connection``
        either, the copy the session's ``read_from`` chooses). From a slave, an offset past the slave's
        log end is not out of range: the slave is behind, so the fetch waits for it up to
        ``max_wait_ms`` and returns no messages (``behind``) if it has not caught up by then.

        ``columns``: return the records as :class:`MessageBatch` views (``batches``) instead of Messages.
        """
        answer, p = await self._response(topic, partition, offset, max_bytes, max_wait_ms, group, connection, replica)
        if isinstance(answer, FetchResult):
            return answer
        return self.decode_response(answer, topic, p, offset, columns)

    async def _response(self, topic: str, partition: PartitionKey, offset: int, max_bytes: int, max_wait_ms: int,
                        group: str, connection: BrokerConnection | None, replica: ReadReplica | None
                        ) -> tuple[FetchResponse | FetchResult, Partition]:
        """The first half of :meth:`fetch`: the broker's reply, records not checked yet (a slave still behind
        ``offset``: the empty ``behind`` result), and the partition. :meth:`decode_response` is the second."""
        if max_bytes <= 0:
            raise InvalidArgument(f"max_bytes must be > 0, not {max_bytes}")
        if offset < 0:
            raise InvalidArgument(f"offset must be >= 0, not {offset}")
        p = await self._core.partition(topic, partition)
        if connection is None and replica is None and self._core.reads_slaves:
            replica = self._core.read_replica(topic, p)
        if connection is not None:
            conn = connection
        elif replica is not None:
            conn = await self._core.read_connection(replica)
        else:
            conn = await self._core.connection(p.broker_id)
        if replica is not None and replica.is_slave:
            return await self._fetch_slave(conn, replica, topic, p, offset, max_bytes, max_wait_ms, group), p
        timeout_s = self._core.config.request_timeout_s + max_wait_ms / 1000.0
        req = FetchRequest(topic, p.partition, offset, max_bytes, max_wait_ms, group)
        try:
            resp: FetchResponse = await conn.request(req, timeout_s)
        except OffsetOutOfRangeError as exc:
            await self._attach_range(exc, topic, p)
            raise
        return resp, p

    def _submit(self, conn: BrokerConnection, topic: str, p: Partition, offset: int, max_bytes: int,
                max_wait_ms: int, group: str) -> asyncio.Future[Any]:
        """Write a fetch to a master now (on the socket before this returns, not at the end of the loop
        step); :meth:`_submitted` awaits its reply."""
        req = FetchRequest(topic, p.partition, offset, max_bytes, max_wait_ms, group)
        future = conn.submit(req, self._core.config.request_timeout_s + max_wait_ms / 1000.0)
        conn.flush()
        return future

    async def _submitted(self, future: asyncio.Future[Any], topic: str, p: Partition) -> FetchResponse:
        try:
            resp: FetchResponse = raise_for_error(await future)
        except OffsetOutOfRangeError as exc:
            await self._attach_range(exc, topic, p)
            raise
        return resp

    def decode_response(self, resp: FetchResponse, topic: str, p: Partition, offset: int,
                        columns: bool = False) -> FetchResult:
        """The records of a fetch reply to ``offset`` checked and decoded (the second half of :meth:`fetch`)."""
        start = resp.reset_offset if resp.reset_offset >= 0 else offset
        records = resp.records
        if resp.reset_offset >= 0:
            log.warning("offset %d of %s:%s was out of range; the broker served from %d", offset, topic, p,
                        resp.reset_offset)
        return self._decoded(records, topic, p, start, resp.log_start_offset, resp.log_end_offset, resp.reset_offset,
                             columns)

    def _decoded(self, records: bytes | memoryview, topic: str, p: Partition, start: int, log_start: int,
                 log_end: int, reset_offset: int, columns: bool = False) -> FetchResult:
        if columns:
            batches, next_offset = decode_fetched_batches(records, topic, p.partition, start, self.verify_crc,
                                                          p.broker_id)
            return FetchResult([], next_offset, log_start, log_end, reset_offset,
                               partial=bool(records) and not batches and next_offset == start, batches=batches)
        messages, next_offset = decode_fetched(records, topic, p.partition, start, self.verify_crc, p.broker_id)
        return FetchResult(messages, next_offset, log_start, log_end, reset_offset,
                           partial=bool(records) and not messages and next_offset == start)

    async def fetch_many(self, conn: BrokerConnection, wanted: list[tuple[str, Partition, int, int]], *,
                         max_wait_ms: int = 0, max_bytes: int = DEFAULT_MULTI_FETCH_MAX_BYTES, min_bytes: int = 1,
                         group: str = "", columns: bool = False) -> list[FetchResult | MetaqError]:
        """One MultiFetch over ``conn`` (a master's connection; ``conn.supports(MULTI_FETCH_API_KEY)``).

        ``wanted``: (topic, partition, offset, max_bytes) of partitions of that broker, each at most once.
        Returns, in the same order, each partition's result or its error (OffsetOutOfRangeError with
        ``earliest``/``latest``, StoredDataCorruptError, a CorruptRecordError of a batch that fails its
        check here, ...), as :meth:`fetch` would raise it: one partition's error never fails the others.
        An error of the whole request (a limit, a lost connection) is raised. ``columns``: as for :meth:`fetch`.
        """
        if not wanted:
            return []
        req = MultiFetchRequest(max_wait_ms, min_bytes, max_bytes, group,
                                [FetchPartition(t, p.partition, offset, pmax) for t, p, offset, pmax in wanted])
        resp: MultiFetchResponse = await conn.request(req, self._core.config.request_timeout_s + max_wait_ms / 1000.0)
        if len(resp.partitions) != len(wanted):
            raise ConnectionClosedError(f"broker {conn.address} answered a MultiFetch of {len(wanted)} partitions "
                                        f"with {len(resp.partitions)}")
        out: list[FetchResult | MetaqError] = []
        for (topic, p, offset, _pmax), got in zip(wanted, resp.partitions, strict=True):
            try:
                out.append(self._result(topic, p, offset, got, columns))
            except (BrokerError, CorruptRecordError) as exc:
                out.append(exc)
        return out

    def _result(self, topic: str, p: Partition, offset: int, got: FetchedPartition,
                columns: bool = False) -> FetchResult:
        raise_for_error(got, f"Fetch {topic}:{p} at offset {offset}")
        start = got.reset_offset if got.reset_offset >= 0 else offset
        if got.reset_offset >= 0:
            log.warning("offset %d of %s:%s was out of range; the broker served from %d", offset, topic, p,
                        got.reset_offset)
        records = got.records
        if not records:  # most partitions of a long poll's reply: nothing to decode
            return FetchResult([], start, got.log_start_offset, got.log_end_offset, got.reset_offset)
        return self._decoded(records, topic, p, start, got.log_start_offset, got.log_end_offset, got.reset_offset,
                             columns)

    async def _fetch_slave(self, conn: BrokerConnection, replica: ReadReplica, topic: str, p: Partition, offset: int,
                           max_bytes: int, max_wait_ms: int, group: str) -> FetchResponse | FetchResult:
        """A fetch from a slave: its reply, or, while the slave's log ends before ``offset`` (it is behind its
        master), a wait for it of up to ``max_wait_ms`` (polling; the slave's own long poll takes over
        once it reaches ``offset``), then an empty ``behind`` result. Never a jump or a reset: a slave's
        end is not the partition's end. A failing slave is passed over for a while."""
        deadline = time.monotonic() + max_wait_ms / 1000.0
        poll_s = BEHIND_POLL_MIN_S
        while True:
            wait_ms = max(0, int((deadline - time.monotonic()) * 1000))
            req = FetchRequest(topic, p.partition, offset, max_bytes, wait_ms, group)
            try:
                resp: FetchResponse = await conn.request(req, self._core.config.request_timeout_s + wait_ms / 1000.0)
            except OffsetOutOfRangeError as exc:
                if exc.latest < 0 or offset <= exc.latest:  # below the slave's log start: as from a master
                    raise
                start, end = exc.earliest, exc.latest
            except (ConnectionClosedError, RequestTimeoutError, BrokerError):
                self._core.replica_failed(replica)
                raise
            else:
                if not 0 <= resp.reset_offset < offset:
                    return resp
                start, end = resp.log_start_offset, resp.log_end_offset  # updateConsumerOffsets on the slave
            log.debug("%s:%s: %s ends at %d, behind offset %d: waiting for it", topic, p, replica, end, offset)
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                return FetchResult([], offset, start, end, behind=True)
            await asyncio.sleep(min(poll_s, remaining_s))
            poll_s = min(poll_s * 2, BEHIND_POLL_MAX_S)

    async def _attach_range(self, exc: OffsetOutOfRangeError, topic: str, p: Partition) -> None:
        if exc.earliest >= 0 and exc.latest >= 0:
            return  # the broker's reply carried the range
        try:
            exc.earliest, exc.latest = await offsets_of(self._core, topic, p)
        except Exception:  # the range is a courtesy; the out-of-range error is what matters
            pass


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


async def offsets_of(core: ClientCore, topic: str, partition: Partition) -> tuple[int, int]:
    resp: ListOffsetsResponse = await core.request(
        ListOffsetsRequest(topic, partition.partition, LATEST_TIMESTAMP), partition.broker_id)
    return resp.log_start_offset, resp.log_end_offset


async def read_request(core: ClientCore, topic: str, partition: Partition, request: ListOffsetsRequest
                       ) -> ListOffsetsResponse:
    """A ListOffsets to the copy consumers read (``read_from``): the master, or a slave, whose earliest and
    latest are its own (a slave's latest may be behind the master's)."""
    if not core.reads_slaves:
        if core.registry is not None:
            core.read_replica(topic, partition)  # ConnectionClosedError (retriable) while its broker is unregistered
        response: ListOffsetsResponse = await core.request(request, partition.broker_id)
        return response
    replica = core.read_replica(topic, partition)
    conn = await core.read_connection(replica)
    try:
        response = await conn.request(request)
    except (ConnectionClosedError, RequestTimeoutError):
        core.replica_failed(replica)
        raise
    return response


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

