"""Client CPU per message of the producer's per-message calls, and what each part of it costs.

CPU time (``time.process_time``) of the client process, not wall time: on a machine shared with other
work it stays put where msg/s moves by half. Each mode runs in a fresh process against a fresh broker
(group commit, uvloop, 4 partitions): --rounds rounds of --count messages (100 B), each round the mode's
calls then ``flush()`` and reading every result; the median of the rounds. Modes are interleaved
--repeat times; the table gives the median of the repeats.

    async         send_async per message, then every future's result().success
    async-nogc    the same with the cyclic GC off during the round (what the collector costs)
    async-shared  the same, every future given one shared SendResult (what a SendResult per message costs)
    oneway        send_oneway per message
    many          send_async_many of the round's messages (one call), then the result's failures
    message       only building the round's Message objects (the caller's part of every mode)

--gc-stats adds, per mode, the cyclic GC's share: CPU time inside collections per message, and how many
collections of each generation ran per 40,000 messages (``gc.callbacks``; medians of the rounds).

    .venv/bin/python scripts/bench_send_cpu.py
    PYTHONPATH=/tmp/base/src .venv/bin/python scripts/bench_send_cpu.py --modes async,oneway   # code before
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MODES = ("message", "async", "async-nogc", "async-shared", "oneway", "many")


class _GcClock:
    """CPU time spent inside the cyclic GC's collections, and their count per generation (gc.callbacks)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.counts = [0, 0, 0]
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.process_time()
        else:
            self.seconds += time.process_time() - self._t0
            self.counts[info["generation"]] += 1

    def reset(self) -> None:
        self.seconds = 0.0
        self.counts = [0, 0, 0]


async def _rounds(servers: str, mode: str, count: int, rounds: int, gc_stats: bool = False
                  ) -> tuple[float, float, list[float]]:
    from metaq.client import Message, MessageSessionFactory

    async with await MessageSessionFactory.connect(servers) as session:
        producer = session.create_producer(batch_bytes=256 * 1024)
        await producer.send_batch("bench", [b"warm up"])
        payload = bytes(100)
        if mode == "async-shared":
            import metaq.client.producer.results as results_module
            from metaq.types import SendResult

            shared = SendResult(True, 0, 0, 0, None, "bench", 0)

            def one_result(waiters: list[Any], start: int, *_: Any) -> None:
                for w in waiters[start:]:
                    if w is not None and not w.done():
                        w.set_result(shared)

            results_module._resolve_ok = one_result  # type: ignore[assignment]
        samples = []
        gc_samples: list[float] = []
        gc_counts: list[list[int]] = []
        clock = _GcClock()
        if gc_stats:
            gc.callbacks.append(clock)
        for _ in range(rounds):
            clock.reset()
            t0 = time.process_time()
            if mode == "message":
                kept = [Message("bench", payload) for _ in range(count)]
                del kept
            elif mode in ("async", "async-nogc", "async-shared"):
                if mode == "async-nogc":
                    gc.disable()
                send = producer.send_async
                futures = [send(Message("bench", payload)) for _ in range(count)]
                await producer.flush()
                failed = sum(not f.result().success for f in futures)
                del futures
                gc.enable()
                if failed:
                    raise SystemExit(f"{failed} messages failed")
            elif mode == "oneway":
                send_oneway = producer.send_oneway
                for _ in range(count):
                    send_oneway(Message("bench", payload))
                await producer.flush()
            elif mode == "many":
                result = await producer.send_async_many([Message("bench", payload) for _ in range(count)])
                if result.failures:
                    raise SystemExit(f"{result.failures} messages failed")
            else:
                raise SystemExit(f"unknown mode {mode!r}")
            samples.append((time.process_time() - t0) / count * 1e6)
            gc_samples.append(clock.seconds / count * 1e6)
            gc_counts.append(clock.counts)
        if gc_stats:
            gc.callbacks.remove(clock)
        per_40k = [statistics.median(c[g] for c in gc_counts) * 40_000 / count for g in range(3)]
        return statistics.median(samples), statistics.median(gc_samples), per_40k


def run_one(mode: str, count: int, rounds: int, gc_stats: bool = False) -> tuple[float, float, list[float]]:
    import uvloop

    from metaq.broker.launcher import BrokerLauncher

    with tempfile.TemporaryDirectory() as data_dir:
        launcher = BrokerLauncher(Path(data_dir), {"unflushThreshold": 0, "event-loop": "uvloop"},
                                  config_text="[system]\nnumPartitions=1\n\n[topic=bench]\nnumPartitions=4\n")
        launcher.start()
        try:
            return uvloop.run(_rounds(launcher.servers, mode, count, rounds, gc_stats))
        finally:
            launcher.stop_or_kill(60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default=",".join(MODES), help="Comma-separated modes (see above).")
    parser.add_argument("-n", "--count", type=int, default=40_000, help="Messages per round.")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--repeat", type=int, default=3, help="Fresh processes per mode, interleaved.")
    parser.add_argument("--gc-stats", action="store_true", help="Also the GC's CPU time and collections.")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(args.one, args.count, args.rounds, args.gc_stats)))
        return 0
    modes = [m for m in args.modes.split(",") if m]
    got: dict[str, list[float]] = {m: [] for m in modes}
    gc_got: dict[str, list[tuple[float, list[float]]]] = {m: [] for m in modes}
    for _ in range(args.repeat):
        for mode in modes:
            out = subprocess.run([sys.executable, __file__, "--one", mode, "-n", str(args.count), "--rounds",
                                  str(args.rounds)] + (["--gc-stats"] if args.gc_stats else []),
                                 check=True, capture_output=True, text=True).stdout
            total, gc_us, per_40k = json.loads(out.strip().splitlines()[-1])
            got[mode].append(total)
            gc_got[mode].append((gc_us, per_40k))
    for mode in modes:
        runs = " ".join(f"{x:.2f}" for x in got[mode])
        line = f"{mode:13s} {statistics.median(got[mode]):.2f} us/msg client CPU  (runs: {runs})"
        if args.gc_stats:
            gc_us = statistics.median(g for g, _ in gc_got[mode])
            gens = "/".join(f"{statistics.median(c[g] for _, c in gc_got[mode]):.0f}" for g in range(3))
            line += f"  GC {gc_us:.2f} us/msg, collections gen0/1/2 per 40k msgs {gens}"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
