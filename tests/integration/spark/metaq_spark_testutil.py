"""Helpers shared by the Spark integration tests and the driver-kill job they run in a subprocess."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from metaq.client.blocking import BlockingClient
from metaq.protocol.records import BatchBuilder
from metaq.types import Message

Produced = dict[int, list[Message]]
"""Per partition, the messages as sent (offsets filled in from the produce replies)."""


def produce(servers: str, topic: str, partitions: Iterable[int], per_partition: int, *, tag: str = "",
            batch: int = 50, keyed: bool = False) -> Produced:
    """Send ``per_partition`` messages to each partition in batches; returns what landed where."""
    out: Produced = {}
    with BlockingClient(servers) as client:
        for p in partitions:
            sent: list[Message] = []
            for first in range(0, per_partition, batch):
                builder = BatchBuilder(max_bytes=1 << 24)
                msgs = []
                for i in range(first, min(per_partition, first + batch)):
                    m = Message(topic, f"{tag}p{p}-m{i}".encode(), timestamp_ms=1_700_000_000_000 + i)
                    if keyed and i % 3 == 0:
                        m.key, m.attribute, m.headers = f"k{i}".encode(), f"attr{i % 2}", [("h", b"%d" % i)]
                    builder.try_append(m.timestamp_ms, m.data, m.key, m.attribute, m.headers)
                    msgs.append(m)
                resp = client.produce(topic, p, builder.build())
                assert resp is not None
                for j, m in enumerate(msgs):
                    m.partition, m.offset, m.id = resp.partition, resp.base_offset + j, resp.base_message_id + j
                sent.extend(msgs)
            out.setdefault(p, []).extend(sent)
    return out


def merge(*parts: Produced) -> Produced:
    out: Produced = {}
    for produced in parts:
        for p, msgs in produced.items():
            out.setdefault(p, []).extend(msgs)
    return out


def expected_rows(produced: Produced) -> list[tuple[int, int, bytes]]:
    return sorted((p, m.offset, bytes(m.data)) for p, msgs in produced.items() for m in msgs)


def rows_of(df: Any) -> list[tuple[int, int, bytes]]:
    return sorted((r["partition"], r["offset"], bytes(r["value"])) for r in df.select("partition", "offset", "value")
                  .collect())


def write_batch_file(out_dir: str, batch_df: Any, batch_id: int,
                     columns: tuple[str, ...] = ("partition", "offset")) -> None:
    """An idempotent foreachBatch sink: batch N always lands in (and replaces) ``batch-N.json``, a row
    being ``columns`` and the value as text."""
    rows = [[*(r[c] for c in columns), bytes(r["value"]).decode()] for r in
            batch_df.select(*columns, "value").collect()]
    path = Path(out_dir) / f"batch-{batch_id:06d}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rows))
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_batch_files(out_dir: str) -> list[tuple[int, int, bytes]]:
    """Every row the file sink holds, duplicates kept (the tests assert there are none)."""
    rows = []
    for path in sorted(Path(out_dir).glob("batch-*.json")):
        rows.extend((p, o, v.encode()) for p, o, v in json.loads(path.read_text()))
    return sorted(rows)
