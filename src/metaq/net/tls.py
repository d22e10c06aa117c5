"""Where TLS enters metaq's connections. A seam only: brokers serve plain TCP, nothing builds a context yet.

Every connection is opened from a :class:`~metaq.net.codec.ConnectionSettings` whose ``ssl_context``
(an ``ssl.SSLContext`` or None) is the one place TLS is decided:

- the asyncio :class:`~metaq.net.connection.BrokerConnection` hands it to ``loop.create_connection``
  (``ssl=``; the broker's host name is checked against its certificate by the context's rules);
- the blocking :class:`~metaq.net.blocking.BlockingConnection` wraps its socket with :func:`wrap_socket`;
- both pools pass their settings to every connection they open, so a session (``ClientCore``), the
  blocking client and, later, the broker's replica fetcher get TLS by building their settings with a
  context.

Today every caller passes ``ssl_context=None``. The TLS issue adds what is missing above this seam: the
client and broker options (certificates, CA, verification), building the ``SSLContext`` from them, and
the broker transport's server side.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ssl


def wrap_socket(sock: socket.socket, host: str, context: ssl.SSLContext | None) -> socket.socket:
    """``sock`` as it is without a context; else a TLS socket whose handshake with ``host`` is done."""
    if context is None:
        return sock
    return context.wrap_socket(sock, server_hostname=host)
