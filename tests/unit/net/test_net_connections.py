"""metaq.net's connections and pools, asyncio and blocking alike, against scripted loopback servers.

The two connection kinds drive one codec with one handshake and one error mapping; these tests hold
them to the same behaviour: version agreement, a broker error with the reply attached, a reply that does
not match closing the connection, a refusal for being full, and the pools' walk over the servers.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from spark_fake_broker import FakeBroker

from metaq.errors import (
    ConnectionClosedError,
    DuplicateBrokerIdError,
    RequestTimeoutError,
    TooManyConnectionsError,
    TooManyRequestsError,
    UnknownTopicError,
)
from metaq.net.blocking import BlockingConnection, BlockingPool
from metaq.net.codec import ConnectionSettings, raise_for_error
from metaq.net.connection import BrokerConnection
from metaq.net.discovery import ServerBook, WalkFailures
from metaq.net.pool import ConnectionPool
from metaq.net.retry import RetryPolicy
from metaq.net.servers import Address, parse_servers
from metaq.protocol import messages as m
from metaq.protocol.codec import NEED_DATA, ServerConnection
from metaq.testing.ports import unused_port

SETTINGS = ConnectionSettings("net-test", connect_timeout_s=2.0, request_timeout_s=2.0, max_in_flight=8,
                              max_frame_bytes=1 << 20)
FULL = "the broker already has 3 connections open (maxConnections=3); close idle ones or retry later"


class ScriptedServer(FakeBroker):
    """A loopback server whose ``answer(codec, request)`` gives the bytes to send back (None: stay silent)."""

    def __init__(self, answer: Callable[[ServerConnection, Any], bytes | None]) -> None:
        self.answer = answer
        super().__init__()
        self.address: Address = ("127.0.0.1", self.port)

    def _serve(self, conn: socket.socket) -> None:
        codec = ServerConnection()
        try:
            while data := conn.recv(1 << 16):
                codec.receive_data(data)
                while (event := codec.next_event()) is not NEED_DATA:
                    reply = self.answer(codec, event)
                    if reply is not None:
                        conn.sendall(reply)
        except OSError:
            pass


def handshake_then(after: Callable[[ServerConnection, Any], bytes | None]) -> Callable[[ServerConnection, Any],
                                                                                        bytes | None]:
    """Answer ApiVersions as broker 5, then hand requests to ``after``."""
    def answer(codec: ServerConnection, event: Any) -> bytes | None:
        if isinstance(event.request, m.ApiVersionsRequest):
            apis = [m.ApiVersionRange(k, s.min_version, s.max_version) for k, s in m.APIS.items()]
            return codec.encode_response(event.header, m.ApiVersionsResponse(broker_id=5, server_version="scripted",
                                                                            apis=apis))
        return after(codec, event)
    return answer


def refuse_full(codec: ServerConnection, event: Any) -> bytes:
    return codec.encode_response(event.header, m.error_response(event.header.api_key, TooManyConnectionsError.code,
                                                                FULL))


def unknown_topic(codec: ServerConnection, event: Any) -> bytes:
    return codec.encode_response(event.header, m.MetadataResponse(
        brokers=[], topics=[m.TopicInfo("t", UnknownTopicError.code, [])], error_code=UnknownTopicError.code,
        error_message="topic 't' does not exist"))


def wrong_correlation(codec: ServerConnection, event: Any) -> bytes:
    reply = bytearray(codec.encode_response(event.header, m.MetadataResponse()))
    reply[4:8] = (event.header.correlation_id + 7).to_bytes(4, "big")  # after the 4-byte frame length
    return bytes(reply)


@pytest.fixture
def servers() -> Iterator[Callable[..., ScriptedServer]]:
    made: list[ScriptedServer] = []

    def make(answer: Callable[[ServerConnection, Any], bytes | None]) -> ScriptedServer:
        made.append(ScriptedServer(answer))
        return made[-1]

    yield make
    for s in made:
        s.stop()


def dead() -> Address:
    return ("127.0.0.1", unused_port())


# -- the sans-IO bookkeeping --------------------------------------------------------------------------------


def test_server_book_learns_only_its_servers() -> None:
    a, b, other = ("h", 1), ("h", 2), ("x", 9)
    book = ServerBook([a, b])
    assert book.unreached() == [a, b] and book.text == "h:1,h:2"
    book.learn(b, 7)
    book.learn(other, 8)  # not a server: metadata's business, not the book's
    book.learn(a, -1)
    assert book.unreached() == [a] and book.ids == {b: 7}
    assert book.address(7) == b and book.address(8) is None and book.broker_id(b) == 7
    book.learn(b, 9)  # restarted with another id
    assert book.address(7) is None and book.address(9) == b


def test_server_book_refuses_a_second_server_answering_with_a_known_broker_id() -> None:
    a, b = ("h", 1), ("h", 2)
    book = ServerBook([a, b])
    book.learn(a, 0)
    book.learn(a, 0)  # the same server again: nothing wrong
    with pytest.raises(DuplicateBrokerIdError, match=r"^servers h:1 and h:2 both answer as broker id 0"):
        book.learn(b, 0)
    assert book.ids == {a: 0} and book.unreached() == [b]  # the second one is not learnt
    book.learn(a, 3)  # a restarted with another id: 0 is free for b now
    book.learn(b, 0)
    assert book.ids == {a: 3, b: 0}


def test_walk_failures_say_too_many_connections_only_when_every_server_was_full() -> None:
    failures = WalkFailures("a:1,b:2")
    failures.add(TooManyConnectionsError(f"broker a:1: {FULL}"))
    assert isinstance(failures.error(), TooManyConnectionsError)
    failures.add(ConnectionClosedError("cannot connect to broker b:2: refused"))
    error = failures.error()
    assert type(error) is ConnectionClosedError
    assert str(error) == (f"cannot reach any metaq broker in servers='a:1,b:2': [TOO_MANY_CONNECTIONS] broker a:1: "
                          f"{FULL}; cannot connect to broker b:2: refused")


# -- both connection kinds behave alike ----------------------------------------------------------------------


def open_async(address: Address) -> Any:
    async def main() -> Any:
        conn = await BrokerConnection.open(address, SETTINGS)
        try:
            return conn.broker_id, conn.server_version, await conn.request(m.MetadataRequest(["t"]))
        finally:
            conn.close()
    return asyncio.run(main())


def open_blocking(address: Address) -> Any:
    conn = BlockingConnection.open(address, SETTINGS)
    try:
        return conn.broker_id, conn.server_version, raise_for_error(conn.call(m.MetadataRequest(["t"])))
    finally:
        conn.close()


KINDS = pytest.mark.parametrize("open_and_ask", [open_async, open_blocking], ids=["asyncio", "blocking"])


@KINDS
def test_handshake_then_an_error_reply_raises_with_the_reply_attached(servers: Any, open_and_ask: Any) -> None:
    server = servers(handshake_then(unknown_topic))
    with pytest.raises(UnknownTopicError, match="topic 't' does not exist") as info:
        open_and_ask(server.address)
    assert isinstance(info.value.response, m.MetadataResponse)  # type: ignore[attr-defined]


@KINDS
def test_a_reply_that_does_not_match_closes_the_connection(servers: Any, open_and_ask: Any) -> None:
    server = servers(handshake_then(wrong_correlation))
    with pytest.raises(ConnectionClosedError, match="malformed or unexpected reply"):
        open_and_ask(server.address)


@KINDS
def test_a_full_broker_is_too_many_connections_naming_it(servers: Any, open_and_ask: Any) -> None:
    server = servers(refuse_full)
    with pytest.raises(TooManyConnectionsError, match=rf"broker 127.0.0.1:{server.address[1]}: .*maxConnections=3"):
        open_and_ask(server.address)


@KINDS
def test_nothing_listening_is_connection_closed(open_and_ask: Any) -> None:
    address = dead()
    with pytest.raises(ConnectionClosedError, match=rf"cannot connect to broker 127.0.0.1:{address[1]}: .*running"):
        open_and_ask(address)


@KINDS
def test_a_silent_broker_is_a_request_timeout(servers: Any, open_and_ask: Any) -> None:
    fast = ConnectionSettings("net-test", 0.3, 0.3, 8, 1 << 20)
    server = servers(lambda codec, event: None)
    with pytest.raises(RequestTimeoutError):
        if open_and_ask is open_async:
            asyncio.run(BrokerConnection.open(server.address, fast))
        else:
            BlockingConnection.open(server.address, fast)


def test_the_blocking_connection_pipelines_in_order_within_max_in_flight() -> None:
    broker = FakeBroker({"t": 1}, broker_id=3)
    try:
        conn = BlockingConnection.open(parse_servers(broker.servers)[0], SETTINGS)
        for _ in range(SETTINGS.max_in_flight):
            conn.send(m.MetadataRequest(["t"]))
        with pytest.raises(TooManyRequestsError):
            conn.send(m.MetadataRequest(["t"]))
        replies = [conn.receive() for _ in range(SETTINGS.max_in_flight)]
        assert all(r.topics[0].name == "t" for r in replies) and conn.in_flight == 0
        conn.close()
    finally:
        broker.stop()


# -- the pools walk the servers alike -----------------------------------------------------------------------


def test_blocking_pool_passes_over_dead_and_full_servers_and_finds_a_broker_id(servers: Any) -> None:
    full = servers(refuse_full)
    one, two = FakeBroker({"t": 1}, broker_id=1), FakeBroker({"t": 1}, broker_id=2)
    try:
        down = dead()
        addresses = [down, full.address, *parse_servers(one.servers), *parse_servers(two.servers)]
        pool = BlockingPool(SETTINGS, addresses)
        address, conn = pool.first_answering()
        assert address == addresses[2] and conn.broker_id == 1
        assert pool.get(address) is conn  # shared
        assert pool.servers.unreached() == [down, full.address, addresses[3]]
        found = pool.find(2)
        assert found is not None and found.broker_id == 2 and pool.servers.address(2) == addresses[3]
        assert pool.find(7) is None
        conn.close()
        assert pool.cached(address) is None and pool.get(address) is not conn  # reopened on demand
        pool.close()
    finally:
        one.stop()
        two.stop()


def test_pools_name_every_server_when_none_answers(servers: Any) -> None:
    full = servers(refuse_full)
    down = dead()
    text = f"127.0.0.1:{down[1]},127.0.0.1:{full.address[1]}"
    with pytest.raises(ConnectionClosedError, match=rf"servers='{text}': cannot connect to broker 127.0.0.1:{down[1]}: "
                       rf".*; \[TOO_MANY_CONNECTIONS\] broker 127.0.0.1:{full.address[1]}: .*maxConnections=3"):
        BlockingPool(SETTINGS, [down, full.address]).first_answering()
    with pytest.raises(TooManyConnectionsError, match=r"every metaq broker in servers=.* refused the connection"):
        BlockingPool(SETTINGS, [full.address, full.address]).first_answering()

    async def main() -> None:
        pool = ConnectionPool(SETTINGS, RetryPolicy.constant(0, max_attempts=1), [down, full.address])
        with pytest.raises(ConnectionClosedError, match=rf"servers='{text}'.*gave up after 1 attempts.*maxConnections"):
            await pool.first_answering()
        pool.close()
    asyncio.run(main())


def test_asyncio_pool_retries_under_its_policy_then_gives_up(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []
    draws = iter([0.0, 0.5, 0.99])
    real_sleep = asyncio.sleep

    async def fake_sleep(delay: float) -> None:
        sleeps.append(delay)
        await real_sleep(0)

    async def main() -> None:
        monkeypatch.setattr(asyncio, "sleep", fake_sleep)
        pool = ConnectionPool(SETTINGS, RetryPolicy(0.1, 0.15, jitter=0.5, max_attempts=4), [dead()],
                              rand=lambda: next(draws))
        with pytest.raises(ConnectionClosedError, match="gave up after 4 attempts"):
            await pool.get(pool.servers.servers[0])
        pool.close()

    asyncio.run(main())
    assert sleeps == pytest.approx([0.1 * 0.5, 0.15 * 0.75, 0.15 * 0.995])


def test_asyncio_pool_walks_and_reaches_the_servers(servers: Any) -> None:
    full = servers(refuse_full)
    one, two = FakeBroker({"t": 1}, broker_id=1), FakeBroker({"t": 1}, broker_id=2)
    a, b = parse_servers(one.servers)[0], parse_servers(two.servers)[0]
    down = dead()

    async def main() -> None:
        pool = ConnectionPool(SETTINGS, RetryPolicy.constant(0, max_attempts=1), [down, full.address, a, b])
        address, conn = await pool.first_answering()
        assert (address, conn.broker_id) == (a, 1) and await pool.get(a) is conn
        assert pool.cached(a, "produce") is None and await pool.get(a, "produce") is not conn  # per channel
        results = await pool.reach([down, b])
        assert isinstance(results[0], ConnectionClosedError) and isinstance(results[1], BrokerConnection)
        assert pool.servers.ids == {a: 1, b: 2} and pool.servers.unreached() == [down, full.address]
        own = await pool.connect(b)
        assert own is not results[1]
        pool.close()
        assert own.closed and conn.closed

    try:
        asyncio.run(main())
    finally:
        one.stop()
        two.stop()


def throttling(codec: ServerConnection, event: Any) -> bytes:
    """Answer every produce as stored, with a quota throttle of 200 ms."""
    return codec.encode_response(event.header, m.ProduceResponse(partition=0, base_offset=0, base_message_id=0,
                                                                 append_time_ms=0, throttle_time_ms=200))


def test_a_throttled_asyncio_connection_holds_new_requests_then_frees_itself(servers: Any) -> None:
    server = servers(handshake_then(throttling))

    async def main() -> None:
        conn = await BrokerConnection.open(server.address, SETTINGS)
        try:
            reply = await conn.request(m.ProduceRequest(topic="t", partition=0))
            assert reply.throttle_time_ms == 200
            assert not conn.writable, "nothing more is sent to a broker that said to wait"
            assert (conn.throttle.throttle_ms_total, conn.throttle.throttled_total) == (200, 1)
            async with asyncio.timeout(5):
                await conn.wait_writable()  # freed by the throttle's end, nothing else
            # asyncio may run a timer up to its clock resolution early: the end of a throttle must free the
            # connection even then (it did not, and a producer waited forever)
            conn._throttled(200)
            conn._throttle_over(conn.throttled_until)
            assert conn.writable
        finally:
            conn.close()

    asyncio.run(main())


def test_a_throttled_blocking_connection_waits_before_its_next_request(servers: Any) -> None:
    server = servers(handshake_then(throttling))
    conn = BlockingConnection.open(server.address, SETTINGS)
    try:
        assert raise_for_error(conn.call(m.ProduceRequest(topic="t", partition=0))).throttle_time_ms == 200
        assert conn.throttle_ms_total == 200 and conn.throttled_until > 0
        conn.call(m.ProduceRequest(topic="t", partition=0))
        assert conn.throttle_ms_total == 400
    finally:
        conn.close()
