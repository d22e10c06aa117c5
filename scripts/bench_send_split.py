"""Where send_async's client time goes: queueing a message against resolving its result.

One client process against a fresh broker (group commit, uvloop, 4 partitions): each round makes --count
``send_async`` calls in one event-loop step (the "queue" figure: Message, future, partition, batch; full
batches are encoded and written on the way), then awaits ``flush()`` (the "acks" figure: the replies
and one SendResult per future). Microseconds per message, median of the rounds. Bounded by --rounds.

    .venv/bin/python scripts/bench_send_split.py
    PYTHONPATH=/tmp/base/src .venv/bin/python scripts/bench_send_split.py     # the code before a change
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import uvloop

from metaq.broker.launcher import BrokerLauncher
from metaq.client import Message, MessageSessionFactory


async def measure(servers: str, count: int, rounds: int, size: int) -> tuple[float, float]:
    async with await MessageSessionFactory.connect(servers) as session:
        producer = session.create_producer(batch_bytes=256 * 1024)
        await producer.send_batch("bench", [b"warm up"])
        payload = bytes(size)
        queue_us, acks_us = [], []
        for _ in range(rounds):
            t0 = time.perf_counter()
            futures = [producer.send_async(Message("bench", payload)) for _ in range(count)]
            t1 = time.perf_counter()
            await producer.flush()
            t2 = time.perf_counter()
            failed = sum(not f.result().success for f in futures)
            if failed:
                raise SystemExit(f"{failed} messages failed")
            queue_us.append((t1 - t0) / count * 1e6)
            acks_us.append((t2 - t1) / count * 1e6)
        return statistics.median(queue_us), statistics.median(acks_us)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--count", type=int, default=40_000, help="send_async calls per round.")
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--size", type=int, default=100, help="Payload bytes.")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as data_dir:
        launcher = BrokerLauncher(Path(data_dir), {"unflushThreshold": 0, "event-loop": "uvloop"},
                                  config_text="[system]\nnumPartitions=1\n\n[topic=bench]\nnumPartitions=4\n")
        launcher.start()
        try:
            queue, acks = uvloop.run(measure(launcher.servers, args.count, args.rounds, args.size))
        finally:
            launcher.stop_or_kill(60)
    print(f"queue {queue:.2f} us/msg  flush+acks {acks:.2f} us/msg  total {queue + acks:.2f} us/msg")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
