"""The options of topics created with CreateTopic ``configs``, kept in the data directory.

A topic created with configs behaves as if server.ini had a ``[topic=NAME]`` section with them, and keeps
them across restarts: each such topic has one small JSON file beside its partition directories,
``<dataPath>/<topic>.topic.json``::

    {"topic": "orders", "options": {"numPartitions": "4", "acceptPublish": "false"}}

The options are server.ini keys and their text, read back with the server.ini validator
(:func:`metaq.broker.ini.parse_topic_options`), so the file can never hold a value a section could
not. ``numPartitions`` is always stored (the count the topic was created with), so a later change of
``[system] numPartitions`` does not grow it. A file is written with :func:`metaq.fsutil.atomic_write`
(temp, fsync, rename, fsync the directory) before the topic is created, and removed when the topic is
deleted; a crash in between leaves a topic with its options and no data yet, which the next start
creates. The partition logs ignore files, so these never look like partitions.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from metaq.broker.config import TopicConfig
from metaq.broker.ini import parse_topic_options
from metaq.errors import ConfigError
from metaq.fsutil import atomic_write, fsync_directory

SUFFIX = ".topic.json"


class TopicOptionsStore:
    """topic -> its options as server.ini text, one file per topic (blocking calls: not on the loop)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def path(self, topic: str) -> Path:
        return self.directory / f"{topic}{SUFFIX}"

    def load(self) -> dict[str, TopicConfig]:
        """Every stored topic's options, checked; ConfigError names the file of a bad one."""
        out: dict[str, TopicConfig] = {}
        if not self.directory.is_dir():
            return out
        for entry in sorted(os.listdir(self.directory)):
            if entry.endswith(SUFFIX + ".tmp"):  # a write cut short by a crash: the old file stands
                with contextlib.suppress(OSError):
                    os.unlink(self.directory / entry)
                continue
            if not entry.endswith(SUFFIX):
                continue
            path = self.directory / entry
            topic = entry[: -len(SUFFIX)]
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
                options = doc["options"]
                if doc.get("topic") != topic or not isinstance(options, dict):
                    raise ValueError("not a topic options document")
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                raise ConfigError(f"{path}: cannot read the stored options of topic {topic!r}: {exc}") from None
            out[topic] = parse_topic_options(topic, options.items(), source=str(path))
        return out

    def save(self, topic: str, options: dict[str, str]) -> None:
        doc = {"topic": topic, "options": options}
        self.directory.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path(topic), json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n")

    def remove(self, topic: str) -> None:
        try:
            os.unlink(self.path(topic))
        except FileNotFoundError:
            return
        fsync_directory(self.directory)
