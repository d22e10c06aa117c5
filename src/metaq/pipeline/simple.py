"""The Spark-free demo (``python -m metaq.demo --simple``): an embedded broker, a producer and a consumer.

Starts a broker process on a free loopback port with its data under ``<data>/broker``, sends a few
thousand messages (ordered by key, with attributes), reads them back, and prints what happened. Useful
where Java (and so Spark) is not available.
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from pathlib import Path

from metaq.broker.launcher import BrokerLauncher
from metaq.client import Message, connect
from metaq.client.selectors import KeyHashSelector
from metaq.types import format_message_id


def run_simple(data: Path, messages: int = 20_000) -> int:
    shutil.rmtree(data, ignore_errors=True)
    print(f"starting an embedded broker (data in {data}/) ...")
    with BrokerLauncher(data / "broker", {"numPartitions": 4, "unflushThreshold": 0}) as broker:
        print(f"broker ready on {broker.servers}")
        with connect(broker.servers) as session:
            session.admin().create_topic("demo-orders", 4)
            producer = session.create_producer(selector=KeyHashSelector())
            t0 = time.perf_counter()
            futures = [producer.send_async(Message("demo-orders", f"order {i}".encode(),
                                                   attribute="vip" if i % 10 == 0 else "normal",
                                                   key=f"customer-{i % 50}".encode()))
                       for i in range(messages)]
            results = [f.result(60) for f in futures]
            elapsed = time.perf_counter() - t0
            ok = sum(r.success for r in results)
            print(f"sent {ok}/{len(results)} messages in {elapsed:.2f}s ({ok / elapsed:,.0f} msg/s); "
                  f"first id {format_message_id(results[0].message_id)}")

            consumer = session.create_pull_consumer()
            t0 = time.perf_counter()
            per_partition: Counter[str] = Counter()
            vip = 0
            for p in session.partitions("demo-orders"):
                for m in consumer.iterate("demo-orders", p, "earliest", stop_at_end=True):
                    per_partition[str(m.partition_id)] += 1
                    vip += m.attribute == "vip"
            elapsed = time.perf_counter() - t0
            total = sum(per_partition.values())
            print(f"read back {total} messages in {elapsed:.2f}s; per partition {dict(sorted(per_partition.items()))}; "
                  f"{vip} with attribute 'vip'")
            loc = session.admin().lookup_message(results[-1].message_id)
            print(f"message id {format_message_id(results[-1].message_id)} is {loc.topic}:{loc.partition_id}"
                  f"@{loc.offset}")
            if total != ok:
                print(f"ERROR: {ok} messages were acknowledged but {total} read back")
                return 1
        print("stopping the broker (SIGTERM: flush and close) ...")
    print("demo done")
    return 0
