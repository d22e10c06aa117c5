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
import stat
import sys
from collections.abc import Callable, Iterable
from typing import Any

Sync = Callable[[int], None]


def datasync(fd: int) -> None:
    """fdatasync(2) a file, fsync(2) a directory: the sync the storage and the stores inject (to time, count or
    fail it) for both. A directory's entries are its metadata, and POSIX promises them durable only after an
    fsync of the directory; fdatasync of a directory leaves them to the filesystem (a FUSE daemon is told it was
    a datasync). One fstat (about a microsecond) decides, beside a sync of hundreds."""
    if stat.S_ISDIR(os.fstat(fd).st_mode):
        os.fsync(fd)
    else:
        os.fdatasync(fd)


def fsync_directory(directory: str | os.PathLike[str], sync: Sync = os.fsync, *,
                    opener: Callable[[str | os.PathLike[str], int], int] = os.open) -> None:
    """Make the directory's entries (new, renamed or removed files) durable. ``sync`` is called with the
    directory's descriptor: a store passing the ``os.fdatasync`` it uses for its files gets ``os.fsync`` here
    (see :func:`datasync`). ``opener`` opens it (the storage passes its descriptor pool's, which sheds idle
    descriptors when the process has none left)."""
    if sync is os.fdatasync:
        sync = os.fsync
    fd = opener(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        sync(fd)
    finally:
        os.close(fd)


FILESYSTEM_NAMES = {
    0xEF53: "ext4",  # ext2, ext3 and ext4 share it
    0x58465342: "xfs",
    0x9123683E: "btrfs",
    0xF2F52010: "f2fs",
    0x01021994: "tmpfs",
    0x65735546: "fuse",
    0x6969: "nfs",
    0xFF534D42: "cifs",
    0xFE534D42: "smb2",
    0x794C7630: "overlayfs",
    0x2FC12FC1: "zfs",
    0x00C36400: "ceph",
    0x01021997: "9p",
    0x858458F6: "ramfs",
}
"""statfs(2) ``f_type`` magic numbers (linux/magic.h) of filesystems a data directory may sit on, by name."""

SYNCFS_DURABLE_FILESYSTEMS = frozenset({"ext4", "xfs", "btrfs", "f2fs", "tmpfs"})
"""Where one syncfs(2) makes every file's written data and every directory entry durable, as an fdatasync of
each file and an fsync of each directory would: the kernel writes back the filesystem's dirty pages and calls
its ``sync_fs``, which commits the journal (ext4, xfs), the transaction (btrfs) or a checkpoint (f2fs). tmpfs
keeps nothing across a power loss either way. Any other filesystem (FUSE, network filesystems, overlayfs,
unknown ones) may not: a FUSE daemon never hears of a syncfs (the kernel sends FUSE_SYNCFS only to
virtiofs), while an fdatasync reaches it as a FUSE_FSYNC."""


def filesystem_type(path: str | os.PathLike[str]) -> int | None:
    """The statfs(2) ``f_type`` of the filesystem holding ``path``; None where it cannot be asked."""
    function = _libc_function("statfs")
    if function is None:
        return None
    buffer = ctypes.create_string_buffer(256)  # struct statfs: 120 bytes on x86-64, f_type (a long) first
    if function(os.fsencode(os.fspath(path)), buffer) != 0:
        return None
    return ctypes.c_long.from_buffer(buffer).value & 0xFFFFFFFF


def filesystem_name(path: str | os.PathLike[str]) -> str:
    """The name of the filesystem holding ``path`` (:data:`FILESYSTEM_NAMES`), its magic number in hex when
    unnamed there, or ``unknown``."""
    magic = filesystem_type(path)
    if magic is None:
        return "unknown"
    return FILESYSTEM_NAMES.get(magic, f"0x{magic:08x}")


def syncfs_available() -> bool:
    """Whether :func:`syncfs` can stand in for fdatasyncs: Linux 5.8 or later, whose syncfs(2) reports a
    write-back error of any file of the filesystem (before 5.8 it returned 0 regardless)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        major, minor = (int(part) for part in os.uname().release.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (5, 8) and _libc_function("syncfs") is not None


_ARGTYPES: dict[str, list[Any]] = {"syncfs": [ctypes.c_int], "statfs": [ctypes.c_char_p, ctypes.c_char_p]}


@functools.cache
def _libc_function(name: str) -> Callable[..., int] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols: libc's among them
        function = getattr(libc, name)
    except (OSError, AttributeError):
        return None
    function.argtypes = _ARGTYPES[name]
    function.restype = ctypes.c_int
    return function


def syncfs(fd: int) -> None:
    """Write back and commit everything dirty on the filesystem holding ``fd`` (Linux syncfs(2)); raises
    OSError with the write-back error of any of its files since ``fd`` last reported one."""
    function = _libc_function("syncfs")
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


def evict_from_page_cache(paths: Iterable[str | os.PathLike[str]]) -> None:
    """fsync each file, then ask the kernel to drop it from the page cache (``posix_fadvise(DONTNEED)``, no
    privileges needed; only clean pages can be dropped): old data as a broker meets it after a while."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
