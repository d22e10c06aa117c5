"""The small files beside the segments, damaged: clean-shutdown records, epoch histories and producer
snapshots are one checked text line per record. Every byte flipped in turn costs the record whose line holds
it and nothing else, with an ERROR naming it and a count in the damage counters; files an earlier version
wrote as one JSON document are still read."""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path

import pytest

from metaq import framing
from metaq.protocol.records import ProducerStamp
from metaq.storage.checkpoint import CleanState, read_clean_states, write_clean_states
from metaq.storage.epochs import EpochHistory
from metaq.storage.producers import ProducerStateTable, read_snapshot, write_snapshot


def _line_of(data: bytes, i: int) -> int:
    starts = list(itertools.accumulate([0] + [len(line) + 1 for line in data.split(b"\n")[:-1]]))
    return next(n for n in range(len(starts) - 1) if starts[n] <= i < starts[n + 1])


def _newline(data: bytes, i: int) -> bool:
    """Byte ``i`` is a newline between two lines (its damage joins them; the reader splits them again)."""
    return data[i:i + 1] == b"\n" and i != len(data) - 1


def _flips(data: bytes):
    for i in range(len(data)):
        damaged = bytearray(data)
        damaged[i] ^= 0xFF
        yield i, bytes(damaged)


def test_clean_shutdown_records_each_cost_only_their_partition(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    states = {f"t-{p}": CleanState(100 * p, 4096 + p, 1000 * p + 7) for p in range(4)}
    path = tmp_path / "clean-shutdown.json"
    write_clean_states(path, states)
    clean = path.read_bytes()
    assert read_clean_states(path) == states
    names = sorted(states)
    for i, damaged in _flips(clean):
        path.write_bytes(damaged)
        before = framing.DAMAGE.snapshot()["damaged_records"].get("clean-shutdown", 0)
        caplog.clear()
        with caplog.at_level(logging.ERROR):
            got = read_clean_states(path)
        if _newline(clean, i):
            assert got == states, i
            continue
        lost = names[_line_of(clean, i)]
        assert got == {n: s for n, s in states.items() if n != lost}, i
        assert len(caplog.records) == 1 and "checked as after a crash" in caplog.records[0].getMessage()
        assert framing.DAMAGE.snapshot()["damaged_records"]["clean-shutdown"] == before + 1


def test_an_earlier_clean_shutdown_document_is_still_read(tmp_path: Path) -> None:
    path = tmp_path / "clean-shutdown.json"
    path.write_text(json.dumps({"version": 1, "broker_id": 0, "partitions": {
        "t-0": {"segment_base_offset": 0, "size_bytes": 10, "log_end_offset": 3}}}))
    assert read_clean_states(path) == {"t-0": CleanState(0, 10, 3)}


def test_an_epoch_history_loses_only_the_damaged_entry(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    history = EpochHistory(tmp_path)
    entries = [(1, 0), (2, 100), (4, 250), (7, 900)]
    for epoch, start in entries:
        history.assign(epoch, start)
    clean = history.path.read_bytes()
    assert EpochHistory(tmp_path).entries == entries
    for i, damaged in _flips(clean):
        history.path.write_bytes(damaged)
        caplog.clear()
        with caplog.at_level(logging.ERROR):
            got = EpochHistory(tmp_path)
        if _newline(clean, i):
            assert got.entries == entries, i
            continue
        k = _line_of(clean, i)
        assert got.entries == entries[:k] + entries[k + 1:], i
        assert len(got.damaged) == 1 and got.verify().damaged, i
        if i - clean.rfind(b"\n", 0, i) - 1 < 8:  # the line's checksum: the key's own names the epoch
            assert f"epoch {entries[k][0]}" in caplog.records[0].getMessage(), i
    history.path.write_text(json.dumps({"version": 1, "epochs": [[1, 0], [3, 50]]}))  # an earlier version's file
    assert EpochHistory(tmp_path).entries == [(1, 0), (3, 50)]


def _table() -> ProducerStateTable:
    table = ProducerStateTable()
    for pid in (11, 22, 33):
        for seq in range(0, 30, 10):
            table.record(ProducerStamp(pid, 0, seq), 10, 1000 * pid + seq, 5_000 + seq)
    return table


def _described(table: ProducerStateTable | None) -> dict[int, object]:
    assert table is not None
    return {pid: (e.epoch, e.last_append_ms, list(e.batches)) for pid, e in table._producers.items()}


def test_a_producer_snapshot_loses_only_the_damaged_producer(tmp_path: Path) -> None:
    write_snapshot(tmp_path, _table(), 500)
    path = tmp_path / f"{500:020d}.producers"
    clean = path.read_bytes()
    full = _described(read_snapshot(tmp_path, 500, 10**9))
    assert sorted(full) == [11, 22, 33]
    for i, damaged in _flips(clean):
        path.write_bytes(damaged)
        got = _described(read_snapshot(tmp_path, 500, 10**9))
        if _newline(clean, i):
            assert got == full, i
            continue
        k = _line_of(clean, i)
        if k == 0:  # the {"offset": 500} line: the file name says it too
            assert got == full, i
            continue
        lost = [11, 22, 33][k - 1]
        assert got == {pid: v for pid, v in full.items() if pid != lost}, i


def test_a_producer_snapshot_of_the_earlier_form_is_still_read(tmp_path: Path) -> None:
    import zlib

    table = _table()
    document = {"offset": 500, "producers": {
        str(pid): [e.epoch, e.last_append_ms, [list(b) for b in e.batches]] for pid, e in table._producers.items()}}
    body = json.dumps(document, separators=(",", ":")).encode()
    (tmp_path / f"{500:020d}.producers").write_bytes(b"%08x\n" % zlib.crc32(body) + body)
    assert _described(read_snapshot(tmp_path, 500, 10**9)) == _described(table)
