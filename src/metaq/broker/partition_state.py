"""Which partitions are closed for publishing (``metaq topic close``), kept across restarts.

MetaQ closes a partition to drain it before maintenance; a restart in the middle of that maintenance
must not open it again behind the operator's back. The closed partitions of every topic live in one
small JSON file in the data directory, beside the partition directories (which the logs tell apart:
they are directories, this is a file)::

    <dataPath>/partition-state.json
    {"closed": {"orders": [0, 3]}}

It is replaced with :func:`metaq.fsutil.atomic_write` (temp file, fsync, rename, fsync the directory)
before the broker answers the close or open, so an acknowledged change survives a crash or a power cut,
and a crash during the write leaves the previous file whole. A missing file means every partition is
open (a data directory from before this file existed). Blocking calls: not on the event loop.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path

from metaq.errors import ConfigError
from metaq.fsutil import atomic_write

FILE_NAME = "partition-state.json"


class PartitionStateStore:
    """topic -> its closed partitions, one file for the whole broker."""

    def __init__(self, directory: str | Path) -> None:
        self.path = Path(directory) / FILE_NAME
        self._write_lock = threading.Lock()
        """One writer of the temp file at a time (a worker thread's close/open, the loop's topic delete)."""

    def load(self) -> dict[str, set[int]]:
        """The stored closed partitions; ConfigError naming the file when it cannot be read."""
        tmp = self.path.with_name(FILE_NAME + ".tmp")
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # a write cut short by a crash: the old file stands
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise ConfigError(f"{self.path}: cannot read the closed partitions: {exc.strerror or exc}") from None
        try:
            doc = json.loads(text)
            closed = doc["closed"]
            out = {str(topic): {int(p) for p in parts} for topic, parts in closed.items()
                   if isinstance(parts, list)}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(f"{self.path}: not a partition state document ({exc}); fix or remove it "
                              "(removing it opens every partition)") from None
        return {topic: parts for topic, parts in out.items() if parts}

    def save(self, closed: dict[str, set[int]]) -> None:
        doc = {"closed": {topic: sorted(parts) for topic, parts in sorted(closed.items()) if parts}}
        with self._write_lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(self.path, json.dumps(doc, sort_keys=True).encode() + b"\n")
