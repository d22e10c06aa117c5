"""The blocking client (what Spark's executors and driver use) against a real broker."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from metaq.client.blocking import BlockingClient, ProduceItem
from metaq.errors import OffsetOutOfRangeError, UnknownTopicError
from metaq.protocol.messages import CreateTopicRequest
from metaq.protocol.records import decode_fetched, encode_values
from metaq.testing.broker import BrokerProcess
from metaq.testing.ports import unused_port
from metaq.types import PartitionId


@pytest.fixture
def servers(broker_factory: Callable[..., BrokerProcess]) -> str:
    """A broker with topic t (2 partitions) and no other: a send to another topic is an error."""
    broker = broker_factory({"autoCreateTopics": False})
    with BlockingClient(broker.servers) as client:
        client.request(CreateTopicRequest("t", 2))
    return broker.servers


def test_produce_fetch_roundtrip(servers: str) -> None:
    with BlockingClient(servers) as client:
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


def test_produce_many_pipelines_and_orders_replies(servers: str) -> None:
    with BlockingClient(servers) as client:
        items = (ProduceItem("t", i % 2, encode_values([b"x"] * 3, 5)) for i in range(50))
        replies = client.produce_many(items, window=4)
        assert [r.base_offset for r in replies] == [3 * (i // 2) for i in range(50)]
        # the connection is still in a clean state
        assert client.list_offsets("t", 0, -1).offset == 75


def test_error_in_pipeline_raises_after_draining(servers: str) -> None:
    with BlockingClient(servers) as client:
        items = [("t", 0, encode_values([b"x"], 1)), ("nope", 0, encode_values([b"y"], 1)),
                 ("t", 0, encode_values([b"z"], 1))]
        with pytest.raises(UnknownTopicError):
            client.produce_many(items, window=8)
        # nothing in flight was left behind: the next request matches its reply
        assert client.list_offsets("t", 0, -1).offset in (1, 2)


def test_errors_are_typed(servers: str) -> None:
    with BlockingClient(servers) as client:
        client.produce("t", 0, encode_values([b"x"] * 5, 1))
        with pytest.raises(OffsetOutOfRangeError) as caught:
            client.fetch("t", 0, 99, 1000)
        assert (caught.value.earliest, caught.value.latest) == (0, 5)  # the valid range comes with the error
        with pytest.raises(UnknownTopicError, match="nope"):
            client.topic_info("nope")
        assert client.partitions_for("t") == [PartitionId(0, 0), PartitionId(0, 1)]
        offsets = client.list_offsets_many("t", [0, "0-1"], -1)
        assert list(offsets) == [0, "0-1"] and offsets[0].log_end_offset == 5  # keyed as asked


def test_first_reachable_server_is_used(servers: str) -> None:
    with BlockingClient(f"127.0.0.1:{unused_port()},{servers}") as client:
        assert client.partitions_for("t") == [PartitionId(0, 0), PartitionId(0, 1)]  # the down one left out
        assert client.produce("t", 0, encode_values([b"q"], 1)) is not None


def test_acks_zero_sends_without_reply(servers: str) -> None:
    with BlockingClient(servers) as client:
        assert client.produce_many([("t", 0, encode_values([b"1"], 1))] * 3, acks=0) == []
        assert client.produce("t", 0, encode_values([b"2"], 1), acks=0) is None
        # a request with a reply after one-way sends still lines up
        assert client.list_offsets("t", 0, -1).offset == 4
