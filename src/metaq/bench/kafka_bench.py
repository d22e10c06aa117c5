"""`metaq bench kafka`: Kafka clients on the Kafka listener beside metaq's own clients, in one run, on one broker.

One embedded broker (kafkaPort=0) serves both protocols. Each round measures, in this order (pairs
interleaved, so that a change in the machine's load hits both sides of a pair alike):

1. ``native produce``: metaq's batch API (``send_batch``, 1000 messages a call, 16 in flight), as
   ``metaq bench produce`` measures it;
2. ``kafka produce``: a confluent-kafka (librdkafka) producer, ``produce()`` per message, acks=all,
   linger.ms=5, from the first call until ``flush()`` returns;
3. ``native consume``: metaq's per-message consumer (``PullConsumer.iterate``), as ``metaq bench consume
   --api iterate`` measures it (its own preloaded topic);
4. ``kafka consume``: a confluent-kafka consumer reading the messages of step 2 from the beginning,
   ``consume()`` in batches of 10,000, from the first message to the last.

Every client runs in a process of its own. Besides msg/s, the broker's CPU time per message over each
step (a steadier figure than msg/s on a shared machine, and the one the listener's own cost shows in), and
once per run the ceiling of confluent-kafka's Python ``produce()`` call with no broker at all.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from metaq.bench.client_bench import BenchSpec, run_bench
from metaq.bench.processes import process_cpu_s
from metaq.bench.report import BenchError, Report, markdown_table, quiet
from metaq.broker.launcher import BrokerLauncher

KAFKA_TIMEOUT_S = 300.0


@dataclass
class KafkaBenchRound:
    native_produce: float = 0.0
    kafka_produce: float = 0.0
    native_consume: float = 0.0
    kafka_consume: float = 0.0
    messages: dict[str, int] = field(default_factory=dict)
    """Messages each step sent or read (every one acknowledged, or read back)."""
    broker_cpu_us: dict[str, float] = field(default_factory=dict)
    """Broker CPU microseconds per message over each step (native-produce, kafka-produce, ...)."""


@dataclass
class KafkaBenchResult:
    count: int
    size: int
    partitions: int
    rounds: list[KafkaBenchRound]
    client_produce_ceiling: float
    """confluent-kafka ``produce()`` calls per second into its own queue, with no broker: the Python client's
    ceiling on this machine now."""
    load_average: tuple[float, float, float]


def _kafka_produce(bootstrap: str, topic: str, count: int, size: int, out: Any) -> None:
    import confluent_kafka as ck

    failures: list[Any] = []
    producer = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all",
                            "queue.buffering.max.messages": 2_000_000, "queue.buffering.max.kbytes": 2_000_000,
                            "delivery.report.only.error": True, "on_delivery": lambda err, _m: failures.append(err)})
    value = b"x" * size
    producer.list_topics(topic, timeout=30)  # the topic exists (auto-created) before the clock starts
    start = time.perf_counter()
    for _ in range(count):
        while True:
            try:
                producer.produce(topic, value)
                break
            except BufferError:
                producer.poll(0.01)
    left = producer.flush(KAFKA_TIMEOUT_S)
    seconds = time.perf_counter() - start
    out.put({"messages": count - left - len(failures), "seconds": seconds, "failures": len(failures) + left})


def _kafka_consume(bootstrap: str, topic: str, count: int, out: Any) -> None:
    import confluent_kafka as ck

    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{os.getpid()}",
                            "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    meta = consumer.list_topics(topic, timeout=30)
    consumer.assign([ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in meta.topics[topic].partitions])
    got = 0
    start = None
    deadline = time.monotonic() + KAFKA_TIMEOUT_S
    while got < count and time.monotonic() < deadline:
        msgs = consumer.consume(10_000, 1.0)
        if msgs and start is None:
            start = time.perf_counter()
        got += sum(1 for m in msgs if m.error() is None)
    seconds = time.perf_counter() - (start or time.perf_counter())
    consumer.close()
    out.put({"messages": got, "seconds": seconds})


def _client_ceiling(count: int, size: int, out: Any) -> None:
    import confluent_kafka as ck

    producer = ck.Producer({"bootstrap.servers": "127.0.0.1:9", "queue.buffering.max.messages": 2_000_000,
                            "queue.buffering.max.kbytes": 2_000_000, "message.timeout.ms": 600_000,
                            "log_level": 0})
    value = b"x" * size
    n = min(count, 1_000_000)
    start = time.perf_counter()
    for _ in range(n):
        producer.produce("ceiling", value)
    out.put({"rate": n / (time.perf_counter() - start)})
    producer.purge()


def _in_process(target: Any, *args: Any) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, out), daemon=True)
    proc.start()
    try:
        result: dict[str, Any] = out.get(timeout=KAFKA_TIMEOUT_S + 60)
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    return result


def run_kafka_bench(count: int, size: int, partitions: int, rounds: int, *, progress: bool = False,
                    report: Report = quiet) -> KafkaBenchResult:
    tmp = tempfile.TemporaryDirectory(prefix="metaq-bench-kafka-")
    broker = BrokerLauncher(os.path.join(tmp.name, "data"), {
        "numPartitions": partitions, "unflushThreshold": 0, "maxTransferSize": 1024 * 1024, "kafkaPort": 0}).start()
    try:
        assert broker.kafka_port is not None and broker.pid is not None
        bootstrap = f"127.0.0.1:{broker.kafka_port}"
        try:
            import confluent_kafka  # noqa: F401
        except ImportError:
            raise BenchError("confluent-kafka is not installed: pip install 'metaq[kafka-clients]'") from None
        ceiling = _in_process(_client_ceiling, count, size)["rate"]
        report(f"confluent-kafka produce() with no broker: {ceiling:,.0f} calls/s")
        say = report if not progress else lambda line: print(line, flush=True)
        out = [_round(r, broker, bootstrap, count, size, partitions, say) for r in range(rounds)]
        return KafkaBenchResult(count, size, partitions, out, round(ceiling, 1), os.getloadavg())
    finally:
        broker.stop()
        tmp.cleanup()


def _round(r: int, broker: BrokerLauncher, bootstrap: str, count: int, size: int, partitions: int,
           report: Report) -> KafkaBenchRound:
    rnd = KafkaBenchRound()
    pid = broker.pid or 0

    def step(name: str, fn: Any) -> float:
        before = process_cpu_s(pid)
        rate, messages = fn()
        after = process_cpu_s(pid)
        rnd.messages[name] = messages
        if before is not None and after is not None and messages:
            rnd.broker_cpu_us[name] = round((after - before) / messages * 1e6, 3)
        report(f"round {r + 1}: {name} {rate:,.0f} msg/s")
        return float(rate)

    def native(mode: str, api: str) -> tuple[float, int]:
        res = run_bench(BenchSpec(mode=mode, api=api, servers=broker.servers, count=count, size=size,
                                  partitions=partitions, concurrency=16, topic=f"native-{mode}-{r}"))
        return res.msgs_per_s, res.messages

    def kafka_produce() -> tuple[float, int]:
        res = _in_process(_kafka_produce, bootstrap, f"kafka-{r}", count, size)
        return res["messages"] / res["seconds"], res["messages"]

    def kafka_consume() -> tuple[float, int]:
        res = _in_process(_kafka_consume, bootstrap, f"kafka-{r}", count)
        return res["messages"] / max(res["seconds"], 1e-9), res["messages"]

    rnd.native_produce = step("native-produce", lambda: native("produce", "batch"))
    rnd.kafka_produce = step("kafka-produce", kafka_produce)
    rnd.native_consume = step("native-consume", lambda: native("consume", "iterate"))
    rnd.kafka_consume = step("kafka-consume", kafka_consume)
    return rnd


def table(result: dict[str, Any]) -> str:
    rows = [[i, f"{r['native_produce']:,.0f}", f"{r['kafka_produce']:,.0f}",
             f"{r['kafka_produce'] / r['native_produce']:.0%}" if r["native_produce"] else "",
             f"{r['native_consume']:,.0f}", f"{r['kafka_consume']:,.0f}",
             f"{r['kafka_consume'] / r['native_consume']:.0%}" if r["native_consume"] else "",
             " ".join(f"{k} {v}" for k, v in r["broker_cpu_us"].items())]
            for i, r in enumerate(result["rounds"], 1)]
    load = ", ".join(f"{x:.2f}" for x in result["load_average"])
    return (f"{result['size']} B messages, {result['partitions']} partitions, {result['count']:,} per step; load "
            f"average {load}; confluent-kafka produce() with no broker: {result['client_produce_ceiling']:,.0f} "
            "calls/s\n\n"
            + markdown_table(["round", "produce: metaq batch API (baseline)", "confluent-kafka", "of metaq",
                              "consume: metaq iterator (baseline)", "confluent-kafka", "of metaq",
                              "broker CPU µs/msg"], rows, right=[1, 2, 3, 4, 5, 6]))
