"""glibc's heap trimming, for processes that move large (~1 MB) messages.

glibc's malloc gives freed memory back to the kernel once the free space at the top of the heap passes
its trim threshold, and serves blocks above its mmap threshold with a fresh ``mmap`` each; both thresholds
move with the program (the "dynamic mmap threshold": twice the largest freed mmapped block, ~2 MB with
1 MB messages). A process that allocates and frees a megabyte or two per message then hands those pages
back and faults them in again for the next one: in the per-message iterator that was ~80% of the client's
cost per 1 MB message (docs/benchmarks.md, "Large messages"). Fixing the two thresholds keeps the pages.

:func:`tune_allocator` does that with ``mallopt`` (what the environment variables
``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` do at a process's start). The broker calls it at
start-up (server.ini ``mallocTrimThreshold`` / ``mallocMmapThreshold``); a client application may call it
itself — the library never does so behind its host's back. Where the C library is not glibc (musl,
macOS, Windows) it does nothing and says so at debug level.
"""

from __future__ import annotations

import logging
import os
import sys

__all__ = ["DEFAULT_MMAP_THRESHOLD", "DEFAULT_TRIM_THRESHOLD", "MAX_MMAP_THRESHOLD", "glibc_version",
           "tune_allocator"]

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
"""``mallopt`` parameter numbers, from glibc's <malloc.h>."""
M_MMAP_THRESHOLD = -3

DEFAULT_TRIM_THRESHOLD = 128 * 1024 * 1024
"""Free bytes at the top of the heap kept before glibc trims it (glibc's own default is 128 KiB, raised
dynamically)."""
DEFAULT_MMAP_THRESHOLD = 32 * 1024 * 1024
"""Blocks at least this large get an mmap of their own (glibc's default is 128 KiB, raised dynamically)."""
MAX_MMAP_THRESHOLD = 32 * 1024 * 1024
"""The largest mmap threshold every glibc accepts on 64-bit (older ones refuse more than ``HEAP_MAX_SIZE /
2``, half that on 32-bit; 2.36 takes any int); the broker's option stays within it."""


def glibc_version() -> str | None:
    """The running glibc's version (``"2.36"``), or None where the C library is not glibc."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION")  # "glibc 2.36"; musl has no such name
    except (ValueError, OSError, AttributeError):
        return None
    if not text or not text.startswith("glibc "):
        return None
    return text.split(" ", 1)[1]


def tune_allocator(trim_threshold: int = DEFAULT_TRIM_THRESHOLD,
                   mmap_threshold: int = DEFAULT_MMAP_THRESHOLD) -> bool:
    """Fix glibc's trim and mmap thresholds for this process (bytes; 0 leaves that one as it is).

    Returns True when every threshold asked for was set; False where the C library is not glibc (a debug
    log line, nothing else) or glibc refused a value (a warning; e.g. an mmap threshold above
    :data:`MAX_MMAP_THRESHOLD`). Setting either also turns glibc's dynamic thresholds off. The memory kept
    is memory the process used: up to ``trim_threshold`` bytes of free heap stay resident instead of being
    given back. Process-wide and lasting: call it once, early (a server's start-up, or a batch job that
    reads large messages); a library should not call it for its host.
    """
    if trim_threshold < 0 or mmap_threshold < 0:
        raise ValueError("thresholds are byte counts >= 0 (0: leave glibc's setting)")
    version = glibc_version()
    if version is None:
        log.debug("allocator tuning skipped: the C library is not glibc (%s)", sys.platform)
        return False
    import ctypes  # here: `import metaq` stays free of it

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        log.debug("allocator tuning skipped: mallopt not found in glibc %s", version)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    done = True
    for name, param, value in (("mmap threshold", M_MMAP_THRESHOLD, mmap_threshold),
                               ("trim threshold", M_TRIM_THRESHOLD, trim_threshold)):
        if not value:
            continue
        if value > 2**31 - 1 or mallopt(param, value) != 1:
            log.warning("glibc %s refused a malloc %s of %d bytes; left as it was", version, name, value)
            done = False
        else:
            log.debug("glibc %s: malloc %s set to %d bytes", version, name, value)
    return done
