"""The delay store's target partitions, numbered: bucket rows name a target by its number.

``targets.json`` holds one text line per target, ``{"id": n, "target": "topic-partition"}``, each with its
checksums (:mod:`metaq.framing`). A damaged line costs that number only: the target's delay log is still found
by its directory and given a new number (never one a damaged line may have held), and :attr:`Targets.damaged`
tells the store that bucket rows may name the lost number. A list an earlier version wrote (``["orders-0",
...]``, the number being the place in it) is still read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from metaq import framing
from metaq.storage.checkpoint import StoreReport, check_records, parse_records, read_bytes, write_records
from metaq.storage.manager import parse_partition_dir_name

STORE = "delay"
TARGETS_FILE = "targets.json"


def _target_key(obj: dict[str, Any]) -> str:
    return str(obj["target"])


class Targets:
    """Target number <-> (topic, partition), kept in ``<root>/targets.json``."""

    def __init__(self, root: Path) -> None:
        self.path = root / TARGETS_FILE
        self._by_number: dict[int, tuple[str, int]] = {}
        self._numbers: dict[tuple[str, int], int] = {}
        self.damaged = False
        """A damaged line was read: bucket rows may name a number that is lost."""

    def load(self) -> None:
        """Read the file (blocking); a missing file is no target."""
        data = read_bytes(self.path) or b""
        if not framing.is_text_lines(data):  # ["orders-0", ...]: the number is the place in the list
            try:
                names = json.loads(data)
            except ValueError:
                names = []
            pairs: list[tuple[object, object]] = list(enumerate(names)) if isinstance(names, list) else []
        else:
            records, damaged = parse_records(
                data, self.path, _target_key, store=STORE,
                lost=lambda key: f"target {key or '(unknown)'}'s number is lost: its delay log gets a new one and the "
                                 "buckets are rebuilt from the delay logs")
            self.damaged = bool(damaged)
            pairs = [(r.get("id"), r.get("target")) for r in records]
        for number, name in pairs:
            parsed = parse_partition_dir_name(name) if isinstance(name, str) else None
            if parsed is not None and isinstance(number, int) and parsed not in self._numbers \
                    and number not in self._by_number:
                self._numbers[parsed] = number
                self._by_number[number] = parsed

    def number(self, topic: str, partition: int) -> int:
        """The target's number; a new one is written to the file (blocking) before it is returned."""
        key = (topic, partition)
        number = self._numbers.get(key)
        if number is None:
            number = max(self._by_number, default=-1) + 1  # never a number a damaged line may have held
            self._by_number[number] = key
            self._numbers[key] = number
            try:
                names = ((f"{t}-{p}", n) for n, (t, p) in sorted(self._by_number.items()))
                write_records(self.path, ((name, {"id": n, "target": name}) for name, n in names))
            except OSError:
                del self._by_number[number], self._numbers[key]
                raise
        return number

    def __getitem__(self, number: int) -> tuple[str, int]:
        return self._by_number[number]

    def items(self) -> Iterator[tuple[int, tuple[str, int]]]:
        return iter(list(self._by_number.items()))

    def verify(self) -> StoreReport:
        """Check the file as it is on disk (blocking); modifies nothing."""
        report = StoreReport(STORE, str(self.path))
        report.records, report.damaged = check_records(read_bytes(self.path), _target_key)
        return report
