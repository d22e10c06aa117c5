"""Values the client commands take as text: where to start reading, a point in time, a duration."""

from __future__ import annotations

import datetime
import re
from typing import Literal

import click


def parse_offset(value: str) -> Literal["earliest", "latest"] | int:
    """An ``--offset``/``--to`` value: earliest, latest or an offset number."""
    if value == "earliest":
        return "earliest"
    if value == "latest":
        return "latest"
    try:
        n = int(value)
    except ValueError:
        raise click.BadParameter("use earliest, latest or a number >= 0") from None
    if n < 0:
        raise click.BadParameter("use earliest, latest or a number >= 0")
    return n


def time_ms(text: str | None, what: str) -> int:
    """Milliseconds since the epoch, or an ISO 8601 time (without a zone: UTC); None -> -1 (open)."""
    if text is None:
        return -1
    text = text.strip()
    if text.isdigit():
        return int(text)
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(f"{text!r} is neither milliseconds since the epoch nor an ISO 8601 time "
                                 "(2026-11-23T13:00:00, 2026-11-23 13:00:00+01:00)", param_hint=what) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return int(when.timestamp() * 1000)


_DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def duration_ms(text: str, what: str) -> int:
    """``500ms``, ``10s``, ``5m``, ``2h``, ``1d``; a bare number is seconds."""
    match = re.fullmatch(r"\s*(\d+)\s*(ms|s|m|h|d)?\s*", text)
    if match is None:
        raise click.BadParameter(f"{text!r} is not a duration (500ms, 10s, 5m, 2h, 1d)", param_hint=what)
    return int(match.group(1)) * _DURATION_UNITS_MS[match.group(2) or "s"]
