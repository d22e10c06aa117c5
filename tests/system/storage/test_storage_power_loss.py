"""A power loss on a file system that keeps only what was synced: every acknowledged message survives.

The broker's data directory is on a DropFS (metaq.testing.dropfs): a FUSE file system that holds file data
until an fsync or fdatasync reaches it, and new directory entries until their directory is fsynced, and
loses the rest when its daemon is killed (the power cut). Like any FUSE file system it never hears of a
syncfs(2): a broker that made a flush round durable with one syncfs there acknowledged messages that a power
loss then took (issue 43). Each trial: a topic whose partitions roll segments under load, a topic created
during the load, kill -9 of the broker and a power cut at that moment, a new mount of what was synced, the
broker restarted on it, and every partition read back and held against the producers' histories (every ack
read back at its offset, in send order, nothing read that was never sent or that failed for certain).
"""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from metaq.client import connect
from metaq.fsutil import atomic_write, datasync, fsync_directory
from metaq.testing import BrokerProcess, wait_until
from metaq.testing.dropfs import DropFS, fuse_unavailable
from metaq.testing.history import ProduceLoad, check_history, read_back
from metaq.types import PartitionId

pytestmark = pytest.mark.slow

PARTITIONS = 4


@pytest.fixture(scope="module")
def fuse() -> None:
    reason = fuse_unavailable()
    if reason is not None:
        pytest.skip(f"power-loss tests need a FUSE mount: {reason}")


@pytest.fixture
def disk(request: pytest.FixtureRequest, tmp_path: Path, fuse: None) -> Iterator[DropFS]:
    """A DropFS with the data directory on it; ``strict`` (indirect parameter, default True): only an fsync of
    a directory persists its new entries, not an fdatasync."""
    fs = DropFS(tmp_path / "mnt", tmp_path / "disk", strict_directories=getattr(request, "param", True)).start()
    data = fs.mountpoint / "data"
    data.mkdir()  # the operator's data directory, durable before the broker starts
    fsync_directory(fs.mountpoint)
    try:
        yield fs
    finally:
        fs.stop()


@pytest.fixture
def broker_on(disk: DropFS) -> Iterator[Any]:
    started: list[BrokerProcess] = []

    def make(options: dict[str, Any]) -> BrokerProcess:
        broker = BrokerProcess(disk.mountpoint / "data", {"numPartitions": PARTITIONS, "maxSegmentSize": "16k",
                                                          **options})
        started.append(broker)
        return broker.start()

    yield make
    for broker in started:
        broker.stop_or_kill(15)
    for broker in started:
        broker.check()


def _load(broker: BrokerProcess, topic: str) -> ProduceLoad:
    session = {"servers": broker.servers, "request_timeout_s": 10, "reconnect_attempts": 1}
    # a send to the dead broker waits for it until its delivery deadline: a short one, so the load ends soon
    return ProduceLoad(session, topic, window=64, limit=50_000, time_limit_s=120, prefix=topic.encode() + b"-",
                       producer_config={"linger_ms": 1, "delivery_timeout_ms": 5000}).start()


def _segments(disk: DropFS, topic: str) -> list[int]:
    data = disk.mountpoint / "data"
    return [len(list((data / f"{topic}-{p}").glob("*.log"))) for p in range(PARTITIONS)]


def _run_until_power_loss(disk: DropFS, broker: BrokerProcess) -> tuple[ProduceLoad, ProduceLoad]:
    """Load a topic until each partition rolled a segment, create a topic and load it too, then kill -9 the
    broker and cut the power while both loads are sending."""
    with connect(broker.servers) as session:
        session.admin().create_topic("old", PARTITIONS)
    old = _load(broker, "old")
    wait_until(lambda: min(_segments(disk, "old")) >= 2 and len(old.acked) >= 2_000, timeout_s=90,
               message="2,000 acks and a segment roll in every partition of the first topic")
    with connect(broker.servers) as session:
        session.admin().create_topic("new", PARTITIONS)
    new = _load(broker, "new")
    before = len(old.acked)
    wait_until(lambda: len(new.acked) >= 500 and len(old.acked) >= before + 500, timeout_s=60,
               message="acks of the new topic, and more of the first")
    broker.kill()
    disk.power_cut()
    for load in (old, new):
        load.stop()
    disk.start()
    broker.start()
    return old, new


def _read(broker: BrokerProcess, topic: str) -> dict[PartitionId, list[tuple[int, bytes]]]:
    with connect(broker.servers) as session:
        return read_back(session, topic)


