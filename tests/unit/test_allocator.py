"""metaq.allocator: glibc's heap thresholds fixed with mallopt, a no-op elsewhere.

The calls that change an allocator run in a child interpreter: mallopt is process-wide and lasting, and
the test process's own allocator is not this test's to change.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from metaq import allocator
from metaq.allocator import glibc_version, tune_allocator

needs_glibc = pytest.mark.skipif(glibc_version() is None, reason="the C library is not glibc")

# Allocates and frees a block, counting mmapped blocks (mallinfo2, glibc >= 2.33) while it is held. glibc's
# default: a 4 MiB block is an mmap of its own, and freeing it raises the dynamic threshold to 4 MiB, so an
# 8 MiB block after it is one too; with the threshold fixed at 32 MiB the 8 MiB block is heap.
_CHILD = """
import ctypes, json, logging, sys
logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
from metaq.allocator import tune_allocator
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = (ctypes.c_void_p,)
def mmapped_while_holding(size):
    before = libc.mallinfo2().hblks
    p = libc.malloc(size)
    during = libc.mallinfo2().hblks
    libc.free(p)
    return during - before
args = json.loads(sys.argv[1])
out = {"default": mmapped_while_holding(4 << 20)}
out["tuned"] = tune_allocator(*args)
out["after"] = mmapped_while_holding(8 << 20)
print(json.dumps(out))
"""


def _child(*args: int) -> tuple[dict[str, int], str]:
    done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(list(args))], capture_output=True, text=True,
                          timeout=60, check=True)
    return json.loads(done.stdout), done.stderr


@needs_glibc
def test_fixed_thresholds_keep_an_8_mib_block_in_the_heap() -> None:
    got, log = _child(128 << 20, 32 << 20)
    assert got == {"default": 1, "tuned": True, "after": 0}, log
    assert "mmap threshold set to 33554432" in log and "trim threshold set to 134217728" in log


@needs_glibc
def test_zero_leaves_a_threshold_as_glibc_has_it() -> None:
    got, _ = _child(0, 0)
    assert got == {"default": 1, "tuned": True, "after": 1}


@needs_glibc
def test_a_value_mallopt_cannot_take_is_a_warning_and_false_not_an_error() -> None:
    got, log = _child(2**31, 0)  # mallopt's value is a C int
    assert got == {"default": 1, "tuned": False, "after": 1}
    assert "WARNING" in log and "refused a malloc trim threshold of 2147483648 bytes" in log


def test_negative_thresholds_are_refused() -> None:
    with pytest.raises(ValueError):
        tune_allocator(-1, 0)


@pytest.mark.parametrize("platform", ["darwin", "win32"])
def test_not_linux_is_a_debug_logged_no_op(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
                                           platform: str) -> None:
    monkeypatch.setattr(allocator.sys, "platform", platform)
    with caplog.at_level(logging.DEBUG, logger="metaq.allocator"):
        assert tune_allocator() is False
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]
    assert "not glibc" in caplog.text


def test_linux_without_glibc_is_a_debug_logged_no_op(monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    def musl_confstr(name: str) -> str:  # musl's confstr knows no CS_GNU_LIBC_VERSION
        raise ValueError(f"unrecognized configuration name {name}")

    monkeypatch.setattr(allocator.sys, "platform", "linux")
    monkeypatch.setattr(allocator.os, "confstr", musl_confstr)
    assert glibc_version() is None
    with caplog.at_level(logging.DEBUG, logger="metaq.allocator"):
        assert tune_allocator() is False
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]


@needs_glibc
def test_glibc_version_reads_the_running_library() -> None:
    version = glibc_version()
    assert version is not None and version.split(".")[0] == "2"
