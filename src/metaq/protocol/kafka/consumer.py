"""Kafka's consumer protocol: the opaque bytes a consumer group's members exchange through JoinGroup and
SyncGroup (``protocol_type`` "consumer").

A member's subscription (JoinGroup ``protocols[].metadata``)::

    version     int16
    topics      array of string          int32 count, then int16-length strings
    user_data   nullable bytes           (version 1+ adds owned partitions, 2+ a generation, 3+ a rack:
                                         read past, never needed here)

An assignment (SyncGroup ``assignment``)::

    version             int16   (0)
    assigned_partitions array of (topic string, partitions array of int32)
    user_data           nullable bytes (-1)
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

from metaq.errors import ProtocolError

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
TOPICS_MAX = 10_000


def subscription_topics(metadata: bytes) -> list[str]:
    """The topics of a member's subscription; ProtocolError when the bytes are not one."""
    try:
        (_version,) = _I16.unpack_from(metadata, 0)
        (count,) = _I32.unpack_from(metadata, 2)
        if not 0 <= count <= TOPICS_MAX:
            raise ProtocolError(f"a consumer subscription names {count} topics")
        pos, topics = 6, []
        for _ in range(count):
            (size,) = _I16.unpack_from(metadata, pos)
            if size < 0 or pos + 2 + size > len(metadata):
                raise ProtocolError("a topic name of a consumer subscription is cut off")
            topics.append(metadata[pos + 2:pos + 2 + size].decode())
            pos += 2 + size
    except (struct.error, UnicodeDecodeError) as exc:
        raise ProtocolError(f"a consumer subscription does not decode: {exc}") from None
    return topics


def encode_subscription(topics: Sequence[str]) -> bytes:
    """Version 0 (what tests and tools send)."""
    parts = [_I16.pack(0), _I32.pack(len(topics))]
    for t in topics:
        raw = t.encode()
        parts += [_I16.pack(len(raw)), raw]
    parts.append(_I32.pack(-1))
    return b"".join(parts)


def encode_assignment(assigned: Mapping[str, Sequence[int]]) -> bytes:
    parts = [_I16.pack(0), _I32.pack(len(assigned))]
    for topic, partitions in sorted(assigned.items()):
        raw = topic.encode()
        parts += [_I16.pack(len(raw)), raw, _I32.pack(len(partitions))]
        parts += [_I32.pack(p) for p in sorted(partitions)]
    parts.append(_I32.pack(-1))
    return b"".join(parts)


def decode_assignment(data: bytes) -> dict[str, list[int]]:
    """For tests: topic -> partitions of an assignment."""
    if not data:
        return {}
    (count,) = _I32.unpack_from(data, 2)
    pos, out = 6, {}
    for _ in range(count):
        (size,) = _I16.unpack_from(data, pos)
        topic = data[pos + 2:pos + 2 + size].decode()
        pos += 2 + size
        (n,) = _I32.unpack_from(data, pos)
        pos += 4
        out[topic] = [_I32.unpack_from(data, pos + 4 * i)[0] for i in range(n)]
        pos += 4 * n
    return out
