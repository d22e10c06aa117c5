"""Wording shared by the commands' output."""

from __future__ import annotations

import datetime

from metaq.wording import plural

__all__ = ["iso_ms", "plural"]


def iso_ms(ms: int) -> str:
    """Milliseconds since the epoch as an ISO 8601 UTC time with milliseconds."""
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(timespec="milliseconds")
