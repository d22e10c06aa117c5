"""The broker acknowledges a produce only after the sync that covers it, and fails it when that sync fails.

The kill -9 tests cannot show this: the page cache survives a process kill, so they pass with no
fsync at all. Here the real broker runs in this process (metaq.testing.inprocess) with an injected
fdatasync that records which file and how many bytes each call covered, can be held closed, and can
fail with EIO; the producer is the real asyncio client over loopback.

The contract (docs/storage.md, "Flush policy"):

* ``unflushThreshold=1`` and group commit (``<= 0``): the ack of a batch is sent only after an
  fdatasync that started after the batch was written has finished.
* ``unflushThreshold=N > 1``: the ack means "in the page cache"; it never waits for a sync. The batch
  is synced once the partition has N unflushed messages or after ``unflushInterval`` ms, so a power
  loss (not a process crash) may lose up to that much acknowledged data.
* A failed fdatasync fails every produce it covered with KAFKA_STORAGE_ERROR (56) and takes the
  partition offline: later produces get the same code and a message saying to restart; reads of what
  was stored before keep working; a restart recovers the partition.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from metaq.client import Message, MessageSessionFactory
from metaq.errors import StorageError, StorageFailureError
from metaq.testing import until
from metaq.testing.inprocess import GatedSync, InProcessBroker, SyncRecord
from metaq.types import SendResult

TOPIC = "durable"
WAIT_S = 30.0


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 120))


def ack_snapshots(sync: GatedSync, task: asyncio.Future[SendResult]) -> list[list[SyncRecord]]:
    """What the sync had done at the moment the answer completed the send (filled by a done callback): an
    answer that came too early, while the sync that must precede it was held, is caught whenever it came."""
    seen: list[list[SyncRecord]] = []
    task.add_done_callback(lambda _t: seen.append(sync.records()))
    return seen


def config(threshold: int, **extra: Any) -> dict[str, Any]:
    return {"unflushThreshold": threshold, "numPartitions": 1, "unflushInterval": 3_600_000, **extra}


def to_partition(partition: int) -> Callable[..., Any]:
    """A selector that always picks one partition."""
    return lambda topic, partitions, message: partitions[partition]


@pytest.mark.parametrize("threshold", [1, 0, -1], ids=["unflushThreshold=1", "group-commit-0", "group-commit-1"])
def test_ack_is_sent_only_after_a_sync_that_covers_the_batch(tmp_path: Path, threshold: int) -> None:
    sync = GatedSync()
    with InProcessBroker(tmp_path / "data", config(threshold), sync=sync) as broker:
        run(_ack_after_sync(broker, sync))


async def _ack_after_sync(broker: InProcessBroker, sync: GatedSync) -> None:
    async with await MessageSessionFactory.connect(broker.servers) as session:
        producer = session.create_producer()
        warm = await producer.send(Message(TOPIC, b"warm-up"))  # creates the topic, syncs its directories
        assert warm.success, warm.error
        partition = warm.partition
        segment, warm_end = broker.batch_extent(TOPIC, partition, warm.offset)
        assert GatedSync.covers(sync.records(), segment, warm_end)

        sync.hold()
        first = asyncio.ensure_future(producer.send(Message(TOPIC, b"held-1")))
        first_seen = ack_snapshots(sync, first)
        await until(lambda: broker.log_end_offset(TOPIC, partition) == warm.offset + 2,
                    message="the held batch to be appended")
        await until(lambda: [r for r in sync.waiting(segment) if r.size_bytes >= warm_end],
                    message="the sync of the held batch to start (and wait at the gate)")
        # Two more batches arrive while that sync is held: they were written after it started, so it
        # cannot cover them; their acks must wait for the next one.
        later = [asyncio.ensure_future(producer.send(Message(TOPIC, b"held-%d" % i))) for i in (2, 3)]
        later_seen = [ack_snapshots(sync, task) for task in later]
        await until(lambda: broker.log_end_offset(TOPIC, partition) == warm.offset + 4,
                    message="the later batches to be appended")
        sync.release()
        results = await asyncio.gather(first, *later)
        assert all(r.success for r in results), [r.error for r in results]
        assert [r.offset for r in results] == [warm.offset + 1, warm.offset + 2, warm.offset + 3]
        for result, seen in zip(results, [first_seen, *later_seen], strict=True):
            path, end = broker.batch_extent(TOPIC, partition, result.offset)
            assert path == segment
            assert GatedSync.covers(seen[0], path, end), \
                f"offset {result.offset} was acked before a sync covered bytes [.., {end}) of {path.name}"


def test_with_unflush_threshold_n_the_ack_does_not_wait_for_any_sync(tmp_path: Path) -> None:
    """The contract of N > 1: ack on write; a sync every N messages (or unflushInterval) comes later."""
    sync = GatedSync()
    with InProcessBroker(tmp_path / "data", config(4), sync=sync) as broker:
        run(_ack_without_sync(broker, sync))


async def _ack_without_sync(broker: InProcessBroker, sync: GatedSync) -> None:
    async with await MessageSessionFactory.connect(broker.servers) as session:
        producer = session.create_producer()

        async def send_four(first: int) -> list[SendResult]:
            results = []
            for i in range(first, first + 4):  # the 4th unflushed message reaches the threshold: a sync
                result = await asyncio.wait_for(producer.send(Message(TOPIC, b"m-%d" % i)), WAIT_S)
                assert result.success and result.partition == 0, result.error
                results.append(result)
            return results

        warm = await send_four(0)  # the first round also syncs the new directories
        segment, warm_end = broker.batch_extent(TOPIC, 0, warm[-1].offset)
        await until(lambda: GatedSync.covers(sync.records(), segment, warm_end), message="the first threshold sync")

        sync.hold()
        acked = await send_four(4)  # each acknowledged at once, though the sync they trigger is held
        _, threshold_end = broker.batch_extent(TOPIC, 0, acked[-1].offset)
        await until(lambda: [r for r in sync.waiting(segment) if r.size_bytes >= threshold_end],
                    message="the threshold sync to start")
        # While that sync is held, a produce is still acknowledged at once.
        extra = await asyncio.wait_for(producer.send(Message(TOPIC, b"m-8")), WAIT_S)
        assert extra.success and extra.partition == 0, extra.error
        assert sync.held and sync.waiting(segment), "the ack should have come while the sync was held"
        _, extra_end = broker.batch_extent(TOPIC, 0, extra.offset)
        assert not GatedSync.covers(sync.records(), segment, threshold_end)

        sync.release()
        await until(lambda: GatedSync.covers(sync.records(), segment, threshold_end),
                    message="the threshold sync to finish")
        # The ninth message is one of the next N: acknowledged, and not yet on disk (the loss window).
        assert not GatedSync.covers(sync.records(), segment, extra_end)


def test_with_unflush_threshold_n_a_lone_message_is_synced_after_the_interval(tmp_path: Path) -> None:
    sync = GatedSync()
    with InProcessBroker(tmp_path / "data", config(1000, unflushInterval=200), sync=sync) as broker:
        run(_synced_after_interval(broker, sync))


async def _synced_after_interval(broker: InProcessBroker, sync: GatedSync) -> None:
    async with await MessageSessionFactory.connect(broker.servers) as session:
        result = await session.create_producer().send(Message(TOPIC, b"alone"))
        assert result.success, result.error
        segment, end = broker.batch_extent(TOPIC, result.partition, result.offset)
        await until(lambda: GatedSync.covers(sync.records(), segment, end),
                    message="unflushInterval to sync a partition far below its message threshold")


@pytest.mark.parametrize("threshold", [1, 0], ids=["unflushThreshold=1", "group-commit"])
def test_a_failed_sync_fails_every_produce_it_covered_and_the_partition_goes_offline(
        tmp_path: Path, threshold: int) -> None:
    sync = GatedSync()
    broker = InProcessBroker(tmp_path / "data", config(threshold), sync=sync).start()
    try:
        before = run(_failing_sync(broker, sync))
    finally:
        sync.release()
        sync.heal()
    with pytest.raises(StorageError, match="durable-0"):  # closing reports the partition it could not flush
        broker.stop()

    # A restart recovers the partition: what was acked before is there and it takes produces again.
    with InProcessBroker(tmp_path / "data", config(threshold)) as restarted:
        run(_after_restart(restarted, before))


async def _failing_sync(broker: InProcessBroker, sync: GatedSync) -> list[bytes]:
    async with await MessageSessionFactory.connect(broker.servers) as session:
        await session.admin().create_topic(TOPIC, 2)
        producer = session.create_producer(to_partition(0))
        other_producer = session.create_producer(to_partition(1))
        consumer = session.create_pull_consumer()
        stored = []
        for i in range(3):
            result = await producer.send(Message(TOPIC, b"before-%d" % i), timeout_s=WAIT_S)
            assert result.success and result.partition == 0, result.error
            stored.append(b"before-%d" % i)
        other = await other_producer.send(Message(TOPIC, b"other-partition"))
        assert other.success and other.partition == 1, other.error
        partition_dir = str(broker.data_dir / f"{TOPIC}-0")
        segment, end = broker.batch_extent(TOPIC, 0, 2)

        sync.hold()
        sync.fail(lambda path: path.startswith(partition_dir + "/"))
        covered = [asyncio.ensure_future(producer.send(Message(TOPIC, b"lost-1")))]
        covered_seen = [ack_snapshots(sync, covered[0])]
        await until(lambda: broker.log_end_offset(TOPIC, 0) == 4, message="the first doomed batch to be appended")
        await until(lambda: [r for r in sync.waiting(segment) if r.size_bytes > end], message="its sync to start")
        covered += [asyncio.ensure_future(producer.send(Message(TOPIC, b"lost-%d" % i))) for i in (2, 3)]
        covered_seen += [ack_snapshots(sync, task) for task in covered[1:]]
        await until(lambda: broker.log_end_offset(TOPIC, 0) == 6, message="the batches behind it to be appended")
        sync.release()

        results = await asyncio.gather(*covered)
        for result, seen in zip(results, covered_seen, strict=True):
            assert not result.success, f"offset {result.offset} was acked although its sync failed"
            assert isinstance(result.error, StorageFailureError) and result.error.code == 56, result.error
            assert [r for r in seen[0] if r.path == str(segment) and r.state == "failed"], \
                "a produce was answered before the sync covering it had failed"
        assert [r for r in sync.records(segment) if r.state == "failed"]

        # Nothing is acked after the failure, even with the disk healthy again: restart to recover.
        sync.heal()
        for i in range(3):
            after = await producer.send(Message(TOPIC, b"after-%d" % i), timeout_s=WAIT_S)
            assert not after.success and isinstance(after.error, StorageFailureError), after
            assert "offline" in str(after.error) and "restart" in str(after.error)
        assert broker.log_end_offset(TOPIC, 0) == 6, "a produce was stored after the failed sync"

        # The safe state: what was stored before can still be read; the other partition still works.
        messages = await consumer.get(TOPIC, 0, 0)
        assert [m.data for m in messages[:3]] == stored
        other = await other_producer.send(Message(TOPIC, b"other-partition-again"))
        assert other.success and other.partition == 1, other.error
        return stored


async def _after_restart(broker: InProcessBroker, before: list[bytes]) -> None:
    async with await MessageSessionFactory.connect(broker.servers) as session:
        consumer = session.create_pull_consumer()
        messages = await consumer.get(TOPIC, 0, 0)
        assert [m.data for m in messages[:3]] == before
        result = await session.create_producer(to_partition(0)).send(Message(TOPIC, b"after-restart"))
        assert result.success and result.partition == 0, result.error
