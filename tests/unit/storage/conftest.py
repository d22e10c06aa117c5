"""Fixtures for the storage tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from storage_helpers import no_sync

from metaq.storage import LogConfig, PartitionLog


@pytest.fixture
def open_log(tmp_path: Path) -> Callable[..., PartitionLog]:
    """Open (or reopen) the test partition ``t-0`` with config overrides."""
    opened: list[PartitionLog] = []

    def opener(**overrides: object) -> PartitionLog:
        kwargs = {"unflush_threshold": 1000, "segment_bytes_max": 1 << 20, "index_interval_bytes": 256}
        kwargs.update(overrides)  # type: ignore[arg-type]
        sync = kwargs.pop("sync", no_sync)
        clock = kwargs.pop("clock", None)
        extra = {"clock": clock} if clock is not None else {}
        log = PartitionLog.open(tmp_path / "t-0", "t", 0, LogConfig(**kwargs), 7,  # type: ignore[arg-type]
                                sync=sync, **extra)  # type: ignore[arg-type]
        opened.append(log)
        return log

    yield opener  # type: ignore[misc]
    for log in opened:
        if not log.closed:
            log.abandon()
