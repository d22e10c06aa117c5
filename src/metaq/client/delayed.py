"""The producer's side of delayed delivery (docs/delayed.md): checks, and the ``metaq.deliver-at`` header."""

from __future__ import annotations

import time

from metaq.errors import InvalidArgument
from metaq.protocol.delayed import DELIVER_AT_HEADER, DELIVER_AT_HEADER_BYTES, pack_ms
from metaq.types import Message

_I64_MAX = (1 << 63) - 1


def check_delay(message: Message) -> int:
    """InvalidArgument for a bad ``deliver_at`` / ``delay_ms``; the bytes the due-time header adds."""
    deliver_at, delay_ms = message.deliver_at, message.delay_ms
    if deliver_at is not None and delay_ms is not None:
        raise InvalidArgument("a message takes deliver_at or delay_ms, not both")
    value = deliver_at if deliver_at is not None else delay_ms
    name = "deliver_at" if deliver_at is not None else "delay_ms"
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _I64_MAX // 2:
        raise InvalidArgument(f"{name} must be an integer number of milliseconds >= 0, not {value!r}")
    if message.headers and any(name in (DELIVER_AT_HEADER,) for name, _ in message.headers):
        raise InvalidArgument(f"{DELIVER_AT_HEADER} is a reserved header; set deliver_at or delay_ms instead")
    return DELIVER_AT_HEADER_BYTES


def due_ms(message: Message, now_ms: int | None = None) -> int:
    if message.deliver_at is not None:
        return message.deliver_at
    assert message.delay_ms is not None
    return (int(time.time() * 1000) if now_ms is None else now_ms) + message.delay_ms


def delayed_headers(message: Message) -> list[tuple[str, bytes]]:
    """The message's headers with its due time added."""
    return [*(message.headers or ()), (DELIVER_AT_HEADER, pack_ms(due_ms(message)))]
