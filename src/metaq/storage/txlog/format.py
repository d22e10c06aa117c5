"""The transaction log's records: their kinds, keys and bodies, and the earlier, unframed form.

A generation file is a run of framed records (:mod:`metaq.framing`: a magic, lengths, a checksum of the key
and one of the body). The key says which record of which transaction it is; the body holds the rest
(big-endian, strings ``u16 length + UTF-8``)::

    key   u8 type, u32 number (the record's place among its transaction's records: BEGIN is 0), txid

==========  ================================================================================
type        body
==========  ================================================================================
1 BEGIN     timeout_ms i64, begun_ms i64, producer_group
2 PUT       topic, partition i32, then the record batch (to the end of the record)
3 PREPARE   xid
4 COMMIT    (empty)
5 ROLLBACK  reason
6 APPLIED   (empty: every batch of the committed transaction is in its partition)
7 DONE      how (written by a checkpoint: a finished transaction and how it ended)
==========  ================================================================================

A generation written by an earlier version holds unframed records, ``[u32 length][u32 crc32c][u8
type][txid][payload]`` (the length and the CRC cover the type, the txid and the payload); it is read
up to its first damaged record and appended to in its own form until the next checkpoint.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator

import crc32c as _crc32c

from metaq import framing
from metaq.errors import StorageError

BEGIN, PUT, PREPARE, COMMIT, ROLLBACK, APPLIED, DONE = 1, 2, 3, 4, 5, 6, 7
NAMES = {BEGIN: "BEGIN", PUT: "PUT", PREPARE: "PREPARE", COMMIT: "COMMIT", ROLLBACK: "ROLLBACK", APPLIED: "APPLIED",
         DONE: "DONE"}
COMMITTED = "committed"
"""How a committed transaction ended (its ``APPLIED`` is logged)."""
ROLLED_BACK = "rolled back"
"""How a rolled-back transaction's ending starts: ``"rolled back (reason)"``."""
HOW_CHARS_MAX = 300
"""A finished transaction's ending is kept to this many characters (the reason can be long)."""
MAX_RECORD_BYTES = 1 << 30
_KEY = struct.Struct(">BI")
V1_HEAD = struct.Struct(">II")
"""The earlier form's record head: the length of what follows, its crc32c."""
_TYPE = struct.Struct(">B")
_U16 = struct.Struct(">H")
I32 = struct.Struct(">i")
I64 = struct.Struct(">q")


def encode_string(text: str) -> bytes:
    """A body string: ``u16 length + UTF-8``."""
    data = text.encode()
    if len(data) > 0xFFFF:
        raise StorageError(f"a transaction log string is {len(data)} bytes; at most 65535")
    return _U16.pack(len(data)) + data


class BodyReader:
    """Reads a record body's fields in order; ``pos`` is where the next one starts."""

    __slots__ = ("data", "pos")

    def __init__(self, data: memoryview | bytes) -> None:
        self.data = data
        self.pos = 0

    def s(self) -> str:
        (n,) = _U16.unpack_from(self.data, self.pos)
        self.pos += 2 + n
        if self.pos > len(self.data):
            raise ValueError("string runs past the record")
        return bytes(self.data[self.pos - n:self.pos]).decode()

    def i32(self) -> int:
        (v,) = I32.unpack_from(self.data, self.pos)
        self.pos += 4
        return int(v)

    def i64(self) -> int:
        (v,) = I64.unpack_from(self.data, self.pos)
        self.pos += 8
        return int(v)


def parse_key(key: bytes) -> tuple[int, int, str] | None:
    """(type, number, txid) of a record's key; None when it is not one."""
    if len(key) < _KEY.size:
        return None
    kind, number = _KEY.unpack_from(key)
    if kind not in NAMES:
        return None
    try:
        return kind, number, key[_KEY.size:].decode()
    except UnicodeDecodeError:
        return None


def describe_key(key: bytes) -> str:
    parsed = parse_key(key)
    if parsed is None:
        return repr(key)
    kind, number, txid = parsed
    return f"{NAMES[kind]} (record {number}) of transaction {txid!r}"


def encode_record(kind: int, number: int, txid: str, *parts: bytes | memoryview) -> list[bytes | memoryview]:
    """The pieces of one record, ready for ``os.writev`` (the payload is not copied)."""
    body_len = sum(len(p) for p in parts)
    if body_len > MAX_RECORD_BYTES:
        raise StorageError(f"a transaction log record of {body_len} bytes is over {MAX_RECORD_BYTES}")
    return framing.encode(_KEY.pack(kind, number) + txid.encode(), *parts)  # type: ignore[return-value]


def encode_v1(kind: int, txid: str, *parts: bytes | memoryview) -> list[bytes | memoryview]:
    """A record in the earlier, unframed form (appended to a generation an earlier version wrote)."""
    head = encode_string(txid)
    body_len = 1 + len(head) + sum(len(p) for p in parts)
    if body_len > MAX_RECORD_BYTES:
        raise StorageError(f"a transaction log record of {body_len} bytes is over {MAX_RECORD_BYTES}")
    crc = _crc32c.crc32c(head, _crc32c.crc32c(_TYPE.pack(kind)))
    for p in parts:
        crc = _crc32c.crc32c(p, crc)
    return [V1_HEAD.pack(body_len, crc) + _TYPE.pack(kind) + head, *parts]


def iter_v1(fd: int, size: int) -> Iterator[tuple[int, int, memoryview, int]]:
    """(position, type, payload, payload position) of the records of an earlier-format generation, up to the
    first that is cut off or damaged. The payload starts with the txid."""
    position = 0
    while size - position >= V1_HEAD.size + 1:
        body_len, crc = V1_HEAD.unpack(os.pread(fd, V1_HEAD.size, position))
        if body_len < 1 or body_len > MAX_RECORD_BYTES or position + V1_HEAD.size + body_len > size:
            return
        body = os.pread(fd, body_len, position + V1_HEAD.size)
        if len(body) != body_len or _crc32c.crc32c(body) != crc:
            return
        view = memoryview(body)
        yield position, view[0], view[1:], position + V1_HEAD.size + 1
        position += V1_HEAD.size + body_len


def is_v1(fd: int, size: int) -> bool:
    """Whether a generation was written by an earlier version (its first record unframed and intact)."""
    if size < len(framing.MAGIC) or os.pread(fd, len(framing.MAGIC), 0) == framing.MAGIC:
        return False
    return next(iter_v1(fd, size), None) is not None
