"""Wording shared by the commands' output."""

from __future__ import annotations

import datetime


def plural(count: int, noun: str, nouns: str | None = None, *, thousands: bool = False) -> str:
    """``1 message``, ``2 messages``, ``0 messages`` (``nouns``: an irregular plural; ``thousands``: 1,000)."""
    return (f"{count:,}" if thousands else str(count)) + " " + (noun if count == 1 else (nouns or noun + "s"))


def iso_ms(ms: int) -> str:
    """Milliseconds since the epoch as an ISO 8601 UTC time with milliseconds."""
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(timespec="milliseconds")
