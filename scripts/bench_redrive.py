"""How fast `metaq group redrive` sends dead letters back: msg/s of the real command on a fresh broker.

A broker (group commit, uvloop) gets ``-n`` dead letters in ``%DLQ%bench`` (1 KiB payloads, a key each,
the ``dlq-*`` headers a consumer would add, written by a batch producer: filling is not measured). Then,
per round: ``metaq group redrive bench --dry-run --json`` (reads the whole topic: the read-only
baseline of the same run) and ``metaq group redrive bench --json`` (reads, sends back, commits), after
a ``metaq group reset`` of ``bench@dlq-redrive`` so each round redrives everything again. Wall time of
the command (process start and connection included, as a user sees it).

    .venv/bin/python scripts/bench_redrive.py -n 20000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from metaq.broker.launcher import BrokerLauncher
from metaq.client import Message, MessageSessionFactory
from metaq.client.group.dead_letter import dead_letter_headers

METAQ = str(Path(sys.executable).with_name("metaq"))


async def fill(servers: str, n: int) -> None:
    """``n`` messages in orders 0-0 and their dead letters (exact copies, as a consumer writes them: the broker
    checks each against the message it names)."""
    session = await MessageSessionFactory.connect(servers)
    await session.admin().create_topic("orders", 4)
    await session.admin().create_topic("%DLQ%bench", 1)
    producer = session.create_producer()
    payload = b"x" * 1024
    for start in range(0, n, 1000):
        originals = [Message("orders", payload, key=b"key-%d" % i, headers=[("trace", b"t")])
                     for i in range(start, min(n, start + 1000))]
        stored = await producer.send_batch("orders", originals, partition="0-0")
        assert stored.success
        where = [(c.base_offset + k, c.base_message_id + k) for c in stored.chunks for k in range(c.count)]
        dead = []
        for original, (offset, message_id) in zip(originals, where, strict=True):
            template = Message("orders", payload, key=original.key, headers=original.headers, partition=0,
                               offset=offset, id=message_id, broker_id=0)
            dead.append(Message("%DLQ%bench", payload, key=original.key,
                                headers=dead_letter_headers(template, RuntimeError("poison"), 6)))
        assert (await producer.send_batch("%DLQ%bench", dead)).success
    await producer.flush()
    await session.close()


def timed(*args: str) -> tuple[float, dict[str, object]]:
    started = time.perf_counter()
    out = subprocess.run([METAQ, *args], capture_output=True, text=True, check=True)
    return time.perf_counter() - started, json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerLauncher(Path(tmp) / "broker", {"numPartitions": 4, "unflushThreshold": 0})
        broker.start()
        try:
            asyncio.run(fill(broker.servers, opts.n))
            s = ["-s", broker.servers]
            for r in range(opts.rounds):
                subprocess.run([METAQ, "group", "reset", "bench@dlq-redrive", "%DLQ%bench", "--to", "earliest", *s],
                               capture_output=True, check=True)
                dry_s, dry = timed("group", "redrive", "bench", "--dry-run", "--json", *s)
                real_s, real = timed("group", "redrive", "bench", "--json", *s)
                assert dry["total"] == real["total"] == opts.n, (dry, real)
                print(json.dumps({"round": r, "n": opts.n, "dry_run_s": round(dry_s, 3),
                                  "dry_run_msg_s": round(opts.n / dry_s), "redrive_s": round(real_s, 3),
                                  "redrive_msg_s": round(opts.n / real_s)}), flush=True)
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
