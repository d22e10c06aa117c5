"""The delay store's parts: bucket rows and files, the checkpoint slots, and the store driven by a fake clock
(what is in memory, delivery order, never early, recovery without the bucket files, exactly once)."""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metaq.broker.delay.buckets import Row, encode_row, parse_rows, read_checkpoint, write_checkpoint
from metaq.broker.delay.store import DelayStore
from metaq.errors import CorruptMessageError, DelayTooLongError
from metaq.protocol.delayed import DELAY_REF_HEADER, DELIVER_AT_HEADER, header_ms, mark_delayed, pack_ms
from metaq.protocol.records import ATTR_DELAYED, decode_batch, encode_columns, validate_batch
from metaq.storage import LogConfig, PartitionLog
from metaq.testing import FakeClock
from metaq.types import Message

CONFIG = LogConfig(segment_bytes_max=1 << 20, unflush_threshold=1000, unflush_interval_ms=10_000,
                   delete_policy="delete,168", max_message_bytes=1 << 20, max_batch_bytes=1 << 24)


def clock_at(ms: int) -> FakeClock:
    clock = FakeClock()
    clock.now_ms = ms
    return clock


def delayed_batch(dues: list[int], payloads: list[bytes] | None = None) -> bytes:
    values = payloads or [f"v{i}".encode() for i in range(len(dues))]
    return mark_delayed(encode_columns(values, [1] * len(values),
                                       headers=[[(DELIVER_AT_HEADER, pack_ms(d))] for d in dues]))


class Env:
    def __init__(self, tmp: Path, clock: FakeClock) -> None:
        self.tmp = tmp
        self.clock = clock
        self.targets: dict[tuple[str, int], PartitionLog] = {}
        self.store = self.open_store()

    def target(self, topic: str, partition: int) -> PartitionLog:
        key = (topic, partition)
        if key not in self.targets:
            self.targets[key] = PartitionLog.open(self.tmp / "data" / f"{topic}-{partition}", topic, partition,
                                                  CONFIG, 0, clock=self.clock)
        return self.targets[key]

    def open_store(self) -> DelayStore:
        store = DelayStore(self.tmp / "data", 0, CONFIG, max_delay_ms=86_400_000, clock=self.clock)
        store.open(lambda t, p: self.target(t, p))
        return store

    def produce(self, dues: list[int], topic: str = "t", partition: int = 0) -> None:
        batch = delayed_batch(dues)
        self.store.produce(topic, partition, batch, validate_batch(batch, 1 << 20, 1 << 24))

    def load_due(self) -> None:
        """What the loader task does at this clock: read every bucket starting before now + 1 s + width."""
        store = self.store
        target = store.buckets.start_of(self.clock.now_ms + 1000) + store.buckets.width_ms

        async def load() -> None:
            while store._unloaded and store._unloaded[0] < target:
                await store._load(store._unloaded.pop(0))
        asyncio.run(load())
        store._loaded_until = max(store._loaded_until, target)

    def step(self, to_ms: int) -> None:
        self.clock.now_ms = to_ms
        self.load_due()
        while self.store._heap and self.store._heap[0].due_ms <= to_ms:
            self.store._deliver_round(to_ms)
        self.store._advance_horizon(to_ms)

    def delivered(self, topic: str = "t", partition: int = 0) -> list[Message]:
        plog = self.target(topic, partition)
        out: list[Message] = []
        from metaq.broker.delay.batches import scan_log
        for _h, msgs in scan_log(plog, 0):
            out.extend(msgs)
        return out

    def crash(self) -> None:
        """kill -9: nothing is closed or flushed by the process (the page cache keeps what was written)."""
        for plog in self.store._logs.values():
            plog.abandon()
        self.store.buckets.close()
        for plog in self.targets.values():
            plog.abandon()
        self.targets.clear()


# -- bucket rows and files -----------------------------------------------------------------------


@given(st.lists(st.tuples(st.integers(0, 1 << 50), st.integers(0, 1000), st.integers(0, 1 << 40),
                          st.binary(max_size=50)), max_size=20))
def test_rows_round_trip(items: list[tuple[int, int, int, bytes]]) -> None:
    data = b"".join(encode_row(*item) for item in items)
    rows, damaged = parse_rows(data)
    assert not damaged
    assert rows == [Row(*item) for item in items]


