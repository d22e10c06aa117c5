"""FileSlice: a pinned byte range of a segment file, for zero-copy ``sendfile`` of fetch replies."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from types import TracebackType

from metaq.storage.scan import pread_exact

READAHEAD_STEP_BYTES = 1 << 20
"""Readahead is asked for in steps of this many bytes, each once per sequential reader (see hint_readahead)."""
READAHEAD_AHEAD_BYTES = 8 << 20
"""How far past a read the bytes a sequential reader will want next are asked for."""
_WILLNEED = getattr(os, "POSIX_FADV_WILLNEED", None)
_NOWAIT: int | None = getattr(os, "RWF_NOWAIT", None)
"""preadv2's flag that fails with EAGAIN instead of reading from the disk (Linux); None: not available, or
the filesystem refused it once."""


def page_cached(fd: int, position: int) -> bool | None:
    """Whether the byte at ``position`` of ``fd`` is in the page cache, asked without waiting for the disk (a
    one-byte ``preadv2(RWF_NOWAIT)``, a few microseconds); None when this kernel or filesystem cannot tell.

    The one residency check of the storage: readahead hints (:func:`hint_readahead`) and the broker's choice
    to read a fetch reply off its event loop use it, and tests that need a page cache in a known state
    replace it (the kernel's own state changes under them on a busy machine). False may also mean "being
    read in, or locked for writeback": not readable without waiting now, which is what callers want to know.
    """
    global _NOWAIT
    if _NOWAIT is None:
        return None
    try:
        return os.preadv(fd, [bytearray(1)], position, _NOWAIT) == 1
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # this kernel or filesystem has no RWF_NOWAIT
            _NOWAIT = None
        return None


def hint_readahead(fd: int, position: int, size: int, size_limit: int) -> None:
    """Tell the kernel that a reader of ``[position, position + size)`` will read on: ``posix_fadvise
    (WILLNEED)`` starts reading the bytes up to READAHEAD_AHEAD_BYTES past it into the page cache and
    returns without waiting, so the next fetches of a consumer reading old data find them there.

    Why: a broker reads fetch replies on its event loop (a pread, or a sendfile that reads the file), so a
    reply not in the page cache stops the loop for one disk read at a time, and the kernel's own readahead
    runs only within each file's window. Hints for every partition being read keep the disk busy with
    several reads at once while the loop serves what is already cached.

    Stateless and cheap: the range ahead is split in READAHEAD_STEP_BYTES steps, and a read asks only for
    the steps that come into reach as it crosses step boundaries, so a sequential reader asks for each
    byte once (one system call per step, none for a read that crosses no boundary: small tail reads).
    Only bytes that exist (below ``size_limit``) are asked for, and not when the last of them is in the page
    cache already (a non-blocking ``preadv2(RWF_NOWAIT)`` of it, a few microseconds, where the advice costs
    tens on a cached range: a reader of recent data pays almost nothing). Advice only: errors are ignored.
    """
    if _WILLNEED is None or size <= 0:
        return
    first = position // READAHEAD_STEP_BYTES + 1  # step boundaries crossed: first..last
    last = (position + size) // READAHEAD_STEP_BYTES
    if last < first:
        return
    start = (first - 1) * READAHEAD_STEP_BYTES + READAHEAD_AHEAD_BYTES
    end = min(last * READAHEAD_STEP_BYTES + READAHEAD_AHEAD_BYTES, size_limit)
    if start >= end:
        return
    if page_cached(fd, end - 1):
        return  # read ahead already (by the kernel, or an earlier hint), or recent data
    try:
        os.posix_fadvise(fd, start, end - start, _WILLNEED)
    except OSError:
        pass


class FileSlice:
    """Whole record batches ``[position, position + size)`` of one segment file.

    The descriptor from ``fileno()`` stays open, and the segment is kept from retention, until
    ``release()`` (or the end of a ``with`` block). ``start_offset`` is the base offset of the first
    batch (it may be below the offset asked for: a fetch starts at the batch holding it) and
    ``next_offset`` the offset to fetch next. An empty slice (``size == 0``, read at the log end) has
    no descriptor: ``fileno()`` returns -1.
    """

    __slots__ = ("_data", "_fd", "_release", "next_offset", "position", "size", "start_offset")

    def __init__(self, fd: int, position: int, size: int, start_offset: int, next_offset: int,
                 release: Callable[[], None] | None, data: bytes | None = None) -> None:
        self._fd = fd
        self._data = data
        """The slice's bytes when the log has them in memory (a batch just appended): read_bytes gives them."""
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
        if self._data is not None:
            return self._data
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
