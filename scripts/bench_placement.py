"""The producer's per-message placement in process, without the network: ``send_async`` / ``send_oneway`` of plain
100 B messages of one 8-partition topic into open batches (a full batch is recorded instead of sent); µs a message,
the Message(...) and the caller's list append included, the cyclic GC off while timed; best of ``--repeat`` runs.

    .venv/bin/python scripts/bench_placement.py [--count 200000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from typing import Any

from metaq.client.config import ClientConfig, ProducerConfig, build_config
from metaq.client.core import ClientCore
from metaq.client.metadata import Partition
from metaq.client.producer import Producer
from metaq.types import Message


async def run(count: int, repeat: int) -> None:
    core = ClientCore(ClientConfig(), [("127.0.0.1", 9)])  # never connected: nothing leaves the process
    payload = bytes(100)
    try:
        for api in ("async", "oneway"):
            runs = []
            for _ in range(repeat):
                p = Producer(core, build_config(ProducerConfig, {"batch_bytes": 256 * 1024,
                                                                 "max_buffered_bytes": 1 << 34}))
                sent: list[Any] = []
                p._sender.dispatch = sent.append  # type: ignore[method-assign, assignment]
                p._sender.busy = lambda key: True  # type: ignore[method-assign]
                p._placement.hot["t"] = tuple(Partition(0, i) for i in range(8))
                p._valid_topics.add("t")  # as after its first send
                send = p.send_async if api == "async" else p.send_oneway
                keep: list[Any] = []
                gc.collect()
                gc.disable()
                t0 = time.perf_counter()
                for _ in range(count):
                    keep.append(send(Message("t", payload)))
                p._placement.place_deferred()  # what the end of the loop step does
                runs.append((time.perf_counter() - t0) / count * 1e6)
                gc.enable()
                p._placement.acc.batches.clear()
                p._placement.hot.clear()
            print(f"{api:7}: {min(runs):.3f} µs/msg (runs {', '.join(f'{r:.3f}' for r in runs)})")
    finally:
        await core.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=200_000, help="Messages per run.")
    ap.add_argument("--repeat", type=int, default=5, help="Runs per API.")
    args = ap.parse_args()
    asyncio.run(run(args.count, args.repeat))


if __name__ == "__main__":
    main()
