"""Waiting for a condition in a test: poll it until it holds, with a deadline so a test fails instead of
hanging. :func:`wait_until` blocks (plain tests, threads); :func:`until` awaits (inside an event loop,
which it leaves free to run what the test waits for). Both return the predicate's truthy value."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

__all__ = ["until", "wait_until"]


def wait_until(predicate: Callable[[], Any], timeout_s: float = 10.0, interval_s: float = 0.005,
               message: str = "condition") -> Any:
    """Poll ``predicate`` until it returns a truthy value or the deadline passes (then AssertionError)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {message}")
        time.sleep(interval_s)


async def until(predicate: Callable[[], Any], timeout_s: float = 30.0, *, message: str = "condition",
                interval_s: float = 0.01) -> Any:
    """:func:`wait_until` for a coroutine: polls without blocking the event loop."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {message}")
        await asyncio.sleep(interval_s)
