"""The Kafka listener's record conversions in-process (docs/kafka.md, "Storage: converted, measured"): µs per
message of checking a Kafka batch, converting it to a metaq batch (compiled and Python), the core's own check
of the result, and converting a stored batch back for a Kafka fetch. One 1,000-message batch of 100 B
records, built by kafka-python's encoder; best of five.

    python scripts/bench_kafka_convert.py
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from kafka.record.default_records import DefaultRecordBatchBuilder

from metaq.protocol import records as mrec
from metaq.protocol.kafka import records as kr

MAX = 1 << 24


def kafka_batch(n: int, size: int) -> bytes:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=MAX)
    for i in range(n):
        b.append(i, timestamp=1_700_000_000_000, key=None, value=b"x" * size, headers=[])
    return bytes(b.build())


def per_message_us(fn: Callable[[], object], n: int, reps: int) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - start) / reps / n * 1e6)
    return round(best, 4)


def main() -> None:
    n = 1000
    raw = kafka_batch(n, 100)
    [batch] = list(kr.iter_kafka_batches(raw, MAX))
    stored = bytearray(kr.to_metaq(batch))
    mrec.stamp(stored, 0, 1, 1)
    fetched = bytes(stored)
    print(f"compiled: {kr.COMPILED}; load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("produce: Kafka batch CRC check", per_message_us(lambda: list(kr.iter_kafka_batches(raw, MAX)), n, 300))
    print("produce: to a metaq batch", per_message_us(lambda: kr.to_metaq(batch), n, 300))
    print("core: validate_batch", per_message_us(lambda: mrec.validate_batch(fetched, MAX, MAX), n, 300))
    print("fetch: to a Kafka batch", per_message_us(lambda: kr.to_kafka(fetched, 0), n, 300))
    to_region, to_records = kr._records_to_region, kr._region_to_records
    kr._records_to_region = kr._region_to_records = None
    try:
        print("produce, Python: to a metaq batch", per_message_us(lambda: kr.to_metaq(batch), n, 20))
        print("fetch, Python: to a Kafka batch", per_message_us(lambda: kr.to_kafka(fetched, 0), n, 20))
    finally:
        kr._records_to_region, kr._region_to_records = to_region, to_records


if __name__ == "__main__":
    main()
