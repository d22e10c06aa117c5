"""Reads of data that is no longer in the page cache, and the readahead a sequential reader asks for."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
from storage_helpers import make_batch, read_all

from metaq.storage import fileslice
from metaq.storage.fileslice import READAHEAD_AHEAD_BYTES, READAHEAD_STEP_BYTES, hint_readahead
from metaq.testing.fs import evict_from_page_cache, resident_pages


def _evict(directory: Path) -> None:
    evict_from_page_cache(directory.iterdir())


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="needs posix_fadvise")
def test_reads_across_segment_boundaries_after_eviction_return_every_message_in_order(open_log, tmp_path):
    log = open_log(segment_bytes_max=64 * 1024)
    expected = []
    for _ in range(300):
        batch, values = make_batch(count=10, size=200)
        log.append(batch)
        expected += values
    log.flush()
    assert log.segment_count > 10
    _evict(tmp_path / "t-0")
    for max_bytes in (1 << 20, 5000, 1):  # whole segments, a few batches, one batch at a time
        assert [bytes(m.data) for m in read_all(log, max_bytes=max_bytes)] == expected
        _evict(tmp_path / "t-0")
    # the sendfile path: every slice from the first offset to the end, sent to a file, is the log's bytes
    out = tmp_path / "sent"
    offset = 0
    with open(out, "wb") as sink:
        while offset < log.log_end_offset:
            with log.read(offset, 1 << 20) as piece:
                piece.send_to(sink.fileno())
                offset = piece.next_offset
    stored = b"".join(p.read_bytes() for p in sorted((tmp_path / "t-0").glob("*.log")))
    assert out.read_bytes() == stored


def _record_hints(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """posix_fadvise still called, each (start, end) of WILLNEED recorded; every hint given (the check that
    skips a range already in the page cache is off: the ranges themselves are tested)."""
    monkeypatch.setattr(fileslice, "_NOWAIT", None)
    calls: list[tuple[int, int]] = []
    real = os.posix_fadvise

    def recording(fd: int, offset: int, length: int, advice: int) -> None:
        if advice == os.POSIX_FADV_WILLNEED:
            calls.append((offset, offset + length))
        real(fd, offset, length, advice)

    monkeypatch.setattr(fileslice.os, "posix_fadvise", recording)
    return calls


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="needs posix_fadvise")
@pytest.mark.parametrize("slice_bytes", [300 * 1024, 1 << 20, 3 * (1 << 20) + 17])
def test_a_sequential_reader_asks_for_each_byte_ahead_once_and_never_past_the_data(monkeypatch, tmp_path,
                                                                                     slice_bytes):
    calls = _record_hints(monkeypatch)
    size_limit = 20 * READAHEAD_STEP_BYTES + 12345
    with open(tmp_path / "f", "wb") as f:
        f.truncate(size_limit)
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        position = 0
        while position < size_limit:
            size = min(slice_bytes, size_limit - position)
            hint_readahead(fd, position, size, size_limit)
            position += size
    finally:
        os.close(fd)
    assert calls, "a reader crossing step boundaries asks for readahead"
    # contiguous, no byte asked for twice, starting where the kernel's first readahead leaves off at the
    # latest, and nothing past the data
    assert all(a[1] == b[0] for a, b in itertools.pairwise(calls))
    assert calls[0][0] <= READAHEAD_AHEAD_BYTES
    assert calls[-1][1] == size_limit


def test_reads_that_cross_no_step_boundary_ask_for_nothing(monkeypatch, tmp_path):
    calls = _record_hints(monkeypatch)
    step, ahead = READAHEAD_STEP_BYTES, READAHEAD_AHEAD_BYTES
    size_limit = ahead + 2 * step + 100
    with open(tmp_path / "f", "wb") as f:
        f.truncate(size_limit)
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        for position in range(0, step - 1000, 1000):  # a tail reader's small fetches
            hint_readahead(fd, position, 1000, size_limit)
        hint_readahead(fd, 0, 0, size_limit)
        assert calls == []
        hint_readahead(fd, step - 10, 20, size_limit)  # crosses the first boundary: the step that came in reach
        assert calls == [(ahead, ahead + step)]
        hint_readahead(fd, 3 * step - 10, 20, size_limit)  # the step in reach ends past the data: clipped
        assert calls[-1] == (ahead + 2 * step, size_limit)
        hint_readahead(fd, 5 * step - 10, 20, size_limit)  # nothing left ahead
        assert len(calls) == 2
    finally:
        os.close(fd)


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="needs posix_fadvise")
@pytest.mark.parametrize(("resident", "asked"), [(True, False), (False, True), (None, True)],
                         ids=["in-the-page-cache", "not-in-it", "cannot-tell"])
def test_no_readahead_is_asked_for_data_already_in_the_page_cache(monkeypatch, tmp_path, resident, asked):
    # the page cache's state is the test's, not whatever the kernel holds on a busy machine: the residency
    # check is replaced (the real one is tested against mincore below)
    calls: list[int] = []
    real = os.posix_fadvise

    def recording(fd: int, offset: int, length: int, advice: int) -> None:
        if advice == os.POSIX_FADV_WILLNEED:
            calls.append(offset)
        real(fd, offset, length, advice)

    probed: list[int] = []

    def page_cached(fd: int, position: int) -> bool | None:
        probed.append(position)
        return resident

    monkeypatch.setattr(fileslice.os, "posix_fadvise", recording)
    monkeypatch.setattr(fileslice, "page_cached", page_cached)
    size_limit = 3 * READAHEAD_AHEAD_BYTES
    with open(tmp_path / "f", "wb") as f:
        f.truncate(size_limit)
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        hint_readahead(fd, 0, READAHEAD_STEP_BYTES, size_limit)
    finally:
        os.close(fd)
    # the byte probed is the last one the hint would ask for
    assert probed == [READAHEAD_AHEAD_BYTES + READAHEAD_STEP_BYTES - 1]
    assert calls == ([READAHEAD_AHEAD_BYTES] if asked else [])


def _settle(path: Path, fd: int, want_resident: bool, attempts: int = 50) -> bool:
    """Put the first page of ``path`` in (a read) or out of (fsync + DONTNEED) the page cache, and check it
    with mincore, which reads nothing; False when the kernel would not keep it so (tmpfs cannot evict)."""
    for _ in range(attempts):
        if want_resident:
            os.pread(fd, 1, 0)
        else:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        if resident_pages(path)[0] == want_resident:
            return True
    return False


@pytest.mark.skipif(not hasattr(os, "posix_fadvise") or fileslice._NOWAIT is None,
                    reason="needs posix_fadvise and preadv2(RWF_NOWAIT)")
def test_the_residency_check_agrees_with_mincore(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(os.urandom(16 * 4096))
    fd = os.open(path, os.O_RDONLY)
    try:
        # out first, and never read before: no readahead of ours can bring it back between mincore and the probe
        if not _settle(path, fd, want_resident=False):
            pytest.skip("this filesystem keeps the file in the page cache (tmpfs?)")
        assert fileslice.page_cached(fd, 0) is False
        assert _settle(path, fd, want_resident=True), "a page just read is in the page cache"
        # a resident page may be locked for a moment (reclaim, writeback): asked again, it is readable at once
        assert any(fileslice.page_cached(fd, 0) and resident_pages(path)[0] for _ in range(50))
    finally:
        os.close(fd)


@pytest.mark.skipif(not hasattr(os, "posix_fadvise") or not hasattr(os, "RWF_NOWAIT"),
                    reason="needs posix_fadvise and preadv2(RWF_NOWAIT)")
def test_a_clean_open_of_a_log_without_producers_does_not_read_its_segment(open_log, tmp_path):
    log = open_log(segment_bytes_max=1 << 30)
    expected = []
    for _ in range(400):  # ~16 MB in the active segment, beyond any readahead window of the tail check
        batch, values = make_batch(count=40, size=1000)
        log.append(batch)
        expected += values
    log.close()
    segment = next((tmp_path / "t-0").glob("*.log"))
    for _ in range(20):  # the state the test starts from is set here, and checked without reading (mincore)
        _evict(tmp_path / "t-0")
        if not any(resident_pages(segment)):
            break
    else:
        pytest.skip("this filesystem keeps the segment in the page cache (tmpfs?)")
    log = open_log(segment_bytes_max=1 << 30)
    assert log.recovery.clean and len(log.producers) == 0
    pages = resident_pages(segment)  # the start (the first batch) and the tail are read; the rest is not
    assert not any(pages[len(pages) * k // 8] for k in range(2, 7))
    assert [bytes(m.data) for m in read_all(log)] == expected  # and everything reads back
