"""Checkpoint files: small files replaced atomically, and the clean-shutdown state they carry.

A checkpoint is never seen half-written: it is written to ``<name>.tmp``, fsynced, renamed over the
old one, and the directory is fsynced so the rename itself survives a power cut.

Files of several records (the clean-shutdown records, epoch histories, producer snapshots) are text
lines, one record a line with its own checksums (:mod:`metaq.framing`): a damaged line costs that record
only, and is an ERROR naming it (:func:`read_records`). A file an earlier version wrote as one JSON
document is still read (:func:`read_json`) and is written as lines next time.

The clean-shutdown state of a partition says which segment was newest and how long it was when the
log was closed after a full flush. On open, a matching newest segment is trusted (only its tail is
checked); anything else means the process did not stop cleanly, and the newest segment is checked
batch by batch. Appends after the close only add bytes past the recorded size, so a stale state can
never vouch for bytes it did not see: the size would differ. A damaged record only costs that
partition the full check.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metaq import framing
from metaq.fsutil import atomic_write, fsync_directory

log = logging.getLogger("metaq.storage")

__all__ = ["atomic_write", "fsync_directory"]  # re-exported: storage code imports them from here

CHECKPOINT_VERSION = 1
CLEAN_SHUTDOWN_FILE = "clean-shutdown.json"


def write_json(path: str | os.PathLike[str], document: dict[str, Any], *,
               sync: Callable[[int], None] = os.fsync) -> None:
    body = dict(document)
    body["version"] = CHECKPOINT_VERSION
    atomic_write(path, json.dumps(body, sort_keys=True).encode(), sync=sync)


def read_json(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The checkpoint's document, or None when it is missing, unreadable or of another version.

    A damaged checkpoint only costs a slower (full) recovery, so it is not an error.
    """
    try:
        with open(path, "rb") as f:
            document = json.loads(f.read())
    except (OSError, ValueError):
        return None
    if not isinstance(document, dict) or document.get("version") != CHECKPOINT_VERSION:
        return None
    return document


def write_records(path: str | os.PathLike[str], records: Iterable[tuple[str, dict[str, Any]]], *,
                  sync: Callable[[int], None] | None = os.fsync) -> None:
    """Replace ``path`` with ``records`` ((key, object) pairs), one text line each."""
    atomic_write(path, b"".join(framing.encode_line(obj, key) for key, obj in records), sync=sync)


def read_bytes(path: str | os.PathLike[str]) -> bytes | None:
    """The file's bytes, None when it is missing or cannot be read (a checkpoint only saves work)."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def parse_records(data: bytes, path: str | os.PathLike[str], key_of: Callable[[dict[str, Any]], str], *,
                  store: str, lost: Callable[[str], str]) -> tuple[list[dict[str, Any]], list[str]]:
    """The intact records of a text-line file, and one message per damaged line (each logged as an ERROR
    and counted under ``store``). ``lost(key)`` says what the loss of the record of that key costs."""
    records, damaged = framing.parse_lines(data, key_of)
    messages = []
    for d in damaged:
        message = f"line {d.number} (the record of {d.describe_key()}) is damaged and skipped: " \
                  f"{lost(d.key) if d.key is not None else lost('')}"
        log.error("%s: %s", path, message)
        framing.DAMAGE.skipped_record(store, f"{path}: {message}")
        messages.append(message)
    return records, messages


def check_records(data: bytes | None, key_of: Callable[[dict[str, Any]], str]) -> tuple[int, list[str]]:
    """(intact records, one line per damaged one) of a text-line file's bytes, without logging: for verify."""
    if not data or not framing.is_text_lines(data):
        return 0, []
    records, damaged = framing.parse_lines(data, key_of)
    return len(records), [f"line {d.number} (the record of {d.describe_key()}) is damaged" for d in damaged]


def remove_file(path: str | os.PathLike[str], *, sync_dir: bool = False,
                sync: Callable[[int], None] = os.fsync) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    if sync_dir:
        fsync_directory(os.path.dirname(os.fspath(path)) or ".", sync)
    return True


@dataclass(slots=True)
class StoreReport:
    """What a check of one store beside the segments found (the offsets log, the transaction log, ...).

    ``damaged``: one line per damaged record, naming what it held as far as its key tells; nothing
    is modified by the check."""

    store: str
    path: str
    records: int = 0
    damaged: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.damaged

    def to_json(self) -> dict[str, Any]:
        return {"store": self.store, "path": self.path, "records": self.records, "ok": self.ok,
                "damaged": list(self.damaged), "notes": list(self.notes)}


@dataclass(frozen=True, slots=True)
class CleanState:
    """A partition's newest segment as it was at a clean close."""

    segment_base_offset: int
    size_bytes: int
    log_end_offset: int

    def to_json(self) -> dict[str, int]:
        return {"segment_base_offset": self.segment_base_offset, "size_bytes": self.size_bytes,
                "log_end_offset": self.log_end_offset}

    @classmethod
    def from_json(cls, value: object) -> CleanState | None:
        if not isinstance(value, dict):
            return None
        try:
            state = cls(int(value["segment_base_offset"]), int(value["size_bytes"]),
                        int(value["log_end_offset"]))
        except (KeyError, TypeError, ValueError, OverflowError):  # OverflowError: Infinity, 1e400
            return None
        if min(state.segment_base_offset, state.size_bytes, state.log_end_offset) < 0:
            return None
        return state


def _clean_key(obj: dict[str, Any]) -> str:
    return str(obj["partition"])


CLEAN_STORE = "clean-shutdown"


def read_clean_states(path: str | os.PathLike[str]) -> dict[str, CleanState | None]:
    """Partition directory name -> its clean-shutdown state, from a checkpoint written at a clean close
    (empty when there is none). A damaged record costs its partition the full check of an unclean open."""
    data = read_bytes(path)
    if data is None:
        return {}
    if not framing.is_text_lines(data):  # one JSON document, as an earlier version wrote it
        document = read_json(path) or {}
        raw = document.get("partitions", {})
        return {name: CleanState.from_json(value) for name, value in raw.items()} if isinstance(raw, dict) else {}
    records, _damage = parse_records(
        data, path, _clean_key, store=CLEAN_STORE,
        lost=lambda key: f"partition {key or '(unknown)'} is checked as after a crash (slower; nothing is lost)")
    return {str(r["partition"]): CleanState.from_json(r) for r in records if "partition" in r}


def write_clean_states(path: str | os.PathLike[str], states: dict[str, CleanState], *,
                       sync: Callable[[int], None] = os.fsync) -> None:
    write_records(path, ((name, {"partition": name, **state.to_json()}) for name, state in sorted(states.items())),
                  sync=sync)


def read_partition_clean_state(directory: Path) -> CleanState | None:
    path = directory / CLEAN_SHUTDOWN_FILE
    data = read_bytes(path)
    if data is not None and not framing.is_text_lines(data):  # an earlier version's {"partition": {...}}
        document = read_json(path)
        return CleanState.from_json(document.get("partition")) if document else None
    return read_clean_states(path).get(directory.name)


def write_partition_clean_state(directory: Path, state: CleanState, *,
                                sync: Callable[[int], None] = os.fsync) -> None:
    write_clean_states(directory / CLEAN_SHUTDOWN_FILE, {directory.name: state}, sync=sync)
