"""A follower's storage: append_replicated (the master's stamped bytes, byte for byte) and truncate_to.

The unit tests pin the errors (gap, overlap, damage, a foreign id, a cut-off tail: nothing written) and
the truncate cases (batch boundaries, segment edges, reopen clean and unclean, a crash at each step of a
truncate). The stateful test drives a master and a follower log with appends, replication in random
chunk sizes, truncation, crashes with torn tails and reopens, and checks after every step that the
follower's bytes are a prefix of the master's, offset for offset.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from storage_helpers import examples, make_batch, no_sync, read_all

from metaq.errors import CorruptRecordError, InvalidArgument, StorageError
from metaq.protocol.records import encode_values, iter_batches
from metaq.storage import LogConfig, OffsetOutOfRange, PartitionLog
from metaq.storage.replica import ReplicaGap

BROKER_ID = 7


def open_pair(root: Path, **config: int) -> tuple[PartitionLog, PartitionLog]:
    cfg = LogConfig(**{"unflush_threshold": 1000, "segment_bytes_max": 2000, "index_interval_bytes": 128,
                       **config})
    master = PartitionLog.open(root / "master" / "t-0", "t", 0, cfg, BROKER_ID, sync=no_sync)
    follower = PartitionLog.open(root / "follower" / "t-0", "t", 0, cfg, BROKER_ID, sync=no_sync)
    return master, follower


def log_bytes(log: PartitionLog, start: int, end: int) -> bytes:
    """The stored bytes of whole batches from ``start`` (a batch boundary) to ``end``."""
    out = bytearray()
    offset = start
    while offset < end:
        with log.read(offset, 1 << 20) as piece:
            data = piece.read_bytes()
            assert piece.next_offset > offset, f"no progress reading {log} at {offset} (end {end})"
            offset = piece.next_offset
        for at, header in iter_batches(data):
            if header.base_offset < end:
                out += data[at:at + header.total_bytes]
    return bytes(out)


def replicate_all(master: PartitionLog, follower: PartitionLog, max_bytes: int = 1 << 20) -> None:
    for _ in range(10_000):
        if not replicate(master, follower, max_bytes):
            return
    raise AssertionError("replication does not converge")


def replicate(master: PartitionLog, follower: PartitionLog, max_bytes: int = 1 << 20) -> int:
    """One fetch-and-store round as the replica fetcher does it; returns the messages copied."""
    if follower.log_end_offset >= master.log_end_offset:
        return 0
    data = master.read_bytes(follower.log_end_offset, max_bytes)
    result = follower.append_replicated(data)
    return 0 if result is None else result.record_count


def fill(master: PartitionLog, batches: int, count: int = 4, size: int = 60) -> None:
    for i in range(batches):
        master.append(make_batch(count, size, 1000 + i)[0])


def segment_files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.glob("*.log"))}


# --------------------------------------------------------------------------- append_replicated


def test_follower_copies_master_byte_for_byte_across_segments(tmp_path: Path) -> None:
    master, follower = open_pair(tmp_path)
    fill(master, 40)
    replicate_all(master, follower, max_bytes=700)
    assert follower.log_end_offset == master.log_end_offset == 160
    assert master.segment_count > 3
    assert follower.segment_base_offsets == master.segment_base_offsets
    assert log_bytes(follower, 0, 160) == log_bytes(master, 0, 160)
    assert segment_files(follower.directory) == segment_files(master.directory)
    ids = [(m.offset, m.id, m.data) for m in read_all(follower)]
    assert ids == [(m.offset, m.id, m.data) for m in read_all(master)]
    assert follower.verify().ok
    master.close()
    follower.close()
    reopened = PartitionLog.open(tmp_path / "follower" / "t-0", "t", 0, follower.config, BROKER_ID, sync=no_sync)
    assert reopened.recovery.clean and reopened.log_end_offset == 160
    reopened.close()


def test_append_replicated_returns_the_run_and_follows_the_flush_policy(tmp_path: Path) -> None:
    synced: list[int] = []
    cfg = LogConfig(unflush_threshold=1, segment_bytes_max=1 << 20)
    master = PartitionLog.open(tmp_path / "m" / "t-0", "t", 0, cfg, BROKER_ID, sync=no_sync)
    follower = PartitionLog.open(tmp_path / "f" / "t-0", "t", 0, cfg, BROKER_ID, sync=synced.append)
    first = master.append(make_batch(3)[0])
    master.append(make_batch(2)[0])
    result = follower.append_replicated(master.read_bytes(0, 1 << 20))
    assert result is not None
    assert (result.base_offset, result.last_offset, result.record_count) == (0, 4, 5)
    assert result.base_message_id == first.base_message_id
    assert result.wait_for_durable and result.durable.done() and synced
    assert follower.append_replicated(b"") is None
    master.close()
    follower.close()


@pytest.mark.parametrize("start", [0, 6])
def test_gap_and_overlap_are_refused_and_nothing_is_written(tmp_path: Path, start: int) -> None:
    master, follower = open_pair(tmp_path)
    fill(master, 4, count=3)
    follower.append_replicated(master.read_bytes(0, 400))
    end = follower.log_end_offset
    assert end == 3
    before = segment_files(follower.directory)
    offered = 0 if start == 0 else start
    with pytest.raises(ReplicaGap) as err:
        follower.append_replicated(master.read_bytes(offered, 1 << 20))
    assert err.value.expected == 3 and err.value.got == offered
    assert ("overlap" if offered < end else "gap") in str(err.value)
    assert f"Fetch again from offset {end}" in str(err.value)
    assert follower.log_end_offset == end and segment_files(follower.directory) == before
    master.close()
    follower.close()


def _flip(data: bytes, position: int) -> bytes:
    damaged = bytearray(data)
    damaged[position] ^= 0x10
    return bytes(damaged)


@pytest.mark.parametrize("what", ["header", "body", "tail", "foreign broker", "foreign partition"])
def test_damaged_or_foreign_batches_are_refused(tmp_path: Path, what: str) -> None:
    master, follower = open_pair(tmp_path)
    fill(master, 3, count=2)
    data = master.read_bytes(0, 1 << 20)
    batches = list(iter_batches(data))
    second_at = batches[1][0]
    if what == "header":
        bad = _flip(data, second_at + 20)
    elif what == "body":
        bad = _flip(data, len(data) - 3)
    elif what == "tail":
        bad = data[:-5]
    elif what == "foreign broker":
        other = PartitionLog.open(tmp_path / "o" / "t-0", "t", 0, master.config, BROKER_ID + 1, sync=no_sync)
        other.append(make_batch(2)[0])
        bad = other.read_bytes(0, 1 << 20)
        other.close()
    else:
        other = PartitionLog.open(tmp_path / "o" / "t-1", "t", 1, master.config, BROKER_ID, sync=no_sync)
        other.append(make_batch(2)[0])
        bad = other.read_bytes(0, 1 << 20)
        other.close()
    with pytest.raises(CorruptRecordError):
        follower.append_replicated(bad)
    assert follower.log_end_offset == 0 and follower.size_bytes == 0
    follower.append_replicated(data)  # the intact bytes are still accepted afterwards
    assert follower.log_end_offset == master.log_end_offset
    master.close()
    follower.close()


# --------------------------------------------------------------------------- truncate_to


def test_truncate_to_batch_boundaries_then_append_continues(tmp_path: Path) -> None:
    master, follower = open_pair(tmp_path)
    fill(master, 30)
    replicate_all(master, follower)
    bounds = [h.base_offset for _, h in iter_batches(log_bytes(follower, 0, 120))]
    segment_bases = follower.segment_base_offsets
    assert len(segment_bases) > 2
    # a cut inside a segment, at a segment's first offset, and back to the very start
    for target in (bounds[-3], segment_bases[-2], 0):
        removed = follower.truncate_to(target)
        assert follower.log_end_offset == target
        assert removed > 0
        assert log_bytes(follower, 0, target) == log_bytes(master, 0, target)
        assert follower.verify().ok
        replicate_all(master, follower, max_bytes=500)
        assert log_bytes(follower, 0, 120) == log_bytes(master, 0, 120)
        assert segment_files(follower.directory) == segment_files(master.directory)
    assert follower.truncate_to(120) == 0
    master.close()
    follower.close()


def test_truncate_refuses_inside_a_batch_and_outside_the_log(tmp_path: Path) -> None:
    master, follower = open_pair(tmp_path)
    fill(master, 3, count=4)
    replicate_all(master, follower)
    with pytest.raises(InvalidArgument, match=r"inside the batch of offsets 4\.\.7.*4 or 8"):
        follower.truncate_to(5)
    with pytest.raises(OffsetOutOfRange):
        follower.truncate_to(13)
    assert follower.log_end_offset == 12
    master.close()
    follower.close()


@pytest.mark.parametrize("clean", [True, False])
def test_truncation_survives_reopen(tmp_path: Path, clean: bool) -> None:
    master, follower = open_pair(tmp_path)
    fill(master, 30)
    replicate_all(master, follower)
    target = follower.segment_base_offsets[1] + 4
    follower.truncate_to(target)
    if clean:
        follower.close()
    else:
        follower.abandon()
    reopened = PartitionLog.open(follower.directory, "t", 0, follower.config, BROKER_ID, sync=no_sync)
    assert reopened.log_end_offset == target
    assert reopened.recovery.truncated_bytes == 0
    assert log_bytes(reopened, 0, target) == log_bytes(master, 0, target)
    assert reopened.verify().ok
    assert reopened.offset_for_timestamp(0) == 0
    replicate_all(master, reopened)
    assert log_bytes(reopened, 0, 120) == log_bytes(master, 0, 120)
    master.close()
    reopened.close()


@pytest.mark.parametrize("fail_at", ["unlink", "ftruncate", "sync"])
def test_crash_mid_truncate_leaves_a_valid_prefix_and_a_retry_finishes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_at: str) -> None:
    master, follower = open_pair(tmp_path)
    fill(master, 30)
    replicate_all(master, follower)
    old_end = follower.log_end_offset
    target = follower.segment_base_offsets[1] + 4
    calls = {"unlink": 0}
    real_unlink, real_ftruncate = os.unlink, os.ftruncate

    def crash(*args: object) -> None:
        raise OSError(5, f"simulated crash at {fail_at}")

    if fail_at == "unlink":
        def unlink(path: str, *a: object, **k: object) -> None:  # the second segment removal "crashes"
            calls["unlink"] += 1
            if calls["unlink"] > 3:
                crash()
            real_unlink(path)
        monkeypatch.setattr(os, "unlink", unlink)
    elif fail_at == "ftruncate":
        monkeypatch.setattr(os, "ftruncate", crash)
    else:
        follower._sync = crash  # type: ignore[method-assign]
    with pytest.raises(StorageError, match="offline until restart"):
        follower.truncate_to(target)
    monkeypatch.setattr(os, "unlink", real_unlink)
    monkeypatch.setattr(os, "ftruncate", real_ftruncate)
    with pytest.raises(StorageError):
        follower.append_replicated(b"x")  # offline: nothing more is written before a restart
    follower.abandon()
    reopened = PartitionLog.open(follower.directory, "t", 0, follower.config, BROKER_ID, sync=no_sync)
    end = reopened.log_end_offset
    assert target <= end <= old_end
    assert log_bytes(reopened, 0, end) == log_bytes(master, 0, end)
    reopened.truncate_to(target)
    assert reopened.log_end_offset == target and reopened.verify().ok
    master.close()
    reopened.close()


# --------------------------------------------------------------------------- stateful


payload_lists = st.lists(st.binary(min_size=0, max_size=30), min_size=1, max_size=8)


class FollowerMachine(RuleBasedStateMachine):
    """A master log, a follower log, and the rule that the follower holds a prefix of the master."""

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="metaq-follower-"))
        self.master: PartitionLog | None = None
        self.follower: PartitionLog | None = None
        self.bounds = [0]  # the master's batch boundaries (offsets)

    @initialize(segment_bytes_max=st.integers(300, 1200), index_interval_bytes=st.sampled_from([0, 64, 256]))
    def open_both(self, segment_bytes_max: int, index_interval_bytes: int) -> None:
        self.config = LogConfig(segment_bytes_max=segment_bytes_max, index_interval_bytes=index_interval_bytes,
                                unflush_threshold=100)
        self.master = PartitionLog.open(self.root / "m" / "t-0", "t", 0, self.config, BROKER_ID, sync=no_sync)
        self.reopen_follower()

    def reopen_follower(self) -> None:
        self.follower = PartitionLog.open(self.root / "f" / "t-0", "t", 0, self.config, BROKER_ID, sync=no_sync)

    @rule(values=payload_lists, timestamp_ms=st.integers(0, 1000))
    def master_appends(self, values: list[bytes], timestamp_ms: int) -> None:
        assert self.master is not None
        result = self.master.append(encode_values(values, timestamp_ms))
        self.bounds.append(result.last_offset + 1)

    @rule(max_bytes=st.integers(1, 1500))
    def replicate(self, max_bytes: int) -> None:
        assert self.master is not None and self.follower is not None
        before = self.follower.log_end_offset
        copied = replicate(self.master, self.follower, max_bytes)
        assert self.follower.log_end_offset == before + copied

    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        assert self.follower is not None
        end = self.follower.log_end_offset
        candidates = [b for b in self.bounds if b <= end]
        target = data.draw(st.sampled_from(candidates))
        self.follower.truncate_to(target)
        assert self.follower.log_end_offset == target

    @rule()
    def reopen_clean(self) -> None:
        assert self.follower is not None
        self.follower.close()
        self.reopen_follower()

    @precondition(lambda self: self.follower is not None and self.follower.size_bytes > 0)
    @rule(data=st.data())
    def crash_with_torn_tail(self, data: st.DataObject) -> None:
        assert self.follower is not None
        self.follower.abandon()
        newest = sorted(self.follower.directory.glob("*.log"))[-1]
        size = newest.stat().st_size
        cut = data.draw(st.integers(0, size))
        with open(newest, "r+b") as f:
            f.truncate(cut)
        self.reopen_follower()

    @invariant()
    def follower_is_a_prefix_of_the_master(self) -> None:
        if self.master is None or self.follower is None:
            return
        end = self.follower.log_end_offset
        assert end in self.bounds, "the follower ends on one of the master's batch boundaries"
        assert end <= self.master.log_end_offset
        assert log_bytes(self.follower, 0, end) == log_bytes(self.master, 0, end)

    def teardown(self) -> None:
        for log in (self.master, self.follower):
            if log is not None and not log.closed:
                log.abandon()
        shutil.rmtree(self.root, ignore_errors=True)


TestFollowerMachine = FollowerMachine.TestCase
TestFollowerMachine.settings = settings(max_examples=examples(40), stateful_step_count=30, deadline=None)


def test_replicated_log_passes_verify_after_random_history() -> None:
    """Spot check beside the machine: a long replicated history is clean to ``verify``."""
    root = Path(tempfile.mkdtemp(prefix="metaq-follower-v-"))
    try:
        master, follower = open_pair(root, segment_bytes_max=900, index_interval_bytes=64)
        for i in range(60):
            master.append(make_batch(1 + i % 5, 10 + i % 40, 1000 + (i * 37) % 500)[0])
            if i % 7 == 0:
                replicate(master, follower, max_bytes=300)
        replicate_all(master, follower, max_bytes=300)
        report = follower.verify()
        assert report.ok, report
        assert follower.offset_for_timestamp(1200) == master.offset_for_timestamp(1200)
        master.close()
        follower.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)




# --------------------------------------------------------------------------- start_empty_at


def test_an_empty_follower_starts_at_the_masters_log_start(tmp_path: Path) -> None:
    master, follower = open_pair(tmp_path)
    master.start_empty_at(50)  # stands for a master whose retention removed offsets 0..49
    fill(master, 10)
    with pytest.raises(ReplicaGap):
        follower.append_replicated(master.read_bytes(50, 1 << 20))
    follower.start_empty_at(50)
    assert (follower.log_start_offset, follower.log_end_offset) == (50, 50)
    replicate_all(master, follower)
    assert log_bytes(follower, 50, 90) == log_bytes(master, 50, 90)
    with pytest.raises(InvalidArgument, match="only an empty log"):
        follower.start_empty_at(200)
    follower.abandon()
    reopened = PartitionLog.open(follower.directory, "t", 0, follower.config, BROKER_ID, sync=no_sync)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (50, 90)
    assert reopened.verify().ok
    master.close()
    reopened.close()


def test_a_crash_inside_start_empty_at_recovers_to_the_old_start(tmp_path: Path) -> None:
    _, follower = open_pair(tmp_path)
    follower.close()
    (follower.directory / "00000000000000000050.log").touch()  # the new file made, the old not yet removed
    reopened = PartitionLog.open(follower.directory, "t", 0, follower.config, BROKER_ID, sync=no_sync)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (0, 0)
    reopened.start_empty_at(50)
    assert sorted(p.name for p in follower.directory.glob("*.log")) == ["00000000000000000050.log"]
    reopened.close()


def test_a_full_disk_at_a_roll_keeps_the_runs_before_it_and_the_next_fetch_resumes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from metaq.storage.errors import DiskFull

    master, follower = open_pair(tmp_path)
    fill(master, 30)
    data = master.read_bytes(0, 1 << 20)  # the first segment: fits the follower's first segment
    second = master.segment_base_offsets[1]
    more = master.read_bytes(second, 1 << 20)
    real_acquire = follower._files.acquire

    def acquire(path: str, *args: object, **kwargs: object) -> object:
        if path.endswith(f"{second:020d}.log"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_acquire(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(follower._files, "acquire", acquire)
    with pytest.raises(DiskFull):
        follower.append_replicated(data + more)
    assert follower.log_end_offset == second, "the batches of the first segment were stored"
    monkeypatch.undo()
    replicate_all(master, follower)
    assert log_bytes(follower, 0, 120) == log_bytes(master, 0, 120)
    assert segment_files(follower.directory) == segment_files(master.directory)
    master.close()
    follower.close()
