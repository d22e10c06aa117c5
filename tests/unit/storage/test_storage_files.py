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
