"""Delayed delivery (docs/delayed.md): send throughput of delayed vs plain messages in the same run, and
lateness with many messages pending.

    .venv/bin/python scripts/bench_delay.py --sends 200000 --pending 1000000 --window 60

One broker process (this tree, group commit, 4 partitions). Steps:

1. throughput: ``--sends`` plain messages, then as many delayed ones (due an hour later, so none is
   delivered during the bench), then plain and delayed again; 100-byte payloads, ``send_async`` with
   at most ``--in-flight`` unacknowledged; msg/s of each run.
2. lateness: ``--pending`` delayed messages due uniformly over ``--window`` seconds, starting
   ``--lead`` seconds after the sends began (every one is sent before the first is due); the broker's
   RSS before and once all are pending; then every message is read back and its lateness is its
   append time minus its ``metaq.deliver-at`` (both the broker's clock): p50, p99, max; early ones
   (negative lateness) are counted (there must be none). With ``--kill-restart`` the broker is killed
   (-9) once all are pending and restarted (the timer index is rebuilt from the delay logs) first.

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from metaq.broker.launcher import BrokerLauncher
from metaq.client import Message, MessageSessionFactory
from metaq.protocol.delayed import DELIVER_AT_HEADER, header_ms


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return -1.0


async def send_many(producer: Any, messages: list[Message], in_flight: int) -> float:
    started = time.perf_counter()
    pending: list[asyncio.Future[Any]] = []
    for msg in messages:
        pending.append(producer.send_async(msg))
        if len(pending) >= in_flight:
            results = await asyncio.gather(*pending)
            assert all(r.success for r in results), [r for r in results if not r.success][:1]
            pending = []
    results = await asyncio.gather(*pending)
    assert all(r.success for r in results), [r for r in results if not r.success][:1]
    return len(messages) / (time.perf_counter() - started)


async def stats(session: Any) -> dict[str, Any]:
    delayed: dict[str, Any] = (await session.admin().stats())["delayed"]
    return delayed


async def main(args: argparse.Namespace, broker: BrokerLauncher) -> dict[str, Any]:
    assert broker.proc is not None
    pid = broker.proc.pid
    payload = b"x" * 100
    out: dict[str, Any] = {"sends": args.sends, "pending": args.pending, "window_s": args.window}
    async with await MessageSessionFactory.connect(broker.servers) as session:
        producer = session.create_producer()
        await producer.send(Message("plain", b"warm"))
        await producer.send(Message("later", b"warm", delay_ms=3_600_000))
        runs: dict[str, list[float]] = {"plain": [], "delayed": []}
        for _ in range(2):
            runs["plain"].append(await send_many(producer, [Message("plain", payload)] * args.sends, args.in_flight))
            later = int(time.time() * 1000) + 3_600_000
            runs["delayed"].append(await send_many(
                producer, [Message("later", payload, deliver_at=later) for _ in range(args.sends)], args.in_flight))
        out["throughput_msg_s"] = {k: [round(v) for v in vs] for k, vs in runs.items()}
        out["rss_mb_before"] = round(rss_mb(pid), 1)
        rng = random.Random(1)
        first_due = int(time.time() * 1000) + args.lead * 1000
        window_ms = args.window * 1000
        messages = [Message("due", payload, deliver_at=first_due + rng.randrange(window_ms))
                    for _ in range(args.pending)]
        rate = await send_many(producer, messages, args.in_flight)
        sent_at = int(time.time() * 1000)
        out["lateness_send_msg_s"] = round(rate)
        if sent_at >= first_due:
            out["warning"] = f"sending ended {sent_at - first_due} ms after the first due time: raise --lead"
        s = await stats(session)
        out["rss_mb_pending"] = round(rss_mb(pid), 1)
        out["pending_when_sent"] = s["pending"]
        out["in_memory_when_sent"] = s["in_memory"]
        out["first_due_ms"] = first_due
        if args.kill_restart:
            await producer.close()
            return out
        await producer.close()
    return await deliveries(args, broker, out)


async def deliveries(args: argparse.Namespace, broker: BrokerLauncher, out: dict[str, Any]) -> dict[str, Any]:
    assert broker.proc is not None
    pid = broker.proc.pid
    async with await MessageSessionFactory.connect(broker.servers) as session:
        peak = out["rss_mb_pending"]
        deadline = time.monotonic() + args.lead + args.window + 300
        while (s := await stats(session))["delivered"] < args.pending:
            peak = max(peak, rss_mb(pid))
            if time.monotonic() > deadline:
                raise SystemExit(f"not delivered in time: {s}")
            await asyncio.sleep(0.5)
        pending_left = s["pending"]
        out["rss_mb_peak_during_delivery"] = round(peak, 1)
        consumer = session.create_pull_consumer()
        lateness: list[int] = []
        early = 0
        for p in range(4):
            async for m in consumer.iterate("due", p, "earliest", stop_at_end=True):
                due = header_ms(m.headers, DELIVER_AT_HEADER)
                assert due is not None
                late = m.append_time_ms - due
                early += late < 0
                lateness.append(late)
        lateness.sort()
        n = len(lateness)
        out["delivered_read_back"] = n
        out["early"] = early
        out["lateness_ms"] = {"p50": lateness[n // 2], "p99": lateness[int(n * 0.99)], "p999": lateness[int(n * 0.999)],
                              "max": lateness[-1], "mean": round(statistics.fmean(lateness), 1)}
        out["broker_lateness_histogram"] = s["lateness"]
        out["pending_left"] = pending_left
    return out


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sends", type=int, default=200_000)
    parser.add_argument("--pending", type=int, default=1_000_000)
    parser.add_argument("--window", type=int, default=60, help="seconds the due times are spread over")
    parser.add_argument("--lead", type=int, default=60, help="seconds from the start of the sends to the first due")
    parser.add_argument("--in-flight", type=int, default=20_000)
    parser.add_argument("--kill-restart", action="store_true",
                        help="kill -9 the broker once everything is pending and restart it (recovery time; the "
                             "index is rebuilt from the delay logs), then measure the deliveries")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-delay-") as tmp:
        broker = BrokerLauncher(Path(tmp) / "broker", {"numPartitions": 4, "unflushThreshold": 0})
        broker.start()
        try:
            result = asyncio.run(main(args, broker))
            if args.kill_restart:
                broker.kill()
                started = time.monotonic()
                broker.start()
                result["restart_after_kill_s"] = round(time.monotonic() - started, 2)
                if int(time.time() * 1000) >= result["first_due_ms"]:
                    result["warning"] = "the restart ended after the first due time: raise --lead"
                assert broker.proc is not None
                result["rss_mb_after_restart"] = round(rss_mb(broker.proc.pid), 1)
                result = asyncio.run(deliveries(args, broker, result))
        finally:
            broker.stop()
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    cli()
