"""`metaq bench redrive`: how fast `metaq group redrive` sends dead letters back, as a user runs it.

A broker of its own (group commit, uvloop) gets ``count`` dead letters in ``%DLQ%bench`` (1 KiB payloads, a key
each, the ``dlq-*`` headers a consumer adds; written by a batch producer, not measured). Then, per round:
``metaq group redrive bench --dry-run --json`` (reads the whole dead-letter topic, sends nothing: the same-run
baseline) and ``metaq group redrive bench --json`` (reads, sends back to a 4-partition topic, commits), after a
``metaq group reset`` of ``bench@dlq-redrive`` so that each round redrives everything again. The figure is the
wall time of the real command (process start, imports and connection included, as a user sees it).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from metaq.bench.report import BenchError, Report, each, markdown_table, median
from metaq.broker.launcher import BrokerLauncher
from metaq.client import Message, MessageSessionFactory
from metaq.client.group.dead_letter import dead_letter_headers

COMMAND_TIMEOUT_S = 600.0


async def _fill(servers: str, n: int) -> None:
    async with await MessageSessionFactory.connect(servers) as session:
        await session.admin().create_topic("orders", 4)
        await session.admin().create_topic("%DLQ%bench", 1)
        producer = session.create_producer()
        payload = b"x" * 1024
        template = Message("orders", payload, key=b"k", headers=[("trace", b"t")], partition=0, offset=0, id=0,
                           broker_id=0)
        batch: list[Message] = []
        for i in range(n):
            headers = dead_letter_headers(template, RuntimeError("poison"), 6)
            batch.append(Message("%DLQ%bench", payload, key=b"key-%d" % i, headers=headers))
            if len(batch) == 1000 or i == n - 1:
                if not (await producer.send_batch("%DLQ%bench", batch)).success:
                    raise BenchError("filling the dead-letter topic failed")
                batch = []
        await producer.flush()


def _metaq(*args: str) -> tuple[float, dict[str, Any]]:
    """Run ``metaq ARGS`` as a user would (a process of its own): (seconds, its JSON output)."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "metaq.cli.main", *args], capture_output=True, text=True,
                          timeout=COMMAND_TIMEOUT_S)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise BenchError(f"metaq {' '.join(args)} failed: {done.stderr.strip()}")
    return seconds, json.loads(done.stdout) if "--json" in args else {}


def run(count: int, rounds: int, report: Report, work_dir: str | None = None) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="metaq-bench-redrive-", dir=work_dir) as tmp, \
            BrokerLauncher(Path(tmp) / "broker", {"numPartitions": 4, "unflushThreshold": 0}) as broker:
        asyncio.run(_fill(broker.servers, count))
        s = ["-s", broker.servers]
        for n in range(1, rounds + 1):
            _metaq("group", "reset", "bench@dlq-redrive", "%DLQ%bench", "--to", "earliest", *s)
            dry_s, dry = _metaq("group", "redrive", "bench", "--dry-run", "--json", *s)
            real_s, real = _metaq("group", "redrive", "bench", "--json", *s)
            if not dry.get("total") == real.get("total") == count:
                raise BenchError(f"round {n}: {dry.get('total')} dead letters read, {real.get('total')} redriven, "
                                 f"{count} stored")
            runs.append({"round": n, "dry_run_s": round(dry_s, 3), "dry_run_msgs_per_s": round(count / dry_s),
                         "redrive_s": round(real_s, 3), "redrive_msgs_per_s": round(count / real_s)})
            report(f"round {n}: --dry-run {runs[-1]['dry_run_msgs_per_s']:,} msg/s, redrive "
                   f"{runs[-1]['redrive_msgs_per_s']:,} msg/s")
    return {"count": count, "runs": runs}


def table(result: dict[str, Any]) -> str:
    dry = [r["dry_run_msgs_per_s"] for r in result["runs"]]
    real = [r["redrive_msgs_per_s"] for r in result["runs"]]
    return markdown_table(["command", "msg/s, each round", "median"], [
        ["`metaq group redrive --dry-run` (reads only: the baseline)", each(dry), f"{median(dry):,.0f}"],
        ["`metaq group redrive` (reads, sends back, commits)", each(real), f"{median(real):,.0f}"]], right=[2])
