"""Damage found after a clean stop, or in an older segment: never served as data, never blocking the
intact batches before it, reported with its offsets, and found by a scrub (``PartitionLog.verify``).

A clean reopen does not read old segments, so these bits stay in place until something reads them.
The reader below is what a consumer does: fetch, decode with the client's ``decode_fetched``, and on
damage note the offsets and resume where the error says intact data starts.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_helpers import examples, make_batch, no_sync

from metaq.errors import CorruptRecordError, StorageError
from metaq.protocol.records import HEADER_BYTES, decode_fetched, iter_batches
from metaq.storage import LogConfig, LogManager, PartitionLog
from metaq.storage.errors import DamagedData
from metaq.types import Message

CONFIG = LogConfig(unflush_threshold=1000, segment_bytes_max=4000, index_interval_bytes=300)

# where in a batch to flip a bit, and whether the batch's header survives (body damage) or not
SPOTS = {
    "base offset": (7, False),
    "length": (10, False),
    "magic": (12, False),
    "broker id bits of the message id": (13, False),
    "message id": (25, False),
    "append time": (33, False),
    "body crc": (38, False),
    "header crc": (42, False),
    "record count": (HEADER_BYTES - 2, True),
    "payload": (HEADER_BYTES + 40, True),
}


def write_log(directory: Path, batches: int = 40) -> list[Message]:
    log = PartitionLog.open(directory, "t", 0, CONFIG, 3, sync=no_sync)
    for _ in range(batches):
        log.append(make_batch(count=4, size=30)[0])
    everything = read_everything(log)[0]
    log.close()
    assert len(everything) == batches * 4
    return everything


def read_everything(log: PartitionLog, max_bytes: int = 1 << 20) -> tuple[list[Message], list[tuple[int, int]]]:
    """Every readable message in order, and the (offset, resume offset) of each damage met on the way."""
    offset, got, damage = log.log_start_offset, [], []
    while offset < log.log_end_offset:
        try:
            data = log.read_bytes(offset, max_bytes)
            messages, next_offset = decode_fetched(data, "t", 0, offset)
        except (DamagedData, CorruptRecordError) as exc:
            start = exc.offset
            resume = exc.resume_offset
            assert start == offset, "damage is reported at the offset the reader has reached"
            assert resume > offset, f"no way past the damage at {offset}: {exc}"
            damage.append((start, resume))
            offset = resume
            continue
        assert messages or next_offset > offset, "a read below the log end must make progress"
        got.extend(messages)
        offset = next_offset
    return got, damage


def flip(path: Path, position: int, bit: int = 0) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)[0]
        f.seek(position)
        f.write(bytes([byte ^ (1 << bit)]))


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


@pytest.mark.parametrize("spot", list(SPOTS), ids=list(SPOTS))
@pytest.mark.parametrize("where", ["older segment", "middle of the newest segment"])
def test_damage_after_a_clean_stop_is_reported_and_everything_else_is_read(tmp_path, spot, where):
    directory = tmp_path / "t-0"
    everything = write_log(directory, batches=51)  # 13 batches a segment: the newest holds 12
    files = segments(directory)
    assert len(files) == 4
    path = files[0] if where == "older segment" else files[-1]
    batches = list(iter_batches(path.read_bytes()))
    # in the newest segment: before its last index entry, where a clean open does not look
    victim_position, victim = batches[len(batches) // 2 if where == "older segment" else 2]
    flip(path, victim_position + SPOTS[spot][0], bit=4)

    log = PartitionLog.open(directory, "t", 0, CONFIG, 3, sync=no_sync)
    assert log.recovery.clean, "a clean stop is trusted: damage like this is only found by reading"
    got, damage = read_everything(log)
    lost = set(range(victim.base_offset, victim.next_offset))
    assert damage == [(victim.base_offset, victim.next_offset)]
    assert len(got) == 51 * 4 - len(lost)
    assert [m.offset for m in got] == [m.offset for m in everything if m.offset not in lost]
    assert [(m.data, m.id) for m in got] == [(m.data, m.id) for m in everything if m.offset not in lost]
    log.close()


def test_a_fetch_from_the_start_delivers_the_intact_batches_before_the_damage(tmp_path):
    """The issue's case: a consumer from earliest with a large max_bytes used to get nothing at all."""
    directory = tmp_path / "t-0"
    everything = write_log(directory)
    path = segments(directory)[0]
    batches = list(iter_batches(path.read_bytes()))
    position, victim = batches[5]
    flip(path, position + HEADER_BYTES + 3)  # inside the records: only the body CRC can see it
    log = PartitionLog.open(directory, "t", 0, CONFIG, 3, sync=no_sync)
    data = log.read_bytes(0, 1 << 20)
    messages, next_offset = decode_fetched(data, "t", 0, 0)
    assert [m.offset for m in messages] == list(range(victim.base_offset))
    assert next_offset == victim.base_offset
    assert messages == everything[:victim.base_offset]
    with pytest.raises(CorruptRecordError) as caught:
        decode_fetched(log.read_bytes(next_offset, 1 << 20), "t", 0, next_offset)
    assert (caught.value.offset, caught.value.resume_offset) == (victim.base_offset, victim.next_offset)
    log.close()


