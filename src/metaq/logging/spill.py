"""The spill files of a :class:`~metaq.logging.MetaqHandler`: records the memory queue could not hold, on disk
until the broker takes them.

A spill file holds records one after the other, each ``[i64 timestamp ms][u32 payload length][u16 attribute
length][u16 key length][attribute][key][payload]`` (a length of 0xFFFF: no attribute, no key), and at most one
batch of them (a file is sent as one batch). Its name, ``metaq-<topic>@<pid>-<token>-<ns>-<seq>.spill``, says
whose it is: a file whose handler is gone (its process, or closed in this one) is an orphan the next handler
of the topic claims.
"""

from __future__ import annotations

import contextlib
import os
import struct
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from metaq.fsutil import fsync_directory, pid_alive

Item = tuple[int, bytes, str | None, bytes | None]
"""A queued record: (timestamp ms, payload, attribute, key)."""

_SPILL_HEADER = struct.Struct(">qIHH")  # timestamp ms, payload length, attribute length (0xFFFF: none), key length
_NONE = 0xFFFF
_LIVE_TOKENS: set[str] = set()
"""Spill-file tokens of the handlers of this process that are not closed: their files are not orphans."""


class SpillFiles:
    """Append-only spill files of one handler; every method is called with the handler's lock held."""

    def __init__(self, directory: Path, topic: str, max_bytes: int, file_records: int) -> None:
        self.dir = directory
        self.file_records = file_records
        self.dir.mkdir(parents=True, exist_ok=True)
        self.prefix = f"metaq-{topic}@"  # "@" cannot occur in a topic name
        self.max_bytes = max_bytes
        self.pid = os.getpid()
        self.token = os.urandom(6).hex()
        _LIVE_TOKENS.add(self.token)
        self.seq = 0
        self.writer: Any = None
        self.writer_path: Path | None = None
        self.writer_records = 0
        self.ready: deque[tuple[Path, int]] = deque()  # closed files to send, oldest first, with record counts
        self.bytes = 0
        self.records = 0
        self.dirty: dict[Path, int] = {}
        """Files written since their last fsync -> how many records that is (:meth:`sync`)."""

    def claim_orphans(self) -> None:
        """Take over spill files of this topic whose handler is gone (its process, or closed in this one)."""
        candidates = []
        for path in self.dir.glob(f"{self.prefix}*.spill"):
            try:
                pid_text, token = path.name[len(self.prefix):].split("-")[:2]
                pid = int(pid_text)
            except ValueError:
                continue
            if (pid == self.pid and token in _LIVE_TOKENS) or (pid != self.pid and pid_alive(pid)):
                continue
            candidates.append(path)
        for path in sorted(candidates, key=lambda p: p.name.split("-")[-2:]):
            mine = self._new_path()
            try:
                os.rename(path, mine)
            except OSError:
                continue  # another handler claimed it first
            records = sum(1 for _ in read_spill(mine))
            self.ready.append((mine, records))
            self.bytes += mine.stat().st_size
            self.records += records

    def _new_path(self) -> Path:
        self.seq += 1
        return self.dir / f"{self.prefix}{self.pid}-{self.token}-{time.time_ns()}-{self.seq:08d}.spill"

    def release(self) -> None:
        """The handler is closed: what it leaves may be claimed by the next handler of the topic."""
        _LIVE_TOKENS.discard(self.token)

    def full(self, extra: int) -> bool:
        return self.bytes + extra > self.max_bytes

    def append(self, item: Item, *, flush: bool = True) -> int:
        """Write one record; with ``flush`` it is with the OS when this returns (a killed process keeps it)."""
        ts, payload, attribute, key = item
        attr = attribute.encode() if attribute is not None else b""
        k = key if key is not None else b""
        data = b"".join((_SPILL_HEADER.pack(ts, len(payload), _NONE if attribute is None else len(attr),
                                            _NONE if key is None else len(k)), attr, k, payload))
        if self.writer is None:
            self.writer_path = self._new_path()
            self.writer = open(self.writer_path, "ab", buffering=1 << 20)  # noqa: SIM115 - kept open across calls
            self.writer_records = 0
        self.writer.write(data)
        if flush:
            self.writer.flush()
        self.writer_records += 1
        self.bytes += len(data)
        self.records += 1
        assert self.writer_path is not None
        self.dirty[self.writer_path] = self.dirty.get(self.writer_path, 0) + 1
        if self.writer_records >= self.file_records:
            self.rotate()  # a file is sent as one batch, so it holds at most one batch
        return len(data)

    def rotate(self, sync: bool = False) -> None:
        """Close the file being written so that it can be sent."""
        if self.writer is None:
            return
        self.writer.flush()
        assert self.writer_path is not None
        if sync:
            os.fsync(self.writer.fileno())
            self.dirty.pop(self.writer_path, None)
            fsync_directory(self.dir)
        self.writer.close()
        self.ready.append((self.writer_path, self.writer_records))
        self.writer = None
        self.writer_path = None

    def sent(self, path: Path, records: int) -> None:
        """A whole file was acknowledged: forget it."""
        with contextlib.suppress(OSError):
            self.bytes -= path.stat().st_size
            path.unlink()
        self.records -= records
        self.dirty.pop(path, None)

    @property
    def unsynced(self) -> int:
        return sum(self.dirty.values())

    def synced(self, done: dict[Path, int]) -> None:
        """The files of ``done`` (a copy of :attr:`dirty` taken before :func:`sync_files`) are on disk."""
        for path, records in done.items():
            left = self.dirty.get(path, 0) - records  # what was written meanwhile stays to be synced
            if left > 0:
                self.dirty[path] = left
            else:
                self.dirty.pop(path, None)


def sync_files(directory: Path, paths: list[Path]) -> None:
    """fsync each spill file (by name: the writer may close it meanwhile) and the directory. A file already
    sent and deleted is simply gone."""
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fsync_directory(directory)


def read_all(path: Path) -> list[Item]:
    return list(read_spill(path))


def read_spill(path: Path) -> Iterator[Item]:
    """Items of a spill file in order; a torn last record (a crash mid-write) ends the file."""
    with open(path, "rb") as f:
        data = f.read()
    pos, n = 0, len(data)
    while pos + _SPILL_HEADER.size <= n:
        ts, plen, alen, klen = _SPILL_HEADER.unpack_from(data, pos)
        pos += _SPILL_HEADER.size
        a = 0 if alen == _NONE else alen
        k = 0 if klen == _NONE else klen
        if pos + a + k + plen > n:
            return
        attribute = None if alen == _NONE else data[pos:pos + a].decode()
        pos += a
        key = None if klen == _NONE else data[pos:pos + k]
        pos += k
        yield ts, data[pos:pos + plen], attribute, key
        pos += plen