def _in_send_order(read: dict[PartitionId, list[tuple[int, bytes]]]) -> list[str]:
    out = []
    for pid, messages in read.items():
        numbers = [int(data.rsplit(b"-", 1)[1]) for _, data in messages]
        if numbers != sorted(numbers):
            out.append(f"{pid}: messages stored out of send order")
    return out


@pytest.mark.parametrize(("threshold", "syncfs_min", "disk"), [
    (1, 2, False), (0, 2, False), (1, 0, True), (0, 0, True)], indirect=["disk"], ids=[
    "unflushThreshold=1-syncfsMinPartitions=2", "group-commit-syncfsMinPartitions=2",
    "unflushThreshold=1-strict-directories", "group-commit-strict-directories"])
def test_every_acknowledged_message_survives_a_power_loss(disk: DropFS, broker_on: Any, threshold: int,
                                                          syncfs_min: int) -> None:
    """syncfsMinPartitions=2 makes nearly every flush round of this load one that a syncfs could cover (on a
    DropFS whose directories, like most file systems', keep new entries after an fdatasync too). The strict
    cases leave every sync to the partitions, on a DropFS where only an fsync of a directory keeps its new
    entries (the new topic's partitions, new segments)."""
    broker = broker_on({"unflushThreshold": threshold, "syncfsMinPartitions": syncfs_min})
    old, new = _run_until_power_loss(disk, broker)
    for load in (old, new):
        read = _read(broker, load.topic)
        problems = check_history(read, load.acked, load.failed) + _in_send_order(read)
        assert not problems, f"{load.topic}: {problems[:10]}"
        assert len(load.acked) >= 500


def test_without_a_sync_before_the_ack_only_the_unsynced_tail_of_each_partition_is_lost(
        disk: DropFS, broker_on: Any) -> None:
    """The control: unflushThreshold=1000 acknowledges before any sync (MetaQ's default loss window), so the
    power cut takes what each partition wrote after its last sync, and nothing before it. That it takes
    something shows the power cut is real."""
    broker = broker_on({"unflushThreshold": 1000, "unflushInterval": 600_000, "syncfsMinPartitions": 2})
    old, new = _run_until_power_loss(disk, broker)
    lost = 0
    for load in (old, new):
        read = _read(broker, load.topic)
        problems = [p for p in check_history(read, load.acked, load.failed) if "not read back" not in p]
        assert not problems + _in_send_order(read), f"{load.topic}: {problems[:10]}"
        by_partition: dict[PartitionId, list[tuple[int, bytes]]] = {}
        for data, ack in load.acked.items():
            by_partition.setdefault(ack.partition, []).append((ack.offset, data))
        for pid, acked in by_partition.items():
            kept = {data for _, data in read.get(pid, [])}
            flags = [data in kept for _, data in sorted(acked)]
            assert flags == sorted(flags, reverse=True), f"{pid}: a message lost before one that survived"
            lost += flags.count(False)
    assert lost > 0, "the power cut lost nothing that was never synced: the test cannot see a loss"



def test_on_fuse_the_broker_says_it_does_not_use_syncfs(disk: DropFS, broker_on: Any) -> None:
    """The decision is logged at start and shown by `metaq stats` and /metrics."""
    from metaq.testing.ports import unused_port

    broker = broker_on({"dashboardHttpPort": unused_port()})
    assert any("not known to make data durable with syncfs" in line and "fuse" in line for line in broker.log_lines)
    with connect(broker.servers) as session:
        durability = session.admin().stats()["durability"]
    assert durability["filesystem"] == "fuse" and durability["syncfs"] is False, durability
    assert broker.metrics_url is not None
    with urllib.request.urlopen(broker.metrics_url, timeout=10) as reply:
        assert 'metaq_storage_syncfs_used{filesystem="fuse"} 0.0' in reply.read().decode()


@pytest.mark.parametrize("sync", [os.fsync, os.fdatasync, datasync], ids=["fsync", "fdatasync", "datasync"])
def test_a_directory_synced_through_fsutil_keeps_its_new_entries(disk: DropFS, sync: Any) -> None:
    """fsutil's directory syncs make new names durable whichever sync a store passes for its files (an
    fdatasync of the directory itself would not, on this DropFS)."""
    directory = disk.mountpoint / "data"
    atomic_write(directory / "checkpoint.json", b"{}", sync=sync)
    (directory / "plain").write_bytes(b"x")
    fsync_directory(directory, sync)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        sync(fd)  # what the storage does with the sync it was given, on a directory: datasync fsyncs it
    finally:
        os.close(fd)
    disk.power_cut()
    disk.start()
    assert (directory / "checkpoint.json").read_bytes() == b"{}"
    assert (directory / "plain").exists()
