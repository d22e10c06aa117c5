"""A fetch reply not in the page cache is read off the event loop: how the broker tells, and that the
bytes it then reads are the slice's."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from metaq.broker.handlers import fetch
from metaq.protocol import messages as m
from metaq.protocol.records import encode_values
from metaq.storage import LogConfig, PartitionLog
from metaq.testing.fs import evict_from_page_cache

pytestmark = pytest.mark.skipif(not hasattr(os, "posix_fadvise") or fetch._NOWAIT is None,
                                reason="needs posix_fadvise and preadv2(RWF_NOWAIT)")


def _evict(directory: Path) -> None:
    evict_from_page_cache(directory.iterdir())


def test_an_evicted_slice_is_not_cached_and_its_off_loop_read_is_the_stored_bytes(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", "t", 0, LogConfig(), 1, sync=os.fdatasync)
    try:
        for i in range(8):
            log.append(encode_values([b"%d" % i + bytes(9999)] * 10, 1))
        log.flush()
        stored = log.read_bytes(0, 1 << 20)
        _evict(tmp_path / "t-0")
        piece = log.read(0, 1 << 20)
        assert piece.size == len(stored) > fetch.SENDFILE_MIN_BYTES
        assert not fetch._cached(piece)
        response = asyncio.run(fetch._read_off_loop(m.FetchResponse(), piece))
        assert response.records == stored and piece.released
        with log.read(0, 1 << 20) as again:  # read once: in the page cache now, sent from the loop
            assert fetch._cached(again)
    finally:
        log.close()
