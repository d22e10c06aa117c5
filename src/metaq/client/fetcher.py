"""One fetch, checked: the reusable :class:`Fetcher` every consumer reads with (the pull consumer, the
group consumer, Spark's readers), and :class:`FetchResult`, what it answers.

A fetch asks one partition for the batches from ``offset`` on, up to ``max_bytes``; the broker may
hold it up to ``max_wait_ms`` while nothing is there yet (long polling). The reply is stored batches
as they are on disk: the first may start before ``offset`` and the last may be cut off, so the client
checks every CRC, drops what is below ``offset`` and what is cut off, and computes the next offset.
From a slave (``read_from``), an offset past the slave's log end is waited for, never jumped over or reset.

A multi-partition fetch (:meth:`Fetcher.fetch_many`; the MultiFetch API of brokers that serve it) asks
many partitions of one broker in one request and long-polls until any of them has data; its reply may
overtake other replies, so it shares a connection without holding it up.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from metaq.client.core import ClientCore
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
from metaq.protocol.messages import (
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
from metaq.protocol.records import MessageBatch, decode_fetched, decode_fetched_batches
from metaq.types import Message, PartitionKey

# The consumer's logger (what users configure to see fetches), whichever of its modules logs.
log = logging.getLogger("metaq.client.consumer")

DEFAULT_FETCH_MAX_BYTES = 1024 * 1024
DEFAULT_MULTI_FETCH_MAX_BYTES = 4 * 1024 * 1024
"""A multi-partition fetch's whole reply (each partition is capped by its own max_bytes too)."""
MULTI_FETCH_API_KEY = MultiFetchRequest.API_KEY
BEHIND_POLL_MIN_S = 0.02
BEHIND_POLL_MAX_S = 0.5
"""A slave behind the consumer's offset is asked again after 20 ms, doubling up to 0.5 s (it cannot
long-poll an offset past its log end: it answers OFFSET_OUT_OF_RANGE at once)."""


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
        if connection is None and replica is None and self._core.reads_slaves_of(p.broker_id):
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


async def offsets_of(core: ClientCore, topic: str, partition: Partition) -> tuple[int, int]:
    resp: ListOffsetsResponse = await core.request(
        ListOffsetsRequest(topic, partition.partition, LATEST_TIMESTAMP), partition.broker_id)
    return resp.log_start_offset, resp.log_end_offset


async def read_request(core: ClientCore, topic: str, partition: Partition, request: ListOffsetsRequest
                       ) -> ListOffsetsResponse:
    """A ListOffsets to the copy consumers read (``read_from``): the master, or a slave, whose earliest and
    latest are its own (a slave's latest may be behind the master's)."""
    if not core.reads_slaves_of(partition.broker_id):
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