def test_a_torn_or_flipped_bucket_keeps_the_rows_before_the_damage() -> None:
    rows = [Row(1000 + i, 0, i, b"record %d" % i) for i in range(10)]
    data = b"".join(encode_row(*r) for r in rows)
    cut, damaged = parse_rows(data[:-3])
    assert damaged and cut == rows[:9]
    rng = random.Random(1)
    for _ in range(50):
        pos = rng.randrange(len(data))
        flipped = bytearray(data)
        flipped[pos] ^= 1 << rng.randrange(8)
        got, damaged = parse_rows(bytes(flipped))
        assert damaged
        assert got == rows[:len(got)]


def test_the_newest_intact_checkpoint_wins(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, 4, {"horizon_ms": 10})
    write_checkpoint(tmp_path, 5, {"horizon_ms": 20})
    assert read_checkpoint(tmp_path)["horizon_ms"] == 20  # type: ignore[index]
    newest = tmp_path / "checkpoint.1"
    data = bytearray(newest.read_bytes())
    data[data.index(b"20")] = ord("9")
    newest.write_bytes(bytes(data))
    assert read_checkpoint(tmp_path)["horizon_ms"] == 10  # type: ignore[index]
    os.truncate(tmp_path / "checkpoint.0", 5)
    assert read_checkpoint(tmp_path) is None


def test_mark_delayed_sets_bit_7_and_keeps_the_batch_valid() -> None:
    batch = delayed_batch([5, 6])
    header = validate_batch(batch, 1 << 20, 1 << 20)
    assert header.attributes & ATTR_DELAYED
    assert [header_ms(m.headers, DELIVER_AT_HEADER) for m in decode_batch(batch)] == [5, 6]


# -- the store ------------------------------------------------------------------------------------

T0 = 1_700_000_000_000


def test_far_future_messages_stay_on_disk_and_are_delivered_in_due_order_never_early(tmp_path: Path) -> None:
    env = Env(tmp_path, clock_at(T0))
    rng = random.Random(5)
    near = [T0 + rng.randrange(0, 4000) for _ in range(300)]
    far = [T0 + 7 * 86_400_000 + rng.randrange(0, 100_000) for _ in range(300)]
    env.store.max_delay_ms = 8 * 86_400_000
    for i in range(0, 300, 50):
        env.produce(near[i:i + 50] + far[i:i + 50])
    assert env.store.pending == 600
    env.load_due()
    assert len(env.store._heap) == 300  # the near bucket only: the week-away ones are files
    for ms in range(T0, T0 + 4001, 7):
        env.step(ms)
        for m in env.delivered():
            assert m.append_time_ms >= (header_ms(m.headers, DELIVER_AT_HEADER) or 0)
    got = env.delivered()
    dues = [header_ms(m.headers, DELIVER_AT_HEADER) for m in got]
    assert dues == sorted(near)
    assert env.store.pending == 300 and env.store.delivered == 300
    assert all(header_ms(m.headers, DELAY_REF_HEADER) is not None for m in got)


def test_refused_batches_store_nothing(tmp_path: Path) -> None:
    env = Env(tmp_path, clock_at(T0))
    env.store.max_delay_ms = 60_000
    with pytest.raises(DelayTooLongError, match="maxDelayInSeconds is 60 s"):
        env.produce([T0 + 1000, T0 + 61_000])
    batch = mark_delayed(encode_columns([b"x"], [1]))
    with pytest.raises(CorruptMessageError, match=r"has no metaq\.deliver-at"):
        env.store.produce("t", 0, batch, validate_batch(batch, 1 << 20, 1 << 20))
    assert env.store.pending == 0 and not env.store._logs


def test_a_past_due_time_is_delivered_at_the_next_round_after_arrival(tmp_path: Path) -> None:
    env = Env(tmp_path, clock_at(T0))
    env.step(T0)
    env.produce([T0 - 3_600_000])
    env.step(T0 + 1)
    [m] = env.delivered()
    assert m.append_time_ms == T0 + 1


def test_after_a_crash_the_index_is_rebuilt_and_deliveries_not_checkpointed_are_not_repeated(tmp_path: Path) -> None:
    clock = clock_at(T0)
    env = Env(tmp_path, clock)
    dues = [T0 + 100 * i for i in range(1, 61)]  # over 6 s: several buckets
    env.produce(dues[:30])
    env.produce(dues[30:])
    env.step(T0 + 2050)  # 20 delivered; no checkpoint was written (no event loop ran one)
    assert len(env.delivered()) == 20
    env.crash()
    clock.now_ms = T0 + 2500
    env.store = env.open_store()  # unclean: the buckets are rebuilt from the delay log
    assert env.store.pending == 40  # the 20 found in the partition by their refs are not pending again
    env.step(T0 + 10_000)
    got = [header_ms(m.headers, DELIVER_AT_HEADER) for m in env.delivered()]
    assert got == dues


