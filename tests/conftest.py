"""Shared fixtures: real broker processes on 127.0.0.1 with kernel-chosen ports."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from metaq.testing.broker import BrokerProcess


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[Callable[..., BrokerProcess]]:
    """Start brokers with given MetaQ options; all are stopped (or killed) at the end of the test."""
    started: list[BrokerProcess] = []

    def make(options: dict[str, Any] | None = None, *, name: str = "broker", start: bool = True,
             config_text: str | None = None) -> BrokerProcess:
        proc = BrokerProcess(tmp_path / name, options, config_text=config_text)
        started.append(proc)
        return proc.start() if start else proc

    yield make
    for proc in started:
        if proc.running:
            try:
                proc.stop(15)
            except AssertionError:
                proc.kill()


@pytest.fixture
def broker(broker_factory: Callable[..., BrokerProcess]) -> BrokerProcess:
    """One broker with 4 partitions per topic, group commit, and dynamic topics allowed."""
    return broker_factory({"numPartitions": 4, "unflushThreshold": 0})
