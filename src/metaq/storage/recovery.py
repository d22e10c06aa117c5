"""Opening a partition directory: find the segments, and cut a torn or corrupt tail.

After a clean close (the clean-shutdown state matches the newest segment) the files are trusted and
only the newest segment's tail, from its last index entry, is checked. Otherwise the newest segment
is checked batch by batch from its start, its indexes are rebuilt on the way, and the file is cut at
the first bad batch. Then the segments before it are tail-checked, newest first, until one ends
exactly where its successor begins: a segment rolled just before a crash may have lost its own tail
while its successor's first bytes reached the disk. A cut there drops every later segment, so offsets
stay contiguous; no acked batch can be dropped that way because the flusher syncs a rolled segment
before (or with) its successor.

The on-disk index of a segment only ever points at bytes that were fsynced before the entry was
written, so the batches after the last index entry are exactly the ones a crash may have torn.

Then the idempotent producers' state is rebuilt (:func:`load_producers`): the newest snapshot, and the
stamped batches stored after it.
"""

from __future__ import annotations

import logging
import os
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from metaq.errors import CorruptRecordError, StorageError
from metaq.protocol.records import (
    HEADER_BYTES,
    MAGIC,
    OLD_MAGICS,
    PRODUCER_BLOCK_BYTES,
    PRODUCER_STAMPED,
    producer_stamp,
)
from metaq.storage.checkpoint import CleanState, fsync_directory
from metaq.storage.files import FileCache
from metaq.storage.index import IndexCorrupt, OffsetIndex, TimeIndex
from metaq.storage.keyindex import KEYINDEX_SUFFIX, key_index_path, remove_key_index
from metaq.storage.producers import ProducerStateTable, list_snapshots, read_snapshot, remove_snapshot
from metaq.storage.scan import CheckResult, check_batches, count_whole_batches, iter_headers, pread_exact
from metaq.storage.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIMEINDEX_SUFFIX,
    Segment,
    headers_stepping_over_damage,
    index_batch,
    parse_segment_file_name,
)

log = logging.getLogger(__name__)


@dataclass(slots=True)
class RecoveryReport:
    """What opening a partition found and did (for logs and tests)."""

    clean: bool = False
    truncated_bytes: int = 0
    truncated_messages: int = 0
    """Messages in the whole, intact-looking batches that a cut dropped (a lower bound: a torn batch's
    messages cannot be counted)."""
    removed_segments: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {"clean": self.clean, "truncated_bytes": self.truncated_bytes,
                "truncated_messages": self.truncated_messages, "removed_segments": list(self.removed_segments),
                "problems": list(self.problems)}


