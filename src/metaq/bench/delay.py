"""`metaq bench delay`: delayed delivery (docs/delayed.md): send throughput of delayed against plain messages in the
same run, and how late the due messages are delivered with many pending.

One broker process (group commit, 4 partitions), 100-byte payloads, ``send_async`` with at most ``in_flight``
unacknowledged. Steps:

1. throughput: ``sends`` plain messages (the same-run baseline), then as many delayed ones (due an hour later,
   so none is delivered during the bench), then plain and delayed again: msg/s of each;
2. lateness: ``pending`` delayed messages due uniformly over ``window`` seconds, starting ``lead`` seconds after
   the sends began (each is sent before the first is due); the broker's RSS before and once all are pending;
   then every message is read back and its lateness is its append time minus its ``metaq.deliver-at`` (both the
   broker's clock): p50, p99, max; early ones (negative lateness) are counted (there must be none). With
   ``kill_restart`` the broker is killed -9 once all are pending and restarted first (the timer index is rebuilt
   from the delay logs): the restart time.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metaq.bench.processes import rss_mib
from metaq.bench.report import BenchError, Report, each, markdown_table
from metaq.broker.launcher import BrokerLauncher
from metaq.client import Message, MessageSessionFactory
from metaq.protocol.delayed import DELIVER_AT_HEADER, header_ms


@dataclass
class DelaySpec:
    sends: int = 200_000
    pending: int = 1_000_000
    window: int = 60
    """Seconds the due times are spread over."""
    lead: int = 60
    """Seconds from the start of the sends to the first due time."""
    in_flight: int = 20_000
    kill_restart: bool = False


def _check_sent(results: list[Any]) -> None:
    failed = [r for r in results if not r.success]
    if failed:
        raise BenchError(f"{len(failed)} sends failed, the first: {failed[0]}")


async def send_many(producer: Any, messages: list[Message], in_flight: int) -> float:
    started = time.perf_counter()
    pending: list[asyncio.Future[Any]] = []
    for msg in messages:
        pending.append(producer.send_async(msg))
        if len(pending) >= in_flight:
            results = await asyncio.gather(*pending)
            _check_sent(results)
            pending = []
    results = await asyncio.gather(*pending)
    _check_sent(results)
    return len(messages) / (time.perf_counter() - started)


async def stats(session: Any) -> dict[str, Any]:
    delayed: dict[str, Any] = (await session.admin().stats())["delayed"]
    return delayed


async def _send(args: DelaySpec, broker: BrokerLauncher) -> dict[str, Any]:
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
        out["rss_mb_before"] = round(rss_mib(pid), 1)
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
        out["rss_mb_pending"] = round(rss_mib(pid), 1)
        out["pending_when_sent"] = s["pending"]
        out["in_memory_when_sent"] = s["in_memory"]
        out["first_due_ms"] = first_due
        if args.kill_restart:
            await producer.close()
            return out
        await producer.close()
    return await deliveries(args, broker, out)


async def deliveries(args: DelaySpec, broker: BrokerLauncher, out: dict[str, Any]) -> dict[str, Any]:
    assert broker.proc is not None
    pid = broker.proc.pid
    async with await MessageSessionFactory.connect(broker.servers) as session:
        peak = out["rss_mb_pending"]
        deadline = time.monotonic() + args.lead + args.window + 300
        while (s := await stats(session))["delivered"] < args.pending:
            peak = max(peak, rss_mib(pid))
            if time.monotonic() > deadline:
                raise BenchError(f"the delayed messages were not all delivered in time: {s}")
            await asyncio.sleep(0.5)
        pending_left = s["pending"]
        out["rss_mb_peak_during_delivery"] = round(peak, 1)
        consumer = session.create_pull_consumer()
        lateness: list[int] = []
        early = 0
        for p in range(4):
            async for m in consumer.iterate("due", p, "earliest", stop_at_end=True):
                due = header_ms(m.headers, DELIVER_AT_HEADER)
                if due is None:
                    raise BenchError(f"a due message without its {DELIVER_AT_HEADER} header: {m}")
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


def run(spec: DelaySpec, report: Report, work_dir: str | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="metaq-bench-delay-", dir=work_dir) as tmp:
        broker = BrokerLauncher(Path(tmp) / "broker", {"numPartitions": 4, "unflushThreshold": 0})
        broker.start()
        try:
            report(f"sending {spec.sends:,} plain and {spec.sends:,} delayed messages, twice, then {spec.pending:,} "
                   f"due over {spec.window} s ...")
            result = asyncio.run(_send(spec, broker))
            report(f"send msg/s: plain {each(result['throughput_msg_s']['plain'])}, delayed "
                   f"{each(result['throughput_msg_s']['delayed'])}; {result['pending_when_sent']:,} pending, broker "
                   f"RSS {result['rss_mb_before']} -> {result['rss_mb_pending']} MiB")
            if spec.kill_restart:
                broker.kill()
                started = time.monotonic()
                broker.start()
                result["restart_after_kill_s"] = round(time.monotonic() - started, 2)
                if int(time.time() * 1000) >= result["first_due_ms"]:
                    result["warning"] = "the restart ended after the first due time: raise --lead"
                assert broker.proc is not None
                result["rss_mb_after_restart"] = round(rss_mib(broker.proc.pid), 1)
                report(f"killed -9 and restarted in {result['restart_after_kill_s']} s")
                result = asyncio.run(deliveries(spec, broker, result))
        finally:
            broker.stop()
    late = result["lateness_ms"]
    report(f"lateness ms: p50 {late['p50']}, p99 {late['p99']}, max {late['max']}; {result['early']} early")
    return result


def table(result: dict[str, Any]) -> str:
    t = result["throughput_msg_s"]
    late = result["lateness_ms"]
    rows = [["send msg/s, plain (the baseline)", each(t["plain"])], ["send msg/s, delayed", each(t["delayed"])],
            [f"lateness of {result['pending']:,} due over {result['window_s']} s, ms: p50 / p99 / p99.9 / max",
             f"{late['p50']} / {late['p99']} / {late['p999']} / {late['max']} ({result['early']} early)"],
            ["broker RSS MiB: before / all pending / peak while delivering",
             f"{result['rss_mb_before']} / {result['rss_mb_pending']} / {result['rss_mb_peak_during_delivery']}"]]
    if "restart_after_kill_s" in result:
        rows.append(["restart after kill -9 with everything pending", f"{result['restart_after_kill_s']} s"])
    if "warning" in result:
        rows.append(["warning", result["warning"]])
    return markdown_table(["measure", "each run"], rows)
