"""Checkpoint files: small JSON documents replaced atomically, and the clean-shutdown state they carry.

A checkpoint is never seen half-written: it is written to ``<name>.tmp``, fsynced, renamed over the
old one, and the directory is fsynced so the rename itself survives a power cut.

The clean-shutdown state of a partition says which segment was newest and how long it was when the
log was closed after a full flush. On open, a matching newest segment is trusted (only its tail is
checked); anything else means the process did not stop cleanly, and the newest segment is checked
batch by batch. Appends after the close only add bytes past the recorded size, so a stale state can
never vouch for bytes it did not see: the size would differ.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metaq.fsutil import atomic_write, fsync_directory

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


def remove_file(path: str | os.PathLike[str], *, sync_dir: bool = False,
                sync: Callable[[int], None] = os.fsync) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    if sync_dir:
        fsync_directory(os.path.dirname(os.fspath(path)) or ".", sync)
    return True


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


def read_partition_clean_state(directory: Path) -> CleanState | None:
    document = read_json(directory / CLEAN_SHUTDOWN_FILE)
    return CleanState.from_json(document.get("partition")) if document else None


def write_partition_clean_state(directory: Path, state: CleanState, *,
                                sync: Callable[[int], None] = os.fsync) -> None:
    write_json(directory / CLEAN_SHUTDOWN_FILE, {"partition": state.to_json()}, sync=sync)