def load_segments(directory: str, files: FileCache, index_interval_bytes: int, tag: int,
                  clean_state: CleanState | None, sync: Callable[[int], None]) -> tuple[list[Segment],
                                                                                     RecoveryReport]:
    """The segments of a partition directory, recovered; creates segment 0 in an empty directory."""
    report = RecoveryReport()
    names = os.listdir(directory)
    bases = sorted(b for n in names if (b := parse_segment_file_name(n, LOG_SUFFIX)) is not None)
    _remove_strays(directory, names, set(bases))
    if not bases:
        segment = Segment(directory, 0, files, index_interval_bytes, tag)
        os.close(files.open_raw(segment.log_path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)))
        segment.start_empty_indexes()
        segment.dir_synced = False
        report.clean = True
        return [segment], report
    _refuse_old_format(directory, bases)
    segments = []
    for i, base in enumerate(bases):
        following = bases[i + 1] if i + 1 < len(bases) else None
        segment = Segment(directory, base, files, index_interval_bytes, tag,
                          size_bytes=os.stat(os.path.join(directory, f"{base:020d}{LOG_SUFFIX}")).st_size,
                          next_offset=following, sealed=following is not None)
        segments.append(segment)
    newest = segments[-1]
    if clean_state is not None and clean_state.segment_base_offset == newest.base_offset \
            and clean_state.size_bytes == newest.size_bytes:
        result = _check_segment(newest, tag, from_start=False, index_unwritten=True)
        if result.problem is None and result.next_offset == clean_state.log_end_offset:
            report.clean = True
            if not _index_files_lag_only(newest):
                _rewrite_indexes(newest, None)
            return segments, report
        report.problems.append(f"clean shutdown state did not hold: {result.problem}")
        newest.size_bytes = os.stat(newest.log_path).st_size  # the tail check shortened it: check it all
    result = _check_segment(newest, tag, from_start=True)
    _cut(newest, result, report, sync)
    if os.path.exists(newest.index_path) or os.path.exists(newest.timeindex_path):
        _rewrite_indexes(newest, None)
    # else its entries stay pending, written as a clean open leaves them (see _index_files_lag_only): creating
    # two files for each of 10,000 partitions made a start after kill -9 take 7-13 s instead of 1.3 s
    i = len(segments) - 2
    while i >= 0:
        segment, following_segment = segments[i], segments[i + 1]
        result = _check_segment(segment, tag, from_start=False)
        if result.problem is None and result.next_offset == following_segment.base_offset:
            segment.seal()
            if _index_files_stale(segment):
                _rewrite_indexes(segment, sync)
            break
        if result.problem is None:
            result.problem = (f"segment ends at offset {result.next_offset} but the next segment starts "
                              f"at {following_segment.base_offset}")
        for dropped in segments[i + 1:]:
            report.truncated_messages += _count_in_file(dropped, 0, dropped.size_bytes, dropped.base_offset - 1, tag)
            _remove_segment_files(dropped)
            report.removed_segments.append(dropped.base_offset)
            report.truncated_bytes += dropped.size_bytes
        del segments[i + 1:]
        segment.sealed = False
        _cut(segment, result, report, sync)
        _rewrite_indexes(segment, None)
        fsync_directory(directory, sync)
        i -= 1
    for problem in report.problems:
        log.warning("recovered %s: %s", directory, problem)
    if report.truncated_bytes:
        log.warning("recovered %s after an unclean shutdown: cut %d bytes holding at least %d messages in whole "
                    "batches (never acknowledged if the flush policy waits for fsync; see docs/storage.md)",
                    directory, report.truncated_bytes, report.truncated_messages)
    return segments, report


def _check_segment(segment: Segment, tag: int, *, from_start: bool, index_unwritten: bool = False) -> CheckResult:
    """Check a segment's batches (all, or from its last index entry) and rebuild its in-memory state.

    ``index_unwritten``: a cleanly closed active segment, whose index file may stop short of its log (the
    entries not yet due to be written): the batches after the file's last entry are indexed from their
    headers (stepping over a damaged one, as a rebuild does: a clean close left no torn tail, so damage
    there is bit rot, reported by the reads that meet it) and checked whole only after the last entry, as
    when the file held every entry."""
    file_size = segment.size_bytes
    index, time_index = OffsetIndex(), TimeIndex()
    if not from_start:
        try:
            index = OffsetIndex.parse(_read(segment.index_path), file_size, None)
            time_index = TimeIndex.parse(_read(segment.timeindex_path), None)
            segment.index_file_bytes = 8 * len(index)
            segment.timeindex_file_bytes = 12 * len(time_index)
        except (OSError, IndexCorrupt):
            index, time_index = OffsetIndex(), TimeIndex()
            # No files (a clean close writes none for a small active segment): written when entries are
            # due; unreadable or bad files: rewritten whole.
            missing = not os.path.exists(segment.index_path) and not os.path.exists(segment.timeindex_path)
            segment.index_file_bytes = segment.timeindex_file_bytes = 0 if missing else -1
    handle = segment.files.acquire(segment.log_path, on_close=segment.on_log_fd_closed)
    try:
        if index_unwritten and not from_start:
            max_ts = time_index.max_timestamp_ms
            relative, position = index.last()
            for at, header in headers_stepping_over_damage(handle.fd, position, file_size,
                                                           segment.base_offset + relative, tag):
                max_ts = index_batch(index, time_index, segment.index_interval_bytes, segment.base_offset, at,
                                     header.base_offset, header.max_timestamp_ms, max_ts)
        relative, position = index.last()
        # Time entries past the last offset entry (a seal entry) are recomputed by the walk below.
        while len(time_index) and time_index.relative_offsets[-1] > relative:
            time_index.timestamps.pop()
            time_index.relative_offsets.pop()
        if not index_unwritten:
            index.take_pending()
            time_index.take_pending()
        segment.index, segment.time_index = index, time_index
        segment.size_bytes = position
        segment.next_offset = segment.base_offset + relative
        segment.max_timestamp_ms = time_index.max_timestamp_ms
        segment.last_batch_base_offset = -1
        segment.tail = None
        result = check_batches(handle.fd, position, file_size, segment.next_offset, tag, segment.note_batch)
    finally:
        segment.files.release(handle)
    if result.problem is not None and position > 0 and result.valid_end_position == position:
        # The index pointed at something that is not a batch: trust nothing, walk from the start.
        segment.index_file_bytes = segment.timeindex_file_bytes = -1
        return _check_segment(segment, tag, from_start=True)
    segment.size_bytes = result.valid_end_position
    segment.synced_bytes = segment.size_bytes
    return result


