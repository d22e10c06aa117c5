"""The metadata cache: pure bookkeeping (server lists: tests/unit/net/test_net_servers.py)."""

from __future__ import annotations

import asyncio

import pytest

from metaq.client.metadata import Metadata, MetadataCache, Partition, merge_metadata
from metaq.errors import InvalidArgument, InvalidTopicError, UnknownTopicError
from metaq.protocol.messages import BrokerInfo, MetadataRequest, MetadataResponse, PartitionInfo, TopicInfo
from metaq.types import PartitionId


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
    assert orders.find(PartitionId(0, 1)) == Partition(0, 1) and orders.find("1-0") == Partition(1, 0)
    assert orders.find(7) is None and orders.find("0-7") is None and orders.find(PartitionId(2, 0)) is None
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


def test_find_by_bare_number_only_when_one_broker_has_it() -> None:
    cache = MetadataCache()
    # PartitionInfo(partition, broker_id): 1-0, 2-0, 1-1, 2-3
    cache.update(MetadataResponse(topics=[TopicInfo("t", 0, [PartitionInfo(0, 1), PartitionInfo(0, 2),
                                                             PartitionInfo(1, 1), PartitionInfo(3, 2)])]))
    tm = cache.topics["t"]
    assert tm.find(3) == PartitionId(2, 3) and tm.find("3") == PartitionId(2, 3)
    assert tm.find(1) == PartitionId(1, 1)
    assert tm.find(2) is None
    with pytest.raises(InvalidArgument, match=r"partition 0 of topic 't' is ambiguous: brokers 1, 2 each have "
                                              r"one \('1-0', '2-0'\); name it as brokerId-partition"):
        tm.find(0)
    with pytest.raises(InvalidArgument, match="brokerId-partition"):
        tm.find("0-")


def _answer(broker: int, topics: list[TopicInfo], port: int = 8123) -> tuple[int, MetadataResponse]:
    return broker, MetadataResponse(brokers=[BrokerInfo(broker, f"b{broker}", port)], topics=topics)


def test_merge_takes_the_union_of_what_each_broker_answers_for_itself() -> None:
    one = _answer(1, [TopicInfo("orders", 0, [PartitionInfo(1, 1), PartitionInfo(0, 1)]),
                      TopicInfo("only-on-2", UnknownTopicError.code, [])])
    two = _answer(2, [TopicInfo("orders", 0, [PartitionInfo(0, 2), PartitionInfo(1, 2, accept_publish=False)]),
                      TopicInfo("only-on-2", 0, [PartitionInfo(0, 2)]),
                      TopicInfo("only-on-2-bad", InvalidTopicError.code, [])])
    for answers in ([one, two], [two, one]):
        merged = merge_metadata(answers)
        assert [(b.broker_id, b.host) for b in merged.brokers] == [(1, "b1"), (2, "b2")]
        cache = MetadataCache()
        got = cache.update(merged, ["orders", "only-on-2", "only-on-2-bad"])
        assert [str(p) for p in got["orders"].partitions] == ["1-0", "1-1", "2-0", "2-1"]
        assert [str(p) for p in got["orders"].publishable] == ["1-0", "1-1", "2-0"]
        assert got["orders"].error is None
        assert [str(p) for p in got["only-on-2"].partitions] == ["2-0"] and got["only-on-2"].error is None
        assert isinstance(got["only-on-2-bad"].error, InvalidTopicError)


def test_merge_prefers_a_partitions_own_broker_over_another_brokers_report() -> None:
    # In ZooKeeper mode (step 2) any broker may report every partition; its own broker's flags win.
    stale = _answer(1, [TopicInfo("t", 0, [PartitionInfo(0, 1), PartitionInfo(0, 2, accept_publish=True)])])
    own = _answer(2, [TopicInfo("t", 0, [PartitionInfo(0, 2, accept_publish=False)])])
    for answers in ([stale, own], [own, stale]):
        parts = MetadataCache().update(merge_metadata(answers), ["t"])["t"].partitions
        assert [(str(p), p.accept_publish) for p in parts] == [("1-0", True), ("2-0", False)]


def test_merge_of_one_answer_is_that_answer() -> None:
    only = _answer(1, [TopicInfo("t", 0, [PartitionInfo(0, 1)])])
    assert merge_metadata([only]) is only[1]


def test_a_refresh_answered_from_before_an_invalidation_is_asked_again_not_cached() -> None:
    """An admin call (reopening a topic's partitions) invalidates the topic while a background refresh is out:
    that refresh may be answered from before the change. Cached, it would undo the invalidation (the next sends
    refused as 'every partition closed' until a later refresh); it is asked again instead."""
    closed = MetadataResponse(topics=[TopicInfo("gate", 0, [PartitionInfo(0, 0, accept_publish=False)])])
    reopened = MetadataResponse(topics=[TopicInfo("gate", 0, [PartitionInfo(0, 0)])])

    async def main() -> None:
        answered = asyncio.get_running_loop().create_future()
        answers = [answered, reopened]
        asked = asyncio.Event()

        async def fetch(request: MetadataRequest) -> MetadataResponse:
            asked.set()
            answer = answers.pop(0)
            return await answer if isinstance(answer, asyncio.Future) else answer

        metadata = Metadata(fetch, max_age_s=30.0, min_interval_s=0.05)
        refresh = asyncio.ensure_future(metadata.refresh_topic("gate"))
        await asyncio.wait_for(asked.wait(), 10)  # the background refresh is out
        metadata.cache.invalidate("gate")  # the admin call's change is done: the topic is invalidated
        answered.set_result(closed)  # ... and the refresh out before it is answered from before the change
        tm = await refresh
        assert [p.accept_publish for p in tm.partitions] == [True]
        cached = metadata.cache.get("gate")
        assert cached is not None and [p.accept_publish for p in cached.partitions] == [True]
        assert answers == []

    asyncio.run(main())
