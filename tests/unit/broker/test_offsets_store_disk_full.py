"""The broker's committed-offsets log on a full disk (a real, small tmpfs): a commit that does not fit is
refused with DiskFull and leaves no torn record in front of later ones; the store opens on a full disk
(compaction needs space, so it appends to the log as it is); commits work again once space is freed."""

from __future__ import annotations

import asyncio
from pathlib import Path

from metaq.broker.offsets_store import OffsetsStore
from metaq.storage.errors import DiskFull
from metaq.testing.fs import small_disk
from metaq.types import PartitionId

P0, P1 = PartitionId(0, 0), PartitionId(0, 1)


def offsets(store: OffsetsStore) -> dict[tuple[str, int], int]:
    return {(t, p.partition): v.offset for (t, p), v in store.group_offsets("g").items()}


def test_commits_on_a_full_disk(tmp_path: Path) -> None:
    async def commit_until_refused(store: OffsetsStore, start: int) -> int:
        for i in range(start, start + 10_000):
            try:
                await store.commit("g", [("t", P0, i, "m" * 200)])
            except DiskFull:
                return i
        raise AssertionError("the disk never filled up")

    with small_disk(tmp_path / "disk", 1 << 20) as disk:
        store = OffsetsStore(disk.path / "o")
        store.open()
        asyncio.run(store.commit("g", [("t", P1, 7, None)]))
        disk.fill(leave_bytes=0)
        refused = asyncio.run(commit_until_refused(store, 0))
        assert offsets(store) == {("t", 0): refused - 1, ("t", 1): 7}, "a refused commit is not visible"
        store.close()

        reopened = OffsetsStore(disk.path / "o")  # compaction cannot write its temp file: opens in place
        reopened.open()
        assert offsets(reopened) == {("t", 0): refused - 1, ("t", 1): 7}, "no torn record hides a commit"
        refused_again = asyncio.run(commit_until_refused(reopened, 100_000))  # still full: refused again
        assert offsets(reopened)[("t", 0)] == (refused_again - 1 if refused_again > 100_000 else refused - 1)
        disk.free()
        asyncio.run(reopened.commit("g", [("t", P0, 5, None)]))
        reopened.close()
        again = OffsetsStore(disk.path / "o")
        again.open()
        assert offsets(again) == {("t", 0): 5, ("t", 1): 7}
        again.close()
