"""A blocking metaq client: one plain socket per broker, driven by the sans-IO :class:`ClientConnection`.

It exists for places where an event loop is a nuisance: Spark executors (one short task, one thread,
forked Python workers), scripts and tests. It speaks exactly the protocol the asyncio client speaks,
because it drives the same codec.

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

import socket
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
    TooManyConnectionsError,
    UnknownPartitionError,
    UnknownServerError,
    UnknownTopicError,
    error_for_code,
)
from metaq.net.servers import DEFAULT_SERVERS, parse_servers
from metaq.protocol.codec import ClientConnection, ResponseEvent
from metaq.protocol.messages import (
    ApiVersionsRequest,
    ApiVersionsResponse,
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
_RECV_BYTES = 1 << 20


def check_response(response: Any, what: str = "") -> Any:
    """Raise the metaq error a response carries (with ``what`` in front of the broker's message)."""
    code = response.error_code
    if code != NONE:
        message = response.error_message or ""
        raise error_for_code(code, f"{what}: {message}" if what else message, response)
    return response


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


class _Link:
    """One socket to one broker plus the codec state for it."""

    def __init__(self, host: str, port: int, client_id: str, timeout_s: float) -> None:
        self.address = f"{host}:{port}"
        self.timeout_s = timeout_s
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.conn = ClientConnection(client_id)
        self.broker_id = -1
        self.closed = False

    def handshake(self, client_software: str) -> ApiVersionsResponse:
        response: ApiVersionsResponse = check_response(self.call(ApiVersionsRequest(client_software)),
                                                       f"ApiVersions with {self.address}")
        self.conn.set_versions({r.api_key: r.max_version for r in response.apis})
        self.broker_id = response.broker_id
        return response

    def send(self, request: Any, expect_response: bool = True) -> None:
        _cid, data = self.conn.send(request, expect_response=expect_response)
        try:
            self.sock.sendall(data)
        except TimeoutError:
            self.close()
            raise RequestTimeoutError(f"writing to broker {self.address} took longer than {self.timeout_s}s") from None
        except OSError as exc:
            self.close()
            raise ConnectionClosedError(f"connection to broker {self.address} failed: {exc}") from None

    def receive(self) -> Any:
        """The response to the oldest request in flight."""
        while True:
            event = self.conn.next_event()
            if isinstance(event, ResponseEvent):
                return event.response
            try:
                data = self.sock.recv(_RECV_BYTES)
            except TimeoutError:
                self.close()
                raise RequestTimeoutError(
                    f"broker {self.address} sent no reply within {self.timeout_s}s") from None
            except OSError as exc:
                self.close()
                raise ConnectionClosedError(f"connection to broker {self.address} failed: {exc}") from None
            if not data:
                self.close()
                raise ConnectionClosedError(f"broker {self.address} closed the connection")
            self.conn.receive_data(data)

    def call(self, request: Any) -> Any:
        self.send(request)
        return self.receive()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.sock.close()
            except OSError:
                pass
            self.conn.clear()


class BlockingClient:
    """A synchronous metaq client on plain sockets (see the module docstring).

    Broker error codes come back as the matching :class:`metaq.errors.BrokerError`; a broker that
    cannot be reached is a :class:`ConnectionClosedError` naming every address tried. Not thread-safe:
    use one client per thread.
    """

    def __init__(self, servers: str = DEFAULT_SERVERS, *, client_id: str = "metaq-blocking",
                 timeout_s: float = 30.0) -> None:
        self.servers = servers
        self.client_id = client_id
        self.timeout_s = timeout_s
        self._addresses = parse_servers(servers)
        self._links: dict[int, _Link] = {}
        self._brokers: dict[int, tuple[str, int]] = {}
        """broker id -> the address to reach it at (a server it answered on, else the advertised one)."""
        self._reached: set[tuple[str, int]] = set()
        self._partitions: dict[str, list[PartitionId]] = {}
        """topic -> its partitions (every broker's), from the last metadata asked."""
        self._bootstrap = self._connect_any()
        self.broker_id = self._bootstrap.broker_id
        self._adopt(self._bootstrap)

    # -- connections --------------------------------------------------------------------------

    def _open(self, host: str, port: int) -> _Link:
        """A handshaken link to one server (OSError or the broker's MetaqError if it cannot be had)."""
        link = _Link(host, port, self.client_id, self.timeout_s)
        try:
            link.handshake(self.client_id)
        except BaseException:
            link.close()
            raise
        return link

    def _adopt(self, link: _Link) -> None:
        host, _, port = link.address.rpartition(":")
        self._reached.add((host, int(port)))
        if link.broker_id >= 0:
            self._brokers[link.broker_id] = (host, int(port))
            old = self._links.get(link.broker_id)
            if old is not None and old is not link and not old.closed and old is not self._bootstrap:
                old.close()
            self._links[link.broker_id] = link

    def _connect_any(self) -> _Link:
        failures: list[str] = []
        refusals = 0
        for host, port in self._addresses:
            try:
                link = self._open(host, port)
            except OSError as exc:
                failures.append(f"{host}:{port} ({exc.strerror or exc})")
                continue
            except MetaqError as exc:
                failures.append(f"{host}:{port} ({exc})")
                refusals += isinstance(exc, TooManyConnectionsError)
                continue
            return link
        if refusals == len(failures):  # every broker is up but full: say so, it is not a network problem
            raise TooManyConnectionsError(
                f"every metaq broker in servers={self.servers!r} refused the connection: {'; '.join(failures)}")
        raise ConnectionClosedError(
            f"cannot reach any metaq broker in servers={self.servers!r}: {'; '.join(failures)}")

    def _bootstrap_link(self) -> _Link:
        if self._bootstrap.closed:
            self._bootstrap = self._connect_any()
            self.broker_id = self._bootstrap.broker_id
            self._adopt(self._bootstrap)
        return self._bootstrap

    def _link_for_broker(self, broker_id: int) -> _Link:
        """The connection to broker ``broker_id``: open, reopened, or found among the servers."""
        link = self._links.get(broker_id)
        if link is not None and not link.closed:
            return link
        if broker_id == self.broker_id:
            return self._bootstrap_link()
        address = self._brokers.get(broker_id)
        if address is not None:
            try:
                link = self._open(*address)
            except OSError as exc:
                raise ConnectionClosedError(f"cannot reach broker {broker_id} at {address[0]}:{address[1]}: "
                                            f"{exc}") from None
            self._adopt(link)
            return link
        for host, port in self._addresses:  # a standalone broker is known only by the server it is at
            if (host, port) in self._reached:
                continue
            try:
                link = self._open(host, port)
            except (OSError, MetaqError):
                continue
            self._adopt(link)
            if link.broker_id == broker_id:
                return link
        raise UnknownServerError(f"broker {broker_id} is not among the servers {self.servers!r} that answered")

    def _route(self, topic: str, partition: PartitionKey) -> tuple[_Link, int]:
        """The connection to a partition's broker and its number there (-1: the bootstrap broker picks)."""
        if partition == -1:
            return self._bootstrap_link(), -1
        pid = self.resolve(topic, partition)
        return self._link_for_broker(pid.broker_id), pid.partition

    def resolve(self, topic: str, partition: PartitionKey) -> PartitionId:
        """The PartitionId a PartitionId, ``"b-p"`` or bare number names (a number must be unambiguous:
        InvalidArgument naming the candidates otherwise; UnknownPartitionError if none has it)."""
        key = partition_key(partition)
        if isinstance(key, PartitionId):
            return key
        if len(self._addresses) == 1 and len(self._brokers) <= 1:
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
        link = self._bootstrap_link() if broker_id is None else self._link_for_broker(broker_id)
        return check_response(link.call(request), _describe(request))

    def request_many(self, requests: Iterable[Any], *, window: int = DEFAULT_WINDOW,
                     check: bool = True) -> Iterator[Any]:
        """Responses to ``requests`` in order, pipelined on the bootstrap connection.

        At most ``window`` requests are written ahead of the replies. With ``check`` the first
        error response raises -- after every reply still in flight has been read, so the
        connection stays usable.
        """
        yield from self._pipeline(((self._bootstrap_link(), r) for r in requests), window, check)

    def _pipeline(self, items: Iterable[tuple[_Link, Any]], window: int, check: bool) -> Iterator[Any]:
        if window < 1:
            raise InvalidArgument(f"window must be >= 1; got {window}")
        pending: deque[tuple[_Link, Any]] = deque()
        error: BaseException | None = None

        def collect() -> Any:
            nonlocal error
            link, req = pending.popleft()
            resp = link.receive()
            if check and resp.error_code != NONE and error is None:
                try:
                    check_response(resp, _describe(req))
                except BrokerError as exc:
                    error = exc
            return resp

        try:
            for link, req in items:
                if error is not None:
                    break
                if link.closed:
                    link = self._link_for_broker(link.broker_id)
                link.send(req)
                pending.append((link, req))
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
            for link, _req in pending:
                link.close()
        if error is not None:
            raise error

    # -- typed helpers ------------------------------------------------------------------------

    def metadata(self, topics: list[str] | None = None) -> MetadataResponse:
        """Brokers and topics, merged from every server (those that fail are left out unless all do);
        remembers each topic's partitions for routing."""
        if len(self._addresses) == 1:
            response: MetadataResponse = self.request(MetadataRequest(topics))
        else:
            answers: dict[int, MetadataResponse] = {}
            errors: list[MetaqError] = []
            for host, port in self._addresses:
                link = next((li for li in self._links.values() if li.address == f"{host}:{port}" and not li.closed),
                            None)
                try:
                    if link is None:
                        link = self._open(host, port)
                        self._adopt(link)
                    answers.setdefault(link.broker_id, check_response(link.call(MetadataRequest(topics)), "Metadata"))
                except (OSError, ConnectionClosedError, RequestTimeoutError, BrokerError) as exc:
                    errors.append(exc if isinstance(exc, MetaqError) else ConnectionClosedError(
                        f"cannot reach metaq broker {host}:{port}: {exc}"))
            if not answers:
                raise errors[0]
            response = merge_metadata(sorted(answers.items()))
        for b in response.brokers:
            self._brokers.setdefault(b.broker_id, (b.host, b.port))
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
        link, number = self._route(topic, partition)
        return check_response(link.call(ListOffsetsRequest(topic, number, timestamp_ms)),
                              f"ListOffsets {topic}:{link.broker_id}-{number}")

    def list_offsets_many(self, topic: str, partitions: Iterable[PartitionKey],
                          timestamp_ms: int) -> dict[PartitionKey, ListOffsetsResponse]:
        """:meth:`list_offsets` for several partitions, pipelined (one round trip per broker); keyed as
        given."""
        parts = list(partitions)
        items = []
        for p in parts:
            link, number = self._route(topic, p)
            items.append((link, ListOffsetsRequest(topic, number, timestamp_ms)))
        return dict(zip(parts, self._pipeline(items, max(1, len(items)), True), strict=True))

    def fetch(self, topic: str, partition: PartitionKey, offset: int, max_bytes: int,
              max_wait_ms: int = 0) -> FetchResponse:
        """Raw batches from ``offset`` (the first may start before it; the last may be cut off)."""
        link, number = self._route(topic, partition)
        response = link.call(FetchRequest(topic, number, offset, max_bytes, max_wait_ms))
        return check_response(response, f"Fetch {topic}:{link.broker_id}-{number} at offset {offset}")

    def produce(self, topic: str, partition: PartitionKey, batch_bytes: bytes, acks: int = 1,
                timeout_ms: int | None = None) -> ProduceResponse | None:
        """Append one record batch; None with ``acks=0`` (the broker does not answer)."""
        link, number = self._route(topic, partition)
        request = ProduceRequest(topic, number, acks, self._timeout_ms(timeout_ms), batch_bytes)
        if acks == 0:
            link.send(request, expect_response=False)
            return None
        return check_response(link.call(request), f"Produce {topic}:{link.broker_id}-{number}")

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

        def requests() -> Iterator[tuple[_Link, ProduceRequest]]:
            for item in items:
                topic, partition, records = item if isinstance(item, tuple) else (
                    item.topic, item.partition, item.records)
                link, number = self._route(topic, partition)
                yield link, ProduceRequest(topic, number, acks, tmo, records)

        if acks == 0:
            for link, req in requests():
                link.send(req, expect_response=False)
            return
        yield from self._pipeline(requests(), window, True)

    def _timeout_ms(self, timeout_ms: int | None) -> int:
        return int(self.timeout_s * 1000) if timeout_ms is None else timeout_ms

    # -- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        for link in list(self._links.values()):
            link.close()
        self._bootstrap.close()
        self._links.clear()
        self._reached.clear()

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