def _cut(segment: Segment, result: CheckResult, report: RecoveryReport, sync: Callable[[int], None]) -> None:
    if result.problem is None:
        return
    file_size = os.stat(segment.log_path).st_size
    cut = file_size - result.valid_end_position
    messages = _count_in_file(segment, result.valid_end_position, file_size, result.next_offset - 1, segment.tag)
    report.problems.append(f"segment {segment.base_offset}: cut {cut} bytes ({messages} messages in whole batches) "
                           f"at byte {result.valid_end_position}, offset {result.next_offset}: {result.problem}")
    report.truncated_bytes += cut
    report.truncated_messages += messages
    remove_key_index(key_index_path(segment.log_path))  # rebuilt from the cut log when next searched
    handle = segment.files.acquire(segment.log_path)
    try:
        os.ftruncate(handle.fd, result.valid_end_position)
        sync(handle.fd)
    finally:
        segment.files.release(handle)


def _count_in_file(segment: Segment, position: int, end_position: int, after_offset: int, tag: int) -> int:
    handle = segment.files.acquire(segment.log_path, on_close=segment.on_log_fd_closed)
    try:
        return count_whole_batches(handle.fd, position, end_position, after_offset, tag)[1]
    finally:
        segment.files.release(handle)


def _refuse_old_format(directory: str, bases: list[int]) -> None:
    """Refuse, rather than cut as damage, segments written in an earlier batch format."""
    for base in (bases[0], bases[-1]):
        path = os.path.join(directory, f"{base:020d}{LOG_SUFFIX}")
        fd = os.open(path, os.O_RDONLY)
        try:
            head = pread_exact(fd, 13, 0)
        finally:
            os.close(fd)
        if len(head) == 13 and head[12] != MAGIC and head[12] in OLD_MAGICS:
            raise StorageError(f"{path} holds record batches in format version {head[12]}, written by "
                               f"{OLD_MAGICS[head[12]]}; this metaq reads version {MAGIC} only. There is no "
                               "migration: move the data directory away (or delete it) and start again")


def _rewrite_indexes(segment: Segment, sync: Callable[[int], None] | None) -> None:
    """Write a segment's recovered indexes to their files (and fsync them); on a full disk, drop the files
    instead: the in-memory indexes serve, and the files are written again later."""
    try:
        segment.rewrite_index_files()
        if sync is not None:
            segment.sync_index_files(sync)
    except OSError as exc:
        segment.drop_index_files()
        log.warning("cannot write the indexes of %s (%s); they are kept in memory and written later",
                    segment.log_path, exc)


def _index_files_lag_only(segment: Segment) -> bool:
    """Whether the index files hold exactly the entries before the pending ones (a clean open's walk past
    the last entry on disk adds pending entries: the flushes write them, no rewrite needed)."""
    assert segment.index is not None and segment.time_index is not None
    return segment.index_file_bytes == 8 * len(segment.index) - segment.index.pending_bytes and \
        segment.timeindex_file_bytes == 12 * len(segment.time_index) - segment.time_index.pending_bytes