def test_after_a_clean_stop_the_buckets_are_used_and_a_damaged_one_is_rebuilt(tmp_path: Path) -> None:
    clock = clock_at(T0)
    env = Env(tmp_path, clock)
    dues = [T0 + 50 * i for i in range(1, 201)]  # 10 s
    env.produce(dues)
    env.step(T0 + 1000)
    env.store.close()
    for plog in env.targets.values():
        plog.close()
    env.targets.clear()
    buckets = sorted((tmp_path / "data" / ".delay" / "buckets").glob("*.bkt"))
    os.truncate(buckets[-1], buckets[-1].stat().st_size - 5)
    env.store = env.open_store()
    assert env.store.pending == 180
    env.step(T0 + 20_000)
    got = [header_ms(m.headers, DELIVER_AT_HEADER) for m in env.delivered()]
    assert got == dues


def test_a_message_at_the_size_limit_is_delivered_though_the_ref_header_makes_it_bigger(tmp_path: Path) -> None:
    env = Env(tmp_path, clock_at(T0))
    value = b"v" * ((1 << 20) - 60)  # with its deliver-at header, just under maxMessageSize (1 MiB)
    batch = mark_delayed(encode_columns([value], [1], headers=[[(DELIVER_AT_HEADER, pack_ms(T0 + 10))]]))
    env.store.produce("t", 0, batch, validate_batch(batch, 1 << 20, 1 << 24))
    env.step(T0 + 10)
    [m] = env.delivered()
    assert m.data == value and env.store.pending == 0


def test_delay_log_segments_and_buckets_whose_messages_are_all_delivered_are_deleted(tmp_path: Path) -> None:
    import time

    start = int(time.time() * 1000)  # retention compares segment file times with the horizon: a real clock
    env = Env(tmp_path, clock_at(start))
    env.store.max_delay_ms = 1000
    env.store._max_delay_ever_ms = 1000
    big = b"p" * 400_000  # delay-log segments roll at 1 MiB here: about two batches per segment
    for i in range(6):
        batch = mark_delayed(encode_columns([big], [1], headers=[[(DELIVER_AT_HEADER, pack_ms(start + 100 * i))]]))
        env.store.produce("t", 0, batch, validate_batch(batch, 1 << 20, 1 << 24))
    [plog] = env.store._logs.values()
    assert plog.segment_count >= 3
    buckets_dir = tmp_path / "data" / ".delay" / "buckets"
    env.step(start + 1000)
    assert len(env.delivered()) == 6
    env.step(start + 70_000)  # past maxDelay + the 60 s margin: every delay-log segment is fully delivered
    horizon = env.store.horizon_ms
    assert horizon >= start + 60_000
    done = [s for s in env.store._loaded if s + env.store.buckets.width_ms - 1 <= horizon]
    env.store._save_and_clean(env.store._checkpoint_document(), done)
    assert plog.segment_count == 1 and plog.log_start_offset > 0  # only the active segment is left
    assert not list(buckets_dir.glob("*.bkt"))
    assert env.store.pending == 0


def test_every_flipped_byte_of_targets_json_costs_no_delivery(tmp_path: Path) -> None:
    """targets.json numbers the target partitions the bucket rows name. Whatever byte of it is damaged, every
    pending message is delivered once, to its own partition: a target whose line is lost keeps its delay log
    (found by its directory, given a new number) and the buckets are rebuilt from the delay logs."""
    import shutil

    pristine = tmp_path / "pristine"
    env = Env(pristine, clock_at(T0))
    targets = [("u", 3), ("t", 1), ("t", 0)]  # not in the order their directories list in
    for n, (topic, partition) in enumerate(targets):
        env.produce([T0 + 1000 + 100 * n + i for i in range(3)], topic, partition)
    env.store.close()
    for plog in env.targets.values():
        plog.close()
    path = pristine / "data" / ".delay" / "targets.json"
    clean = path.read_bytes()
    assert clean.count(b"\n") == 3
    for i in range(len(clean)):
        work = tmp_path / f"w{i}"
        shutil.copytree(pristine, work)
        damaged = bytearray(clean)
        damaged[i] ^= 0xFF
        (work / "data" / ".delay" / "targets.json").write_bytes(bytes(damaged))
        again = Env(work, clock_at(T0))
        assert again.store.pending == 9, i
        again.step(T0 + 5000)
        for n, (topic, partition) in enumerate(targets):
            dues = [header_ms(m.headers, DELIVER_AT_HEADER) for m in again.delivered(topic, partition)]
            assert dues == [T0 + 1000 + 100 * n + k for k in range(3)], (i, topic, partition, dues)
        again.crash()
        shutil.rmtree(work)
