"""FileCache (the descriptor budget) and checkpoint files."""

from __future__ import annotations

import os

from storage_helpers import FakeClock

from metaq.storage.checkpoint import CleanState, atomic_write, read_json, write_json
from metaq.storage.files import FileCache


def test_lru_eviction_skips_pinned_descriptors_and_overshoots_rather_than_fail(tmp_path):
    paths = [str(tmp_path / f"f{i}") for i in range(5)]
    cache = FileCache(2)
    pinned = cache.acquire(paths[0], create=True)
    for path in paths[1:]:
        cache.release(cache.acquire(path, create=True))
        assert cache.open_count <= 2
    assert pinned.fd >= 0 and os.fstat(pinned.fd)  # never closed under its holder
    second = cache.acquire(paths[1])
    third = cache.acquire(paths[2])
    assert cache.open_count == 3 and cache.overshoot_count >= 1
    for handle in (pinned, second, third):
        cache.release(handle)
    cache.release(cache.acquire(paths[3]))
    assert cache.open_count == 2


def test_discard_of_a_held_descriptor_closes_it_on_release(tmp_path):
    closed = []
    cache = FileCache(4)
    handle = cache.acquire(str(tmp_path / "x"), create=True, on_close=lambda: closed.append(True))
    fd = handle.fd
    cache.discard(handle.path)
    assert os.fstat(fd) and not closed
    cache.release(handle)
    assert closed == [True] and handle.fd == -1


def test_close_idle(tmp_path):
    clock = FakeClock(0)
    cache = FileCache(8, clock=clock)
    cache.release(cache.acquire(str(tmp_path / "a"), create=True))
    clock.now_s = 100
    held = cache.acquire(str(tmp_path / "b"), create=True)
    assert cache.close_idle(50) == 1
    assert cache.open_count == 1
    cache.release(held)


def test_atomic_write_and_json_checkpoints(tmp_path):
    path = tmp_path / "cp.json"
    atomic_write(path, b"first")
    atomic_write(path, b"second")
    assert path.read_bytes() == b"second" and not (tmp_path / "cp.json.tmp").exists()
    state = CleanState(10, 2000, 55)
    write_json(path, {"partition": state.to_json()})
    document = read_json(path)
    assert document is not None and CleanState.from_json(document["partition"]) == state
    path.write_bytes(b"{not json")
    assert read_json(path) is None
    assert CleanState.from_json({"segment_base_offset": -1, "size_bytes": 0, "log_end_offset": 0}) is None


def _use(cache: FileCache, path: str) -> None:
    cache.release(cache.acquire(path, create=True))


def test_files_used_in_turn_beyond_the_budget_keep_most_of_the_budget_open_instead_of_reopening_every_time(
        tmp_path):
    """Round robin over more files than the budget (a producer over more partitions than maxOpenFiles): with
    plain LRU every use reopened its file (each was the least recently used just before its turn)."""
    for files, budget in ((150, 100), (100, 99)):
        paths = [str(tmp_path / f"{files}-{i}") for i in range(files)]
        cache = FileCache(budget)
        for path in paths:  # the first round opens every file
            _use(cache, path)
        first = cache.open_calls
        for _ in range(20):
            for path in paths:
                _use(cache, path)
            assert cache.open_count <= budget
        reopened_per_round = (cache.open_calls - first) / 20
        # about (files - budget) reopens a round (plus the one in INSERT_RECENT_EVERY let in at the other end),
        # not one per file
        assert reopened_per_round <= (files - budget) + files // 10, reopened_per_round
        cache.close_all()


def test_a_file_used_again_soon_stays_open_among_files_used_once(tmp_path):
    """A hot file (an active segment) used between every open of a stream of files used once (a scan): it
    is reopened a bounded number of times, then stays open."""
    closes = []
    cache = FileCache(50)
    for i in range(100):  # the pool is full of files used once when the hot one comes
        _use(cache, str(tmp_path / f"before-{i}"))
    hot = str(tmp_path / "hot")
    step = [0]  # when the hot file's descriptor is closed
    for i in range(2000):
        step[0] = i
        cache.release(cache.acquire(hot, create=True, on_close=lambda: closes.append(step[0])))
        _use(cache, str(tmp_path / f"once-{i}"))
    # let in as most recently used one time in 32, at random: closed ~32 times on average (401 or more: p < 1e-5)
    assert len(closes) <= 400, len(closes)
    assert not closes or closes[-1] < 1000  # none late: once in, it stayed open
    cache.close_all()
