"""The broker's limits on connections and what they hold, against real broker processes.

Each limit hit is a clear error for the one who hit it while everyone else is still served: waiting
long polls (in all and per connection, and given back when a connection closes).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from metaq.errors import TooManyRequestsError
from metaq.protocol import messages as m
from metaq.protocol.codec import NEED_DATA
from metaq.protocol.records import decode_fetched, encode_values
from metaq.testing import BrokerProcess, wait_until
from metaq.testing.raw import RawClient

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
