"""`metaq bench peers|http|kafka|kafka-convert|logging|spark|connect|startup|goals`: metaq beside other systems, its
other protocols and its client libraries, the CLI's start-up, and the performance goals."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import click

from metaq.bench.report import Report
from metaq.cli.bench_common import comma_list, json_option, run_and_print, work_dir_option


@click.command("peers")
@click.option("--systems", default="metaq,redis-4,metaq-1,metaq-sticky,redis,nats,relay,metaq-sync,redis-always",
              show_default=True, callback=comma_list(("metaq", "metaq-sticky", "metaq-1", "metaq-sync", "redis",
                                                      "redis-4", "redis-always", "nats", "relay")),
              help="Systems, in the order each round runs them: metaq (4 partitions, round robin), metaq-sticky, "
                   "metaq-1 (one partition), metaq-sync (--flush sync); redis (one stream), redis-4 (four streams "
                   "round robin), redis-always (appendfsync always); nats (JetStream); relay (a bare Python relay, "
                   "the floor under a Python broker).")
@click.option("--pacing", "pacings", default="tick,even", show_default=True, callback=comma_list(("tick", "even")),
              help="tick: what is due every millisecond, sent together; even: each message at its own time.")
@click.option("--rounds", type=click.IntRange(1), default=3, show_default=True)
@click.option("--rate", type=click.IntRange(1), default=5000, show_default=True, help="Messages per second offered.")
@click.option("-d", "--duration", "duration_s", type=click.FloatRange(0.1), default=8.0, show_default=True,
              help="Seconds of each run.")
@click.option("--size", type=click.IntRange(8), default=100, show_default=True, help="Message payload bytes.")
@json_option
def bench_peers(as_json: bool, **kwargs: Any) -> None:
    """End-to-end latency of metaq beside Redis Streams, NATS JetStream and a bare Python relay, interleaved, under
    the same offered load (needs redis-server and nats-server, and pip install 'metaq[peers]')."""
    from metaq.bench import peers

    run_and_print(as_json, lambda report: peers.run(report=report, **kwargs), peers.table)


@click.command("http")
@click.option("--url", default=None, help="The HTTP API to measure (http://host:port); default: an embedded broker "
                                          "with httpPort 0 for the run.")
@click.option("--api", type=click.Choice(["single", "batch", "raw"]), default="single", show_default=True,
              help="single: one JSON message per request; batch: --batch messages per JSON request; raw: one "
                   "application/octet-stream message per request.")
@click.option("--batch", type=click.IntRange(1), default=100, show_default=True, help="Messages per request (batch).")
@click.option("--size", type=click.IntRange(1), default=100, show_default=True, help="Message payload bytes.")
@click.option("-n", "--count", type=click.IntRange(1), default=100_000, show_default=True)
@click.option("-d", "--duration", "duration_s", type=click.FloatRange(0.1), default=30.0, show_default=True)
@click.option("--concurrency", type=click.IntRange(1, 1024), default=16, show_default=True,
              help="Requests in flight per process (keep-alive connections).")
@click.option("--processes", type=click.IntRange(1, 64), default=1, show_default=True, help="Client processes.")
@click.option("--partitions", type=click.IntRange(1), default=4, show_default=True)
@click.option("--flush", default="group", show_default=True, help="Embedded broker's unflushThreshold.")
@json_option
def bench_http(as_json: bool, **kwargs: Any) -> None:
    """Produce throughput over the HTTP API (docs/http.md) with keep-alive clients."""
    from metaq.bench.http_bench import HttpBenchSpec, run_http_bench, table

    run_and_print(as_json, lambda report: asdict(run_http_bench(HttpBenchSpec(**kwargs))), table)


@click.command("kafka")
@click.option("-n", "--count", type=click.IntRange(1), default=1_000_000, show_default=True,
              help="Messages each step sends or reads.")
@click.option("--size", type=click.IntRange(1), default=100, show_default=True, help="Message payload bytes.")
@click.option("--partitions", type=click.IntRange(1), default=4, show_default=True)
@click.option("--rounds", type=click.IntRange(1), default=3, show_default=True,
              help="Rounds of the four steps, interleaved (native produce, kafka produce, native consume, "
                   "kafka consume).")
@json_option
def bench_kafka(count: int, size: int, partitions: int, rounds: int, as_json: bool) -> None:
    """confluent-kafka on the Kafka listener beside metaq's batch producer and per-message consumer (the
    baselines), same run, one embedded broker (docs/kafka.md)."""
    from metaq.bench.kafka_bench import run_kafka_bench, table

    run_and_print(as_json, lambda report: asdict(run_kafka_bench(count, size, partitions, rounds, progress=False,
                                                                 report=report)), table)


@click.command("kafka-convert")
@click.option("--messages", type=click.IntRange(1), default=1000, show_default=True, help="Records in the batch.")
@click.option("--size", type=click.IntRange(1), default=100, show_default=True, help="Record value bytes.")
@click.option("--repeat", type=click.IntRange(1), default=5, show_default=True, help="Timings; the best is kept.")
@json_option
def bench_kafka_convert(as_json: bool, messages: int, size: int, repeat: int) -> None:
    """The Kafka listener's record conversions in process, µs per message, compiled beside the Python reference
    (needs kafka-python: pip install 'metaq[kafka-clients]')."""
    from metaq.bench import kafka_convert

    run_and_print(as_json, lambda report: kafka_convert.run(messages, size, repeat, report), kafka_convert.table)


@click.command("logging")
@click.option("-s", "--servers", default=None, help="Broker to log to; default: an embedded broker for the run.")
@click.option("-n", "--count", type=click.IntRange(1), default=100_000, show_default=True,
              help="Records logged in each case.")
@json_option
def bench_logging(servers: str | None, count: int, as_json: bool) -> None:
    """metaq.logging.MetaqHandler: what a logging call costs the application, broker up and broker down."""
    from metaq.bench import logging_bench

    run_and_print(as_json, lambda report: logging_bench.run(servers, count, report), logging_bench.table)


@click.command("spark")
@click.option("-s", "--servers", default=None, help="Broker to measure; default: an embedded broker for the run.")
@click.option("--rows", type=click.IntRange(1), default=2_000_000, show_default=True)
@click.option("--size", type=click.IntRange(1), default=100, show_default=True, help="Message payload bytes.")
@click.option("--partitions", type=click.IntRange(1), default=4, show_default=True)
@click.option("--repeat", type=click.IntRange(1), default=3, show_default=True,
              help="Timed runs of each case (after one warm-up run).")
@click.option("--master", default="local[2]", show_default=True, help="Spark's master.")
@click.option("--stream-batch-rows", type=click.IntRange(1), default=250_000, show_default=True,
              help="maxOffsetsPerTrigger of the streaming copies.")
@click.option("--cases", default="batch-read,stream-read,batch-write,keyed-write,copy-at-least-once,"
                                 "copy-exactly-once", show_default=True,
              callback=comma_list(("batch-read", "stream-read", "batch-write", "keyed-write", "copy-at-least-once",
                                   "copy-exactly-once")),
              help="Which cases: reads into Spark's noop sink, writes from spark.range, streaming copies through "
                   "the sink at-least-once and exactly-once.")
@json_option
def bench_spark(as_json: bool, **kwargs: Any) -> None:
    """Rows per second Spark reads from and writes into metaq (needs pip install 'metaq[spark]' and Java 17)."""
    from metaq.bench import spark

    spec = spark.SparkBenchSpec(**kwargs)
    run_and_print(as_json, lambda report: spark.run(spec, report), spark.table)


@click.command("connect")
@click.argument("plain", metavar="PLAIN_HOST:PORT")
@click.argument("tls", metavar="TLS_HOST:PORT")
@click.option("--ca-file", required=True, type=click.Path(exists=True, dir_okay=False),
              help="The CA that signed the broker's certificate.")
@click.option("--user", default=None, help="Also TLS + SCRAM-SHA-256 as this user (password from METAQ_PASSWORD).")
@click.option("-n", "--count", type=click.IntRange(1), default=200, show_default=True,
              help="Connections of each kind.")
@json_option
def bench_connect(as_json: bool, plain: str, tls: str, ca_file: str, user: str | None, count: int) -> None:
    """How long opening a connection takes to a running broker: plaintext (the baseline), TLS, TLS +
    SCRAM-SHA-256."""
    from metaq.bench import connect_time

    run_and_print(as_json, lambda report: connect_time.run(plain, tls, ca_file, user, count, report),
                  connect_time.table)


@click.command("startup")
@click.option("--runs", type=click.IntRange(1), default=10, show_default=True, help="Runs of each case.")
@click.option("--baseline", type=click.Path(file_okay=False, exists=True), default=None, metavar="SRC",
              help="Another checkout's src directory (its compiled modules built): the same cases with that code, "
                   "alternating run by run.")
@work_dir_option
@json_option
def bench_startup(as_json: bool, runs: int, baseline: str | None, work_dir: str | None) -> None:
    """How long a metaq command takes to start: wall and CPU time of whole processes (--version, --help, a produce and
    a consume of one message), beside --baseline's code when given."""
    from metaq.bench import startup

    run_and_print(as_json, lambda report: startup.run(runs, baseline, report, work_dir), startup.table)


