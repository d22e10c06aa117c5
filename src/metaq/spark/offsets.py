"""Offset arithmetic of the source: resolving specs, stream offsets, admission control, splitting.

Pure functions (no I/O, no pyspark) so each rule is unit-tested on its own.

Stream offsets are ``{"<topic>": {"<partition>": <next offset>, ...}}`` with partitions in numeric
order. Spark stores ``json.dumps`` of that dict and compares the *strings* to decide whether there is
new data, so the same positions must always serialise to the same text: :func:`stream_offset` is
the only place that builds one.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

from metaq.errors import ConfigError
from metaq.spark.options import EARLIEST, LATEST, OffsetSpec


@dataclass(frozen=True, slots=True)
class Bounds:
    """What a partition holds right now: [log_start, log_end)."""

    log_start: int
    log_end: int


@dataclass(frozen=True, slots=True)
class OffsetRange:
    partition: int
    start: int
    end: int
    """Exclusive."""

    @property
    def size(self) -> int:
        return self.end - self.start


def stream_offset(topic: str, positions: Mapping[int, int]) -> dict[str, dict[str, int]]:
    """The canonical stream offset (partitions in numeric order, string keys)."""
    return {topic: {str(p): int(positions[p]) for p in sorted(positions)}}


def parse_stream_offset(offset: Mapping[str, object], topic: str) -> dict[int, int]:
    """Positions from a stream offset; a checkpoint of another topic is refused clearly."""
    if not isinstance(offset, Mapping) or set(offset) != {topic}:
        names = sorted(offset) if isinstance(offset, Mapping) else offset
        raise ConfigError(
            f"option 'topic': the query's checkpoint holds offsets of {names}, not of topic {topic!r}; "
            "use a new checkpoint location for a different topic")
    inner = offset[topic]
    if not isinstance(inner, Mapping):
        raise ConfigError(f"checkpointed offset {json.dumps(offset)} is not in the metaq format")
    return {int(p): int(v) for p, v in inner.items()}


def resolve_spec(spec: OffsetSpec, bounds: Mapping[int, Bounds], option: str) -> dict[int, int]:
    """Concrete offsets for every partition in ``bounds``.

    Partitions a JSON spec leaves out take the default of the option (earliest for a start, latest
    for an end); a partition the topic does not have is an error naming the option.
    """
    if spec == "earliest":
        return {p: b.log_start for p, b in sorted(bounds.items())}
    if spec == "latest":
        return {p: b.log_end for p, b in sorted(bounds.items())}
    assert isinstance(spec, dict)
    missing = sorted(set(spec) - set(bounds))
    if missing:
        raise ConfigError(f"option {option!r}: partition(s) {missing} do not exist; the topic has partitions "
                          f"{sorted(bounds)}")
    default = EARLIEST if option == "startingOffsets" else LATEST
    out: dict[int, int] = {}
    for p, b in sorted(bounds.items()):
        value = spec.get(p, default)
        out[p] = b.log_start if value == EARLIEST else b.log_end if value == LATEST else value
    return out


def batch_ranges(start: Mapping[int, int], end: Mapping[int, int]) -> list[OffsetRange]:
    """[start, end) per partition for a batch query; an end before its start is an option error."""
    out = []
    for p in sorted(end):
        s, e = start.get(p, 0), end[p]
        if e < s:
            raise ConfigError(f"option 'startingOffsets': offset {s} of partition {p} is after its "
                              f"endingOffsets offset {e}")
        out.append(OffsetRange(p, s, e))
    return out


def cap_to_max_rows(start: Mapping[int, int], latest: Mapping[int, int], max_rows: int) -> dict[int, int]:
    """End offsets that admit at most ``max_rows`` messages in total, shared fairly.

    ``start`` must have every partition of ``latest``. A partition whose latest is below its start
    (its log was truncated) keeps its latest.

    Each partition gets a share proportional to its backlog (largest remainders take the leftover
    rows, lower partition first on ties), so a busy partition cannot starve a quiet one and the
    result is a pure function of its inputs (a replayed plan gives the same batch).
    """
    backlog = {p: max(0, latest[p] - start[p]) for p in latest}
    total = sum(backlog.values())
    if total <= max_rows:
        return dict(latest)
    shares = {p: max_rows * n // total for p, n in backlog.items()}
    left = max_rows - sum(shares.values())
    by_remainder = sorted(backlog, key=lambda p: (-(max_rows * backlog[p] % total), p))
    for p in by_remainder:
        if left == 0:
            break
        if shares[p] < backlog[p]:
            shares[p] += 1
            left -= 1
    out = {}
    for p in latest:
        out[p] = start[p] + shares[p] if backlog[p] else latest[p]
    return out


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """Non-empty ranges, cut into contiguous pieces so that there are at least ``min_partitions``.

    A range gets pieces in proportion to its size (rounded up, never more pieces than messages),
    like Spark's Kafka source; without ``min_partitions`` each metaq partition is one Spark task.
    """
    ranges = [r for r in ranges if r.size > 0]
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.size for r in ranges)
    out: list[OffsetRange] = []
    for r in ranges:
        pieces = min(r.size, max(1, math.ceil(r.size * min_partitions / total)))
        bounds = [r.start + r.size * k // pieces for k in range(pieces + 1)]
        out.extend(OffsetRange(r.partition, a, b) for a, b in itertools.pairwise(bounds) if b > a)
    return out
