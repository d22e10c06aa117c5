"""A real full disk for tests: a small tmpfs mounted on a temporary directory (root only).

``with small_disk(path, size_bytes=...) as disk:`` mounts, and unmounts at the end (lazily if a process
still holds files there). ``disk.fill()`` takes every free byte with a filler file, ``disk.free()``
gives it back: what an operator does when a disk fills up and is cleaned.

``evict_from_page_cache(files)``: old data as a broker meets it after a while, written, synced and no
longer in the page cache (``posix_fadvise(DONTNEED)``, no privileges needed).
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path


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


def evict_from_page_cache(files: Iterable[Path]) -> None:
    """fsync each file, then drop it from the page cache (only clean pages can be dropped)."""
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
