"""``make demo`` (``python -m metaq.demo``): log analytics on metaq and Spark, end to end, in about a minute.

1. An embedded broker (a ``metaq.broker`` process, data under ``<data>/broker``); with ``--brokers N`` a
   local cluster (a real ZooKeeper and N brokers in ZooKeeper mode, :class:`metaq.devcluster.DevCluster`,
   data under ``<data>/cluster``) that the events topic is spread over and Spark finds through
   ``zkConnect``; or ``--servers``.
2. Spark Structured Streaming (local[2]): windowed aggregates with a watermark -> the aggregates topic,
   and from there -> Parquet and a live table (see :mod:`metaq.spark.pipeline`). While the JVM starts and the
   first micro-batch runs (tens of seconds on a busy machine) a line every few seconds says so.
3. Once Spark has run its first micro-batch: a generator logging realistic web-access and application events
   through Python ``logging`` with a :class:`metaq.logging.MetaqHandler` into the events topic.
4. After ``--duration`` seconds of events, or on Ctrl-C: the generator stops, a punctuation record closes the
   last windows, the queries finish what arrived, and both sinks are read back and checked.

See docs/demo.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from metaq.broker.launcher import BrokerLauncher
from metaq.client import connect
from metaq.devcluster import DetachedBroker, DevCluster
from metaq.errors import TopicExistsError
from metaq.logging import MetaqHandler
from metaq.pipeline.generator import EventGenerator, LiveGenerator, log_event, punctuation
from metaq.pipeline.simple import run_simple
from metaq.pipeline.summary import (
    LivePrinter,
    RunTotals,
    by_kind,
    clock,
    delay_stats,
    group_windows,
    read_parquet,
    read_topic,
    say,
    self_check,
)
from metaq.types import PartitionId
from metaq.wording import plural

SPARK_PROGRESS_EVERY_S = 5.0
"""While Spark starts, how often the demo says it is still at it."""
SPARK_FIRST_BATCH_MAX_S = 300.0
"""The generator starts after Spark's first micro-batch, or after this long without one (with a warning)."""

DEMO_LOGGERS = ("web", "shop", "demo")
"""Parents of the generator's loggers; the handler is attached here (not to the root logger, which
would also ship py4j's and Spark's Python-side log records to the topic)."""

