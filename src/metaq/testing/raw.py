"""A bare socket plus the sans-IO codec: lets a test send any request, or any bytes at all."""

from __future__ import annotations

import socket
from typing import Any

from metaq.errors import error_for_code
from metaq.protocol.codec import NEED_DATA, ClientConnection


class RawClient:
    def __init__(self, host: str, port: int, timeout_s: float = 30.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.codec = ClientConnection("metaq-raw")

    @classmethod
    def to(cls, broker: Any) -> RawClient:
        return cls(broker.host, broker.port)

    def call(self, request: Any) -> Any:
        """Send one request and return its response (error codes are left in the response)."""
        _, data = self.codec.send(request)
        self.sock.sendall(data)
        while True:
            event = self.codec.next_event()
            if event is not NEED_DATA:
                return event.response  # type: ignore[union-attr]
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("broker closed the connection")
            self.codec.receive_data(chunk)

    def raise_for(self, request: Any) -> Any:
        """Send one request; raise the wire error as its exception class."""
        response = self.call(request)
        if response.error_code:
            raise error_for_code(response.error_code, response.error_message)
        return response

    def closed_by_peer(self, timeout_s: float = 10.0) -> bool:
        return socket_closed_by_peer(self.sock, timeout_s)

    def close(self) -> None:
        self.sock.close()


def socket_closed_by_peer(sock: socket.socket, timeout_s: float = 10.0) -> bool:
    """True once the peer closed or reset the connection (waits up to ``timeout_s`` for it)."""
    sock.settimeout(timeout_s)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
