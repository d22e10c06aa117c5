"""Scrubbing a partition: check every stored byte and every index entry, and say what is damaged.

Reads trust what recovery checked at open and check headers as they go; damage in the middle of an
older segment (a flipped bit on a disk, a bad sector) is otherwise only found when a consumer reaches
it. :func:`verify_segment` walks a whole segment the way recovery does (header CRC, body CRC, offset
continuity, the id naming this partition), but does not stop at damage: it resyncs on the next intact
batch and reports each damaged stretch as a :class:`DamagedRange`, with the offsets it makes
unreadable. It also checks that every entry of the offset and time index files points at the start of
an intact batch with the right offset and running maximum timestamp. An index file that is missing or
ends in a torn entry (what a kill -9 leaves: index files are derived data, written after the log and
rebuilt on first use) is not damage: it is noted (``index_notes``), not reported as a problem. Nothing is
modified.
"""

from __future__ import annotations

import os
import threading
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from metaq.storage.errors import LogClosedError
from metaq.storage.files import FileCache
from metaq.storage.index import OFFSET_ENTRY_BYTES, TIME_ENTRY_BYTES, IndexCorrupt, OffsetIndex, TimeIndex
from metaq.storage.scan import Damage, walk_batches
from metaq.storage.segment import Segment


@dataclass(frozen=True, slots=True)
class DamagedRange:
    """Offsets ``[first_offset, resume_offset)`` of a partition cannot be read: their stored bytes are
    damaged. Reading resumes at ``resume_offset``; skipping there loses ``messages`` messages."""

    segment_base_offset: int
    position: int
    size_bytes: int
    first_offset: int
    resume_offset: int
    problem: str

    @property
    def messages(self) -> int:
        return self.resume_offset - self.first_offset

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "messages": self.messages}


@dataclass(slots=True)
class SegmentCheck:
    batches: int = 0
    messages: int = 0
    size_bytes: int = 0
    damaged: list[DamagedRange] = field(default_factory=list)
    index_problems: list[str] = field(default_factory=list)
    index_notes: list[str] = field(default_factory=list)


@dataclass(slots=True)
class PartitionReport:
    """What a scrub of one partition found."""

    topic: str
    partition: int
    log_start_offset: int = 0
    log_end_offset: int = 0
    segments: int = 0
    batches: int = 0
    messages: int = 0
    size_bytes: int = 0
    damaged: list[DamagedRange] = field(default_factory=list)
    index_problems: list[str] = field(default_factory=list)
    index_notes: list[str] = field(default_factory=list)
    """Not damage: index files missing or with a torn last entry (rebuilt on first use)."""

    @property
    def ok(self) -> bool:
        return not self.damaged and not self.index_problems

    @property
    def messages_damaged(self) -> int:
        return sum(r.messages for r in self.damaged)

    def add(self, check: SegmentCheck) -> None:
        self.segments += 1
        self.batches += check.batches
        self.messages += check.messages
        self.size_bytes += check.size_bytes
        self.damaged.extend(check.damaged)
        self.index_problems.extend(check.index_problems)
        self.index_notes.extend(check.index_notes)

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "log_start_offset": self.log_start_offset,
                "log_end_offset": self.log_end_offset, "segments": self.segments, "batches": self.batches,
                "messages": self.messages, "size_bytes": self.size_bytes, "ok": self.ok,
                "messages_damaged": self.messages_damaged, "damaged": [r.to_json() for r in self.damaged],
                "index_problems": self.index_problems, "index_notes": self.index_notes}


def verify_segment(fd: int, base_offset: int, size_bytes: int, next_offset: int, tag: int,
                   index_path: str | None, timeindex_path: str | None) -> SegmentCheck:
    """Check ``size_bytes`` of a segment file holding offsets ``[base_offset, next_offset)``.

    ``index_path`` / ``timeindex_path``: the index files to check against the log (None to skip, e.g.
    for a segment whose indexes are still being written).
    """
    check = SegmentCheck(size_bytes=size_bytes)
    starts: dict[int, tuple[int, int]] = {}  # position -> (base offset, running max timestamp)
    running_max = -1
    last_offset = base_offset
    for item in walk_batches(fd, 0, size_bytes, base_offset, tag, resync=True):
        if isinstance(item, Damage):
            resume = item.resume_offset if item.resume_offset >= 0 else next_offset
            check.damaged.append(DamagedRange(base_offset, item.position, item.bytes, item.first_offset,
                                              resume, item.problem))
            last_offset = resume
            continue
        position, header = item
        check.batches += 1
        check.messages += header.record_count
        running_max = max(running_max, header.max_timestamp_ms)
        starts[position] = (header.base_offset, running_max)
        last_offset = header.next_offset
    if last_offset != next_offset and not (check.damaged and check.damaged[-1].resume_offset == next_offset):
        check.damaged.append(DamagedRange(base_offset, size_bytes, 0, last_offset, next_offset,
                                          f"segment ends at offset {last_offset} but the next one starts at "
                                          f"{next_offset}"))
    # an entry into a damaged stretch is not an index problem: the log is (and is already reported)
    spans = [(r.position, r.position + max(r.size_bytes, 1), r.first_offset, r.resume_offset) for r in check.damaged]
    if index_path is not None:
        check.index_problems.extend(_check_offset_index(index_path, base_offset, size_bytes, next_offset, starts,
                                                        spans, check.index_notes))
    if timeindex_path is not None:
        check.index_problems.extend(_check_time_index(timeindex_path, base_offset, next_offset, starts, spans,
                                                      check.index_notes))
    return check


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _whole_entries(data: bytes | None, entry_bytes: int, name: str, notes: list[str]) -> bytes | None:
    """The whole entries of an index file; a missing file or a torn last entry noted (not damage)."""
    if data is None:
        notes.append(f"{name} is missing (rebuilt on first use)")
        return None
    torn = len(data) % entry_bytes
    if torn:
        notes.append(f"{name} ends in a torn entry of {torn} bytes (rebuilt on first use)")
        return data[:len(data) - torn]
    return data


