"""A blocking metaq client: request helpers and routing over :mod:`metaq.net.blocking`'s connections.

It exists for places where an event loop is a nuisance: Spark executors (one short task, one thread,
forked Python workers), scripts and tests. It speaks exactly the protocol the asyncio client speaks,
because its connections drive the same codec with the same handshake and error replies.

Requests on one connection are answered in order, so pipelining is simply "write several frames, then
read as many replies" (:meth:`BlockingClient.request_many`, :meth:`BlockingClient.produce_many`), with a
bounded window so a slow broker pushes back instead of letting requests pile up in memory.

Routing: a partition is ``brokerId-partition`` (:class:`~metaq.types.PartitionId`); requests about it go
to its own broker (a connection is opened on first use; with one broker that is the bootstrap connection
itself). ``servers`` lists every broker: the first that answers is the bootstrap broker (it gets
produce requests for partition -1), metadata is asked of every server and merged as the asyncio client
does (standalone brokers each answer for their own partitions), and a broker id is looked for among the
servers when it is first needed. A bare partition number is accepted where exactly one broker has it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from metaq.client.metadata import merge_metadata, resolve_partition
from metaq.errors import (
    NONE,
    BrokerError,
    ConnectionClosedError,
    InvalidArgument,
    MetaqError,
    RequestTimeoutError,
    UnknownPartitionError,
    UnknownServerError,
    UnknownTopicError,
    error_for_code,
)
from metaq.net.blocking import BlockingConnection, BlockingPool
from metaq.net.codec import ConnectionSettings, raise_for_error
from metaq.net.servers import DEFAULT_SERVERS, Address, parse_servers
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
                 password: str | None = None) -> None:
        """``tls``: connect over TLS (the brokers' sslPort) with these CA and client certificate files;
        ``username``/``password``: authenticate every connection (SASL SCRAM-SHA-256)."""
        self.servers = servers
        self.client_id = client_id
        self.timeout_s = timeout_s
        settings = ConnectionSettings(client_id, timeout_s, timeout_s, DEFAULT_MAX_IN_FLIGHT, DEFAULT_MAX_FRAME_BYTES,
                                      ssl_context=tls.context() if tls is not None else None,
                                      sasl_username=username, sasl_password=password)
        self._pool = BlockingPool(settings, parse_servers(servers))
        self._advertised: dict[int, Address] = {}
        """broker id -> the address metadata gives for it (used when no server answered as that id)."""
        self._partitions: dict[str, list[PartitionId]] = {}
        """topic -> its partitions (every broker's), from the last metadata asked."""
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
        """The connection to broker ``broker_id``: open, reopened, or found among the servers."""
        if broker_id == self.broker_id:
            return self._bootstrap()
        address = self._pool.servers.address(broker_id) or self._advertised.get(broker_id)
        if address is not None:
            try:
                return self._pool.get(address)
            except ConnectionClosedError as exc:
                raise ConnectionClosedError(f"cannot reach broker {broker_id}: {exc}") from None
        conn = self._pool.find(broker_id)  # a standalone broker is known only by the server it is at
        if conn is None:
            raise UnknownServerError(f"broker {broker_id} is not among the servers {self.servers!r} that answered")
        return conn

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
            self._partitions[t.name] = sorted(PartitionId(p.broker_id, p.partition) for p in t.partitions
                                              if p.error_code == NONE)
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
        """The topic's partitions on every broker, ``brokerId-partition``, in (broker id, partition) order."""
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
        """Append one record batch; None with ``acks=0`` (the broker does not answer)."""
        conn, number = self._route(topic, partition)
        request = ProduceRequest(topic, number, acks, self._timeout_ms(timeout_ms), batch_bytes)
        if acks == 0:
            conn.send(request, expect_response=False)
            return None
        return raise_for_error(conn.call(request), f"Produce {topic}:{conn.broker_id}-{number}")

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
        """:meth:`produce_many` yielding each reply as it arrives (nothing is sent until iterated)."""
        tmo = self._timeout_ms(timeout_ms)

        def requests() -> Iterator[tuple[BlockingConnection, ProduceRequest]]:
            for item in items:
                topic, partition, records = item if isinstance(item, tuple) else (
                    item.topic, item.partition, item.records)
                conn, number = self._route(topic, partition)
                yield conn, ProduceRequest(topic, number, acks, tmo, records)

        if acks == 0:
            for conn, req in requests():
                conn.send(req, expect_response=False)
            return
        yield from self._pipeline(requests(), window, True)

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
