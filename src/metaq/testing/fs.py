"""A real full disk for tests: a small tmpfs mounted on a temporary directory (root only).

``with small_disk(path, size_bytes=...) as disk:`` mounts, and unmounts at the end (lazily if a process
still holds files there). ``disk.fill()`` takes every free byte with a filler file, ``disk.free()``
gives it back: what an operator does when a disk fills up and is cleaned.

``evict_from_page_cache(files)``: old data as a broker meets it after a while, written, synced and no
longer in the page cache (``posix_fadvise(DONTNEED)``, no privileges needed). ``resident_pages(path)``:
which of a file's pages are in the page cache, asked with mincore(2), which reads nothing (a probing read,
even with RWF_NOWAIT, may start the kernel's readahead, up to ``read_ahead_kb`` of the file).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from metaq.fsutil import evict_from_page_cache

__all__ = ["SmallDisk", "evict_from_page_cache", "resident_pages", "small_disk"]


class SmallDisk:
    def __init__(self, path: Path, size_bytes: int) -> None:
        self.path = path
        self.size_bytes = size_bytes
        self._fillers: list[Path] = []

    def free_bytes(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def fill(self, leave_bytes: int = 0) -> int:
        """Write filler files until at most ``leave_bytes`` are free; returns the bytes written."""
        filler = self.path / f".filler-{len(self._fillers)}"
        self._fillers.append(filler)
        written = 0
        chunk = b"\0" * 4096
        with open(filler, "wb", buffering=0) as f:
            while self.free_bytes() > leave_bytes:
                try:
                    written += f.write(chunk[: max(1, min(len(chunk), self.free_bytes() - leave_bytes))])
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
        return written

    def free(self) -> None:
        """Remove every filler file."""
        for filler in self._fillers:
            with contextlib.suppress(FileNotFoundError):
                filler.unlink()
        self._fillers.clear()


@contextlib.contextmanager
def small_disk(path: Path, size_bytes: int, *, inodes: int | None = None) -> Iterator[SmallDisk]:
    """Mount a tmpfs of ``size_bytes`` (and ``inodes`` files, if given) on ``path``; needs root."""
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size_bytes}" + (f",nr_inodes={inodes}" if inodes else "")
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True,
                            text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"cannot mount a tmpfs on {path} (root is needed): {result.stderr.strip()}")
    try:
        yield SmallDisk(path, size_bytes)
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.mmap.restype = ctypes.c_void_p
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def resident_pages(path: Path) -> list[bool]:
    """For each page of ``path``, whether it is in the page cache (mincore(2) on a mapping nobody touches)."""
    size = os.path.getsize(path)
    if size == 0:
        return []
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        address = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap of {path} failed")
        try:
            vector = (ctypes.c_ubyte * pages)()
            if _libc.mincore(address, size, vector) != 0:
                raise OSError(ctypes.get_errno(), f"mincore of {path} failed")
            return [bool(v & 1) for v in vector]
        finally:
            _libc.munmap(address, size)
    finally:
        os.close(fd)