def _check_offset_index(path: str, base_offset: int, size_bytes: int, next_offset: int,
                        starts: dict[int, tuple[int, int]], spans: list[tuple[int, int, int, int]],
                        notes: list[str]) -> list[str]:
    name = os.path.basename(path)
    data = _whole_entries(_read(path), OFFSET_ENTRY_BYTES, name, notes) if size_bytes else None
    if data is None:
        return []
    try:
        index = OffsetIndex.parse(data, size_bytes, next_offset - base_offset)
    except IndexCorrupt as exc:
        return [f"{name}: {exc} (it is rebuilt on first use)"]
    problems = []
    for relative, position in zip(index.relative_offsets, index.positions, strict=True):
        start = starts.get(position)
        if any(a <= position < b for a, b, _, _ in spans):
            continue
        if start is None or start[0] != base_offset + relative:
            problems.append(f"{name}: entry for offset {base_offset + relative} points at byte {position}, "
                            "which is not the start of that intact batch")
    return problems


def _check_time_index(path: str, base_offset: int, next_offset: int,
                      starts: dict[int, tuple[int, int]], spans: list[tuple[int, int, int, int]],
                      notes: list[str]) -> list[str]:
    name = os.path.basename(path)
    data = _whole_entries(_read(path), TIME_ENTRY_BYTES, name, notes)
    if data is None:
        return []
    try:
        index = TimeIndex.parse(data, next_offset - base_offset)
    except IndexCorrupt as exc:
        return [f"{name}: {exc} (it is rebuilt on first use)"]
    by_offset = {offset: running for offset, running in starts.values()}
    problems = []
    damaged_after = min((first for _, _, first, _ in spans), default=next_offset)
    for timestamp, relative in zip(index.timestamps, index.relative_offsets, strict=True):
        if base_offset + relative >= damaged_after:
            break  # running maxima past damage cannot be recomputed: the damaged batches' timestamps are lost
        running = by_offset.get(base_offset + relative)
        if running is None or running != timestamp:
            problems.append(f"{name}: entry ({timestamp}, offset {base_offset + relative}) does not match the "
                            "batches of the log")
    return problems


class VerifiedLog(Protocol):
    """What a scrub uses of a :class:`~metaq.storage.log.PartitionLog`: its segment list under its lock, its
    pins and its record of damage. Declared here, so this module need not import log.py, which calls it."""

    _topic: str
    _partition: int
    _tag: int
    _lock: threading.Lock
    _closed: bool
    _segments: list[Segment]
    _end_offset: int
    _truncations: int
    _damaged: dict[int, DamagedRange]
    _files: FileCache

    def _unpin(self, segment: Segment) -> None: ...

    def _note_damage(self, damaged: DamagedRange) -> None: ...


def verify_partition(plog: VerifiedLog) -> PartitionReport:
    """Check every stored byte and index entry of the partition (blocking; minutes for a big log).

    Appends go on meanwhile: the active segment is checked up to its size when its turn comes.
    The damaged ranges found replace what reads had recorded for the segments checked.
    """
    report = PartitionReport(plog._topic, plog._partition)
    with plog._lock:
        if plog._closed:
            raise LogClosedError(f"{plog} is closed")
        segments = list(plog._segments)
        report.log_start_offset = plog._segments[0].base_offset
    for segment in segments:
        with plog._lock:
            if plog._closed or segment not in plog._segments:
                continue  # removed by retention meanwhile
            segment.pins += 1
            generation = plog._truncations
            size_limit, next_limit, sealed = segment.size_bytes, segment.next_offset, segment.sealed
        try:
            handle = plog._files.acquire(segment.log_path, on_close=segment.on_log_fd_closed)
            try:
                check = verify_segment(handle.fd, segment.base_offset, size_limit, next_limit, plog._tag,
                                       segment.index_path if sealed else None,
                                       segment.timeindex_path if sealed else None)
            finally:
                plog._files.release(handle)
        finally:
            plog._unpin(segment)
        if plog._truncations != generation:  # cut while being checked: the part checked no longer exists
            continue
        report.add(check)
        with plog._lock:
            known = {k for k, r in plog._damaged.items() if r.segment_base_offset == segment.base_offset}
            for key in known:
                del plog._damaged[key]
            for damaged in check.damaged:
                if damaged.first_offset in known:  # already reported: refresh it quietly
                    plog._damaged[damaged.first_offset] = damaged
        for damaged in check.damaged:
            if damaged.first_offset not in known:
                plog._note_damage(damaged)
    report.log_end_offset = plog._end_offset
    return report


def check_partition_files(directory: str | os.PathLike[str]) -> list[str]:
    """What is damaged in the files beside a partition's segments (its epoch history, its producer snapshots):
    one line per damaged record; nothing is modified."""
    from pathlib import Path

    from metaq.storage.checkpoint import check_records, read_bytes
    from metaq.storage.epochs import EPOCHS_FILE, epoch_key
    from metaq.storage.producers import check_snapshot, list_snapshots, snapshot_path

    directory = Path(directory)
    problems = [f"{EPOCHS_FILE}: {line}" for line in check_records(read_bytes(directory / EPOCHS_FILE), epoch_key)[1]]
    try:
        snapshots = list_snapshots(directory)
    except OSError:
        snapshots = []
    for offset in snapshots:
        path = snapshot_path(directory, offset)
        problems += [f"{path.name}: {line}" for line in check_snapshot(path)[1]]
    return problems
