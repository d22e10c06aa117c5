"""The delay store's timer index on disk: one append-only file per ``width_ms`` of due time, and the
deliverer's checkpoint (docs/delayed.md).

A bucket file ``<start ms, 20 digits>.bkt`` holds rows back to back::

    u32 body_length   u32 crc32c(body)   body = i64 due_ms, u32 target id, i64 delay-log offset, record

where ``record`` is in ``records.encode_record`` row form (its headers include ``metaq.delay-ref``), ready
to be assembled into a delivery batch. A row that is cut off or fails its CRC marks the file damaged: the
store rebuilds that bucket from the delay logs, so a bucket file is derived data, never the only copy.

Blocking file work: the store calls these from worker threads or at open/close, never per message on
the event loop except :meth:`BucketFiles.append` (one ``write`` to the page cache per bucket per batch).
"""

from __future__ import annotations

import json
import os
import struct
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, NamedTuple

import crc32c as _crc32c

from metaq.fsutil import atomic_write, fsync_directory

SUFFIX = ".bkt"
_HEAD = struct.Struct(">II")
_ENTRY = struct.Struct(">qIq")
ROW_OVERHEAD_BYTES = _HEAD.size + _ENTRY.size
_OPEN_FILES_MAX = 32


class Row(NamedTuple):
    """One pending delayed record; ordered by (due, target, offset): the delivery order."""

    due_ms: int
    target: int
    offset: int
    record: bytes


def encode_row(due_ms: int, target: int, offset: int, record: bytes) -> bytes:
    body = _ENTRY.pack(due_ms, target, offset) + record
    return _HEAD.pack(len(body), _crc32c.crc32c(body)) + body


def parse_rows(data: bytes | memoryview) -> tuple[list[Row], bool]:
    """The rows of a bucket file's bytes, and whether it was damaged (torn tail or a bad CRC: parsing
    stops there)."""
    view = memoryview(data)
    rows: list[Row] = []
    pos, end = 0, len(view)
    unpack_head, unpack_entry, crc = _HEAD.unpack_from, _ENTRY.unpack_from, _crc32c.crc32c
    while pos < end:
        if end - pos < _HEAD.size:
            return rows, True
        length, checksum = unpack_head(view, pos)
        start = pos + _HEAD.size
        if length < _ENTRY.size or start + length > end:
            return rows, True
        body = view[start:start + length]
        if crc(body) != checksum:
            return rows, True
        due, target, offset = unpack_entry(body)
        rows.append(Row(due, target, offset, bytes(body[_ENTRY.size:])))
        pos = start + length
    return rows, False


class BucketFiles:
    """The bucket files of one directory, with a small cache of append descriptors."""

    def __init__(self, directory: Path, width_ms: int) -> None:
        assert width_ms > 0
        self.directory = directory
        self.width_ms = width_ms
        self._fds: OrderedDict[int, int] = OrderedDict()
        self._sizes: dict[int, int] = {}
        self._lock = threading.Lock()

    def start_of(self, due_ms: int) -> int:
        return due_ms - due_ms % self.width_ms

    def path(self, start: int) -> Path:
        return self.directory / f"{start:020d}{SUFFIX}"

    def open(self) -> list[int]:
        """Create the directory; the starts of the bucket files in it, sorted (half-written temps removed)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        starts = []
        for name in os.listdir(self.directory):
            if name.endswith(".tmp"):
                os.unlink(self.directory / name)
                continue
            stem = name[:-len(SUFFIX)]
            if name.endswith(SUFFIX) and stem.isdigit():
                start = int(stem)
                starts.append(start)
                self._sizes[start] = os.path.getsize(self.directory / name)
        return sorted(starts)

    def size(self, start: int) -> int:
        return self._sizes.get(start, 0)

    def append(self, start: int, data: bytes) -> None:
        with self._lock:
            fd = self._fds.get(start)
            if fd is None:
                fd = os.open(self.path(start), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                self._fds[start] = fd
                while len(self._fds) > _OPEN_FILES_MAX:
                    _, old = self._fds.popitem(last=False)
                    os.close(old)
            else:
                self._fds.move_to_end(start)
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            self._sizes[start] = self._sizes.get(start, 0) + len(data)

    def read(self, start: int, size: int) -> bytes:
        """The first ``size`` bytes of a bucket (what was written when the caller looked)."""
        try:
            with open(self.path(start), "rb") as f:
                return f.read(size)
        except FileNotFoundError:
            return b""

    def replace(self, start: int, data: bytes) -> None:
        """Write a bucket anew (a rebuild): temp file, fsync, rename."""
        with self._lock:
            fd = self._fds.pop(start, None)
            if fd is not None:
                os.close(fd)
            if data:
                atomic_write(self.path(start), data)
            else:
                self._unlink(start)
            self._sizes[start] = len(data)

    def remove(self, start: int) -> None:
        with self._lock:
            fd = self._fds.pop(start, None)
            if fd is not None:
                os.close(fd)
            self._unlink(start)
            self._sizes.pop(start, None)

    def _unlink(self, start: int) -> None:
        try:
            os.unlink(self.path(start))
        except FileNotFoundError:
            pass

    def remove_all(self) -> None:
        for start in list(self._sizes):
            self.remove(start)
        if self.directory.is_dir():
            for name in os.listdir(self.directory):
                if name.endswith(SUFFIX) or name.endswith(".tmp"):
                    os.unlink(self.directory / name)

    def sync(self) -> None:
        """fsync every bucket written since it was opened (at a clean stop)."""
        with self._lock:
            for fd in self._fds.values():
                os.fsync(fd)
        fsync_directory(str(self.directory))

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()


# -- the checkpoint ------------------------------------------------------------------------------------

CHECKPOINT_SLOTS = ("checkpoint.0", "checkpoint.1")


def write_checkpoint(directory: Path, seq: int, document: dict[str, Any]) -> None:
    """Write checkpoint number ``seq`` into the slot ``seq % 2`` (temp, fsync, rename, fsync dir), so a torn
    write leaves the previous one intact."""
    body = dict(document, seq=seq)
    text = json.dumps(body, sort_keys=True)
    payload = json.dumps({"crc": _crc32c.crc32c(text.encode()), "checkpoint": body}, sort_keys=True)
    atomic_write(directory / CHECKPOINT_SLOTS[seq % 2], payload.encode())


def read_checkpoint(directory: Path) -> dict[str, Any] | None:
    """The newest intact checkpoint, or None."""
    best: dict[str, Any] | None = None
    for name in CHECKPOINT_SLOTS:
        try:
            outer = json.loads((directory / name).read_bytes())
            body = outer["checkpoint"]
            text = json.dumps(body, sort_keys=True)
            if _crc32c.crc32c(text.encode()) != outer["crc"] or not isinstance(body.get("seq"), int):
                continue
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        if best is None or body["seq"] > best["seq"]:
            best = body
    return best
