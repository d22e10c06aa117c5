"""Framed records: how the stores beside the segments keep their records, each checked on its own.

Every store that is not a partition's segments (the committed offsets, the transaction log, the delay
store's targets, producer snapshots, epoch histories, clean-shutdown records, the users and ACL files)
frames its records with one of the two forms below, so that damage in the middle of a file costs the
damaged record and nothing else: a reader checks each record, steps over a damaged one to the next
intact one, and can say what the lost record was about (its **key**: a group, a transaction id, a
partition), because the key has a checksum of its own. A damaged stretch with nothing intact after it
is a **torn tail** (a crash while appending) and the store cuts it.

**Binary records**, for logs appended record by record (the offsets log, the transaction log)::

    offset  size  field
    0       4     magic      b"\\xc3MQr": where a reader resynchronises after damage
    4       4     body_len   u32, big-endian
    8       2     key_len    u16, big-endian
    10      4     head_crc   CRC32C of bytes [4, 10) followed by the key
    14      4     body_crc   CRC32C of the body
    18      k     key        what the record is about (named when the record is lost)
    18+k    n     body

A head that passes ``head_crc`` is trusted (its lengths give the record's extent) even with a damaged
magic; a head that fails it makes the reader search for the next magic followed by an intact head. A
record whose head is intact and whose body fails ``body_crc`` is skipped with its key known. Where the
head itself is damaged, the key is still named when its checksum matches once ``body_len`` is taken
from where the next intact record starts (a flipped bit in the length).

**Text lines**, for small files rewritten whole (users, ACLs, producer snapshots, epochs, clean-shutdown
records, the delay store's targets): one JSON object a line, behind two checksums::

    <crc32c, 8 hex digits> <crc32c of the key, 8 hex digits> <JSON object>\\n

The first CRC covers the rest of the line after its space; the key's CRC covers the key the store
derives from the object (``key_of``), so a line that fails only its first CRC still names its key. A
newline damaged into another byte joins two lines: the reader splits them again where the second
line's checksums start.

:class:`DamageCounts` keeps, per store, how many records were skipped and how many torn tails were cut
in this process: ``metaq stats`` and the Prometheus endpoint show them.
"""

from __future__ import annotations

import json
import re
import struct
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import crc32c as _crc32c

MAGIC = b"\xc3MQr"
HEAD = struct.Struct(">4sIHII")
HEAD_BYTES = HEAD.size  # 18
KEY_BYTES_MAX = 0xFFFF
BODY_BYTES_MAX = (1 << 32) - 1
_LENGTHS = struct.Struct(">IH")
_crc = _crc32c.crc32c


# -- binary records ------------------------------------------------------------------------------------


def encode(key: bytes, *body: bytes | bytearray | memoryview) -> list[bytes | bytearray | memoryview]:
    """The pieces of one record, ready for ``os.writev`` (the body's pieces are not copied)."""
    if len(key) > KEY_BYTES_MAX:
        raise ValueError(f"a record key of {len(key)} bytes is over {KEY_BYTES_MAX}")
    body_len = sum(len(p) for p in body)
    if body_len > BODY_BYTES_MAX:
        raise ValueError(f"a record body of {body_len} bytes is over {BODY_BYTES_MAX}")
    lengths = _LENGTHS.pack(body_len, len(key))
    body_crc = 0
    for piece in body:
        body_crc = _crc(piece, body_crc)
    return [HEAD.pack(MAGIC, body_len, len(key), _crc(key, _crc(lengths)), body_crc) + key, *body]


def encode_bytes(key: bytes, body: bytes | bytearray | memoryview = b"") -> bytes:
    """One record as bytes."""
    return b"".join(bytes(p) for p in encode(key, body))


class Record(NamedTuple):
    """An intact record: its key, and where its body is (``data[body_at:end]``). A tuple: a replay makes one
    per record."""

    position: int
    key: bytes
    body_at: int
    end: int

    @property
    def body_len(self) -> int:
        return self.end - self.body_at


@dataclass(frozen=True, slots=True)
class Damage:
    """Bytes ``[position, position + size_bytes)`` that hold no intact record.

    ``key`` is the lost record's key when its checksum vouches for it; ``key_guess`` is what the bytes
    say where it does not (for a message only). ``tail``: nothing intact follows (a torn tail)."""

    position: int
    size_bytes: int
    key: bytes | None
    key_guess: bytes | None
    tail: bool
    problem: str

    @property
    def end(self) -> int:
        return self.position + self.size_bytes

    def describe_key(self, name: Callable[[bytes], str] = lambda k: k.decode("utf-8", "replace")) -> str:
        """The lost record's key for a message: as vouched for, or as far as it can be read."""
        if self.key is not None:
            return name(self.key)
        if self.key_guess:
            return f"unreadable (it looks like {name(self.key_guess)!s})"
        return "unreadable"


