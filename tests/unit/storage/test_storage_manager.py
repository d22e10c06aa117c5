"""LogManager: loading, creating, tags and message ids, topic config, retention, fd budget."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from storage_helpers import make_batch, no_sync, read_all

from metaq.errors import InvalidArgument, StorageError
from metaq.storage import LogConfig, LogManager, MessageNotFound
from metaq.storage.manager import CHECKPOINT_FILE, parse_partition_dir_name

FAST = LogConfig(unflush_threshold=1000, segment_bytes_max=1 << 20)


def manager(tmp_path, **kwargs) -> LogManager:
    kwargs.setdefault("sync", no_sync)
    return LogManager(tmp_path / "data", 3, FAST, **kwargs).open()


def test_partition_dir_names_split_on_the_last_dash():
    assert parse_partition_dir_name("my-topic-12") == ("my-topic", 12)
    assert parse_partition_dir_name("t-0") == ("t", 0)
    for bad in ("topic", "topic-", "-1", "t-x", "t-0.deleting", "a/b-1", "t-\u0661"):
        assert parse_partition_dir_name(bad) is None


def test_create_close_reopen_keeps_partitions_and_data(tmp_path):
    m = manager(tmp_path)
    written = {}
    for topic, partition in [("orders-eu", 0), ("orders-eu", 2), ("a.b_c", 1)]:
        log = m.get_or_create(topic, partition)
        batch, values = make_batch()
        log.append(batch)
        written[(topic, partition)] = values
    assert m.topics() == {"a.b_c": [1], "orders-eu": [0, 2]}
    assert m.partitions("orders-eu") == [0, 2]
    m.close()
    assert (tmp_path / "data" / CHECKPOINT_FILE).exists()
    m = manager(tmp_path, load_in_parallel=True)
    assert not (tmp_path / "data" / CHECKPOINT_FILE).exists()
    for (topic, partition), values in written.items():
        log = m.get(topic, partition)
        assert log is not None and log.recovery.clean
        assert [x.data for x in read_all(log)] == values
    m.close()


def test_unclean_stop_is_recovered(tmp_path):
    m = manager(tmp_path)
    log = m.get_or_create("t", 0)
    log.append(make_batch()[0])
    for partition_log in m.logs():
        partition_log.abandon()
    m.flusher.stop()
    m._unlock_data_dir()  # what a dead process leaves: no checkpoint, lock released
    m = manager(tmp_path)
    log = m.get("t", 0)
    assert log is not None and not log.recovery.clean and log.log_end_offset == 3
    m.close()


def test_bad_names_and_partitions_are_refused(tmp_path):
    m = manager(tmp_path)
    for topic in ("../x", "", "a/b", "x" * 300):
        with pytest.raises(InvalidArgument):
            m.get_or_create(topic, 0)
    with pytest.raises(InvalidArgument):
        m.get_or_create("t", -1)
    m.close()


def test_data_dir_is_locked(tmp_path):
    m = manager(tmp_path)
    with pytest.raises(StorageError, match="in use"):
        manager(tmp_path)
    m.close()


def test_tag_collision_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr("metaq.storage.manager.partition_tag", lambda topic, partition: 42)
    monkeypatch.setattr("metaq.storage.log.partition_tag", lambda topic, partition: 42)
    m = manager(tmp_path)
    m.get_or_create("a", 0)
    with pytest.raises(StorageError, match="tag"):
        m.get_or_create("b", 0)
    m.close()


def test_resolve_message_id(tmp_path):
    m = manager(tmp_path)
    m.get_or_create("x", 0).append(make_batch()[0])
    log = m.get_or_create("y", 5)
    log.append(make_batch()[0])
    result = log.append(make_batch(count=4)[0])
    assert m.resolve_message_id(result.base_message_id + 2) == ("y", 5, result.base_offset + 2)
    with pytest.raises(MessageNotFound, match="broker 9"):
        m.resolve_message_id(result.base_message_id & ((1 << 112) - 1) | (9 << 112))
    with pytest.raises(MessageNotFound, match="tag"):
        m.resolve_message_id((3 << 112) | (12345 << 64))
    with pytest.raises(MessageNotFound, match="outside"):
        m.resolve_message_id(result.base_message_id + 4)
    m.close()


def test_delete_topic_and_live_config(tmp_path):
    m = manager(tmp_path)
    for partition in range(3):
        log = m.get_or_create("gone", partition)
        log.append(make_batch()[0])
    keep = m.get_or_create("keep", 0)
    while keep.segment_count < 4:
        keep.append(make_batch(size=200)[0])
    assert m.delete_topic("gone") == [0, 1, 2]
    assert m.get("gone", 0) is None and not (tmp_path / "data" / "gone-0").exists()
    assert m.run_retention().removed == {}
    m.set_topic_config("keep", FAST.with_changes(delete_policy="delete,1s"))
    # Retention never removes a sealed segment the flusher has not synced yet; sync them all first so
    # that every sealed segment is a candidate (without this the count raced the background flusher).
    m.flush_all()
    removed = m.run_retention(now_ms=int(time.time() * 1000) + 10_000).removed
    assert list(removed) == ["keep-0"] and keep.segment_count == 1
    m.set_topic_config("keep", FAST.with_changes(unflush_threshold=1))
    result = keep.append(make_batch()[0])
    assert result.wait_for_durable
    result.durable.result(10)
    m.close()


@pytest.mark.parametrize("count", [
    2_000,
    pytest.param(10_000, marks=pytest.mark.slow),  # about 5 s
])
def test_many_partitions_with_a_small_fd_budget(tmp_path, count):
    m = manager(tmp_path, max_open_files=64)
    batch, values = make_batch(count=2)
    for partition in range(count):
        m.get_or_create("many", partition).append(batch)
        assert m.files.open_count <= 64
    for partition in range(0, count, 7):
        log = m.get("many", partition)
        assert log is not None and [x.data for x in read_all(log)] == values
    assert m.files.open_count <= 64 and m.files.overshoot_count == 0
    m.flush_all()
    m.close()
    m = manager(tmp_path, max_open_files=64)
    assert len(m.partitions("many")) == count
    log = m.get("many", count - 1)
    assert log is not None and log.recovery.clean and [x.data for x in read_all(log)] == values
    m.close()


def test_close_syncs_partitions_side_by_side_and_records_every_one_clean(tmp_path):
    """One close after another took minutes for 10,000 partitions on a busy disk (two index fsyncs each, plus
    the log's): the syncs of a close run side by side. Two syncs must meet at the barrier, which they can
    only do if two partitions are being closed at once."""
    closing = threading.Event()
    barrier = threading.Barrier(2, timeout=10)
    first_two = threading.Semaphore(2)

    def sync(fd: int) -> None:
        if closing.is_set() and first_two.acquire(blocking=False):
            barrier.wait()  # BrokenBarrierError after 10 s if no other sync runs meanwhile

    m = LogManager(tmp_path / "data", 3, FAST, sync=sync, load_workers=4).open()
    batch, values = make_batch(count=2)
    for partition in range(40):
        m.get_or_create("wide", partition).append(batch)
    closing.set()
    m.close()  # a broken barrier (serial syncs) raises out of close
    closing.clear()
    m = manager(tmp_path)
    assert all(log.recovery.clean for log in m.logs()) and len(m.logs()) == 40
    assert [x.data for x in read_all(m.get("wide", 39))] == values
    m.close()


def test_the_open_files_limit_is_raised_up_to_what_the_budget_needs():
    """A soft RLIMIT_NOFILE of 1024 (a common default) and a budget of 1024 descriptors would fail with EMFILE."""
    script = (
        "import resource; from metaq.storage.files import raise_descriptor_limit\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))\n"
        "want = 2000 if hard == resource.RLIM_INFINITY else min(2000, hard)\n"
        "assert raise_descriptor_limit(2000) == want, raise_descriptor_limit(2000)\n"
        "assert resource.getrlimit(resource.RLIMIT_NOFILE) == (want, hard)\n"
        "assert raise_descriptor_limit(100) == want  # never lowered\n")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)


def test_a_clean_close_creates_no_index_files_for_small_partitions_and_they_reopen_clean(tmp_path):
    """Two index files created and fsynced per partition made the close of 10,000 new partitions take
    seconds; an empty segment's indexes are empty, so a missing file says the same, and a small active
    segment's are made again by the clean open's walk."""
    m = manager(tmp_path)
    for partition in range(3):
        m.get_or_create("quiet", partition)
    batch, values = make_batch(count=2)
    m.get("quiet", 2).append(batch)
    m.close()
    data = tmp_path / "data"
    assert sorted(p.name for p in (data / "quiet-0").iterdir()) == ["00000000000000000000.log"]
    assert sorted(p.name for p in (data / "quiet-2").iterdir()) == ["00000000000000000000.log"]
    m = manager(tmp_path)
    assert all(log.recovery.clean for log in m.logs())
    for partition in range(3):
        report = m.get("quiet", partition).verify()
        assert report.ok and not report.index_problems, report
    m.get("quiet", 0).append(batch)  # the files appear with a 4 KiB run of entries, or at a seal
    assert [x.data for x in read_all(m.get("quiet", 0))] == values
    m.close()
    m = manager(tmp_path)
    assert m.get("quiet", 0).recovery.clean and [x.data for x in read_all(m.get("quiet", 0))] == values
    m.close()
