"""The broker's committed-offsets log, damaged: every byte of a log of six groups flipped in turn costs
the group whose record holds it and no other; the loss is an ERROR naming the group and a count in the
damage counters; the compaction at start keeps the damaged log beside the new one instead of rewriting
the damage away silently; a torn last record is cut as a tail; `verify()` reports the damage."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from metaq import framing
from metaq.broker.offsets_store import OffsetsStore
from metaq.types import PartitionId

GROUPS = [f"group-{i}" for i in range(6)]


def _write_log(directory: Path) -> bytes:
    store = OffsetsStore(directory, fsync=False)
    store.open()

    async def commit() -> None:
        for i, group in enumerate(GROUPS):
            await store.commit(group, [("orders", PartitionId(0, p), 100 * i + p, f"m{i}") for p in range(3)])

    asyncio.run(commit())
    store.close()
    reopened = OffsetsStore(directory, fsync=False)  # the compaction at open: one record per group
    reopened.open()
    reopened.close()
    return (directory / "consumer_offsets.log").read_bytes()


def _offsets(store: OffsetsStore) -> dict[str, dict[str, int]]:
    return {g: {str(p): c.offset for (_t, p), c in store.group_offsets(g).items()} for g in store.groups()}


EXPECTED = {g: {f"0-{p}": 100 * i + p for p in range(3)} for i, g in enumerate(GROUPS)}


def test_every_flipped_byte_costs_only_the_group_whose_record_holds_it(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    clean = _write_log(tmp_path / "clean")
    spans = [(r.position, r.end, r.key.decode()) for r in framing.scan(clean) if isinstance(r, framing.Record)]
    assert [k for *_, k in spans] == GROUPS
    directory = tmp_path / "d"
    directory.mkdir()
    named = 0
    for i in range(len(clean)):
        for stale in directory.iterdir():
            stale.unlink()
        damaged = bytearray(clean)
        damaged[i] ^= 0xFF
        (directory / "consumer_offsets.log").write_bytes(bytes(damaged))
        skipped_before = framing.DAMAGE.snapshot()["damaged_records"].get("offsets", 0)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="metaq.broker.offsets"):
            store = OffsetsStore(directory, fsync=False)
            store.open()
        got = _offsets(store)
        store.close()
        a, _b, group = next(s for s in spans if s[0] <= i < s[1])
        if i - a < 4:  # the magic alone: the record's head checksum still vouches for it
            assert got == EXPECTED, i
            continue
        assert got == {g: v for g, v in EXPECTED.items() if g != group}, f"byte {i}"
        last = group == GROUPS[-1]
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        if last:  # a damaged last record is a torn tail: cut, as after a crash while writing it
            assert not errors and any("torn or corrupt tail" in w for w in warnings), f"byte {i}"
            continue
        assert len(errors) == 1, f"byte {i}: {errors}"
        assert framing.DAMAGE.snapshot()["damaged_records"]["offsets"] == skipped_before + 1
        assert "the damaged log is kept as" in errors[0]
        kept = [p for p in directory.iterdir() if ".damaged-" in p.name]
        assert len(kept) == 1 and kept[0].read_bytes() == bytes(damaged), "the damaged log is kept as it was"
        # the group is named unless the flipped byte is in its name or in the checksum over it
        if not (8 <= i - a < 14 or 18 <= i - a < 18 + len(group)):
            assert f"of group {group!r}" in errors[0], f"byte {i}: {errors[0]}"
            named += 1
    assert named > len(clean) // 2


def test_the_issue_s_flip_of_byte_20_loses_one_group(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clean = _write_log(tmp_path)
    damaged = bytearray(clean)
    damaged[20] ^= 0x01
    (tmp_path / "consumer_offsets.log").write_bytes(bytes(damaged))
    store = OffsetsStore(tmp_path, fsync=False)
    with caplog.at_level(logging.ERROR, logger="metaq.broker.offsets"):
        store.open()
    assert _offsets(store) == {g: v for g, v in EXPECTED.items() if g != "group-0"}
    # byte 20 is in the key itself: named as far as it can be read
    assert len(store.damaged_records) == 1 and "it looks like 'grnup-0'" in store.damaged_records[0]
    report = store.verify()
    assert report.ok and report.records == 5, "the compacted log holds the five groups left, intact"
    store.close()


def test_verify_reports_damage_in_the_log_on_disk(tmp_path: Path) -> None:
    _write_log(tmp_path)
    store = OffsetsStore(tmp_path, fsync=False)
    store.open()
    assert store.verify().ok and store.verify().records == 6
    path = tmp_path / "consumer_offsets.log"
    data = bytearray(path.read_bytes())
    second = [r for r in framing.scan(bytes(data)) if isinstance(r, framing.Record)][1]
    data[second.body_at + 3] ^= 0x10
    path.write_bytes(bytes(data))
    report = store.verify()
    assert not report.ok and report.records == 5
    assert "'group-1'" in report.damaged[0] and "skipped" in report.damaged[0]
    store.close()


def test_an_earlier_format_log_with_a_torn_tail_is_read_and_migrated(tmp_path: Path) -> None:
    import json
    import struct

    import crc32c

    body = json.dumps({"g": "g", "o": [["t", "0-1", 7, None]]}).encode()
    record = struct.pack(">II", len(body), crc32c.crc32c(body)) + body
    (tmp_path / "consumer_offsets.log").write_bytes(record + record[:9])
    store = OffsetsStore(tmp_path, fsync=False)
    store.open()
    assert store.corrupt_tail_bytes == 9 and _offsets(store) == {"g": {"0-1": 7}}
    store.close()
    assert (tmp_path / "consumer_offsets.log").read_bytes()[:4] == framing.MAGIC
