"""Delayed records on the wire (docs/delayed.md): the reserved headers and the batch bit.

A delayed batch is an ordinary record batch whose attribute bit 7 (:data:`records.ATTR_DELAYED`) is set
and whose every record carries :data:`DELIVER_AT_HEADER` (i64 big-endian, ms since the epoch). The
broker keeps such a batch in its delay store; when a record is due it is appended to its partition as a
normal record with :data:`DELAY_REF_HEADER` added (its offset in the delay log, i64 big-endian).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import crc32c as _crc32c

from metaq.errors import InvalidArgument
from metaq.protocol.records import ATTR_DELAYED, HEADER_BYTES, HEADER_CRC_COVERS, STAMPED_BYTES

DELIVER_AT_HEADER = "metaq.deliver-at"
DELAY_REF_HEADER = "metaq.delay-ref"
DELIVER_AT_HEADER_BYTES = 6 + len(DELIVER_AT_HEADER) + 8
"""What the deliver-at header adds to a record in a batch (name length, name, value length, value)."""

_I64 = struct.Struct(">q")
_ATTRS = struct.Struct(">h")
_U32 = struct.Struct(">I")


def pack_ms(ms: int) -> bytes:
    return _I64.pack(ms)


def unpack_ms(value: bytes) -> int:
    if len(value) != 8:
        raise InvalidArgument(f"a {DELIVER_AT_HEADER} / {DELAY_REF_HEADER} header holds 8 bytes, not {len(value)}")
    return int(_I64.unpack(value)[0])


def header_ms(headers: Sequence[tuple[str, bytes]] | None, name: str) -> int | None:
    """The i64 value of header ``name`` (the last one if repeated), None without it."""
    if not headers:
        return None
    found = None
    for hname, value in headers:
        if hname == name:
            found = value
    return None if found is None else unpack_ms(found)


def mark_delayed(batch: bytes) -> bytes:
    """``batch`` (as the producer built it) with attribute bit 7 set and both checksums recomputed."""
    out = bytearray(batch)
    (attributes,) = _ATTRS.unpack_from(out, STAMPED_BYTES)
    _ATTRS.pack_into(out, STAMPED_BYTES, attributes | ATTR_DELAYED)
    view = memoryview(out)
    _U32.pack_into(out, 37, _crc32c.crc32c(view[STAMPED_BYTES:]))
    _U32.pack_into(out, HEADER_CRC_COVERS, _crc32c.crc32c(view[STAMPED_BYTES:HEADER_BYTES],
                                                          _crc32c.crc32c(view[:HEADER_CRC_COVERS])))
    return bytes(out)
