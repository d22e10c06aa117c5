"""Wording every part of metaq shares in what it tells people (errors, logs, the CLI, the dashboard)."""

from __future__ import annotations


def plural(count: int, noun: str, nouns: str | None = None, *, thousands: bool = False) -> str:
    """``1 message``, ``2 messages``, ``0 messages`` (``nouns``: an irregular plural; ``thousands``: 1,000)."""
    return (f"{count:,}" if thousands else str(count)) + " " + (noun if count == 1 else (nouns or noun + "s"))
