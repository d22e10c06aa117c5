"""A blocking metaq client: request helpers and routing over :mod:`metaq.net.blocking`'s connections.

It exists for places where an event loop is a nuisance: Spark executors (one short task, one thread,
forked Python workers), scripts and tests. It speaks exactly the protocol the asyncio client speaks,
because its connections drive the same codec with the same handshake and error replies.

Requests on one connection are answered in order, so pipelining is simply "write several frames, then
read as many replies" (:meth:`BlockingClient.request_many`, :meth:`BlockingClient.produce_many`), with a
bounded window so a slow broker pushes back instead of letting requests pile up in memory.

Producing (:meth:`BlockingClient.iter_produce`) keeps the asyncio producer's guarantees (docs/producer.md): a
batch refused before the append, or never written because its broker could not be reached, is sent again, in
order, within ``delivery_timeout_ms`` (waiting for the broker meanwhile), and never behind a later batch of its
partition that was stored; a failure says whether the batch may have been stored (``error.maybe_stored``).

Routing: a partition is ``brokerId-partition`` (:class:`~metaq.types.PartitionId`); requests about it go
to its own broker (a connection is opened on first use; with one broker that is the bootstrap connection
itself). ``servers`` lists every broker: the first that answers is the bootstrap broker (it gets
produce requests for partition -1), metadata is asked of every server and merged as the asyncio client
does (standalone brokers each answer for their own partitions), and a broker id is looked for among the
servers when it is first needed. A bare partition number is accepted where exactly one broker has it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from metaq.client.metadata import KeySpace, merge_metadata, resolve_partition
from metaq.errors import (
    NONE,
    BrokerError,
    ConnectionClosedError,
    DeliveryTimeoutError,
    InvalidArgument,
    MetaqError,
    RequestTimeoutError,
    UnknownPartitionError,
    UnknownServerError,
    UnknownTopicError,
    WouldReorderError,
    error_for_code,
)
from metaq.net.blocking import BlockingConnection, BlockingPool
from metaq.net.codec import ConnectionSettings, raise_for_error
from metaq.net.servers import DEFAULT_SERVERS, Address, format_address, parse_servers
from metaq.net.tls import ClientTls
from metaq.protocol.codec import DEFAULT_MAX_FRAME_BYTES, DEFAULT_MAX_IN_FLIGHT
from metaq.protocol.messages import (
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    MetadataRequest,
    MetadataResponse,
    ProduceRequest,
    ProduceResponse,
    TopicInfo,
)
from metaq.types import PartitionId, PartitionKey, partition_key

DEFAULT_WINDOW = 16
"""Requests written ahead of their replies in the pipelined calls."""


def _describe(request: Any) -> str:
    name = type(request).__name__.removesuffix("Request")
    topic = getattr(request, "topic", None)
    partition = getattr(request, "partition", None)
    if isinstance(topic, str) and isinstance(partition, int):
        return f"{name} {topic}-{partition}"
    return name


@dataclass(frozen=True, slots=True)
class ProduceItem:
    """One batch for :meth:`BlockingClient.produce_many`: ``partition`` is a PartitionId, ``"b-p"``, an
    unambiguous number, or -1 (the bootstrap broker picks)."""

    topic: str
    partition: PartitionKey
    records: bytes


class PendingFetch:
    """A fetch written ahead of its reply (:meth:`BlockingClient.send_fetch`).

    Replies on a connection come in request order, so the reply must be taken (:meth:`result`) or given
    up (:meth:`cancel`) before anything else is asked of the partition's broker.
    """

    __slots__ = ("_conn", "_what", "done", "max_bytes", "offset")

    def __init__(self, conn: BlockingConnection, what: str, offset: int, max_bytes: int) -> None:
        self._conn = conn
        self._what = what
        self.offset = offset
        self.max_bytes = max_bytes
        self.done = False

    def result(self) -> FetchResponse:
        """The reply (its error code raised as a BrokerError, like :meth:`BlockingClient.fetch`)."""
        if self.done:
            raise InvalidArgument(f"{self._what}: the reply was already taken or given up")
        self.done = True
        return raise_for_error(self._conn.receive(), self._what)

    def cancel(self) -> None:
        """Give the reply up without reading it: the connection is closed (it would otherwise answer the
        next request with this reply); the client opens a new one when it next needs the broker."""
        if not self.done:
            self.done = True
            self._conn.close()


class BlockingClient:
    """A synchronous metaq client on plain sockets (see the module docstring).

    Broker error codes come back as the matching :class:`metaq.errors.BrokerError`; a broker that
    cannot be reached is a :class:`ConnectionClosedError` naming every address tried. Not thread-safe:
    use one client per thread.
    """

    def __init__(self, servers: str = DEFAULT_SERVERS, *, client_id: str = "metaq-blocking",
                 timeout_s: float = 30.0, tls: ClientTls | None = None, username: str | None = None,
                 password: str | None = None, delivery_timeout_ms: float = 120_000.0,
                 retry_backoff_ms: float = 100.0) -> None:
        """``tls``: connect over TLS (the brokers' sslPort) with these CA and client certificate files;
        ``username``/``password``: authenticate every connection (SASL SCRAM-SHA-256); ``delivery_timeout_ms``:
        how long a produced batch may wait for its broker and be sent again (the asyncio producer's option)."""
        self.servers = servers
        self.client_id = client_id
        self.timeout_s = timeout_s
        self.delivery_timeout_s = delivery_timeout_ms / 1000.0
        self.retry_backoff_s = retry_backoff_ms / 1000.0
        settings = ConnectionSettings(client_id, timeout_s, timeout_s, DEFAULT_MAX_IN_FLIGHT, DEFAULT_MAX_FRAME_BYTES,
                                      ssl_context=tls.context() if tls is not None else None,
                                      sasl_username=username, sasl_password=password)
        self._pool = BlockingPool(settings, parse_servers(servers))
        self._advertised: dict[int, Address] = {}
        """broker id -> the address metadata gives for it (used when no server answered as that id)."""
        self._partitions: dict[str, list[PartitionId]] = {}
        """topic -> its partitions (every broker's): its key space (a broker that did not answer keeps its own)."""
        self._key_spaces: KeySpace[PartitionId] = KeySpace()
        self._bootstrap_address, bootstrap = self._pool.first_answering()
        self.broker_id = bootstrap.broker_id

    # -- connections --------------------------------------------------------------------------

    def _bootstrap(self) -> BlockingConnection:
        """The bootstrap broker's connection: reopened, or the first server that answers now."""
        conn = self._pool.cached(self._bootstrap_address)
        if conn is None:
            self._bootstrap_address, conn = self._pool.first_answering()
            self.broker_id = conn.broker_id
        return conn

    def _connection(self, broker_id: int) -> BlockingConnection:
        """The connection to broker ``broker_id``: open, reopened, or found among the servers; never another
        broker's (the bootstrap broker's requests included: a request about a partition names only its number,
        and another broker would act on its own partition of that number)."""
        address = self._pool.servers.address(broker_id) or self._advertised.get(broker_id)
        if address is None and broker_id == self.broker_id:
            address = self._bootstrap_address
        if address is not None:
            try:
                conn = self._pool.get(address)
            except ConnectionClosedError as exc:
                raise ConnectionClosedError(f"cannot reach broker {broker_id}: {exc}") from None
            if conn.broker_id >= 0 and conn.broker_id != broker_id:
                raise ConnectionClosedError(f"cannot reach broker {broker_id}: {format_address(address)} answers as "
                                            f"broker {conn.broker_id} now")
            return conn
        found = self._pool.find(broker_id)  # a standalone broker is known only by the server it is at
        if found is None:
            raise UnknownServerError(f"broker {broker_id} is not among the servers {self.servers!r} that answered")
        return found

    def _route(self, topic: str, partition: PartitionKey) -> tuple[BlockingConnection, int]:
        """The connection to a partition's broker and its number there (-1: the bootstrap broker picks)."""
        if partition == -1:
            return self._bootstrap(), -1
        pid = self.resolve(topic, partition)
        return self._connection(pid.broker_id), pid.partition

    def resolve(self, topic: str, partition: PartitionKey) -> PartitionId:
        """The PartitionId a PartitionId, ``"b-p"`` or bare number names (a number must be unambiguous:
        InvalidArgument naming the candidates otherwise; UnknownPartitionError if none has it)."""
        key = partition_key(partition)
        if isinstance(key, PartitionId):
            return key
        if len(self._pool.servers.servers) == 1 and self._advertised.keys() <= {self.broker_id}:
            # The common case (one broker): every number is its own, no metadata round trip.
            return PartitionId(self.broker_id, key)
        cached = self._partitions.get(topic)
        found = resolve_partition(topic, cached, key) if cached is not None else None
        parts = cached or []
        if found is None:
            parts = self.partitions_for(topic)
            found = resolve_partition(topic, parts, key)
        if found is None:
            raise UnknownPartitionError(f"topic {topic!r} has no partition {key} on servers {self.servers!r} "
                                        f"(it has {[str(p) for p in parts]})")
        return found

    # -- generic requests ---------------------------------------------------------------------

    def request(self, request: Any, *, broker_id: int | None = None) -> Any:
        """Send one request and return its response; a non-zero error code raises."""
        conn = self._bootstrap() if broker_id is None else self._connection(broker_id)
        return raise_for_error(conn.call(request), _describe(request))

    def request_many(self, requests: Iterable[Any], *, window: int = DEFAULT_WINDOW,
                     check: bool = True) -> Iterator[Any]:
        """Responses to ``requests`` in order, pipelined on the bootstrap connection.

        At most ``window`` requests are written ahead of the replies. With ``check`` the first
        error response raises -- after every reply still in flight has been read, so the
        connection stays usable.
        """
        yield from self._pipeline(((self._bootstrap(), r) for r in requests), window, check)

    def iter_requests(self, items: Iterable[tuple[int, Any]], *, window: int = DEFAULT_WINDOW) -> Iterator[Any]:
        """Responses to (broker id, request) pairs in order, pipelined per broker connection (at most
        ``window`` unanswered); the first error raises after the replies in flight are read."""
        yield from self._pipeline(((self._connection(broker_id), r) for broker_id, r in items), window, True)

    def _pipeline(self, items: Iterable[tuple[BlockingConnection, Any]], window: int, check: bool) -> Iterator[Any]:
        if window < 1:
            raise InvalidArgument(f"window must be >= 1; got {window}")
        pending: deque[tuple[BlockingConnection, Any]] = deque()
        error: BaseException | None = None

        def collect() -> Any:
            nonlocal error
            conn, req = pending.popleft()
            resp = conn.receive()
            if check and resp.error_code != NONE and error is None:
                try:
                    raise_for_error(resp, _describe(req))
                except BrokerError as exc:
                    error = exc
            return resp

        try:
            for conn, req in items:
                if error is not None:
                    break
                if conn.closed:
                    conn = self._connection(conn.broker_id)
                conn.send(req)
                pending.append((conn, req))
                while len(pending) >= window:
                    resp = collect()
                    if error is None:
                        yield resp
            while pending:
                resp = collect()
                if error is None:
                    yield resp
        finally:
            # A consumer that stops early (or an exception) leaves replies in flight: the codec
            # would then mismatch correlation ids, so drop those connections.
            for conn, _req in pending:
                conn.close()
        if error is not None:
            raise error

    # -- typed helpers ------------------------------------------------------------------------

    def metadata(self, topics: list[str] | None = None) -> MetadataResponse:
        """Brokers and topics, merged from every server (those that fail are left out unless all do);
        remembers each topic's partitions for routing."""
        if len(self._pool.servers.servers) == 1:
            response: MetadataResponse = self.request(MetadataRequest(topics))
        else:
            answers: dict[int, MetadataResponse] = {}
            errors: list[MetaqError] = []
            for address in self._pool.servers.servers:
                try:
                    conn = self._pool.get(address)
                    answers.setdefault(conn.broker_id, raise_for_error(conn.call(MetadataRequest(topics)), "Metadata"))
                except (ConnectionClosedError, RequestTimeoutError, BrokerError) as exc:
                    errors.append(exc)
            if not answers:
                raise errors[0]
            response = merge_metadata(sorted(answers.items()))
        for b in response.brokers:
            self._advertised.setdefault(b.broker_id, (b.host, b.port))
        for t in response.topics:
            parts = sorted(PartitionId(p.broker_id, p.partition) for p in t.partitions if p.error_code == NONE)
            self._partitions[t.name] = list(self._key_spaces.update(t.name, parts) or parts)
        return response

    def topic_info(self, topic: str) -> TopicInfo:
        """One topic's metadata; UnknownTopicError (naming the topic and servers) if it does not exist."""
        for t in self.metadata([topic]).topics:
            if t.name == topic:
                if t.error_code != NONE:
                    raise error_for_code(t.error_code, f"topic {topic!r} on servers {self.servers!r}")
                return t
        raise UnknownTopicError(f"topic {topic!r} does not exist on servers {self.servers!r}")

    def partitions_for(self, topic: str) -> list[PartitionId]:
        """The topic's partitions on every broker, ``brokerId-partition``, in (broker id, partition) order: its
        key space, so a broker that does not answer now keeps its partitions (a key hash over them stays put)."""
        self.topic_info(topic)
        parts = self._partitions.get(topic, [])
        if not parts:
            raise UnknownPartitionError(f"topic {topic!r} has no partitions on servers {self.servers!r}")
        return list(parts)

    def list_offsets(self, topic: str, partition: PartitionKey, timestamp_ms: int) -> ListOffsetsResponse:
        """-2 earliest, -1 latest (the next offset to be written), else the first offset at or after it."""
        conn, number = self._route(topic, partition)
        return raise_for_error(conn.call(ListOffsetsRequest(topic, number, timestamp_ms)),
                              f"ListOffsets {topic}:{conn.broker_id}-{number}")

    def list_offsets_many(self, topic: str, partitions: Iterable[PartitionKey],
                          timestamp_ms: int) -> dict[PartitionKey, ListOffsetsResponse]:
        """:meth:`list_offsets` for several partitions, pipelined (one round trip per broker); keyed as
        given."""
        parts = list(partitions)
        items = []
        for p in parts:
            conn, number = self._route(topic, p)
            items.append((conn, ListOffsetsRequest(topic, number, timestamp_ms)))
        return dict(zip(parts, self._pipeline(items, max(1, len(items)), True), strict=True))

    def fetch(self, topic: str, partition: PartitionKey, offset: int, max_bytes: int,
              max_wait_ms: int = 0) -> FetchResponse:
        """Raw batches from ``offset`` (the first may start before it; the last may be cut off)."""
        conn, number = self._route(topic, partition)
        response = conn.call(FetchRequest(topic, number, offset, max_bytes, max_wait_ms))
        return raise_for_error(response, f"Fetch {topic}:{conn.broker_id}-{number} at offset {offset}")

    def send_fetch(self, topic: str, partition: PartitionKey, offset: int, max_bytes: int,
                   max_wait_ms: int = 0) -> PendingFetch:
        """:meth:`fetch` in two halves: the request is written now and its reply read by ``.result()``, so
        that the broker serves the next fetch while the caller works on the last one. Take the reply (or
        ``.cancel()`` it) before asking the same broker anything else."""
        conn, number = self._route(topic, partition)
        conn.send(FetchRequest(topic, number, offset, max_bytes, max_wait_ms))
        return PendingFetch(conn, f"Fetch {topic}:{conn.broker_id}-{number} at offset {offset}", offset, max_bytes)

    def produce(self, topic: str, partition: PartitionKey, batch_bytes: bytes, acks: int = 1,
                timeout_ms: int | None = None) -> ProduceResponse | None:
        """Append one record batch; None with ``acks=0`` (the broker does not answer). Sent again within
        ``delivery_timeout_ms`` while it is certainly not stored (see :meth:`iter_produce`)."""
        if acks == 0:
            conn, number = self._route(topic, partition)
            conn.send(ProduceRequest(topic, number, acks, self._timeout_ms(timeout_ms), batch_bytes),
                      expect_response=False)
            return None
        return next(self.iter_produce([(topic, partition, batch_bytes)], acks, 1, timeout_ms))

    def produce_many(self, items: Iterable[ProduceItem | tuple[str, PartitionKey, bytes]], acks: int = 1,
                     window: int = DEFAULT_WINDOW, timeout_ms: int | None = None) -> list[ProduceResponse]:
        """Send batches pipelined (at most ``window`` unanswered); the replies in order.

        ``items`` may be a generator: later batches are built while earlier ones are on the wire.
        With ``acks=0`` the list is empty. The first error raises after the replies in flight are
        read; batches after it are not sent, batches before it were appended (a retry re-sends them).
        """
        return list(self.iter_produce(items, acks, window, timeout_ms))

    def iter_produce(self, items: Iterable[ProduceItem | tuple[str, PartitionKey, bytes]], acks: int = 1,
                     window: int = DEFAULT_WINDOW, timeout_ms: int | None = None) -> Iterator[ProduceResponse]:
        """:meth:`produce_many` yielding each reply in item order (nothing is sent until iterated).

        With ``acks=1`` the batches in flight are one generation (docs/producer.md): when one is refused before
        the append (``NOT_MASTER``, ``NOT_ENOUGH_REPLICAS``, ``BROKER_STOPPING``...) or cannot be written (its
        broker cannot be reached), every reply of the window is read, then the refused batches go again in item
        order after ``retry_backoff_ms``, until ``delivery_timeout_ms`` (then DeliveryTimeoutError, certainly not
        stored); a refused batch that a later one of its partition was stored before fails with
        WouldReorderError instead. A batch that may have been stored (a lost connection, a late reply) is not
        sent again: its error is raised (``maybe_stored`` True), as any other failure, once the window is read."""
        tmo = self._timeout_ms(timeout_ms)

        def normalized() -> Iterator[tuple[str, PartitionKey, bytes]]:
            for item in items:
                yield item if isinstance(item, tuple) else (item.topic, item.partition, item.records)

        if acks == 0:
            for topic, partition, records in normalized():
                conn, number = self._route(topic, partition)
                conn.send(ProduceRequest(topic, number, acks, tmo, records), expect_response=False)
            return
        yield from _InOrder(self, normalized(), max(1, window), tmo).replies()

    def _timeout_ms(self, timeout_ms: int | None) -> int:
        return int(self.timeout_s * 1000) if timeout_ms is None else timeout_ms

    # -- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Close every connection the client opened."""
        self._pool.close()

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Batch:
    """One batch of :meth:`BlockingClient.iter_produce`: where it goes, its deadline, its outcome so far."""

    __slots__ = ("conn", "deadline", "error", "maybe_stored", "partition", "records", "response", "topic", "where")

    def __init__(self, topic: str, partition: PartitionKey, records: bytes, deadline: float) -> None:
        self.topic, self.partition, self.records, self.deadline = topic, partition, records, deadline
        self.conn: BlockingConnection | None = None
        self.where: tuple[str, int, int] | None = None
        """(topic, broker id, partition) it was written to: what "the same partition" means for the order."""
        self.response: ProduceResponse | None = None
        self.error: BaseException | None = None
        self.maybe_stored = False


class _InOrder:
    """iter_produce with acks=1, the generation rule over its window (see :meth:`BlockingClient.iter_produce`)."""

    def __init__(self, client: BlockingClient, items: Iterator[tuple[str, PartitionKey, bytes]], window: int,
                 timeout_ms: int) -> None:
        self.client, self.items, self.window, self.timeout_ms = client, items, window, timeout_ms
        self.pending: deque[_Batch] = deque()
        """Taken from the items and not yet yielded, in item order."""
        self.unwritten: deque[_Batch] = deque()
        """To write, in item order (what failed and goes again first)."""
        self.inflight: deque[_Batch] = deque()
        self.exhausted = False

    def replies(self) -> Iterator[ProduceResponse]:
        failed = False
        while True:
            if not failed:
                failed = self._fill()
            while self.pending and self.pending[0].response is not None:
                yield self.pending.popleft().response  # type: ignore[misc]
            if self.inflight:
                failed = self._receive(self.inflight.popleft()) or failed
                continue
            if failed:
                self._resolve()  # raises when something cannot go again in order
                failed = False
                continue
            if self.exhausted and not self.unwritten:
                return

    def _fill(self) -> bool:
        """Write while the window has room; True when a batch could not be written (its broker unreachable)."""
        client = self.client
        while len(self.inflight) < self.window:
            if not self.unwritten:
                if self.exhausted:
                    return False
                nxt = next(self.items, None)
                if nxt is None:
                    self.exhausted = True
                    return False
                batch = _Batch(*nxt, time.monotonic() + client.delivery_timeout_s)
                self.pending.append(batch)
                self.unwritten.append(batch)
            batch = self.unwritten[0]
            try:
                conn, number = client._route(batch.topic, batch.partition)
                if conn.in_flight == 0 and conn.peer_closed():  # closed by a broker that went away meanwhile
                    conn, number = client._route(batch.topic, batch.partition)
                conn.send(ProduceRequest(batch.topic, number, 1, self.timeout_ms, batch.records))
            except (ConnectionClosedError, UnknownServerError, RequestTimeoutError) as exc:
                batch.error, batch.maybe_stored = exc, False  # not written (a partial frame is never taken)
                return True
            self.unwritten.popleft()
            batch.conn, batch.where = conn, (batch.topic, conn.broker_id, number)
            self.inflight.append(batch)
        return False

    def _receive(self, batch: _Batch) -> bool:
        """Read one reply; True when the batch failed."""
        assert batch.conn is not None
        try:
            response = batch.conn.receive()
        except (ConnectionClosedError, RequestTimeoutError) as exc:
            batch.error, batch.maybe_stored = exc, True  # in flight when the connection broke, or late
            return True
        if response.error_code == NONE:
            batch.response = response
            return False
        where = f"Produce {batch.topic}:{batch.where[1]}-{batch.where[2]}" if batch.where else "Produce"
        try:
            raise_for_error(response, where)
        except BrokerError as exc:
            batch.error, batch.maybe_stored = exc, exc.maybe_stored
        return True

    def _resolve(self) -> None:
        """Every batch of the window has its outcome: the refused ones go again, in item order, after a back-off;
        anything else raises (the first failure in item order)."""
        now = time.monotonic()
        stored_after: dict[tuple[str, int, int], bool] = {}
        again: list[_Batch] = []
        for batch in reversed(self.pending):  # latest first: what a refused batch would land behind
            if batch.response is not None or batch.error is None:
                if batch.response is not None and batch.where is not None:
                    stored_after[batch.where] = True
                continue
            error = batch.error
            if batch.maybe_stored:
                if batch.where is not None:
                    stored_after[batch.where] = True
                raise error
            if batch.where is not None and stored_after.get(batch.where):
                raise WouldReorderError(f"a batch to {batch.topic} was refused ({error}) and a later batch of its "
                                        "partition was stored (or may have been) first: it was not stored, and is not "
                                        "sent again behind that one", cause=error)
            if not getattr(error, "retriable", False):
                raise error
            if now >= batch.deadline:
                raise DeliveryTimeoutError(f"a batch to {batch.topic} was not stored within delivery_timeout_ms="
                                           f"{self.client.delivery_timeout_s * 1000:g} (last: {error}); it was "
                                           "certainly not stored", maybe_stored=False, cause=error)
            again.append(batch)
        again.reverse()
        for batch in again:
            batch.error = None
        # the refused go first, then what was never written, all in item order
        unwritten = {id(b) for b in self.unwritten}
        self.unwritten = deque(b for b in self.pending if id(b) in unwritten or b in again)
        topics = sorted({b.topic for b in again})
        time.sleep(self.client.retry_backoff_s)  # a back-off before asking the brokers again
        try:
            self.client.metadata(topics)  # where each partition is now (a new master, a broker back)
        except MetaqError:
            pass  # unreachable still: the writes say so again
