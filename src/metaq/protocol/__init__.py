"""The sans-IO wire protocol: frames, declared schemas, record batches. No sockets, no asyncio, no files."""

from metaq.protocol.codec import (
    NEED_DATA,
    BadRequest,
    ClientConnection,
    RequestEvent,
    RequestHeader,
    ResponseEvent,
    ServerConnection,
)
from metaq.protocol.messages import APIS

__all__ = [
    "APIS",
    "NEED_DATA",
    "BadRequest",
    "ClientConnection",
    "RequestEvent",
    "RequestHeader",
    "ResponseEvent",
    "ServerConnection",
]
