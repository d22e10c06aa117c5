"""In-process baseline of the consumer's decode: a fetch reply -> Messages / columns, no broker, no socket.

    .venv/bin/python scripts/bench_decode.py [--batches 7] [--per-batch 1000] [--size 100] [--reps 100]

One reply of ``--batches`` stored batches (about 1 MiB with the defaults, what ``metaq bench consume``
fetches), decoded ``--reps`` times, the result of one kept alive while the next is decoded (as a consumer
loop does). Prints messages per second of this process's CPU time (not the wall clock: the figure
stays meaningful on a shared machine) of:

- ``eager``: ``decode_fetched`` (a list of Messages per reply), every payload's length read;
- ``lazy``: ``decode_fetched_batches`` then each MessageBatch iterated, one Message at a time (what
  ``PullConsumer.iterate`` does), every payload's length read;
- ``columns``: ``decode_fetched_batches``, every payload's length read from ``payloads`` (memoryviews);
- ``*_keyed``: the same with a key and an attribute on every message.

Runs against whatever ``metaq`` is importable (``PYTHONPATH=<other checkout>/src`` for a same-run
baseline); cases the code does not have are left out.
"""

from __future__ import annotations

import argparse
import operator
import time
from collections.abc import Callable

from metaq.protocol import records as rec

_DATA = operator.attrgetter("data")


def reply(batches: int, per_batch: int, size: int, keyed: bool) -> bytes:
    out = bytearray()
    offset = 0
    for b in range(batches):
        values = [bytes([(b + i) % 256]) * size for i in range(per_batch)]
        if keyed:
            raw = rec.encode_columns(values, [1000 + i for i in range(per_batch)],
                                     keys=[b"key-%d" % i for i in range(per_batch)], attributes=["attr"] * per_batch)
        else:
            raw = rec.encode_values(values, 1000)
        batch = bytearray(raw)
        rec.stamp(batch, offset, (1 << 70) + offset, 12345)
        offset += per_batch
        out += batch
    return bytes(out)


def eager(buf: bytes) -> tuple[int, object]:
    messages, _ = rec.decode_fetched(buf, "t", 0, 0, True, 0)
    sum(map(len, map(_DATA, messages)))
    return len(messages), messages


def lazy(buf: bytes) -> tuple[int, object]:
    n = 0
    batches = rec.decode_fetched_batches(buf, "t", 0, 0, True, 0)[0]  # type: ignore[attr-defined]
    for batch in batches:
        for message in batch:
            n += 1
            len(message.data)
    return n, batches


def columns(buf: bytes) -> tuple[int, object]:
    n = 0
    batches = rec.decode_fetched_batches(buf, "t", 0, 0, True, 0)[0]  # type: ignore[attr-defined]
    for batch in batches:
        n += len(batch)
        sum(map(len, batch.payloads))
    return n, batches


Case = Callable[[bytes], tuple[int, object]]


def rate(fn: Case, buf: bytes, reps: int) -> float:
    fn(buf)  # warm up
    n = 0
    kept: object = None
    started = time.process_time()  # CPU time: steadier than the wall clock on a shared machine
    for _ in range(reps):
        count, kept = fn(buf)  # the previous reply's result lives until this one is decoded
        n += count
    del kept
    return n / (time.process_time() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=7)
    parser.add_argument("--per-batch", type=int, default=1000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--reps", type=int, default=100)
    args = parser.parse_args()
    plain = reply(args.batches, args.per_batch, args.size, keyed=False)
    keyed = reply(args.batches, args.per_batch, args.size, keyed=True)
    cases: list[tuple[str, Case]] = [("eager", eager)]
    if hasattr(rec, "decode_fetched_batches"):
        cases += [("lazy", lazy), ("columns", columns)]
    results = []
    for name, fn in cases:
        results.append(f"{name}={rate(fn, plain, args.reps) / 1e6:.2f}M")
        results.append(f"{name}_keyed={rate(fn, keyed, args.reps) / 1e6:.2f}M")
    print(" ".join(results), "msg/s")


if __name__ == "__main__":
    main()
