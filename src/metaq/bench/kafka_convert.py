"""`metaq bench kafka-convert`: the Kafka listener's record conversions in process (docs/kafka.md, "Storage:
converted, measured"): µs per message of checking a Kafka batch, converting it to a metaq batch, the core's own
check of the result, and converting a stored batch back for a Kafka fetch. One batch of ``messages`` records of
``size`` bytes built by kafka-python's encoder (the ``kafka-clients`` extra); the best of ``repeat`` timings.

The conversions run compiled where ``metaq._kafka_speedups`` is built; the same cases run again in a child process
with ``METAQ_NO_EXTENSIONS=1``: the Python reference, the same-run baseline of the compiled code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from metaq.bench.report import BenchError, Report, markdown_table

MAX_BYTES = 1 << 24
CASES = {"kafka_check": "produce: the Kafka batch's CRC and records checked",
         "to_metaq": "produce: converted to a metaq batch",
         "validate": "the core's check of the converted batch (validate_batch)",
         "to_kafka": "fetch: a stored batch converted to a Kafka batch"}


def kafka_batch(n: int, size: int) -> bytes:
    try:
        from kafka.record.default_records import DefaultRecordBatchBuilder
    except ImportError:
        raise BenchError("kafka-python is not installed: pip install 'metaq[kafka-clients]'") from None
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=MAX_BYTES)
    for i in range(n):
        b.append(i, timestamp=1_700_000_000_000, key=None, value=b"x" * size, headers=[])
    return bytes(b.build())


def per_message_us(fn: Callable[[], object], n: int, reps: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - start) / reps / n * 1e6)
    return round(best, 4)


def measure(messages: int, size: int, repeat: int) -> dict[str, Any]:
    """µs per message of each case, in this process (compiled or not, as it loaded)."""
    from metaq.protocol import records as mrec
    from metaq.protocol.kafka import records as kr

    raw = kafka_batch(messages, size)
    [batch] = list(kr.iter_kafka_batches(raw, MAX_BYTES))
    stored = bytearray(kr.to_metaq(batch))
    mrec.stamp(stored, 0, 1, 1)
    fetched = bytes(stored)
    reps = 300 if kr.COMPILED else 20
    return {"compiled": kr.COMPILED, "us_per_message": {
        "kafka_check": per_message_us(lambda: list(kr.iter_kafka_batches(raw, MAX_BYTES)), messages, reps, repeat),
        "to_metaq": per_message_us(lambda: kr.to_metaq(batch), messages, reps, repeat),
        "validate": per_message_us(lambda: mrec.validate_batch(fetched, MAX_BYTES, MAX_BYTES), messages, reps, repeat),
        "to_kafka": per_message_us(lambda: kr.to_kafka(fetched, 0), messages, reps, repeat)}}


def _reference(messages: int, size: int, repeat: int) -> dict[str, Any]:
    """The same cases in a child process without the compiled modules."""
    code = (f"import json; from metaq.bench.kafka_convert import measure; "
            f"print(json.dumps(measure({messages}, {size}, {repeat})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "METAQ_NO_EXTENSIONS": "1"})
    if done.returncode != 0:
        raise BenchError(f"the Python reference run failed: {done.stderr.strip()}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def run(messages: int, size: int, repeat: int, report: Report) -> dict[str, Any]:
    here = measure(messages, size, repeat)
    report("this process (" + ("compiled" if here["compiled"] else "not compiled") + "): "
           + ", ".join(f"{k} {v} µs" for k, v in here["us_per_message"].items()))
    runs = [here]
    if here["compiled"]:
        python = _reference(messages, size, repeat)
        report("Python reference: " + ", ".join(f"{k} {v} µs" for k, v in python["us_per_message"].items()))
        runs.append(python)
    return {"messages": messages, "size": size, "repeat": repeat, "runs": runs}


def table(result: dict[str, Any]) -> str:
    header = ["step", *("compiled µs/msg" if r["compiled"] else "Python µs/msg" for r in result["runs"])]
    rows = [[CASES[case], *(r["us_per_message"][case] for r in result["runs"])] for case in CASES]
    return (f"One batch of {result['messages']:,} records of {result['size']} B, the best of {result['repeat']}:\n\n"
            + markdown_table(header, rows, right=list(range(1, len(header)))))
