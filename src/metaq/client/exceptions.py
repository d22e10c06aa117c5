"""Errors only the client raises; they live in :mod:`metaq.errors` with the rest (re-exported here)."""

from metaq.errors import BufferFullError, ClientClosedError

__all__ = ["BufferFullError", "ClientClosedError"]
