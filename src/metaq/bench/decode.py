"""`metaq bench decode`: the consumer's decode in process, no broker and no socket: a fetch reply to Messages or to
columns, in messages per second of this process's CPU time (not the wall clock: the figure holds on a shared
machine, where the wall-clock rates of the other benches move by tens of percent).

One reply of ``batches`` stored batches of ``per_batch`` messages of ``size`` bytes (about 1 MiB with the
defaults, what `metaq bench consume` fetches), decoded ``reps`` times, the result of one kept alive while the next
is decoded (as a consumer loop does):

- ``eager``: ``decode_fetched`` (a list of Messages per reply), every payload's length read;
- ``lazy``: ``decode_fetched_batches``, then each MessageBatch iterated one Message at a time (what
  ``PullConsumer.iterate`` does), every payload's length read;
- ``columns``: ``decode_fetched_batches``, every payload's length read from ``payloads`` (memoryviews);
- each again with a key and an attribute on every message (``keyed``).

Run it once with ``METAQ_NO_EXTENSIONS=1`` for the same cases without the compiled module.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable
from typing import Any

from metaq.bench.report import Report, markdown_table
from metaq.protocol import records as rec

_DATA = operator.attrgetter("data")


def reply(batches: int, per_batch: int, size: int, keyed: bool) -> bytes:
    """A fetch reply's records: ``batches`` stored batches, stamped as the broker stores them."""
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
    batches = rec.decode_fetched_batches(buf, "t", 0, 0, True, 0)[0]
    for batch in batches:
        for message in batch:
            n += 1
            len(message.data)
    return n, batches


def columns(buf: bytes) -> tuple[int, object]:
    n = 0
    batches = rec.decode_fetched_batches(buf, "t", 0, 0, True, 0)[0]
    for batch in batches:
        n += len(batch)
        sum(map(len, batch.payloads))
    return n, batches


Case = Callable[[bytes], tuple[int, object]]
CASES: dict[str, Case] = {"eager": eager, "lazy": lazy, "columns": columns}


def rate(fn: Case, buf: bytes, reps: int) -> float:
    """Messages per CPU second of this process over ``reps`` decodes of ``buf``."""
    fn(buf)  # warm up
    n = 0
    kept: object = None
    started = time.process_time()
    for _ in range(reps):
        count, kept = fn(buf)  # the previous reply's result lives until this one is decoded
        n += count
    del kept
    return n / (time.process_time() - started)


def run(batches: int, per_batch: int, size: int, reps: int, rounds: int, report: Report) -> dict[str, Any]:
    plain = reply(batches, per_batch, size, keyed=False)
    keyed = reply(batches, per_batch, size, keyed=True)
    runs: dict[str, list[float]] = {}
    for n in range(1, rounds + 1):
        for name, fn in CASES.items():
            for label, buf in ((name, plain), (f"{name}, keyed", keyed)):
                runs.setdefault(label, []).append(round(rate(fn, buf, reps)))
        report(f"round {n}: " + ", ".join(f"{label} {rates[-1] / 1e6:.2f}M" for label, rates in runs.items()))
    return {"batches": batches, "per_batch": per_batch, "size": size, "reply_bytes": len(plain), "reps": reps,
            "msgs_per_cpu_s": runs}


def table(result: dict[str, Any]) -> str:
    return (f"A reply of {result['batches']} batches x {result['per_batch']} messages of {result['size']} B "
            f"({result['reply_bytes']:,} bytes), decoded {result['reps']} times a round:\n\n"
            + markdown_table(["case", "M messages per CPU second, each round"],
                             [[label, " · ".join(f"{r / 1e6:.2f}" for r in rates)]
                              for label, rates in result["msgs_per_cpu_s"].items()]))