def test_the_broker_refuses_a_read_inside_a_damaged_header_and_names_the_way_out(tmp_path):
    directory = tmp_path / "t-0"
    write_log(directory)
    path = segments(directory)[0]
    batches = list(iter_batches(path.read_bytes()))
    position, victim = batches[3]
    flip(path, position + 7, bit=4)  # base offset: 100 would read as 116 without the header CRC
    log = PartitionLog.open(directory, "t", 0, CONFIG, 3, sync=no_sync)
    for offset in range(victim.base_offset, victim.next_offset):
        with pytest.raises(DamagedData) as caught:
            log.read(offset, 1 << 20)
        assert (caught.value.offset, caught.value.resume_offset) == (victim.base_offset, victim.next_offset)
        assert f"offset {victim.base_offset}" in str(caught.value)
    # reads on either side of it are served
    assert log.read_bytes(victim.next_offset, 1)
    assert log.read_bytes(0, 1)
    assert [(r.first_offset, r.resume_offset) for r in log.damaged_ranges] == [(victim.base_offset, victim.next_offset)]
    log.close()


def test_verify_finds_every_damaged_range_and_changes_nothing(tmp_path):
    directory = tmp_path / "t-0"
    write_log(directory, batches=60)
    files = segments(directory)
    victims = []
    for path, (index, spot) in zip(files[:3], [(2, 7), (4, HEADER_BYTES + 9), (6, 42)], strict=True):
        position, header = list(iter_batches(path.read_bytes()))[index]
        flip(path, position + spot)
        victims.append((header.base_offset, header.next_offset))
    log = PartitionLog.open(directory, "t", 0, CONFIG, 3, sync=no_sync)
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()}
    report = log.verify()
    after = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()}
    assert before == after, "verify must not modify anything"
    assert [(r.first_offset, r.resume_offset) for r in report.damaged] == victims
    assert report.messages_damaged == sum(b - a for a, b in victims)
    assert report.messages == 60 * 4 - report.messages_damaged
    assert report.segments == len(files) and not report.ok and not report.index_problems
    assert [(r.first_offset, r.resume_offset) for r in log.damaged_ranges] == victims
    log.close()


def test_verify_of_an_intact_log_is_clean_and_checks_the_indexes(tmp_path):
    directory = tmp_path / "t-0"
    write_log(directory)
    log = PartitionLog.open(directory, "t", 0, CONFIG, 3, sync=no_sync)
    report = log.verify()
    assert report.ok and report.messages == 160 and report.segments == len(segments(directory))
    log.close()
    index = sorted(directory.glob("*.index"))[0]
    entries = index.read_bytes()
    assert len(entries) >= 16
    # an entry whose position is moved by one byte still looks plausible to the loader
    index.write_bytes(entries[:12] + (int.from_bytes(entries[12:16], "big") + 1).to_bytes(4, "big") + entries[16:])
    log = PartitionLog.open(directory, "t", 0, CONFIG, 3, sync=no_sync)
    report = log.verify()
    assert not report.damaged
    assert len(report.index_problems) == 1 and index.name in report.index_problems[0]
    # the reads work anyway: the bad entry is noticed and the index rebuilt
    assert read_everything(log)[1] == []
    log.close()


