"""Small file-system primitives shared by the storage engine and the client's on-disk stores.

They sit at the bottom of the layers (beside errors) so that both storage and client can use them
without the client importing storage.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import sys
from collections.abc import Callable

Sync = Callable[[int], None]


def fsync_directory(directory: str | os.PathLike[str], sync: Sync = os.fsync, *,
                    opener: Callable[[str | os.PathLike[str], int], int] = os.open) -> None:
    """Make the directory's entries (new, renamed or removed files) durable. ``opener`` opens it (the
    storage passes its descriptor pool's, which sheds idle descriptors when the process has none left)."""
    fd = opener(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        sync(fd)
    finally:
        os.close(fd)


def syncfs_available() -> bool:
    """Whether :func:`syncfs` can stand in for fdatasyncs: Linux 5.8 or later, whose syncfs(2) reports a
    write-back error of any file of the filesystem (before 5.8 it returned 0 regardless)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        major, minor = (int(part) for part in os.uname().release.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (5, 8) and _libc_syncfs() is not None


@functools.cache
def _libc_syncfs() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols: libc's among them
        function = libc.syncfs
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int]
    function.restype = ctypes.c_int
    return function


def syncfs(fd: int) -> None:
    """Write back and commit everything dirty on the filesystem holding ``fd`` (Linux syncfs(2)); raises
    OSError with the write-back error of any of its files since ``fd`` last reported one."""
    function = _libc_syncfs()
    if function is None:
        raise OSError(errno.ENOSYS, "syncfs is not available here")
    if function(fd) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


class WriteBackGauge:
    """Bytes this machine's kernel has yet to write to disk: ``Dirty`` plus ``Writeback`` of /proc/meminfo (every
    filesystem's, not one's). A syncfs(2) writes back the dirty pages of its whole filesystem, so this says what
    one would cost beyond the caller's own bytes. Holds a descriptor of /proc/meminfo (read again at offset 0:
    a few microseconds) until :meth:`close`. The kernel folds its per-CPU counts into these figures within a
    second or a few hundred pages per CPU, so they are approximate."""

    def __init__(self, path: str = "/proc/meminfo") -> None:
        try:
            self._fd = os.open(path, os.O_RDONLY)
        except OSError:
            self._fd = -1

    def __call__(self) -> int | None:
        """The bytes; None where /proc/meminfo cannot be read or lacks the two lines."""
        if self._fd < 0:
            return None
        try:
            text = os.pread(self._fd, 16384, 0)
        except OSError:
            return None
        total = 0
        found = 0
        for line in text.split(b"\n"):
            if line.startswith((b"Dirty:", b"Writeback:")):
                fields = line.split()
                try:
                    total += int(fields[1]) * 1024  # "Dirty:  1234 kB"
                except (IndexError, ValueError):
                    return None
                found += 1
        return total if found == 2 else None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def atomic_write(path: str | os.PathLike[str], data: bytes, *, sync: Sync | None = os.fsync,
                 tmp_path: str | os.PathLike[str] | None = None, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` so a reader sees the old or the new file, never half of one.

    Temp file (``tmp_path``, default ``<path>.tmp``, created with ``mode``), fsync, rename, fsync the
    directory. ``sync=None`` skips both fsyncs (still atomic against a process crash, not against power
    loss). A failure removes the temp file.
    """
    path = os.fspath(path)
    tmp = os.fspath(tmp_path) if tmp_path is not None else path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if sync is not None:
                sync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if sync is not None:
        fsync_directory(os.path.dirname(path) or ".", sync)


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (a process we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