_GOALS = ("batch", "send_async", "async_yield", "oneway", "iterate", "e2e_rr", "e2e_sticky", "e2e_sync")


@click.command("goals")
@click.option("--rounds", type=click.IntRange(1), default=3, show_default=True,
              help="Rounds (each goal once per tree per round).")
@click.option("--only", default=",".join(_GOALS), show_default=True, callback=comma_list(_GOALS),
              help="The goals to run, in order.")
@click.option("--against", metavar="REV", default=None,
              help="Another commit of this checkout, exported and built, measured alternately with this tree.")
@click.option("--scale", type=click.FloatRange(0.0001), default=1.0, show_default=True,
              help="Multiply the goals' counts and durations (a quick look).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(1), default=900.0, show_default=True,
              help="Upper bound of one command, seconds.")
@click.option("--peers", is_flag=True,
              help="Once a round, each end-to-end goal's peer of the same shape under the same load (Redis Streams: "
                   "four streams round robin, one stream, appendfsync always; see metaq bench peers).")
@json_option
def bench_goals(as_json: bool, **kwargs: Any) -> None:
    """metaq's performance goals (send_async, send_oneway and iterate msg/s, end-to-end latency), each run beside its
    same-run baseline, optionally interleaved with another commit."""
    from metaq.bench import goals

    result: dict[str, Any] = {}

    def run(report: Report) -> dict[str, Any]:
        result.update(goals.run(report=report, **kwargs))
        return result

    run_and_print(as_json, run, goals.table)
    if goals.failed(result):
        raise SystemExit(1)


COMMANDS = [bench_peers, bench_http, bench_kafka, bench_kafka_convert, bench_logging, bench_spark, bench_connect,
            bench_startup, bench_goals]
