"""deletePolicy parsing and retention: delete, archive, zip; never the active or a pinned segment."""

from __future__ import annotations

import os
import time
import zipfile

import pytest
from storage_helpers import make_batch, read_all

from metaq.errors import ConfigError
from metaq.storage import LogConfig, OffsetOutOfRange, RetentionPolicy

HOUR_MS = 3_600_000


@pytest.mark.parametrize(("text", "expected"), [
    ("delete,168", RetentionPolicy("delete", 168 * HOUR_MS)),
    ("delete,10s", RetentionPolicy("delete", 10_000)),
    ("delete, 10m", RetentionPolicy("delete", 600_000)),
    ("DELETE,10h", RetentionPolicy("delete", 10 * HOUR_MS)),
    ("archive,72", RetentionPolicy("archive", 72 * HOUR_MS)),
    ("archive,72,true", RetentionPolicy("archive", 72 * HOUR_MS, True)),
    ("archive,1s,false", RetentionPolicy("archive", 1000, False)),
])
def test_parse_delete_policy(text, expected):
    assert RetentionPolicy.parse(text) == expected


@pytest.mark.parametrize("text", ["", "delete", "remove,10", "delete,ten", "delete,10d", "delete,-1",
                                  "delete,10,true", "archive,10,maybe", "archive,1,true,x"])
def test_malformed_policy_is_a_config_error_naming_the_value(text):
    with pytest.raises(ConfigError) as info:
        RetentionPolicy.parse(text)
    assert repr(text) in str(info.value)


def test_config_validates_its_fields():
    with pytest.raises(ConfigError, match="segment_bytes_max"):
        LogConfig(segment_bytes_max=0)
    with pytest.raises(ConfigError, match="unflush_interval_ms"):
        LogConfig(unflush_interval_ms=0)
    with pytest.raises(ConfigError, match="deletePolicy"):
        LogConfig(delete_policy="keep,forever")
    assert LogConfig(delete_policy="delete,1h").retention.max_age_ms == HOUR_MS
    assert LogConfig().with_changes(unflush_threshold=0).group_commit


def age_segments(log, count: int, age_ms: int) -> None:
    """Make the ``count`` oldest segments look last written ``age_ms`` ago."""
    then = time.time() - age_ms / 1000
    for base in log.segment_base_offsets[:count]:
        os.utime(log.directory / f"{base:020d}.log", (then, then))


def filled(open_log, policy: str, segments: int = 5):
    log = open_log(segment_bytes_max=400, delete_policy=policy)
    values = []
    while log.segment_count < segments:
        batch, vals = make_batch(count=2, size=50)
        log.append(batch)
        values.extend(vals)
    return log, values


def test_delete_removes_expired_prefix_but_never_the_active_segment(open_log):
    log, values = filled(open_log, "delete,1h")
    bases = log.segment_base_offsets
    age_segments(log, 2, 2 * HOUR_MS)
    assert log.apply_retention() == bases[:2]
    assert log.log_start_offset == bases[2]
    assert not (log.directory / f"{bases[0]:020d}.log").exists()
    assert not (log.directory / f"{bases[0]:020d}.index").exists()
    with pytest.raises(OffsetOutOfRange) as info:
        log.read(0, 100)
    assert (info.value.earliest, info.value.latest) == (bases[2], log.log_end_offset)
    assert [m.data for m in read_all(log)] == values[bases[2]:]
    # Everything old, even the active segment: the active one stays.
    age_segments(log, 10, 2 * HOUR_MS)
    assert log.apply_retention() == bases[2:-1]
    assert log.segment_count == 1 and log.log_start_offset == bases[-1]
    log.close()
    log = open_log(segment_bytes_max=400, delete_policy="delete,1h")
    assert log.log_start_offset == bases[-1]


def test_young_segment_stops_retention_so_offsets_stay_contiguous(open_log):
    log, _ = filled(open_log, "delete,1h")
    age_segments(log, 3, 2 * HOUR_MS)
    age_segments(log, 1, 0)  # the oldest was just written again
    assert log.apply_retention() == []


def test_pinned_segment_is_not_removed_until_released(open_log):
    log, _ = filled(open_log, "delete,1h")
    age_segments(log, 3, 2 * HOUR_MS)
    piece = log.read(0, 100)
    assert log.apply_retention() == []
    data = piece.read_bytes()
    piece.release()
    assert data and len(log.apply_retention()) == 3


def test_archive_renames_the_segment(open_log):
    log, _ = filled(open_log, "archive,1h")
    bases = log.segment_base_offsets
    age_segments(log, 1, 2 * HOUR_MS)
    first = (log.directory / f"{bases[0]:020d}.log").read_bytes()
    assert log.apply_retention() == bases[:1]
    archived = log.directory / f"{bases[0]:020d}.log.arc"
    assert archived.read_bytes() == first
    log.close()
    log = open_log(segment_bytes_max=400, delete_policy="archive,1h")
    assert log.log_start_offset == bases[1] and archived.exists()


def test_archive_with_compression_zips_the_segment(open_log):
    log, _ = filled(open_log, "archive,10s,true")
    bases = log.segment_base_offsets
    name = f"{bases[0]:020d}.log"
    first = (log.directory / name).read_bytes()
    assert log.apply_retention(now_ms=int(time.time() * 1000) + 60_000) == bases[:-1]
    with zipfile.ZipFile(log.directory / (name + ".zip")) as zf:
        assert zf.read(name) == first
    assert not (log.directory / name).exists()
    assert not list(log.directory.glob("*.tmp"))