def _index_files_stale(segment: Segment) -> bool:
    assert segment.index is not None and segment.time_index is not None
    return segment.index_file_bytes != 8 * len(segment.index) or \
        segment.timeindex_file_bytes != 12 * len(segment.time_index)


def _remove_segment_files(segment: Segment) -> None:
    for path in (segment.log_path, segment.index_path, segment.timeindex_path):
        segment.files.discard(path)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    remove_key_index(key_index_path(segment.log_path))


def _remove_strays(directory: str, names: list[str], bases: set[int]) -> None:
    """Half-written temp files, and indexes whose log is gone (retention stopped midway)."""
    for name in names:
        base = parse_segment_file_name(name, INDEX_SUFFIX)
        if base is None:
            base = parse_segment_file_name(name, TIMEINDEX_SUFFIX)
        if base is None:
            base = parse_segment_file_name(name, KEYINDEX_SUFFIX)
        stray = name.endswith(".tmp") or (base is not None and base not in bases)
        if stray:
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


class RecoveringLog(Protocol):
    """What rebuilding the producer table uses of a :class:`~metaq.storage.log.PartitionLog` just opened.
    Declared here, so this module need not import log.py, which calls it."""

    directory: Path
    producers: ProducerStateTable
    recovery: RecoveryReport
    _segments: list[Segment]
    _bases: list[int]
    _active: Segment
    _end_offset: int
    _files: FileCache


def load_producers(plog: RecoveringLog) -> None:
    """Rebuild :attr:`producers`: the newest usable snapshot at or below the log end, then the
    stamped batches stored after it (headers and producer blocks only).

    Without a snapshot only the active segment is read: a roll writes one whenever the log has
    producers, so older segments hold none that a snapshot does not have (unless that write failed,
    which was logged; a producer missing from the table is taken at whatever sequence it sends).
    After a clean close without a snapshot nothing is read: a clean close writes one whenever the log
    has producers, so it had none (walking every batch header of a 1 GB active segment read a quarter
    of it from the disk at each start, through the kernel's readahead)."""
    end, start = plog._end_offset, plog._segments[0].base_offset
    table: ProducerStateTable | None = None
    offset = plog._active.base_offset
    for snap in reversed(list_snapshots(plog.directory)):
        if snap > end:  # written for bytes a crash took back
            remove_snapshot(plog.directory, snap)
            continue
        table = read_snapshot(plog.directory, snap, plog.producers.expiration_ms)
        if table is not None:
            offset = max(snap, start)
            break
    plog.producers = table if table is not None else ProducerStateTable()
    if offset < end and (table is not None or not plog.recovery.clean):
        _scan_producers(plog, offset, end)


def _scan_producers(plog: RecoveringLog, offset: int, end: int) -> None:
    i = bisect_right(plog._bases, offset) - 1
    for segment in plog._segments[max(i, 0):]:
        if segment.next_offset <= offset or not segment.size_bytes:
            continue
        handle = plog._files.acquire(segment.log_path, on_close=segment.on_log_fd_closed)
        try:
            position = 0
            if offset > segment.base_offset:
                position, header = segment.find_batch(handle.fd, offset, segment.size_bytes, segment.next_offset)
                if header.base_offset < offset:
                    position += header.total_bytes
            for at, header in iter_headers(handle.fd, position, segment.size_bytes):
                if header.attributes & PRODUCER_STAMPED:
                    block = pread_exact(handle.fd, HEADER_BYTES + PRODUCER_BLOCK_BYTES, at)
                    stamp = producer_stamp(block, header)
                    assert stamp is not None
                    plog.producers.record(stamp, header.record_count, header.base_offset, header.append_time_ms)
        except (CorruptRecordError, StorageError) as exc:  # damage is reported where it is read
            log.warning("%s: producer state not read past damage in %s: %s", plog, segment.log_path, exc)
        finally:
            plog._files.release(handle)
