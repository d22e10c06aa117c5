"""FileSlice: a pinned byte range of a segment file, for zero-copy ``sendfile`` of fetch replies."""

from __future__ import annotations

import os
from collections.abc import Callable
from types import TracebackType

from metaq.storage.scan import pread_exact


class FileSlice:
    """Whole record batches ``[position, position + size)`` of one segment file.

    The descriptor from ``fileno()`` stays open, and the segment is kept from retention, until
    ``release()`` (or the end of a ``with`` block). ``start_offset`` is the base offset of the first
    batch (it may be below the offset asked for: a fetch starts at the batch holding it) and
    ``next_offset`` the offset to fetch next. An empty slice (``size == 0``, read at the log end) has
    no descriptor: ``fileno()`` returns -1.
    """

    __slots__ = ("_fd", "_release", "next_offset", "position", "size", "start_offset")

    def __init__(self, fd: int, position: int, size: int, start_offset: int, next_offset: int,
                 release: Callable[[], None] | None) -> None:
        self._fd = fd
        self.position = position
        self.size = size
        self.start_offset = start_offset
        self.next_offset = next_offset
        self._release = release

    @classmethod
    def empty(cls, offset: int) -> FileSlice:
        return cls(-1, 0, 0, offset, offset, None)

    def __repr__(self) -> str:
        return (f"FileSlice(fd={self._fd}, position={self.position}, size={self.size}, "
                f"offsets=[{self.start_offset}, {self.next_offset}))")

    def fileno(self) -> int:
        return self._fd

    @property
    def released(self) -> bool:
        return self._release is None

    def read_bytes(self) -> bytes:
        """The slice's bytes, read with pread (a copy; fetch paths should prefer sendfile)."""
        if not self.size:
            return b""
        if self._release is None:
            raise ValueError("read of a released FileSlice")
        data = pread_exact(self._fd, self.size, self.position)
        if len(data) != self.size:
            raise OSError(f"segment file is shorter than the slice ({len(data)} of {self.size} bytes)")
        return data

    def send_to(self, out_fd: int) -> int:
        """Blocking ``os.sendfile`` of the whole slice to ``out_fd`` (files or blocking sockets)."""
        sent = 0
        while sent < self.size:
            n = os.sendfile(out_fd, self._fd, self.position + sent, self.size - sent)
            if n == 0:
                raise OSError("sendfile sent nothing: the segment file is shorter than the slice")
            sent += n
        return sent

    def release(self) -> None:
        """Unpin; idempotent. The descriptor must not be used afterwards."""
        release, self._release = self._release, None
        if release is not None:
            self._fd = -1
            release()

    def __enter__(self) -> FileSlice:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()

    def __del__(self) -> None:
        if self._release is not None:
            self.release()