def test_damage_that_reaches_the_end_of_a_segment_resumes_at_the_next_segment(tmp_path):
    directory = tmp_path / "t-0"
    everything = write_log(directory)
    first = segments(directory)[0]
    batches = list(iter_batches(first.read_bytes()))
    # wreck the headers of the last two batches of the segment: no intact batch follows in it
    for position, _ in batches[-2:]:
        flip(first, position + 20)
    log = PartitionLog.open(directory, "t", 0, CONFIG, 3, sync=no_sync)
    got, damage = read_everything(log)
    start = batches[-2][1].base_offset
    end = batches[-1][1].next_offset
    assert damage == [(start, end)]
    assert [m.offset for m in got] == [m.offset for m in everything if not start <= m.offset < end]
    report = log.verify()
    assert [(r.first_offset, r.resume_offset) for r in report.damaged] == [(start, end)]
    log.close()


def test_a_batch_of_the_old_format_is_refused_not_cut(tmp_path):
    directory = tmp_path / "t-0"
    write_log(directory)
    newest = segments(directory)[-1]
    size = os.path.getsize(newest)
    content = bytearray(newest.read_bytes())
    content[12] = 1  # what metaq 0.1 wrote
    newest.write_bytes(bytes(content))
    with pytest.raises(StorageError, match=r"format version 1, written by metaq 0\.1"):
        PartitionLog.open(directory, "t", 0, CONFIG, 3, sync=no_sync)
    assert os.path.getsize(newest) == size, "nothing was cut"


def test_a_data_dir_of_another_format_is_refused(tmp_path):
    manager = LogManager(tmp_path, 1, CONFIG, sync=no_sync).open()
    manager.get_or_create("t", 0).append(make_batch()[0])
    manager.close()
    marker = tmp_path / "format.json"
    assert '"record_batch_format": 2' in marker.read_text()
    marker.write_text('{"record_batch_format": 1, "version": 1}')
    with pytest.raises(StorageError, match="holds record batch format 1"):
        LogManager(tmp_path, 1, CONFIG, sync=no_sync).open()


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_damage_in_sealed_segments_loses_exactly_the_damaged_batches(tmp_path_factory, data):
    """Any bytes of any sealed segment: the damaged batches are reported (by reads and by verify) and
    every other message is read back, in order, with its id; nothing else is lost or made up."""
    directory = tmp_path_factory.mktemp("d") / "t-0"
    everything = write_log(directory, batches=data.draw(st.integers(14, 45), label="batches"))
    sealed = segments(directory)[:-1]
    layout = {path: list(iter_batches(path.read_bytes())) for path in sealed}
    spots = data.draw(st.sets(st.tuples(st.sampled_from(sealed), st.integers(0, 1 << 20)), min_size=1, max_size=4),
                      label="spots")
    touched: set[int] = set()
    for path, position in {(path, raw % path.stat().st_size) for path, raw in spots}:
        flip(path, position, data.draw(st.integers(0, 7), label="bit"))
        header = next(h for p, h in layout[path] if p <= position < p + h.total_bytes)
        touched.update(range(header.base_offset, header.next_offset))
    log = PartitionLog.open(directory, "t", 0, CONFIG, 3, sync=no_sync)
    got, damage = read_everything(log)
    reported = {o for a, b in damage for o in range(a, b)}
    assert reported == touched
    assert [(m.offset, m.data, m.id) for m in got] == [(m.offset, m.data, m.id) for m in everything
                                                       if m.offset not in touched]
    report = log.verify()
    assert {o for r in report.damaged for o in range(r.first_offset, r.resume_offset)} == touched
    assert report.messages == len(everything) - len(touched)
    log.close()