_EXPECTED_WARNINGS = "|".join((
    "Disabling AQE",                    # AQE is off for stateful queries anyway
    "Current batch is falling behind",  # micro-batches longer than the trigger while the JVM warms up
    "Snapshot Lag",                     # state snapshots not uploaded yet in a one-minute query
    "Failed to cancel job group",       # a query stopped between two micro-batches
))
LOG4J2_PROPERTIES = f"""\
# Spark's JVM logging for the demo: warnings and errors only, without the start-up chatter and without
# warnings that are expected in a short local run.
rootLogger.level = warn
rootLogger.appenderRef.console.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{HH:mm:ss}} %p %c{{1}}: %m%n%ex
appender.console.filter.expected.type = RegexFilter
appender.console.filter.expected.regex = .*({_EXPECTED_WARNINGS}).*
appender.console.filter.expected.onMatch = DENY
appender.console.filter.expected.onMismatch = NEUTRAL
logger.hostname.name = org.apache.spark.util.Utils
logger.hostname.level = error
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = error
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m metaq.demo",
                                description="Log analytics on metaq and Spark: generator -> MetaqHandler -> metaq "
                                            "-> Spark Structured Streaming -> metaq + Parquet (docs/demo.md).")
    p.add_argument("--duration", type=float, default=75.0,
                   help="seconds the generator runs, from when Spark is ready, before the demo winds down "
                        "(default 75)")
    p.add_argument("--window", type=int, default=10,
                   help="aggregation window in seconds (default 10, so that results show within the demo; "
                        "60 for per-minute figures, with a longer --duration)")
    p.add_argument("--watermark", type=int, default=10,
                   help="seconds an event may arrive late; a window is written once the watermark passes its end "
                        "(default 10)")
    p.add_argument("--rate", type=float, default=150.0, help="mean events per second (default 150)")
    p.add_argument("--seed", type=int, default=None, help="random seed of the generator (default: from the clock)")
    p.add_argument("--trigger", default="1 second", help="micro-batch interval of both queries (default '1 second')")
    p.add_argument("--data", default="demo-data",
                   help="working directory, wiped first: broker data, checkpoints, parquet/ (default ./demo-data)")
    p.add_argument("--servers", default=None,
                   help="use this running broker (host:port[,...]) instead of starting one")
    p.add_argument("--brokers", type=int, default=None,
                   help="start a local cluster instead of one embedded broker: ZooKeeper and this many brokers "
                        "(ZooKeeper mode); the events topic gets --partitions on each of them")
    p.add_argument("--topic", default="demo-logs", help="events topic (default demo-logs)")
    p.add_argument("--output-topic", default="demo-aggregates", help="aggregates topic (default demo-aggregates)")
    p.add_argument("--partitions", type=int, default=2, help="partitions of the events topic (default 2)")
    p.add_argument("--simple", action="store_true",
                   help="the Spark-free demo instead: a producer and a consumer on an embedded broker")
    args = p.parse_args(argv)
    if args.window < 1 or args.watermark < 0 or args.rate <= 0 or args.duration <= 0:
        p.error("--window, --rate and --duration must be positive, --watermark >= 0")
    if args.brokers is not None and not 1 <= args.brokers <= 16:
        p.error("--brokers must be 1 to 16")
    if args.brokers is not None and args.servers:
        p.error("--brokers starts a cluster; --servers uses a running one: give one of them")
    return args


def java_available() -> bool:
    home = os.environ.get("JAVA_HOME")
    return bool(shutil.which("java") or (home and Path(home, "bin", "java").exists()))


def prepare_topics(servers: str, topics: dict[str, tuple[int, bool]]) -> dict[str, dict[PartitionId, int]]:
    """Create the topics if needed, each with (partitions, on every broker?); returns their current end
    offsets (where this run starts reading)."""
    out: dict[str, dict[PartitionId, int]] = {}
    with connect(servers) as session:
        admin = session.admin()
        every_broker = admin.broker_ids()
        for topic, (partitions, spread) in topics.items():
            for broker_id in every_broker if spread else [None]:
                try:
                    admin.create_topic(topic, partitions, broker_id=broker_id)
                except TopicExistsError:
                    pass
            out[topic] = {d.partition.id: d.latest for d in admin.describe_topic(topic).partitions}
    return out


def offsets_json(topic: str, offsets: dict[PartitionId, int]) -> str:
    return json.dumps({topic: {str(p): o for p, o in sorted(offsets.items())}})


class Interrupts:
    """First Ctrl-C: wind down gracefully. Second: KeyboardInterrupt (quit now, best-effort cleanup)."""

    def __init__(self, on_first: Callable[[], None]) -> None:
        self.count = 0
        self.on_first = on_first
        self._previous: Any = None

    def __enter__(self) -> Interrupts:
        self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def reinstall(self) -> None:
        """Take SIGINT back: creating a SparkContext installs its own handler (cancel jobs, raise)."""
        signal.signal(signal.SIGINT, self._handle)

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._previous)

    def _handle(self, signum: int, frame: types.FrameType | None) -> None:
        self.count += 1
        if self.count > 1:
            raise KeyboardInterrupt
        self.on_first()


class Demo:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.data = Path(args.data).resolve()
        self.t0 = time.monotonic()
        self.generator_t0: float | None = None
        """When the generator started (after Spark's first micro-batch): --duration counts from here."""
        self.stop_reason: str | None = None
        self.broker: BrokerLauncher | None = None
        self.cluster: DevCluster | None = None
        self.handler: MetaqHandler | None = None
        self.live: LiveGenerator | None = None
        self.spark: Any = None
        self.queries: list[Any] = []
        self._printer = LivePrinter()
        self.interrupts = Interrupts(self.request_stop)

    def elapsed(self) -> str:
        return f"[{time.monotonic() - self.t0:5.1f}s]"

    def log(self, text: str) -> None:
        say(f"{self.elapsed()} {text}")

    def request_stop(self) -> None:
        if self.stop_reason is None:
            self.stop_reason = "Ctrl-C"
            say(f"\n{self.elapsed()} Ctrl-C: stopping the generator and finishing what arrived "
                "(Ctrl-C again to quit at once)")

    def run(self) -> int:
        with self.interrupts:
            try:
                return self._run()
            finally:
                self._cleanup()

    def _run(self) -> int:
        args = self.args
        shutil.rmtree(self.data, ignore_errors=True)
        self.data.mkdir(parents=True)
        if args.servers:
            servers = args.servers
            self.log(f"using the broker at {servers}")
        elif args.brokers is not None:
            self.log(f"starting ZooKeeper and {args.brokers} broker(s) in ZooKeeper mode ...")
            self.cluster = DevCluster(self.data / "cluster", args.brokers, partitions=args.partitions).start()
            servers = self.cluster.servers
            self.log(f"cluster ready: ZooKeeper {self.cluster.zk_connect}, brokers "
                     + ", ".join(f"{b.broker_id} on {b.address}" for b in self.cluster.info())
                     + f" (data in {self._rel(self.data / 'cluster')}/)")
        else:
            self.broker = DetachedBroker(self.data / "broker", {"numPartitions": args.partitions,
                                                                "unflushThreshold": 0}).start()
            servers = self.broker.servers
            self.log(f"broker ready on {servers} (data in {self._rel(self.data / 'broker')}/)")
        start = prepare_topics(servers, {args.topic: (args.partitions, True), args.output_topic: (1, False)})

        self._start_spark(servers, start)
        if self.stop_reason is not None:
            return 130  # Ctrl-C before any event was generated: nothing to check

        seed = args.seed if args.seed is not None else int(time.time()) % 100_000
        self.handler = handler = MetaqHandler(servers, args.topic, key_func=lambda r: str(getattr(r, "seq", "")))
        for name in DEMO_LOGGERS:
            lg = logging.getLogger(name)
            lg.setLevel(logging.DEBUG)
            lg.propagate = False
            lg.addHandler(handler)
        gen = EventGenerator(seed, rate=args.rate, start=time.time())
        self.live = live = LiveGenerator(gen).start()
        self.generator_t0 = time.monotonic()
        self.log(f"generator started: ~{args.rate:.0f} events/s (seed {seed}) -> logging -> MetaqHandler -> "
                 f"topic {args.topic!r}")
        self.log(f"a window is printed once the watermark passes its end: expect the first in about "
                 f"{args.window + args.watermark + 5}s")
        printer = self._printer
        while self.stop_reason is None:
            if self._wait(min(5.0, self._left())):
                break
            if self._left() <= 0:
                self.stop_reason = f"--duration {args.duration:g}s reached"
                break
            self._check_queries()
            self._status()

        # -- wind down --------------------------------------------------------------------------
        self.log(f"stopping ({self.stop_reason}): generator off, closing the last windows")
        live.stop()
        last_ts = live.stats.last_ts or time.time()
        punct_ts = last_ts + args.window + args.watermark + 1
        log_event(punctuation(punct_ts, gen.next_seq()))
        printer.shutdown_at = time.time()
        if not handler.drain(15):
            self.log(f"warning: {handler.pending} log record(s) still not sent to the broker")
        agg_rows = 0
        if self.queries:
            agg_q, archive_q = self.queries
            from metaq.spark import pipeline as sp

            target_ms = int((punct_ts - args.watermark) * 1000) - 1
            deadline = time.monotonic() + 60
            while (sp.watermark_ms(agg_q) or 0) < target_ms:
                self._check_queries()
                if time.monotonic() > deadline:
                    self.log("warning: the aggregation did not close the last windows within 60 s")
                    break
                time.sleep(0.2)
            archive_q.processAllAvailable()
            agg_rows = sp.total_input_rows(agg_q)
            agg_batches = len(agg_q.recentProgress)
            for q in self.queries:
                q.stop()
            self.queries = []
        else:
            agg_batches = 0
        return self._final_summary(servers, start, agg_rows, agg_batches)

    def _start_spark(self, servers: str, start: dict[str, dict[PartitionId, int]]) -> None:
        """Start both queries and wait for the aggregation's first micro-batch, saying every few seconds what
        Spark is doing: the generator starts only then, so the windows are printed while it runs (on a busy
        machine the JVM and the first micro-batch take a minute)."""
        self.log("starting Spark (local[2]; the JVM and the first micro-batch take 10-20 s, more on a busy "
                 "machine); the generator starts once Spark is ready ...")
        phase = ["starting the JVM and the Spark session"]
        done = threading.Event()

        def tick() -> None:
            while not done.wait(SPARK_PROGRESS_EVERY_S):
                self.log(f"still starting Spark: {phase[0]} ...")

        ticker = threading.Thread(target=tick, name="demo-spark-progress", daemon=True)
        ticker.start()
        try:
            self._start_queries(servers, start, phase)
        finally:
            done.set()
            ticker.join()

    def _start_queries(self, servers: str, start: dict[str, dict[PartitionId, int]], phase: list[str]) -> None:
        args = self.args
        from metaq.spark import pipeline as sp

        brokers: dict[str, Any] = {"servers": servers}
        if self.cluster is not None:  # Spark finds the brokers in ZooKeeper
            brokers = {"zk_connect": self.cluster.zk_connect, "zk_root": self.cluster.zk_root}
        log4j = self.data / "log4j2.properties"
        log4j.write_text(LOG4J2_PROPERTIES)
        self.spark = sp.build_session("metaq-demo", log4j_config=str(log4j))
        self.interrupts.reinstall()
        phase[0] = "starting the queries"
        ck = self.data / "checkpoints"
        agg_q = sp.start_aggregation(
            self.spark, **brokers, topic=args.topic, output_topic=args.output_topic,
            checkpoint=str(ck / "aggregate"), window=f"{args.window} seconds", watermark=f"{args.watermark} seconds",
            trigger=args.trigger, starting_offsets=offsets_json(args.topic, start[args.topic]))
        archive_q = sp.start_archive(
            self.spark, **brokers, output_topic=args.output_topic, parquet_dir=str(self.data / "parquet"),
            checkpoint=str(ck / "archive"), trigger=args.trigger, on_batch=self._printer,
            starting_offsets=offsets_json(args.output_topic, start[args.output_topic]))
        self.queries = [agg_q, archive_q]
        phase[0] = "running the first micro-batch (it plans and compiles the queries)"
        deadline = time.monotonic() + SPARK_FIRST_BATCH_MAX_S
        while not agg_q.recentProgress and self.stop_reason is None:
            self._check_queries()
            if time.monotonic() > deadline:
                self.log(f"warning: no micro-batch within {SPARK_FIRST_BATCH_MAX_S:.0f}s; starting the generator "
                         "anyway (Spark reads its events when it gets there)")
                break
            self._wait(0.2)
        self.log(f"Spark ready; query 'aggregate': {args.topic} -> {args.window}s windows, {args.watermark}s watermark "
                 f"-> {args.output_topic}; query 'archive': {args.output_topic} -> "
                 f"{self._rel(self.data / 'parquet')}/ + the table below")

    def _left(self) -> float:
        return self.args.duration - (time.monotonic() - (self.generator_t0 or time.monotonic()))

    def _wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True when a stop was requested meanwhile."""
        end = time.monotonic() + max(seconds, 0)
        while time.monotonic() < end:
            if self.stop_reason is not None:
                return True
            time.sleep(0.1)
        return self.stop_reason is not None

    def _check_queries(self) -> None:
        for q in self.queries:
            if not q.isActive:
                exc = q.exception()
                raise RuntimeError(f"Spark query {q.name!r} stopped: {exc}")

    def _status(self) -> None:
        assert self.live is not None and self.handler is not None
        stats = self.handler.stats()
        text = f"generated {self.live.stats.events:,} events | handler: {stats.sent:,} sent, {stats.pending:,} pending"
        if self.queries:
            from metaq.spark import pipeline as sp

            agg_q = self.queries[0]
            wm = sp.watermark_ms(agg_q)
            progress = agg_q.recentProgress
            text += f" | Spark read {sp.total_input_rows(agg_q):,} in {len(progress)} micro-batches"
            if wm:
                text += f", watermark {clock(wm / 1000)}"
        self.log(text)

    def _rel(self, path: Path) -> str:
        try:
            return str(path.relative_to(Path.cwd()))
        except ValueError:
            return str(path)

    def _final_summary(self, servers: str, start: dict[str, dict[PartitionId, int]], spark_rows: int,
                       spark_batches: int) -> int:
        args = self.args
        assert self.live is not None and self.handler is not None
        gs = self.live.stats
        hs = self.handler.stats()
        with connect(servers) as session:
            desc = session.admin().describe_topic(args.topic)
        per_broker: dict[int, int] = {}
        for d in desc.partitions:
            per_broker[d.partition.broker_id] = (per_broker.get(d.partition.broker_id, 0) + d.latest
                                                 - start[args.topic].get(d.partition.id, 0))
        stored = sum(per_broker.values())
        topic_back = read_topic(servers, args.output_topic, start[args.output_topic])
        parquet_back = read_parquet(self.data / "parquet")
        windows = group_windows(topic_back.rows)
        counted = sum(ws.requests for ws in windows)
        requests = gs.by_kind["access"]
        span = max(gs.last_ts - gs.first_ts, 1e-9)
        delays = delay_stats(windows, written_before=self._printer.shutdown_at)

        say("")
        say(f"== summary ({self.stop_reason}, {time.monotonic() - self.t0:.0f}s in all) ==")
        say(f"events generated   {gs.events:,} ({requests:,} requests, {gs.by_kind['app']:,} application lines) "
            f"in {span:.1f}s, {gs.events / span:,.0f}/s")
        say(f"MetaqHandler       {hs.sent:,} records sent (the events and 1 punctuation record), {hs.dropped} dropped, "
            f"{hs.pending} pending")
        spread = ""
        if len(per_broker) > 1:
            spread = " over brokers " + ", ".join(f"{b}: {n:,}" for b, n in sorted(per_broker.items()))
        say(f"events topic       {plural(stored, 'message', thousands=True)} in {args.topic!r}{spread}")
        if spark_batches:
            say(f"Spark read         {spark_rows:,} events in {spark_batches} micro-batches of query 'aggregate'")
        kinds = by_kind(topic_back.rows)
        say(f"aggregates topic   {len(topic_back.rows):,} rows in {args.output_topic!r} for {len(windows)} windows "
            f"({', '.join(f'{n} {k}' for k, n in kinds.items())}); {topic_back.duplicates} duplicate(s)")
        same = parquet_back.keys == topic_back.keys
        say(f"Parquet            {len(parquet_back.rows):,} rows in {parquet_back.files} file(s) under "
            f"{self._rel(self.data / 'parquet')}/; same rows as the topic: {'yes' if same else 'NO'}")
        say(f"requests counted   {counted:,} of {requests:,} generated"
            + (" (every window closed and written)" if counted == requests else ""))
        if delays:
            n = int(delays["count"])
            say(f"end-to-end delay   log call -> aggregate row in {args.output_topic!r}, {n} windows "
                f"closed while the generator ran: median {delays['median']:.1f}s, p95 {delays['p95']:.1f}s, "
                f"max {delays['max']:.1f}s (min {delays['min']:.1f}s; the {args.watermark}s watermark is part of it)")
        else:
            say("end-to-end delay   no window was closed while the generator ran (run longer: --duration)")
        problems = self_check(RunTotals(requests, counted, spark_rows, spark_batches, same))
        for p in problems:
            say(f"PROBLEM: {p}")
        return 1 if problems else 0

    def _cleanup(self) -> None:
        for q in self.queries:
            try:
                q.stop()
            except Exception:
                pass
        if self.live is not None:
            self.live.stop(1)
        if self.spark is not None:
            self.log("stopping Spark ...")
            try:
                self.spark.stop()
            except Exception:
                pass
        if self.handler is not None:
            for name in DEMO_LOGGERS:
                logging.getLogger(name).removeHandler(self.handler)
            self.handler.close(timeout=2)
        if self.broker is not None:
            self.log("stopping the broker (SIGTERM: flush and close) ...")
            self.broker.stop_or_kill(15)
        if self.cluster is not None:
            self.log("stopping the brokers (SIGTERM: deregister, flush and close), then ZooKeeper ...")
            self.cluster.stop()
        self.log(f"demo done; results in {self._rel(self.data / 'parquet')}/ and topic {self.args.output_topic!r}"
                 if self.stop_reason and self.live is not None else "demo ended")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.simple:
        return run_simple(Path(args.data))
    if not java_available():
        say("The Spark demo needs Java 17 (no 'java' on PATH and no JAVA_HOME). Install a JDK, or run the "
            "Spark-free demo: python -m metaq.demo --simple")
        return 2
    try:
        return Demo(args).run()
    except KeyboardInterrupt:
        say("interrupted")
        return 130