class _Scanner:
    __slots__ = ("buf", "end", "view")

    def __init__(self, buf: Any, end: int) -> None:
        self.buf = buf
        self.view = memoryview(buf)
        self.end = end

    def head(self, p: int) -> tuple[int, int, int, int] | None:
        """(body_len, key_len, body_crc, key_end) of an intact head at ``p`` (the magic not checked)."""
        if self.end - p < HEAD_BYTES:
            return None
        _magic, body_len, key_len, head_crc, body_crc = HEAD.unpack_from(self.view, p)
        key_end = p + HEAD_BYTES + key_len
        if key_end > self.end:
            return None
        if _crc(self.view[p + HEAD_BYTES:key_end], _crc(self.view[p + 4:p + 10])) != head_crc:
            return None
        return body_len, key_len, body_crc, key_end

    def next_head(self, p: int) -> int:
        """The first position after ``p`` holding the magic and an intact head; the end if none."""
        find = self.buf.find
        while True:
            p = find(MAGIC, p + 1, self.end)
            if p < 0:
                return self.end
            if self.head(p) is not None:
                return p

    def named(self, p: int, q: int) -> tuple[bytes | None, bytes | None]:
        """(verified key, guessed key) of a damaged head at ``p`` whose record ends at ``q``."""
        if self.end - p < HEAD_BYTES:
            return None, None
        _magic, _body_len, key_len, head_crc, _body_crc = HEAD.unpack_from(self.view, p)
        key_end = p + HEAD_BYTES + key_len
        if key_end > q:
            return None, None
        key = bytes(self.view[p + HEAD_BYTES:key_end])
        if _crc(key, _crc(_LENGTHS.pack(q - key_end, key_len))) == head_crc:
            return key, None  # only the body length was damaged
        return None, key


def scan(buf: Any, start: int = 0, end: int | None = None) -> list[Record | Damage]:
    """Every intact record and every damaged stretch of ``buf`` (bytes, or an mmap) from ``start``, in order.

    A damaged stretch runs to the next intact head; the damaged stretches after the last intact record
    have ``tail`` set (a torn tail, when it is the last record that is damaged)."""
    s = _Scanner(buf, len(buf) if end is None else end)
    p, stop = start, s.end
    out: list[Record | Damage] = []
    try:
        _scan(s, p, stop, out)
    finally:
        s.view.release()
    for i in range(len(out) - 1, -1, -1):
        item = out[i]
        if isinstance(item, Record):
            break
        out[i] = replace(item, tail=True)
    return out


def _scan(s: _Scanner, p: int, stop: int, out: list[Record | Damage]) -> None:
    view, unpack, crc, append = s.view, HEAD.unpack_from, _crc, out.append
    while p < stop:
        if stop - p >= HEAD_BYTES:  # the common case inline: an intact head (its magic not needed)
            _magic, body_len, key_len, head_crc, body_crc = unpack(view, p)
            key_end = p + HEAD_BYTES + key_len
            if key_end <= stop and crc(view[p + HEAD_BYTES:key_end], crc(view[p + 4:p + 10])) == head_crc:
                key = bytes(view[p + HEAD_BYTES:key_end])
                record_end = key_end + body_len
                if record_end > stop:
                    append(Damage(p, stop - p, key, None, True, "cut off"))
                    return
                if crc(view[key_end:record_end]) == body_crc:
                    append(Record(p, key, key_end, record_end))
                else:
                    append(Damage(p, record_end - p, key, None, False, "the body fails its checksum"))
                p = record_end
                continue
        q = s.next_head(p)
        named, guess = s.named(p, q)
        problem = "cut off" if q == stop and stop - p < HEAD_BYTES else "the head fails its checksum"
        append(Damage(p, q - p, named, guess, False, problem))
        p = q


# -- text lines ----------------------------------------------------------------------------------------

_LINE = re.compile(rb"([0-9a-f]{8}) ([0-9a-f]{8}) (\{.*\})\Z", re.DOTALL)
_LINE_START = re.compile(rb"[0-9a-f]{8} [0-9a-f]{8} \{")
_LOOSE_LINE = re.compile(rb"(.{8}) (.{8}) (\{.*\})\Z", re.DOTALL)


