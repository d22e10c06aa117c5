"""Retention: MetaQ's ``deletePolicy`` strings and what happens to an expired segment.

``delete,168``       delete segments whose last write is older than 168 hours.
``archive,72``       rename the segment's log to ``<name>.arc`` instead (kept for manual recovery).
``archive,72,true``  zip the segment's log into ``<name>.zip``, then remove it.

The duration takes a unit suffix ``s``, ``m`` or ``h``; without one it is hours (MetaQ's rule).
Indexes are derived data and are always deleted with their segment.
"""

from __future__ import annotations

import os
import re
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from metaq.errors import ConfigError, StorageError
from metaq.storage.keyindex import key_index_path

if TYPE_CHECKING:
    from metaq.storage.log import PartitionLog
    from metaq.storage.segment import Segment

_DURATION_RE = re.compile(r"(\d+)\s*([smhSMH]?)")
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "": 3_600_000}

ARCHIVE_SUFFIX = ".arc"
ZIP_SUFFIX = ".zip"


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """A parsed ``deletePolicy``: what to do (``delete`` / ``archive``) with segments older than a bound."""

    action: str
    max_age_ms: int
    compress: bool = False

    @classmethod
    def parse(cls, text: str) -> RetentionPolicy:
        """Parse a MetaQ ``deletePolicy`` string; ConfigError naming the value when it is malformed."""
        if not isinstance(text, str):
            raise ConfigError(f"deletePolicy must be a string like 'delete,168', not {text!r}")
        parts = [p.strip() for p in text.split(",")]
        name = parts[0].lower()
        if name not in ("delete", "archive"):
            raise ConfigError(
                f"deletePolicy {text!r}: unknown policy {parts[0]!r}; use 'delete,<age>' or "
                "'archive,<age>[,true]'")
        if len(parts) < 2 or len(parts) > (3 if name == "archive" else 2):
            raise ConfigError(
                f"deletePolicy {text!r}: expected 'delete,<age>' or 'archive,<age>[,true|false]' "
                "(age like 168, 10h, 10m or 10s)")
        max_age_ms = parse_duration_ms(parts[1], what=f"deletePolicy {text!r}")
        compress = False
        if len(parts) == 3:
            flag = parts[2].lower()
            if flag not in ("true", "false"):
                raise ConfigError(f"deletePolicy {text!r}: the archive compress flag must be true or false")
            compress = flag == "true"
        return cls(name, max_age_ms, compress)

    def expired(self, last_write_ms: int, now_ms: int) -> bool:
        """Whether a segment last written at ``last_write_ms`` is older than the bound at ``now_ms``."""
        return now_ms - last_write_ms > self.max_age_ms


@dataclass(slots=True)
class RetentionOutcome:
    """What one retention run did, by partition (``topic-partition``, its directory's name): the base
    offsets of the segments removed, and the partitions that failed with why."""

    removed: dict[str, list[int]] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)


def parse_duration_ms(text: str, *, what: str = "duration") -> int:
    """``168`` (hours), ``10h``, ``10m`` or ``10s`` to milliseconds."""
    match = _DURATION_RE.fullmatch(text.strip())
    if match is None:
        raise ConfigError(f"{what}: age {text!r} is not a number with an optional unit s, m or h")
    return int(match.group(1)) * _UNIT_MS[match.group(2).lower()]


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


def apply_retention(plog: PartitionLog, now_ms: int | None = None) -> list[int]:
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
