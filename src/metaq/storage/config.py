"""Per-topic log settings, with MetaQ's names translated to units-last Python names.

=====================  ====================  ===================================================
LogConfig field         MetaQ server.ini      meaning
=====================  ====================  ===================================================
segment_bytes_max       maxSegmentSize        roll to a new segment before a batch would pass it
index_interval_bytes    (Kafka's)             one sparse index entry per this many log bytes
unflush_threshold       unflushThreshold      1: fsync per ack; <=0: group commit; N>1: every N
unflush_interval_ms     unflushInterval       with N>1: fsync at least this often
delete_policy           deletePolicy          retention, e.g. ``delete,168`` (RetentionPolicy)
max_message_bytes       maxMessageSize        largest record (its length prefix included)
max_batch_bytes         (metaq)               largest record batch one append accepts
=====================  ====================  ===================================================
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from metaq.errors import ConfigError
from metaq.protocol.records import HEADER_BYTES
from metaq.types import DEFAULT_MAX_BATCH_BYTES, DEFAULT_MAX_MESSAGE_BYTES

SEGMENT_BYTES_LIMIT = (1 << 32) - 1
"""Index entries hold positions as u32, so no batch may start past 4 GiB in a segment."""


_DURATION_RE = re.compile(r"(\d+)\s*([smhSMH]?)")
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "": 3_600_000}

@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """A parsed ``deletePolicy``: what to do (``delete`` / ``archive``) with segments older than a bound.

    ``delete,168``       delete segments whose last write is older than 168 hours.
    ``archive,72``       rename the segment's log to ``<name>.arc`` instead (kept for manual recovery).
    ``archive,72,true``  zip the segment's log into ``<name>.zip``, then remove it.

    The duration takes a unit suffix ``s``, ``m`` or ``h``; without one it is hours (MetaQ's rule). What a run
    does to an expired segment is retention.py's."""

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


def parse_duration_ms(text: str, *, what: str = "duration") -> int:
    """``168`` (hours), ``10h``, ``10m`` or ``10s`` to milliseconds."""
    match = _DURATION_RE.fullmatch(text.strip())
    if match is None:
        raise ConfigError(f"{what}: age {text!r} is not a number with an optional unit s, m or h")
    return int(match.group(1)) * _UNIT_MS[match.group(2).lower()]


def _check_int(name: str, value: object, low: int, high: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"{name} must be an integer, not {value!r}")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ConfigError(f"{name} is {value}; it must be {bound}")


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Settings of one topic's partition logs. Immutable: change a topic with a new instance."""

    segment_bytes_max: int = 1 << 30
    index_interval_bytes: int = 4096
    unflush_threshold: int = 1000
    unflush_interval_ms: int = 10_000
    delete_policy: str = "delete,168"
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
    retention: RetentionPolicy = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_int("segment_bytes_max", self.segment_bytes_max, 1, SEGMENT_BYTES_LIMIT)
        _check_int("index_interval_bytes", self.index_interval_bytes, 0, SEGMENT_BYTES_LIMIT)
        _check_int("unflush_threshold", self.unflush_threshold, -(1 << 31))
        _check_int("unflush_interval_ms", self.unflush_interval_ms, 1)
        _check_int("max_message_bytes", self.max_message_bytes, 1)
        _check_int("max_batch_bytes", self.max_batch_bytes, HEADER_BYTES)
        object.__setattr__(self, "retention", RetentionPolicy.parse(self.delete_policy))

    @property
    def sync_every_append(self) -> bool:
        """unflushThreshold=1: every append gets its own fdatasync before the ack."""
        return self.unflush_threshold == 1

    @property
    def group_commit(self) -> bool:
        """unflushThreshold<=0: acks wait for one shared fdatasync covering all pending batches."""
        return self.unflush_threshold <= 0

    @property
    def ack_waits_for_durable(self) -> bool:
        return self.unflush_threshold <= 1

    def with_changes(self, **changes: Any) -> LogConfig:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)
