"""Retention: what happens to a segment past its topic's ``deletePolicy`` (parsed by
:class:`metaq.storage.config.RetentionPolicy`): deleted, renamed to ``<name>.arc``, or zipped into
``<name>.zip``. Indexes are derived data and are always deleted with their segment.
"""

from __future__ import annotations

import os
import threading
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from metaq.errors import StorageError
from metaq.storage.config import LogConfig, RetentionPolicy
from metaq.storage.files import FileCache
from metaq.storage.keyindex import key_index_path
from metaq.storage.partition_flush import PartitionFlush
from metaq.storage.segment import Segment


class RetainedLog(Protocol):
    """What a retention run uses of a :class:`~metaq.storage.log.PartitionLog`: its segment list and the state
    beside it, under its lock. Declared here, so this module need not import log.py, which calls it."""

    _config: LogConfig
    _clock: Callable[[], float]
    _lock: threading.Lock
    _closed: bool
    _flush: PartitionFlush
    _segments: list[Segment]
    _bases: list[int]
    _size_bytes: int
    _files: FileCache


ARCHIVE_SUFFIX = ".arc"
ZIP_SUFFIX = ".zip"


@dataclass(slots=True)
class RetentionOutcome:
    """What one retention run did, by partition (``topic-partition``, its directory's name): the base
    offsets of the segments removed, and the partitions that failed with why."""

    removed: dict[str, list[int]] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)


def dispose_segment(log_path: str, index_paths: Iterable[str], policy: RetentionPolicy,
                    sync: Callable[[int], None] = os.fsync) -> str | None:
    """Remove one expired segment from the log directory as the policy says; returns the archive path.

    The log file goes first: a crash in between leaves only orphan index files, which the next open
    deletes, never an index without its log that could be mistaken for data.
    """
    archive: str | None = None
    if policy.action == "archive" and policy.compress:
        archive = log_path + ZIP_SUFFIX
        tmp = archive + ".tmp"
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            zf.write(log_path, arcname=os.path.basename(log_path))
        fd = os.open(tmp, os.O_RDONLY)
        try:
            sync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, archive)
        os.unlink(log_path)
    elif policy.action == "archive":
        archive = log_path + ARCHIVE_SUFFIX
        os.replace(log_path, archive)
    else:
        os.unlink(log_path)
    for path in index_paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    return archive


def apply_retention(plog: RetainedLog, now_ms: int | None = None) -> list[int]:
    """Remove (or archive) the oldest segments past the topic's deletePolicy age.

    Never the active segment, never one pinned by a reader or a sync, never one not yet synced,
    and only a prefix of the log, so offsets stay contiguous. Returns the removed base offsets.
    """
    policy = plog._config.retention
    if now_ms is None:
        now_ms = int(plog._clock() * 1000)
    victims: list[Segment] = []
    with plog._lock:
        if plog._closed:
            return []
        unsynced = {id(s) for s in plog._flush.unsynced_sealed}
        for segment in plog._segments[:-1]:
            if segment.pins or id(segment) in unsynced:
                break
            try:
                last_write_ms = segment.mtime_ms()
            except OSError:
                break
            if not policy.expired(last_write_ms, now_ms):
                break
            victims.append(segment)
        if not victims:
            return []
        del plog._segments[:len(victims)]
        del plog._bases[:len(victims)]
        plog._size_bytes -= sum(s.size_bytes for s in victims)
        for segment in victims:
            for path in (segment.log_path, segment.index_path, segment.timeindex_path):
                plog._files.discard(path)
    for i, segment in enumerate(victims):
        try:
            dispose_segment(segment.log_path, (segment.index_path, segment.timeindex_path,
                                               key_index_path(segment.log_path)), policy)
        except OSError as exc:
            if not os.path.exists(segment.log_path):
                continue  # only an index file is left behind: the next open removes it as an orphan
            # This segment and the later ones are still on disk: they stay the head of the log (a
            # prefix, so offsets stay contiguous) and the next run tries again.
            kept = victims[i:]
            with plog._lock:
                plog._segments[:0] = kept
                plog._bases[:0] = [s.base_offset for s in kept]
                plog._size_bytes += sum(s.size_bytes for s in kept)
            raise StorageError(f"retention of {plog} could not remove {segment.log_path}: {exc}; "
                               f"{len(kept)} segment(s) kept, retried at the next run") from exc
    return [s.base_offset for s in victims]
