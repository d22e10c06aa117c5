"""The in-memory broker the unit tests keep answers as the real one does, request for request.

Same batches produced to both, then the same requests; replies are compared by what a client sees:
error codes, the partition's bounds, and which whole batches came back (base offset, records, bytes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from spark_fake_broker import FakeBroker

from metaq.protocol import messages as m
from metaq.protocol.records import encode_messages, encode_values, iter_batches
from metaq.testing.broker import BrokerProcess
from metaq.testing.raw import RawClient
from metaq.types import Message

TOPIC = "t"


def _batches() -> list[bytes]:
    """10 small records at 1000..1009 ms, one 5,000-byte record at 2000, 20 small at 3000..3019."""
    return [encode_messages([Message(TOPIC, b"a" * 100, timestamp_ms=1000 + i) for i in range(10)]),
            encode_values([b"b" * 5000], 2000),
            encode_messages([Message(TOPIC, b"c" * 100, timestamp_ms=3000 + i) for i in range(20)])]


@pytest.fixture
def both(broker_factory: Callable[..., BrokerProcess]) -> Iterator[tuple[RawClient, RawClient]]:
    real = broker_factory({"autoCreateTopics": False})
    fake = FakeBroker({TOPIC: 1})
    clients = (RawClient(real.host, real.port), RawClient("127.0.0.1", fake.port))
    try:
        assert clients[0].call(m.CreateTopicRequest(TOPIC, 1)).error_code == 0
        for client in clients:
            for batch in _batches():
                assert client.call(m.ProduceRequest(TOPIC, 0, records=batch)).error_code == 0
        yield clients
    finally:
        for client in clients:
            client.close()
        fake.stop()


def _seen(response: Any) -> tuple[Any, ...]:
    """What a client can tell from a reply (not stamps such as append times)."""
    if isinstance(response, m.FetchResponse):
        batches = [(h.base_offset, h.record_count, h.total_bytes) for _, h in iter_batches(response.records)]
        return (response.error_code, response.log_start_offset, response.log_end_offset, batches,
                len(response.records))  # bytes beyond the whole batches: a cut-off tail
    if isinstance(response, m.ListOffsetsResponse):
        return response.error_code, response.offset, response.log_start_offset, response.log_end_offset
    if isinstance(response, m.ProduceResponse):
        return response.error_code, response.base_offset if response.error_code == 0 else None
    return (response.error_code,)


FETCHES = [(0, 1 << 20), (0, 100), (5, 1500), (10, 1000), (10, 7000), (11, 2000), (30, 1), (31, 1000),
           (32, 1000), (-1, 1000), (0, 0), (0, 64 << 20)]
"""(offset, max_bytes): everything; a first batch over the limit; whole batches up to the limit; the
end; past the end; a negative offset; no room at all; more than maxTransferSize."""


@pytest.mark.parametrize(("offset", "max_bytes"), FETCHES)
def test_fetch(both: tuple[RawClient, RawClient], offset: int, max_bytes: int) -> None:
    real, fake = (_seen(c.call(m.FetchRequest(TOPIC, 0, offset, max_bytes))) for c in both)
    assert fake == real


def test_fetch_at_the_end_long_polls_then_answers_empty(both: tuple[RawClient, RawClient]) -> None:
    real, fake = (_seen(c.call(m.FetchRequest(TOPIC, 0, 31, 1000, max_wait_ms=50))) for c in both)
    assert fake == real == (0, 0, 31, [], 0)


@pytest.mark.parametrize("timestamp_ms", [-2, -1, -5, 0, 999, 1000, 1005, 1010, 2000, 2500, 3019, 4000])
def test_list_offsets(both: tuple[RawClient, RawClient], timestamp_ms: int) -> None:
    real, fake = (_seen(c.call(m.ListOffsetsRequest(TOPIC, 0, timestamp_ms))) for c in both)
    assert fake == real


def test_produce_errors(both: tuple[RawClient, RawClient]) -> None:
    corrupt = bytearray(encode_values([b"x"] * 3, 1))
    corrupt[-1] ^= 0xFF
    requests = [m.ProduceRequest("nope", 0, records=encode_values([b"x"], 1)),
                m.ProduceRequest(TOPIC, 0, records=encode_values([b"x" * (1 << 20)], 1)),
                m.ProduceRequest(TOPIC, 0, records=bytes(corrupt)),
                m.ProduceRequest(TOPIC, 0, records=encode_values([b"ok"], 1))]
    for request in requests:
        real, fake = (_seen(c.call(request)) for c in both)
        assert fake == real, request.topic


def test_metadata(both: tuple[RawClient, RawClient]) -> None:
    real, fake = (c.call(m.MetadataRequest([TOPIC, "nope"])).topics for c in both)
    assert fake == real
