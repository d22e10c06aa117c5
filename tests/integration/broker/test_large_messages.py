"""Messages at the size limit through a real broker: a message of exactly maxMessageSize comes back whole
and intact (CRC checked) from Fetch and MultiFetch, under both event loops (asyncio's sends fetch replies
with sendfile, uvloop's reads and writes them), even when the consumer's max_bytes is smaller, and in
order with the small messages around it; the client consumer reads it too. And fetches of data that is
no longer in the page cache (read off the event loop) return the stored bytes, across segments."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from metaq.allocator import glibc_version
from metaq.client import Message, MessageSessionFactory
from metaq.protocol import messages as m
from metaq.protocol.records import RECORD_OVERHEAD_BYTES, decode_fetched, encode_values, iter_batches
from metaq.testing import BrokerProcess
from metaq.testing.fs import evict_from_page_cache
from metaq.testing.raw import RawClient
from metaq.types import DEFAULT_MAX_MESSAGE_BYTES

BIG = (bytes(range(256)) * (DEFAULT_MAX_MESSAGE_BYTES // 256))[:DEFAULT_MAX_MESSAGE_BYTES - RECORD_OVERHEAD_BYTES]
"""A payload whose record is maxMessageSize (the default, 1 MiB) to the byte, not all zeros."""


def _values(fetched: bytes | memoryview, offset: int) -> list[bytes]:
    messages, _ = decode_fetched(fetched, "big", 0, offset)  # checks every batch's CRC
    return [bytes(x.data) for x in messages]


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_message_of_max_message_size_round_trips_through_fetch_and_multi_fetch(
        broker_factory: Callable[..., BrokerProcess], loop: str) -> None:
    assert len(BIG) + RECORD_OVERHEAD_BYTES == DEFAULT_MAX_MESSAGE_BYTES
    c = RawClient.to(broker_factory({"numPartitions": 1, "event-loop": loop}))
    for values in ([b"before"], [BIG], [b"after-1", b"after-2"]):
        assert c.call(m.ProduceRequest("big", 0, 1, 5000, encode_values(values, 1))).error_code == 0
    # the whole batch even though max_bytes is smaller than it (a consumer never stalls on a big message)
    for max_bytes in (1, 64 * 1024, 1 << 20, 4 << 20):
        single = c.call(m.FetchRequest("big", 0, 1, max_bytes, 0))
        assert single.error_code == 0
        assert _values(single.records, 1)[0] == BIG
        multi = c.call(m.MultiFetchRequest(0, 1, 8 << 20, "", [m.FetchPartition("big", 0, 1, max_bytes)]))
        assert multi.partitions[0].error_code == 0
        assert bytes(multi.partitions[0].records) == bytes(single.records)
    # from the start: in order, the big one between the small ones (a reply holds at most maxTransferSize,
    # 1 MiB, past its first batch: the big one comes alone)
    got: list[bytes] = []
    offset = 0
    while offset < 4:
        reply = c.call(m.FetchRequest("big", 0, offset, 8 << 20, 0))
        messages, offset = decode_fetched(reply.records, "big", 0, offset)
        got += [bytes(x.data) for x in messages]
    assert got == [b"before", BIG, b"after-1", b"after-2"]


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_fetch_reply_ends_at_the_last_whole_batch_that_fits(
        broker_factory: Callable[..., BrokerProcess], loop: str) -> None:
    """A reply is never cut inside a batch: it holds the whole batches from the one at the offset that fit in
    max_bytes (and in maxTransferSize, 1 MiB), or that first batch alone when even it does not fit. So a
    consumer of 1,000,000 B messages reading 1 MiB at a time moves every stored byte once."""
    c = RawClient.to(broker_factory({"numPartitions": 1, "event-loop": loop}))
    sizes = []
    for i, size in enumerate([1_000_000, 1_000_000, 300_000, 300_000, 300_000, 500_000, 10]):
        assert c.call(m.ProduceRequest("edges", 0, 1, 5000, encode_values([bytes([i]) * size], 1))).error_code == 0
        sizes.append(size + 71 + RECORD_OVERHEAD_BYTES)  # one stored batch each: its header and one record

    def expected(offset: int, max_bytes: int) -> int:
        """The bytes of the whole batches from ``offset`` that fit in ``max_bytes`` (at least the first)."""
        fit = sizes[offset]
        for size in sizes[offset + 1:]:
            if fit + size > min(max_bytes, 1 << 20):
                break
            fit += size
        return fit

    three = sum(sizes[2:5])
    for offset, max_bytes in [(0, 1 << 20), (0, 600_000), (0, 8 << 20), (1, 1 << 20), (2, 1 << 20), (2, three),
                              (2, three - 1), (2, 8 << 20), (5, 1 << 20), (6, 1 << 20)]:
        want = expected(offset, max_bytes)
        single = c.call(m.FetchRequest("edges", 0, offset, max_bytes, 0))
        multi = c.call(m.MultiFetchRequest(0, 1, 8 << 20, "", [m.FetchPartition("edges", 0, offset, max_bytes)]))
        for records in (bytes(single.records), bytes(multi.partitions[0].records)):
            walked = [(pos, h.total_bytes) for pos, h in iter_batches(records)]
            assert (len(records), walked[-1][0] + walked[-1][1]) == (want, want), (offset, max_bytes)
    assert expected(2, three) == three and expected(2, three - 1) == sum(sizes[2:4])  # the limit is inclusive
    # reading the partition 1 MiB at a time moves every stored byte exactly once
    moved, offset = 0, 0
    while offset < len(sizes):
        records = c.call(m.FetchRequest("edges", 0, offset, 1 << 20, 0)).records
        _, offset = decode_fetched(records, "edges", 0, offset)  # every batch whole and CRC-checked
        moved += len(records)
    assert moved == sum(sizes)


def test_the_client_consumer_reads_a_message_of_max_message_size(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 1, "event-loop": "asyncio"})

    async def go() -> list[bytes]:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            producer = session.create_producer()
            for value in (b"before", BIG, b"after"):
                assert (await producer.send(Message("big", value))).success
            consumer = session.create_pull_consumer()
            got = []
            offset = 0
            while len(got) < 3:
                result = await consumer.fetcher.fetch("big", 0, offset, max_bytes=64 * 1024)
                got += [bytes(x.data) for x in result.messages]
                offset = result.next_offset
            return got

    assert asyncio.run(go()) == [b"before", BIG, b"after"]


GLIBC_LINE = "glibc heap: trim threshold"
"""The broker's start-up line once it has fixed glibc's heap thresholds (mallocTrimThreshold, mallocMmapThreshold)."""


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
@pytest.mark.parametrize("thresholds", [{"mallocTrimThreshold": "128m", "mallocMmapThreshold": "32m"},
                                        {"mallocTrimThreshold": "1g"}, {}])
def test_a_broker_with_its_heap_thresholds_serves_1_mb_messages_to_the_iterator(
        broker_factory: Callable[..., BrokerProcess], loop: str, thresholds: dict[str, object]) -> None:
    # fixed thresholds (those for ~1 MB messages, a trim threshold alone) and the default (glibc's own, moving
    # thresholds): the same messages either way, and the broker says when it has set them
    broker = broker_factory({"numPartitions": 1, "event-loop": loop, **thresholds})
    values = [bytes([i]) * 1000 + BIG[:999_000] for i in range(8)] + [b"small"]

    async def go() -> list[bytes]:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            producer = session.create_producer()
            for value in values:
                assert (await producer.send(Message("big", value))).success
            consumer = session.create_pull_consumer()
            return [bytes(x.data) async for x in consumer.iterate("big", 0, 0, max_bytes=1 << 20,
                                                                     stop_at_end=True)]

    assert asyncio.run(go()) == values
    tuned = any(GLIBC_LINE in line for line in broker.log_lines)
    assert tuned is (glibc_version() is not None and bool(thresholds)), broker.log_lines


def _evict(directory: Path) -> None:
    evict_from_page_cache(directory.iterdir())


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="needs posix_fadvise")
@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_fetches_of_data_no_longer_in_the_page_cache_return_the_stored_bytes_in_order(
        broker_factory: Callable[..., BrokerProcess], loop: str) -> None:
    broker = broker_factory({"numPartitions": 1, "event-loop": loop, "maxSegmentSize": "256k"})
    c = RawClient.to(broker)
    expected = []
    for i in range(40):  # ~1.3 MB over several segments, batches of 32 KiB (above the sendfile size)
        values = [b"%04d-%04d:" % (i, j) + bytes(1000) for j in range(32)]
        assert c.call(m.ProduceRequest("cold", 0, 1, 5000, encode_values(values, 1))).error_code == 0
        expected += values
    assert len(list((broker.data_dir / "cold-0").glob("*.log"))) > 3
    for max_bytes in (100_000, 1):  # several batches per reply; one batch per reply
        _evict(broker.data_dir / "cold-0")
        got: list[bytes] = []
        offset = 0
        while offset < len(expected):
            reply = c.call(m.FetchRequest("cold", 0, offset, max_bytes, 0))
            assert reply.error_code == 0 and reply.records
            messages, offset = decode_fetched(reply.records, "cold", 0, offset)  # CRC checked
            got += [bytes(x.data) for x in messages]
        assert got == expected
