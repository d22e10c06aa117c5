"""A fetch reply not in the page cache is read off the event loop: how the broker tells, and that the
bytes it then reads are the slice's.

What the page cache holds is set by the test (the residency check is replaced), not left to the kernel:
on a busy machine pages come and go under a test (the check itself is tested in
tests/unit/storage/test_storage_readahead.py).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from metaq.broker.handlers import fetch
from metaq.protocol import messages as m
from metaq.protocol.records import encode_values
from metaq.storage import LogConfig, PartitionLog, fileslice


@pytest.mark.parametrize(("first", "last", "cached"), [
    (False, True, False), (True, False, False), (True, True, True), (None, None, True)],
    ids=["first-byte-out", "last-byte-out", "both-in", "cannot-tell"])
def test_an_evicted_slice_is_not_cached_and_its_off_loop_read_is_the_stored_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first: bool | None, last: bool | None, cached: bool) -> None:
    log = PartitionLog.open(tmp_path / "t-0", "t", 0, LogConfig(), 1, sync=os.fdatasync)
    try:
        for i in range(8):
            log.append(encode_values([b"%d" % i + bytes(9999)] * 10, 1))
        log.flush()
        stored = log.read_bytes(0, 1 << 20)
        piece = log.read(0, 1 << 20)
        assert piece.size == len(stored) > fetch.SENDFILE_MIN_BYTES
        ends = {piece.position: first, piece.position + piece.size - 1: last}
        monkeypatch.setattr(fileslice, "page_cached", lambda fd, position: ends[position])
        assert fetch._cached(piece) is cached
        response = asyncio.run(fetch._read_off_loop(m.FetchResponse(), piece))
        assert response.records == stored and piece.released
    finally:
        log.close()
