"""Offset arithmetic of the source: resolving specs, stream offsets, admission control, splitting.

Pure functions (no I/O, no pyspark) so each rule is unit-tested on its own.

Partitions are ``brokerId-partition`` (:class:`~metaq.types.PartitionId`). Stream offsets are
``{"<topic>": {"<brokerId-partition>": <next offset>, ...}}`` with partitions in (broker id, partition)
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

from metaq.errors import ConfigError, InvalidArgument
from metaq.spark.options import EARLIEST, LATEST, OffsetSpec
from metaq.types import PartitionId


@dataclass(frozen=True, slots=True)
class Bounds:
    """What a partition holds right now: [log_start, log_end)."""

    log_start: int
    log_end: int


@dataclass(frozen=True, slots=True)
class OffsetRange:
    partition: PartitionId
    start: int
    end: int
    """Exclusive."""

    @property
    def size(self) -> int:
        return self.end - self.start


def stream_offset(topic: str, positions: Mapping[PartitionId, int]) -> dict[str, dict[str, int]]:
    """The canonical stream offset (partitions in (broker id, partition) order, ``"b-p"`` keys)."""
    return {topic: {str(p): int(positions[p]) for p in sorted(positions)}}


def parse_stream_offset(offset: Mapping[str, object], topic: str) -> dict[PartitionId, int]:
    """Positions from a stream offset; a checkpoint of another topic is refused clearly."""
    if not isinstance(offset, Mapping) or set(offset) != {topic}:
        names = sorted(offset) if isinstance(offset, Mapping) else offset
        raise ConfigError(
            f"option 'topic': the query's checkpoint holds offsets of {names}, not of topic {topic!r}; "
            "use a new checkpoint location for a different topic")
    inner = offset[topic]
    if not isinstance(inner, Mapping):
        raise ConfigError(f"checkpointed offset {json.dumps(offset)} is not in the metaq format")
    out: dict[PartitionId, int] = {}
    for key, value in inner.items():
        try:
            out[PartitionId.parse(key)] = int(value)
        except InvalidArgument:
            raise ConfigError(
                f"checkpointed offset {json.dumps(offset)} names partition {key!r}, not brokerId-partition (an "
                "earlier metaq wrote bare partition numbers): use a new checkpoint location") from None
    return out


def resolve_spec(spec: OffsetSpec, bounds: Mapping[PartitionId, Bounds], option: str) -> dict[PartitionId, int]:
    """Concrete offsets for every partition in ``bounds``.

    Partitions a JSON spec leaves out take the default of the option (earliest for a start, latest
    for an end); a partition the topic does not have, or a bare number that more than one broker has,
    is an error naming the option.
    """
    if spec == "earliest":
        return {p: b.log_start for p, b in sorted(bounds.items())}
    if spec == "latest":
        return {p: b.log_end for p, b in sorted(bounds.items())}
    assert isinstance(spec, dict)
    named: dict[PartitionId, int] = {}
    missing: list[str] = []
    for key, value in spec.items():
        if isinstance(key, PartitionId):
            pid: PartitionId | None = key if key in bounds else None
        else:
            candidates = [p for p in bounds if p.partition == key]
            if len(candidates) > 1:
                raise ConfigError(f"option {option!r}: partition {key} is ambiguous: brokers "
                                  f"{', '.join(str(p.broker_id) for p in sorted(candidates))} each have one; "
                                  f"name it as brokerId-partition ({', '.join(str(p) for p in sorted(candidates))})")
            pid = candidates[0] if candidates else None
        if pid is None:
            missing.append(str(key))
        elif pid in named:
            raise ConfigError(f"option {option!r}: partition {pid} is named twice")
        else:
            named[pid] = value
    if missing:
        raise ConfigError(f"option {option!r}: partition(s) {missing} do not exist; the topic has partitions "
                          f"{[str(p) for p in sorted(bounds)]}")
    default = EARLIEST if option == "startingOffsets" else LATEST
    out: dict[PartitionId, int] = {}
    for p, b in sorted(bounds.items()):
        value = named.get(p, default)
        out[p] = b.log_start if value == EARLIEST else b.log_end if value == LATEST else value
    return out


def batch_ranges(start: Mapping[PartitionId, int], end: Mapping[PartitionId, int]) -> list[OffsetRange]:
    """[start, end) per partition for a batch query; an end before its start is an option error."""
    out = []
    for p in sorted(end):
        s, e = start.get(p, 0), end[p]
        if e < s:
            raise ConfigError(f"option 'startingOffsets': offset {s} of partition {p} is after its "
                              f"endingOffsets offset {e}")
        out.append(OffsetRange(p, s, e))
    return out


def cap_to_max_rows(start: Mapping[PartitionId, int], latest: Mapping[PartitionId, int],
                    max_rows: int) -> dict[PartitionId, int]:
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
