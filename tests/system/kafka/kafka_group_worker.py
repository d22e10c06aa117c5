"""One member of a Kafka consumer group, for tests/system/kafka/test_kafka_groups.py: consumes ``topic`` in group
``group`` through the Kafka listener with one of three client libraries, appends ``partition offset value``
per message to ``out`` (flushed before the offsets are committed, so what is committed was recorded), and
commits synchronously after each batch. Runs until SIGTERM (then leaves the group) or kill -9.

    python kafka_group_worker.py confluent|kafka-python|aiokafka BOOTSTRAP TOPIC GROUP OUT
"""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Any

SESSION_TIMEOUT_MS = 6000
HEARTBEAT_MS = 500
stop = False


def on_term(*_: Any) -> None:
    global stop
    stop = True


def confluent(bs: str, topic: str, group: str, out: Any) -> None:
    import confluent_kafka as ck

    c = ck.Consumer({"bootstrap.servers": bs, "group.id": group, "auto.offset.reset": "earliest",
                     "enable.auto.commit": False, "session.timeout.ms": SESSION_TIMEOUT_MS,
                     "heartbeat.interval.ms": HEARTBEAT_MS, "partition.assignment.strategy": "range,roundrobin"})
    c.subscribe([topic])
    while not stop:
        msgs = c.consume(500, 0.2)
        good = [m for m in msgs if m.error() is None]
        if good:
            out.write("".join(f"{m.partition()} {m.offset()} {m.value().decode()}\n" for m in good))
            out.flush()
            try:
                c.commit(asynchronous=False)
            except ck.KafkaException:
                pass  # a rebalance took the partitions: their records are consumed again by their new owner
    c.close()


def kafka_python(bs: str, topic: str, group: str, out: Any) -> None:
    import kafka
    from kafka.errors import CommitFailedError

    c = kafka.KafkaConsumer(topic, bootstrap_servers=bs, group_id=group, auto_offset_reset="earliest",
                            enable_auto_commit=False, session_timeout_ms=SESSION_TIMEOUT_MS,
                            heartbeat_interval_ms=HEARTBEAT_MS)
    while not stop:
        batch = c.poll(200, max_records=500)
        records = [r for rs in batch.values() for r in rs]
        if records:
            out.write("".join(f"{r.partition} {r.offset} {r.value.decode()}\n" for r in records))
            out.flush()
            try:
                c.commit()
            except CommitFailedError:
                pass
    c.close()


def aiokafka(bs: str, topic: str, group: str, out: Any) -> None:
    import aiokafka as ak
    from aiokafka.errors import CommitFailedError

    async def run() -> None:
        c = ak.AIOKafkaConsumer(topic, bootstrap_servers=bs, group_id=group, auto_offset_reset="earliest",
                                enable_auto_commit=False, session_timeout_ms=SESSION_TIMEOUT_MS,
                                heartbeat_interval_ms=HEARTBEAT_MS)
        await c.start()
        try:
            while not stop:
                batch = await c.getmany(timeout_ms=200, max_records=500)
                records = [r for rs in batch.values() for r in rs]
                if records:
                    out.write("".join(f"{r.partition} {r.offset} {r.value.decode()}\n" for r in records))
                    out.flush()
                    try:
                        await c.commit()
                    except CommitFailedError:
                        pass
        finally:
            await c.stop()

    asyncio.run(run())


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, on_term)
    lib, bs, topic, group, path = sys.argv[1:6]
    with open(path, "a") as out:
        {"confluent": confluent, "kafka-python": kafka_python, "aiokafka": aiokafka}[lib](bs, topic, group, out)
