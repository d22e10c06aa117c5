"""Errors only the client raises (no wire code: they never travel).

They belong in :mod:`metaq.errors` eventually; they live here until that module grows them.
"""

from __future__ import annotations

from metaq.errors import MetaqError


class BufferFullError(MetaqError):
    """The producer already holds ``max_buffered_bytes`` of unsent or unacknowledged messages.

    Only the non-waiting calls (``send_async``, ``send_oneway``) report it; ``send`` and
    ``send_batch`` wait for room instead. Retriable once earlier sends complete.
    """

    retriable = True


class ClientClosedError(MetaqError):
    """The producer, consumer or session was closed; create a new one."""
