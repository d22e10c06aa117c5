"""Loopback ports for tests."""

from __future__ import annotations

import socket


def unused_port() -> int:
    """A 127.0.0.1 port nothing listens on right now (the kernel picked it, then it was released).

    For a server a test starts later on a known port, or a port that must refuse connections. Prefer
    ``--serverPort 0`` where the server can report its own port: this one can race with other processes.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
