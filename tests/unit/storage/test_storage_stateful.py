"""A stateful property test of PartitionLog against a plain Python list of payloads.

Rules append, read, roll (small segments), expire old segments, close and reopen, and crash (drop
the log without a clean close, cut the newest segment at a random byte, reopen). After a crash the
model keeps exactly the batches that were wholly before the cut.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from storage_helpers import no_sync

from metaq.protocol.records import decode_fetched, encode_values, iter_batches
from metaq.storage import LogConfig, OffsetOutOfRange, PartitionLog

payloads = st.binary(min_size=0, max_size=40)


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="metaq-stateful-"))
        self.directory = self.root / "s-1"
        self.model: list[bytes] = []  # payload of offset i at index i
        self.stamps: list[int] = []  # record timestamp of offset i
        self.start = 0
        self.log: PartitionLog | None = None

    @initialize(segment_bytes_max=st.integers(300, 1500), index_interval_bytes=st.sampled_from([0, 64, 512]))
    def open_first(self, segment_bytes_max: int, index_interval_bytes: int) -> None:
        self.config = LogConfig(segment_bytes_max=segment_bytes_max, index_interval_bytes=index_interval_bytes,
                                unflush_threshold=100, delete_policy="delete,1h")
        self.reopen()

    def reopen(self) -> None:
        self.log = PartitionLog.open(self.directory, "s", 1, self.config, 2, sync=no_sync)

    @property
    def end(self) -> int:
        return len(self.model)

    @rule(values=st.lists(payloads, min_size=1, max_size=20), timestamp_ms=st.integers(0, 1000))
    def append(self, values: list[bytes], timestamp_ms: int) -> None:
        assert self.log is not None
        result = self.log.append(encode_values(values, timestamp_ms))
        assert result.base_offset == self.end
        self.model.extend(values)
        self.stamps.extend([timestamp_ms] * len(values))

    @rule(segment_bytes_max=st.integers(100, 1500))
    def resize_segments(self, segment_bytes_max: int) -> None:
        """Roll at different sizes (a live config change), so rolls land anywhere in the sequence."""
        assert self.log is not None
        self.config = self.config.with_changes(segment_bytes_max=segment_bytes_max)
        self.log.set_config(self.config)

    @rule(target_ms=st.integers(-1, 1001))
    def offset_for_timestamp(self, target_ms: int) -> None:
        assert self.log is not None
        expected = next((o for o in range(self.start, self.end) if self.stamps[o] >= target_ms), self.end)
        assert self.log.offset_for_timestamp(target_ms) == expected

    @rule(data=st.data(), max_bytes=st.integers(0, 3000))
    def read(self, data: st.DataObject, max_bytes: int) -> None:
        assert self.log is not None
        offset = data.draw(st.integers(self.start, self.end))
        with self.log.read(offset, max_bytes) as piece:
            raw = piece.read_bytes()
        messages, next_offset = decode_fetched(raw, "s", 1, offset)
        if offset == self.end:
            assert raw == b"" and messages == []
            return
        assert messages, "a read below the end returns at least one batch"
        assert [m.offset for m in messages] == list(range(offset, next_offset))
        assert [m.data for m in messages] == self.model[offset:next_offset]

    @rule(data=st.data())
    def read_out_of_range(self, data: st.DataObject) -> None:
        assert self.log is not None
        choices = [self.end + 1, self.end + 100]
        if self.start > 0:
            choices.append(self.start - 1)
        offset = data.draw(st.sampled_from(choices))
        with pytest.raises(OffsetOutOfRange) as info:
            self.log.read(offset, 100)
        assert (info.value.earliest, info.value.latest) == (self.start, self.end)

    @precondition(lambda self: self.log is not None and self.log.segment_count > 1)
    @rule(data=st.data())
    def expire_oldest(self, data: st.DataObject) -> None:
        assert self.log is not None
        bases = self.log.segment_base_offsets
        count = data.draw(st.integers(1, len(bases) - 1))
        old = time.time() - 7200
        for base in bases[:count]:
            os.utime(self.directory / f"{base:020d}.log", (old, old))
        for base in bases[count:]:  # the rest were just written
            os.utime(self.directory / f"{base:020d}.log")
        assert self.log.apply_retention() == bases[:count]
        self.start = bases[count]
        assert self.log.log_start_offset == self.start

    @rule()
    def close_and_reopen(self) -> None:
        assert self.log is not None
        self.log.close()
        self.reopen()
        assert self.log.recovery.clean

    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        assert self.log is not None
        bases = self.log.segment_base_offsets
        self.log.abandon()
        newest = self.directory / f"{bases[-1]:020d}.log"
        content = newest.read_bytes()
        cut = data.draw(st.integers(0, len(content)), label="cut")
        os.truncate(newest, cut)
        kept_end = bases[-1]
        for position, header in iter_batches(content):
            if position + header.total_bytes <= cut:
                kept_end = header.next_offset
        del self.model[kept_end:]
        del self.stamps[kept_end:]
        self.reopen()
        assert self.log.segment_base_offsets == bases

    @invariant()
    def offsets_match(self) -> None:
        if self.log is not None:
            assert self.log.log_end_offset == self.end
            assert self.log.log_start_offset == self.start

    def teardown(self) -> None:
        if self.log is not None and not self.log.closed:
            self.log.abandon()
        shutil.rmtree(self.root, ignore_errors=True)


TestPartitionLogStateful = LogMachine.TestCase
TestPartitionLogStateful.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
