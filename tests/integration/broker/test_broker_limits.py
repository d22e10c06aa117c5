"""The broker's limits on connections and what they hold, against real broker processes.

Each limit hit is a clear error for the one who hit it while everyone else is still served: waiting
long polls (in all and per connection, and given back when a connection closes), connections
(maxConnections), idle and handshake timeouts, and the bytes of unfinished frames buffered.
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Callable
from typing import Any

import pytest

from metaq.client import connect
from metaq.client.blocking import BlockingClient
from metaq.errors import TooManyConnectionsError, TooManyRequestsError
from metaq.protocol import messages as m
from metaq.protocol.codec import NEED_DATA
from metaq.protocol.records import decode_fetched, encode_values
from metaq.testing import BrokerProcess, wait_until
from metaq.testing.raw import RawClient, socket_closed_by_peer

LONG_WAIT_MS = 120_000
"""Long polls that must never end by themselves during a test (they end by an append, or not at all)."""


def _send(c: RawClient, request: Any) -> None:
    """Pipeline a request without waiting for its reply."""
    _, data = c.codec.send(request)
    c.sock.sendall(data)


def _receive(c: RawClient) -> Any:
    """The reply to the oldest request sent with _send."""
    while (event := c.codec.next_event()) is NEED_DATA:
        chunk = c.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("broker closed the connection")
        c.codec.receive_data(chunk)
    return event.response  # type: ignore[union-attr]


def _stats(c: RawClient) -> dict[str, Any]:
    return json.loads(c.call(m.StatsRequest(None)).stats_json)  # type: ignore[no-any-return]


def _waiting(c: RawClient) -> int:
    return int(_stats(c)["waiting_fetches"])


def _append(c: RawClient, topic: str, value: bytes = b"wake") -> int:
    reply = c.call(m.ProduceRequest(topic, 0, 1, 5000, encode_values([value], 1)))
    assert reply.error_code == 0, reply.error_message
    return int(reply.base_offset)


def _long_poll(topic: str, offset: int) -> m.FetchRequest:
    return m.FetchRequest(topic, 0, offset, 1 << 20, LONG_WAIT_MS)


# -- waiting long polls -----------------------------------------------------------------------------


def test_a_closed_connection_gives_its_waiting_fetches_back_at_once(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 1, "maxWaitingFetches": 20, "maxWaitingFetchesPerConnection": 10})
    admin = RawClient.to(broker)
    end = _append(admin, "lp") + 1
    abandoned = [RawClient.to(broker) for _ in range(2)]
    for c in abandoned:
        for _ in range(10):
            _send(c, _long_poll("lp", end))
    wait_until(lambda: _waiting(admin) == 20, message="20 long polls parked at the broker")
    for c in abandoned:
        c.close()
    # the slots come back when the connections close, not at the polls' 120 s deadline
    wait_until(lambda: _waiting(admin) == 0, message="the closed connections' long polls to be released")
    consumer = RawClient.to(broker)
    _send(consumer, _long_poll("lp", end))
    wait_until(lambda: _waiting(admin) == 1, message="a new long poll to be accepted")
    _append(admin, "lp", b"after")
    reply = _receive(consumer)
    assert reply.error_code == 0
    assert [bytes(x.data) for x in decode_fetched(reply.records, "lp", 0, end)[0]] == [b"after"]


def test_one_connection_holds_at_most_its_share_of_waiting_fetches(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 1, "maxWaitingFetches": 20, "maxWaitingFetchesPerConnection": 5})
    admin = RawClient.to(broker)
    end = _append(admin, "share") + 1
    greedy = RawClient.to(broker)
    for _ in range(6):
        _send(greedy, _long_poll("share", end))
    wait_until(lambda: _waiting(admin) == 5, message="the greedy connection's first 5 long polls to wait")
    other = RawClient.to(broker)
    _send(other, _long_poll("share", end))  # another connection is still served
    wait_until(lambda: _waiting(admin) == 6, message="another connection's long poll to wait too")
    _append(admin, "share")
    replies = [_receive(greedy) for _ in range(6)]
    assert [r.error_code for r in replies] == [0] * 5 + [TooManyRequestsError.code]
    assert all(r.records for r in replies[:5])
    assert "maxWaitingFetchesPerConnection=5" in replies[5].error_message
    assert _receive(other).error_code == 0


def test_max_waiting_fetches_refuses_past_the_limit_and_frees_when_fetches_end(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 1, "maxWaitingFetches": 3})
    admin = RawClient.to(broker)
    end = _append(admin, "lim") + 1
    waiting = [RawClient.to(broker) for _ in range(3)]
    for c in waiting:
        _send(c, _long_poll("lim", end))
    wait_until(lambda: _waiting(admin) == 3, message="3 long polls to wait")
    late = RawClient.to(broker)
    refused = late.call(_long_poll("lim", end))
    assert refused.error_code == TooManyRequestsError.code and "maxWaitingFetches" in refused.error_message
    assert late.call(m.FetchRequest("lim", 0, 0, 1 << 20, 0)).records  # a fetch that does not wait is served
    _append(admin, "lim")
    assert [_receive(c).error_code for c in waiting] == [0, 0, 0]
    wait_until(lambda: _waiting(admin) == 0, message="the slots to be free once the fetches returned")
    _send(late, _long_poll("lim", end + 1))
    wait_until(lambda: _waiting(admin) == 1, message="the refused consumer's next long poll to be accepted")
    _append(admin, "lim", b"third")
    assert _receive(late).error_code == 0


# -- maxConnections ---------------------------------------------------------------------------------


def test_a_connection_over_max_connections_is_answered_with_too_many_connections(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"maxConnections": 3})
    held = [RawClient.to(broker) for _ in range(3)]
    for c in held:
        assert c.call(m.ApiVersionsRequest()).error_code == 0
    over = RawClient.to(broker)
    reply = over.call(m.MetadataRequest(None))
    assert reply.error_code == TooManyConnectionsError.code
    assert "maxConnections=3" in reply.error_message
    assert over.closed_by_peer()
    # the metaq clients say why, with the hint, instead of "connection closed"
    with pytest.raises(TooManyConnectionsError, match="maxConnections=3"), connect(broker.servers) as session:
        session.admin().stats()
    with pytest.raises(TooManyConnectionsError, match="close idle ones or retry later"):
        BlockingClient(broker.servers, timeout_s=10)
    assert _stats(held[0])["connections_refused"] >= 3
    # a connection that closes makes room
    held.pop().close()
    wait_until(lambda: _stats(held[0])["connections"] == 2, message="the closed connection to be counted out")
    with connect(broker.servers) as session:
        assert session.admin().stats()["connections"] == 3


# -- timeouts ---------------------------------------------------------------------------------------


def test_idle_and_silent_connections_are_closed_but_a_long_poll_is_not_idle(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 1, "connectionIdleTimeoutSeconds": 1,
                             "connectionHandshakeTimeoutSeconds": 1})
    silent = socket.create_connection((broker.host, broker.port), timeout=30)  # never sends a request
    idle = RawClient.to(broker)
    assert idle.call(m.ApiVersionsRequest()).error_code == 0
    polling = RawClient.to(broker)
    end = _append(polling, "idle") + 1
    _send(polling, m.FetchRequest("idle", 0, end, 1 << 20, 4_000))  # longer than the idle timeout
    assert socket_closed_by_peer(silent, 30)
    assert idle.closed_by_peer(30)
    reply = _receive(polling)  # ended by its max_wait, not by the idle timeout
    assert reply.error_code == 0 and reply.records == b""
    assert polling.call(m.ApiVersionsRequest()).error_code == 0  # and the connection is still open
    assert _stats(polling)["connections_timed_out"] >= 2


# -- bytes of unfinished frames ---------------------------------------------------------------------


def _partial_produce(sock: socket.socket, correlation_id: int, body_bytes: int, declared_bytes: int) -> int:
    """Send the start of a produce frame declaring ``declared_bytes`` of records, ``body_bytes`` of them.

    Returns the bytes of the frame sent after its size prefix (what the broker buffers).
    """
    client_id, topic = b"raw", b"big"
    head = struct.pack(">hhih", 4, 0, correlation_id, len(client_id)) + client_id
    body = struct.pack(">h", len(topic)) + topic + struct.pack(">ihii", 0, 1, 5000, declared_bytes)
    size = len(head) + len(body) + declared_bytes
    sock.sendall(struct.pack(">I", size) + head + body + b"\0" * body_bytes)
    return len(head) + len(body) + body_bytes


def test_unfinished_frames_past_the_budget_are_refused_and_the_broker_keeps_serving(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    kib = 1024
    broker = broker_factory({"numPartitions": 1, "maxBatchSize": "1m", "maxMessageSize": "1m",
                             "maxFrameSize": "2m", "maxPartialFramesSize": "4m"})
    admin = RawClient.to(broker)
    declared = 2000 * kib
    senders = [socket.create_connection((broker.host, broker.port), timeout=30) for _ in range(5)]
    buffered = 0
    for i, sock in enumerate(senders[:4]):  # 4 x 700 KiB: within the 4 MiB budget
        buffered += _partial_produce(sock, 100 + i, 700 * kib, declared)
        wait_until(lambda: _stats(admin)["partial_frame_bytes"] == buffered,  # noqa: B023
                   message="the unfinished frame to be buffered")
    # the fifth goes over the budget once it holds more than 1.2 MiB: it is then the biggest, refused
    big = senders[4]
    _partial_produce(big, 104, 1500 * kib, declared)
    wait_until(lambda: _stats(admin)["partial_frames_refused"] == 1, message="the biggest frame to be refused")
    big.settimeout(30)
    reply = b""
    while len(reply) < 10 or len(reply) < 4 + struct.unpack_from(">I", reply)[0]:
        reply += big.recv(65536)
    _size, correlation_id, code = struct.unpack_from(">Iih", reply)
    assert (correlation_id, code) == (104, TooManyRequestsError.code)
    assert b"maxPartialFramesSize" in reply
    stats = _stats(admin)
    assert stats["partial_frame_bytes"] == buffered and stats["partial_frames_refused"] == 1
    # the rest of the refused frame is skipped, and the same connection serves its next request
    big.sendall(b"\0" * (declared - 1500 * kib))
    payload = struct.pack(">hhih", 0, 0, 7, 3) + b"raw" + struct.pack(">h", 3) + b"raw"
    big.sendall(struct.pack(">I", len(payload)) + payload)
    reply = b""
    while len(reply) < 10:
        reply += big.recv(65536)
    assert struct.unpack_from(">Iih", reply)[1:] == (7, 0)  # ApiVersions answered, no error
    # everyone else is still served, and the other unfinished frames are still being received
    assert _append(admin, "big", b"small") == 0
    assert _stats(admin)["partial_frame_bytes"] == buffered
    for sock in senders:
        sock.close()
    wait_until(lambda: _stats(admin)["partial_frame_bytes"] == 0, message="closed connections' buffers freed")
