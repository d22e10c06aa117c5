"""A broker on a full disk (a real, small tmpfs): produces are refused with DISK_FULL while fetches go on;
killed -9 in that state it starts again (read-only until space returns); once space is freed it takes
writes again without a restart; every acknowledged message is there throughout.
"""

from __future__ import annotations

import asyncio

import pytest

from metaq.client import MessageSessionFactory, connect
from metaq.client.group.admin import reset_offsets
from metaq.errors import DeliveryTimeoutError, DiskFullError
from metaq.testing.fs import small_disk

pytestmark = pytest.mark.slow


def produce_until_full(servers: str, acked: list[tuple[int, bytes]], start: int) -> DiskFullError:
    with connect(servers, request_timeout_s=10) as session:
        # DISK_FULL is retriable (space may be freed): the producer resends until its delivery deadline, then
        # fails with DeliveryTimeoutError naming it (docs/producer.md)
        producer = session.create_producer(delivery_timeout_ms=2000)
        for n in range(start, start + 100_000):
            payloads = [b"%08d-%03d " % (n, i) + b"p" * 300 for i in range(20)]
            result = producer.send_batch("full", payloads, partition=0)
            for r, data in zip(result, payloads, strict=True):
                if r.success:
                    acked.append((r.offset, data))
            if not result.success:
                error = result.errors[0]
                assert isinstance(error, DeliveryTimeoutError) and not error.maybe_stored, repr(error)
                assert isinstance(error.cause, DiskFullError), repr(error)
                return error.cause
    raise AssertionError("the disk never filled up")


def read_back(servers: str) -> list[tuple[int, bytes]]:
    with connect(servers) as session:
        consumer = session.create_pull_consumer()
        return [(m.offset, bytes(m.data)) for m in consumer.iterate("full", 0, 0, stop_at_end=True, max_wait_ms=0)]


def test_full_disk_read_only_then_recovered_without_restart(tmp_path, broker_factory) -> None:
    with small_disk(tmp_path / "disk", 8 << 20) as disk:
        broker = broker_factory({"unflushThreshold": 1, "maxSegmentSize": 512 * 1024}, name="disk/data")
        with connect(broker.servers) as session:
            session.admin().create_topic("full", 1)

        async def commit(offset: int) -> None:
            async with await MessageSessionFactory.connect(broker.servers) as s:
                await reset_offsets(s, "g", "full", offset)

        asyncio.run(commit(0))  # something in the offsets log for the restart to compact
        disk.fill(leave_bytes=1 << 20)
        acked: list[tuple[int, bytes]] = []
        error = produce_until_full(broker.servers, acked, 0)
        assert "disk is full" in error.message and error.retriable
        assert acked and read_back(broker.servers) == acked, "every acknowledged message, nothing else"
        broker.kill()  # a crash while the disk is full
        disk.fill(leave_bytes=0)  # not one byte left for the restart's index rewrites and compaction
        broker.start()  # used to fail: ENOSPC while opening the partition or compacting the offsets log
        assert read_back(broker.servers) == acked
        # still full: writes are refused again (the last partly used page may take a little first)
        produce_until_full(broker.servers, acked, 100_000)
        assert read_back(broker.servers) == acked

        disk.free()  # the operator makes room: no restart needed
        with connect(broker.servers) as session:
            result = session.create_producer().send_batch("full", [b"after"], partition=0)
        assert result.success
        acked.append((result[0].offset, b"after"))
        asyncio.run(commit(5))
        assert read_back(broker.servers) == acked
        assert broker.stop() == 0
