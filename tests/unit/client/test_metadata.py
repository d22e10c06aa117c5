"""The metadata cache and server lists: pure bookkeeping."""

from __future__ import annotations

import pytest

from metaq.client.metadata import MetadataCache, Partition
from metaq.client.pool import parse_servers
from metaq.errors import InvalidArgument, UnknownTopicError
from metaq.protocol.messages import BrokerInfo, MetadataResponse, PartitionInfo, TopicInfo


def response() -> MetadataResponse:
    return MetadataResponse(
        brokers=[BrokerInfo(1, "b1.example", 8123), BrokerInfo(0, "0.0.0.0", 8124)],
        topics=[
            TopicInfo("orders", 0, [PartitionInfo(1, 1), PartitionInfo(0, 1), PartitionInfo(1, 0, accept_publish=False),
                                    PartitionInfo(0, 0), PartitionInfo(2, 0, error_code=4)]),
            TopicInfo("missing", UnknownTopicError.code, []),
        ])


def test_partitions_are_ordered_by_broker_then_partition_with_their_flags() -> None:
    cache = MetadataCache(clock=lambda: 5.0)
    got = cache.update(response(), ["orders", "missing", "never-named"])
    orders = got["orders"]
    assert [str(p) for p in orders.partitions] == ["0-0", "0-1", "1-0", "1-1"]  # errored 0-2 left out
    assert [str(p) for p in orders.publishable] == ["0-0", "1-0", "1-1"]  # 0-1 is closed
    assert orders.find(1) == Partition(0, 1) and orders.find(7) is None
    assert isinstance(got["missing"].error, UnknownTopicError) and got["missing"].partitions == ()
    assert isinstance(got["never-named"].error, UnknownTopicError)


def test_the_address_a_broker_was_reached_at_wins_over_the_advertised_one() -> None:
    cache = MetadataCache()
    cache.update(response())
    assert cache.address(0) == ("0.0.0.0", 8124)
    cache.known_addresses[0] = ("127.0.0.1", 8124)
    assert cache.address(0) == ("127.0.0.1", 8124)
    assert cache.address(1) == ("b1.example", 8123)
    assert cache.address(9) is None


def test_freshness_and_a_full_listing_replacing_topics() -> None:
    now = [0.0]
    cache = MetadataCache(clock=lambda: now[0])
    cache.update(response(), ["orders"])
    now[0] = 10.0
    assert cache.is_fresh("orders", 30.0) and not cache.is_fresh("orders", 5.0)
    cache.update(MetadataResponse(topics=[TopicInfo("other", 0, [PartitionInfo(0, 0)])]))
    assert cache.get("orders") is None and cache.get("other") is not None


def test_parse_servers() -> None:
    assert parse_servers("127.0.0.1:8123, host-b:9000,") == [("127.0.0.1", 8123), ("host-b", 9000)]
    assert parse_servers(["[::1]:8123"]) == [("::1", 8123)]
    for bad in ("", "localhost", "h:x", "h:70000", ":8123"):
        with pytest.raises(InvalidArgument):
            parse_servers(bad)
