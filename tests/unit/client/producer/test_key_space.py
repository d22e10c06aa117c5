"""A key maps over the topic's registered partitions, never over the ones reachable now (docs/producer.md, "the
key space"): a broker id whose master is down or being handed over keeps its partitions, so a keyed send to one
waits in its partition's lane instead of moving to another partition."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from offline_producer import run_offline

from metaq.client.config import ProducerConfig
from metaq.client.core import ClientCore
from metaq.client.metadata import MetadataCache
from metaq.client.producer import Producer
from metaq.client.selectors import KeyHashSelector, key_hash
from metaq.protocol.messages import BrokerInfo, MetadataResponse, PartitionInfo, TopicInfo
from metaq.types import Message, PartitionId

ALL = [(1, 0), (1, 1), (2, 0), (2, 1)]


def answer(partitions: list[tuple[int, int]], brokers: tuple[int, ...] = (1, 2)) -> MetadataResponse:
    """A Metadata answer naming ``brokers`` alive and ``partitions`` (broker id, partition) of topic "t"."""
    return MetadataResponse(brokers=[BrokerInfo(b, "127.0.0.1", 9000 + b) for b in brokers],
                            topics=[TopicInfo("t", 0 if partitions else 3, [PartitionInfo(p, b, 0, True, True)
                                                                          for b, p in partitions])])


def key_space(cache: MetadataCache) -> list[str]:
    tm = cache.get("t")
    assert tm is not None
    return [str(p) for p in tm.key_space]


def test_a_broker_id_without_a_master_keeps_its_partitions_in_the_key_space() -> None:
    cache = MetadataCache()
    cache.update(answer(ALL), ["t"])
    assert key_space(cache) == ["1-0", "1-1", "2-0", "2-1"]
    cache.update(answer([(1, 0), (1, 1)], brokers=(1,)), ["t"])  # broker 2's master is down
    tm = cache.get("t")
    assert tm is not None and [str(p) for p in tm.partitions] == ["1-0", "1-1"]
    assert key_space(cache) == ["1-0", "1-1", "2-0", "2-1"]
    cache.update(answer([(1, 0), (1, 1)]), ["t"])  # its new master registered, its topic node not yet
    assert key_space(cache) == ["1-0", "1-1", "2-0", "2-1"]
    cache.update(answer([], brokers=()), ["t"])  # no master at all for a moment
    assert key_space(cache) == ["1-0", "1-1", "2-0", "2-1"]
    cache.update(answer([(1, 0), (1, 1), (1, 2), (2, 0), (2, 1)]), ["t"])  # an admin grew broker 1's share
    assert key_space(cache) == ["1-0", "1-1", "1-2", "2-0", "2-1"]
    tm = cache.get("t")
    assert tm is not None and tm.key_space is tm.partitions  # nothing missing: the same tuple, no copy


def run(test: Callable[[ClientCore, Producer, dict[bytes, PartitionId]], Coroutine[Any, Any, None]]) -> None:
    """A key-hash producer of a never-connected session; each batch it would send is recorded instead."""
    sent: dict[bytes, PartitionId] = {}

    def on_batch(batch: Any) -> None:
        sent.update((data, PartitionId(batch.broker_id, batch.partition)) for data in batch.values)

    run_offline(answer(ALL), ["t"], ProducerConfig(), KeyHashSelector(), on_batch,
                lambda core, producer: test(core, producer, sent))


def test_a_keyed_send_goes_to_its_partition_while_that_partitions_master_is_down() -> None:
    keys = [b"key-%d" % i for i in range(40)]
    home = {k: PartitionId(*ALL[key_hash(k) % len(ALL)]) for k in keys}
    assert any(p.broker_id == 2 for p in home.values())

    async def test(core: ClientCore, producer: Producer, sent: dict[bytes, PartitionId]) -> None:
        core.metadata.cache.update(answer([(1, 0), (1, 1)], brokers=(1,)), ["t"])  # broker 2 lost its master
        for k in keys:
            producer.send_async(Message("t", k, key=k))
        await asyncio.sleep(0)
        assert sent == home  # none moved to broker 1's partitions

    run(test)



