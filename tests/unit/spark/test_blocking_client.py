"""The blocking client against an in-memory broker speaking the real protocol."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from spark_fake_broker import FakeBroker

from metaq.client.blocking import BlockingClient, ProduceItem, parse_servers
from metaq.errors import ConnectionClosedError, InvalidArgument, OffsetOutOfRangeError, UnknownTopicError
from metaq.protocol.records import decode_fetched, encode_values
from metaq.testing.ports import unused_port


@pytest.fixture
def fake() -> Iterator[FakeBroker]:
    broker = FakeBroker({"t": 2})
    yield broker
    broker.stop()


def test_parse_servers() -> None:
    assert parse_servers("a:1, b:2") == [("a", 1), ("b", 2)]
    assert parse_servers("host") == [("host", 8123)]
    for bad in ("", " , ", "a:x", "a:0", ":5"):
        with pytest.raises(InvalidArgument):
            parse_servers(bad)


def test_produce_fetch_roundtrip(fake: FakeBroker) -> None:
    with BlockingClient(fake.servers) as client:
        r = client.produce("t", 1, encode_values([b"a", b"b", b"c"], 1000))
        assert r is not None and r.base_offset == 0 and r.partition == 1
        r2 = client.produce("t", 1, encode_values([b"d"], 1001))
        assert r2 is not None and r2.base_offset == 3
        resp = client.fetch("t", 1, 1, 1 << 20)
        msgs, next_offset = decode_fetched(resp.records, "t", 1, 1)
        assert [bytes(x.data) for x in msgs] == [b"b", b"c", b"d"]
        assert next_offset == 4
        assert client.list_offsets("t", 1, -1).offset == 4
        assert client.list_offsets("t", 0, -2).offset == 0


def test_produce_many_pipelines_and_orders_replies(fake: FakeBroker) -> None:
    with BlockingClient(fake.servers) as client:
        items = (ProduceItem("t", i % 2, encode_values([b"x"] * 3, 5)) for i in range(50))
        replies = client.produce_many(items, window=4)
        assert [r.base_offset for r in replies] == [3 * (i // 2) for i in range(50)]
        # the connection is still in a clean state
        assert client.list_offsets("t", 0, -1).offset == 75


def test_error_in_pipeline_raises_after_draining(fake: FakeBroker) -> None:
    with BlockingClient(fake.servers) as client:
        items = [("t", 0, encode_values([b"x"], 1)), ("nope", 0, encode_values([b"y"], 1)),
                 ("t", 0, encode_values([b"z"], 1))]
        with pytest.raises(UnknownTopicError):
            client.produce_many(items, window=8)
        # nothing in flight was left behind: the next request matches its reply
        assert client.list_offsets("t", 0, -1).offset in (1, 2)


def test_errors_are_typed(fake: FakeBroker) -> None:
    with BlockingClient(fake.servers) as client:
        with pytest.raises(OffsetOutOfRangeError):
            client.fetch("t", 0, 99, 1000)
        with pytest.raises(UnknownTopicError, match="nope"):
            client.topic_info("nope")
        assert client.partitions_for("t") == [0, 1]
        offsets = client.list_offsets_many("t", [0, 1], -1)
        assert sorted(offsets) == [0, 1]


def test_connection_refused_names_servers() -> None:
    port = unused_port()
    servers = f"127.0.0.1:{port}"
    with pytest.raises(ConnectionClosedError, match=f"servers='{servers}'"):
        BlockingClient(servers, timeout_s=2)


def test_first_reachable_server_is_used(fake: FakeBroker) -> None:
    servers = f"127.0.0.1:{unused_port()},{fake.servers}"
    with BlockingClient(servers) as client:
        assert client.partitions_for("t") == [0, 1]
        assert client.produce("t", 0, encode_values([b"q"], 1)) is not None


def test_acks_zero_sends_without_reply(fake: FakeBroker) -> None:
    with BlockingClient(fake.servers) as client:
        assert client.produce_many([("t", 0, encode_values([b"1"], 1))] * 3, acks=0) == []
        assert client.produce("t", 0, encode_values([b"2"], 1), acks=0) is None
        # a request with a reply after one-way sends still lines up
        assert client.list_offsets("t", 0, -1).offset == 4