def encode_line(obj: dict[str, Any], key: str) -> bytes:
    """One record as a text line (``key``: what :func:`parse_lines`' ``key_of`` gives for ``obj``)."""
    text = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()
    rest = b"%08x %s" % (_crc(key.encode()), text)
    return b"%08x %s\n" % (_crc(rest), rest)


@dataclass(frozen=True, slots=True)
class LineDamage:
    """A line (``number``, from 1) that holds no intact record; its key as in :class:`Damage`."""

    number: int
    key: str | None
    key_guess: str | None
    text: bytes
    problem: str

    def describe_key(self) -> str:
        if self.key is not None:
            return self.key
        if self.key_guess:
            return f"unreadable (it looks like {self.key_guess!r})"
        return "unreadable"


def _line(line: bytes) -> dict[str, Any] | None:
    """The object of an intact line, or None."""
    m = _LINE.match(line)
    if m is None or int(m.group(1), 16) != _crc(line[9:]):
        return None
    try:
        obj = json.loads(m.group(3))
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _damaged_line(number: int, line: bytes, key_of: Callable[[dict[str, Any]], str],
                  problem: str) -> LineDamage:
    m = _LOOSE_LINE.match(line)
    key = guess = None
    if m is not None:
        try:
            obj = json.loads(m.group(3))
            found = key_of(obj) if isinstance(obj, dict) else None
        except (ValueError, KeyError, TypeError, AttributeError):
            found = None
        if isinstance(found, str):
            if m.group(2) == b"%08x" % _crc(found.encode()):
                key = found
            else:
                guess = found
    return LineDamage(number, key, guess, line, problem)


def parse_lines(data: bytes, key_of: Callable[[dict[str, Any]], str]) -> tuple[list[dict[str, Any]],
                                                                                list[LineDamage]]:
    """The intact records of a text-line file, in order, and the damaged lines."""
    records: list[dict[str, Any]] = []
    damaged: list[LineDamage] = []
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    for number, line in enumerate(lines, 1):
        obj = _line(line)
        if obj is not None:
            records.append(obj)
            continue
        # a damaged newline joins two lines: split where the second one's checksums start
        pieces = [line]
        for m in _LINE_START.finditer(line, 1):
            right = line[m.start():]
            if _line(right) is not None:
                pieces = [line[:m.start() - 1], right]
                break
        for piece in pieces:
            obj = _line(piece)
            if obj is not None:
                records.append(obj)
            elif piece:
                damaged.append(_damaged_line(number, piece, key_of, "the line fails its checksum"))
    # a byte damaged into a newline splits one record in two: one loss, not two
    merged: list[LineDamage] = []
    for d in damaged:
        if merged and merged[-1].number + 1 == d.number and merged[-1].key is None and d.key is None:
            last = merged.pop()
            d = LineDamage(last.number, None, last.key_guess or d.key_guess, last.text + b"\n" + d.text, d.problem)
        merged.append(d)
    return records, merged


def is_text_lines(data: bytes) -> bool:
    """Whether ``data`` is in the text-line form (else a whole JSON document an earlier version wrote)."""
    stripped = data.lstrip()
    return not stripped or stripped[:1] not in (b"{", b"[")


# -- counts --------------------------------------------------------------------------------------------


class DamageCounts:
    """Records skipped and torn tails cut, per store, in this process (``metaq stats``, Prometheus)."""

    RECENT = 20

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.skipped: dict[str, int] = {}
        self.tails: dict[str, int] = {}
        self.recent: deque[str] = deque(maxlen=self.RECENT)

    def skipped_record(self, store: str, what: str) -> None:
        """A damaged record skipped (``what``: the message, naming what was lost)."""
        with self._lock:
            self.skipped[store] = self.skipped.get(store, 0) + 1
            self.recent.append(what)

    def cut_tail(self, store: str) -> None:
        with self._lock:
            self.tails[store] = self.tails.get(store, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"damaged_records": dict(self.skipped), "torn_tails": dict(self.tails),
                    "recent": list(self.recent)}


DAMAGE = DamageCounts()
"""The process's counts (one broker per process)."""

STORES = ("offsets", "txlog", "delay", "producers", "epochs", "clean-shutdown", "users", "acls")
"""The store names the counts use."""
