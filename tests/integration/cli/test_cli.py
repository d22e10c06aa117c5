"""The `metaq` command line against real brokers: missing topics, Ctrl-C, wording of counts."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from cli_process import METAQ, CliProcess, assert_quiet_interrupt, metaq

from metaq.client import connect
from metaq.testing.broker import BrokerProcess, wait_until


def _values(servers: str, topic: str) -> list[bytes]:
    with connect(servers) as session:
        consumer = session.create_pull_consumer()
        return [bytes(m.data) for p in session.partitions(topic)
                for m in consumer.iterate(topic, p, "earliest", stop_at_end=True)]


def _put_messages(servers: str, prefix: str) -> int:
    with connect(servers) as session:
        topics = session.admin().stats(None)["topics"]
    return sum(p["put_messages"] for name, t in topics.items() if name.startswith(prefix)
               for p in t["partitions"].values())


# -- a topic that does not exist ------------------------------------------------------------------

def test_consume_of_a_missing_topic_is_an_error_naming_it_and_the_servers(broker: BrokerProcess) -> None:
    done = metaq("consume", "nope", "-s", broker.servers)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == f"Error: topic 'nope' does not exist on {broker.servers}\n"


def test_consume_follow_waits_for_a_missing_topic_and_ctrl_c_ends_it_quietly(broker: BrokerProcess) -> None:
    s = ["-s", broker.servers]
    with CliProcess("consume", "later", "--follow", *s) as proc:
        notice = proc.wait_for_stderr("does not exist")
        assert notice == (f"topic 'later' does not exist on {broker.servers} yet; waiting for it to be created "
                          "(Ctrl-C to stop)")
        assert metaq("topic", "create", "later", "-p", "2", *s).returncode == 0
        assert metaq("produce", "later", "-p", "1", *s, input="first\n").returncode == 0
        assert proc.wait_for_stdout(1) == ["first"]
        assert metaq("produce", "later", "-p", "0", *s, input="second\n").returncode == 0
        assert proc.wait_for_stdout(2) == ["first", "second"]
        proc.interrupt()
        assert_quiet_interrupt(proc)
    assert [line for line in proc.stderr if line] == [notice, "consumed 2 messages from later; interrupted"]


# -- Ctrl-C ---------------------------------------------------------------------------------------

def test_produce_ctrl_c_sends_what_was_read_then_exits_130(broker: BrokerProcess) -> None:
    # stdin stays open (a terminal): before, Ctrl-C waited for one more line, then said "Aborted!"
    with CliProcess("produce", "typed", "-s", broker.servers, stdin=subprocess.PIPE) as proc:
        proc.write("one\ntwo\n")
        wait_until(lambda: len(_values(broker.servers, "typed")) == 2, 30, message="both lines stored")
        proc.interrupt()
        assert_quiet_interrupt(proc)
    assert "sent 2 messages to typed; interrupted" in proc.stderr
    assert _values(broker.servers, "typed") == [b"one", b"two"]


def test_broker_ctrl_c_drains_and_exits_130_quietly(tmp_path: Path) -> None:
    with CliProcess("broker", "--dataPath", str(tmp_path / "data"), "--serverPort", "0") as proc:
        (ready,) = proc.wait_for_stdout(1)
        assert ready.startswith("metaq broker ready ")
        proc.interrupt()
        assert_quiet_interrupt(proc)
    assert "stopped cleanly" in proc.stderr[-1]
    assert not [line for line in proc.stderr if " ERROR " in line or " CRITICAL " in line]


def test_bench_ctrl_c_stops_the_run_and_its_workers_quietly(broker: BrokerProcess) -> None:
    with CliProcess("bench", "produce", "-s", broker.servers, "-n", "50000000", "-d", "120", "--processes", "2",
                    "--no-progress") as proc:
        wait_until(lambda: _put_messages(broker.servers, "bench-produce-") > 10_000, 60,
                   message="the bench producing")
        proc.interrupt()
        assert_quiet_interrupt(proc)
    assert proc.stdout == []


def test_bench_produce_async_yield_sends_each_message_in_its_own_loop_iteration(broker: BrokerProcess) -> None:
    # --api async-yield: send_async with the event loop run between two sends, as from request handlers; every
    # message acknowledged, and the broker stored exactly that many (plus the bench's warm-up message)
    done = metaq("bench", "produce", "-s", broker.servers, "--api", "async-yield", "-n", "3000", "-d", "30",
                 "--partitions", "3", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["messages"], doc["failures"], doc["spec"]["api"]) == (3000, 0, "async-yield")
    with connect(broker.servers) as session:
        topics = session.admin().stats(None)["topics"]
    stored = [t for name, t in topics.items() if name.startswith("bench-produce-")]
    assert len(stored) == 1
    assert sum(p["put_messages"] for p in stored[0]["partitions"].values()) == 3001


# -- wording --------------------------------------------------------------------------------------

def test_counts_are_pluralised(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 1})
    s = ["-s", broker.servers]
    assert metaq("topic", "create", "single", "-p", "1", *s).stdout == "created topic single with 1 partition\n"
    assert metaq("produce", "single", *s, input="only\n").stderr == "sent 1 message to single\n"
    assert metaq("produce", "single", *s, input="").stderr == "sent 0 messages to single\n"
    assert metaq("produce", "other", *s, input="a\nb\n").stderr == "sent 2 messages to other\n"
    assert metaq("topic", "list", *s).stdout == "other\t1 partition\nsingle\t1 partition\n"



def test_produce_prints_a_repeated_error_once(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"autoCreateTopics": False})
    done = metaq("produce", "missing", "-s", broker.servers, input="".join(f"{i}\n" for i in range(30)))
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "error: [UNKNOWN_TOPIC] topic 'missing' does not exist and autoCreateTopics=false",
        "sent 0 messages to missing, 30 failed"]


def test_produce_waits_for_a_broker_that_went_away_until_its_delivery_deadline(broker: BrokerProcess) -> None:
    s = ["-s", broker.servers]
    assert metaq("topic", "create", "gone", "-p", "1", *s).returncode == 0
    with CliProcess("produce", "gone", "-p", "0", "--print-ids", "--delivery-timeout-ms", "1500", *s,
                    stdin=subprocess.PIPE) as proc:
        proc.write("first\n")
        wait_until(lambda: _put_messages(broker.servers, "gone") == 1, 30, 0.05, "the first line to be stored")
        broker.stop()
        proc.write("second\n")
        assert proc.proc.stdin is not None
        proc.proc.stdin.close()
        assert proc.wait(60) == 1
    errors = [line for line in proc.stderr if line.startswith("error:")]
    assert len(errors) == 1 and "delivery_timeout_ms=1500" in errors[0] and "certainly not stored" in errors[0]
    assert proc.stderr[-1] == "sent 1 message to gone, 1 failed" and proc.stdout[0].startswith("0-0\t0\t")


def test_consume_into_a_reader_that_stops_early_ends_quietly(broker: BrokerProcess) -> None:
    # `metaq consume t | head -1`
    s = ["-s", broker.servers]
    assert metaq("topic", "create", "many", "-p", "1", *s).returncode == 0
    assert metaq("produce", "many", *s, input="".join(f"{i}\n" for i in range(50_000))).returncode == 0
    proc = subprocess.Popen([METAQ, "consume", "many", *s], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"0\n"
    proc.stdout.close()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and err == b""


def test_bench_logging_reports_the_cost_of_a_logging_call(broker: BrokerProcess) -> None:
    done = metaq("bench", "logging", "-s", broker.servers, "-n", "500", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["records"] == 500
    assert (doc["broker_up"]["pending"], doc["broker_up"]["dropped"]) == (0, 0)
    assert (doc["broker_down"]["pending"], doc["broker_down"]["dropped"]) == (500, 0)
    assert doc["broker_up"]["emit_us"] > 0 and doc["broker_down"]["records_per_s"] > 0
    assert len(_values(broker.servers, "bench-logging")) == 500


def test_bench_consume_with_a_tuned_allocator_reads_every_message(broker: BrokerProcess) -> None:
    # --tune-allocator: the consumer process fixes glibc's heap thresholds first (a no-op without glibc)
    done = metaq("bench", "consume", "-s", broker.servers, "-n", "40", "--size", "300000", "--batch", "4",
                 "--partitions", "1", "--api", "iterate", "--tune-allocator", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    # the 40 and the preload's warm-up message, read back from the first offset
    assert (doc["messages"], doc["failures"], doc["spec"]["tune_allocator"]) == (41, 0, True)


def test_bench_e2e_with_fsync_per_ack_measures_the_disks_fdatasync_in_the_same_run() -> None:
    # an embedded broker with unflushThreshold=1: the figure to hold the e2e latency against comes along
    done = metaq("bench", "e2e", "--flush", "sync", "--rate", "1000", "-n", "300", "-d", "1", "--linger-ms", "0",
                 "--partitions", "1", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["messages"] == 300 and doc["failures"] == 0
    assert set(doc["fdatasync_ms"]) == {"p50", "p99", "p999", "max"}
    assert 0 < doc["fdatasync_ms"]["p50"] <= doc["fdatasync_ms"]["max"]
    assert doc["latency_ms"]["p50"] > 0
    # and the machine's loopback round trip between two processes, the floor under a delivery's two hops
    assert set(doc["loopback_rtt_ms"]) == {"p50", "p99", "p999", "max"}
    assert 0 < doc["loopback_rtt_ms"]["p50"] <= doc["loopback_rtt_ms"]["p99"] <= doc["loopback_rtt_ms"]["max"]
    assert doc["spec"]["gc_freeze"] is True  # the clients freeze their start-up objects, as the broker does
    # without fsync per ack there is nothing to compare with; --no-gc-freeze measures clients that do not freeze
    done = metaq("bench", "e2e", "--flush", "1000", "--rate", "1000", "-n", "100", "-d", "1", "--partitions", "1",
                 "--no-gc-freeze", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["fdatasync_ms"] == {} and doc["spec"]["gc_freeze"] is False and doc["messages"] == 100
    assert doc["loopback_rtt_ms"]["p50"] > 0  # measured with any embedded broker
    # --consumer multi: one MultiFetch loop over every partition delivers them all
    done = metaq("bench", "e2e", "--flush", "1000", "--rate", "1000", "-n", "200", "-d", "1", "--partitions", "3",
                 "--consumer", "multi", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["messages"], doc["failures"], doc["spec"]["consumer"]) == (200, 0, "multi")
    # --pacing even: each message at its own time (start + i/rate), not in millisecond bursts; all delivered,
    # and not faster than offered (400 at 2,000 msg/s: the last one 0.1995 s after the first)
    done = metaq("bench", "e2e", "--flush", "1000", "--rate", "2000", "-n", "400", "-d", "1", "--partitions", "3",
                 "--linger-ms", "0", "--pacing", "even", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["messages"], doc["failures"], doc["spec"]["pacing"]) == (400, 0, "even")
    assert doc["seconds"] >= 0.1995 and doc["latency_ms"]["p50"] > 0
    assert doc["latency_by_place_ms"] == {}  # no bursts: nothing to break down by place


def test_bench_e2e_breaks_the_latency_down_by_a_message_place_in_its_burst() -> None:
    # --pacing tick at 5,000 msg/s: bursts of about five; every delivered message is counted at its place, and
    # each burst has a first message, so no place is reached by more messages than the one before it
    done = metaq("bench", "e2e", "--flush", "1000", "--rate", "5000", "-n", "600", "-d", "1", "--partitions", "4",
                 "--linger-ms", "0", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["messages"], doc["failures"]) == (600, 0)
    by_place = doc["latency_by_place_ms"]
    places = [int(p) for p in by_place]
    assert places == list(range(1, len(places) + 1)) and len(places) >= 2
    counts = [by_place[str(p)]["count"] for p in places]
    assert sum(counts) == 600 and counts == sorted(counts, reverse=True)
    # places restart each tick: ~120 bursts of ~5 on a quiet machine. A tick the producer's loop runs late sends
    # everything due since the last one, so how many bursts there are is the scheduler's to decide (a loaded
    # machine gave 31 bursts, the longest 75): what the bench owes is that each burst has a first message, which
    # the monotone counts above check, and that there is more than one burst
    assert counts[0] >= 2, counts
    assert all(0 < by_place[str(p)]["p50"] <= by_place[str(p)]["max"] for p in places)
    # the text output shows the places that most bursts reach
    done = metaq("bench", "e2e", "--flush", "1000", "--rate", "5000", "-n", "300", "-d", "1", "--partitions", "4",
                 "--linger-ms", "0", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "by place in its 1 ms burst, p50 ms: #1 " in done.stdout and " #2 " in done.stdout
    # an 8-byte payload is all timestamp: no place to break down by
    done = metaq("bench", "e2e", "--flush", "1000", "--rate", "5000", "-n", "100", "-d", "1", "--size", "8", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["messages"] == 100 and doc["latency_by_place_ms"] == {}


def test_bench_e2e_runs_each_process_on_the_cpus_given() -> None:
    # --cpus B,P,C pins the embedded broker, the producer and the consumer ('-': left to the scheduler); the
    # result says where each was allowed to run, and every message is still delivered
    last = max(os.sched_getaffinity(0))
    done = metaq("bench", "e2e", "--flush", "1000", "--rate", "1000", "-n", "200", "-d", "1", "--partitions", "2",
                 "--linger-ms", "0", "--cpus", f"{last},-,0", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["messages"], doc["failures"]) == (200, 0)
    everywhere = sorted(os.sched_getaffinity(0))
    assert doc["placement"] == {"broker": [last], "producer": everywhere, "consumer": [0]}
    assert doc["spec"]["cpus"] == [last, None, 0]
    done = metaq("bench", "e2e", "-n", "10", "-d", "1", "--json")  # not pinned: anywhere, and said so
    assert json.loads(done.stdout)["placement"] == {"broker": everywhere, "producer": everywhere,
                                                    "consumer": everywhere}
    for wrong, why in (("0,1", "expected three CPU numbers"), ("0,x,1", "expected three CPU numbers"),
                       (f"0,{last + 1},0", f"CPU {last + 1} is not one this process may use")):
        done = metaq("bench", "e2e", "--cpus", wrong)
        assert done.returncode == 2 and why in done.stderr, done.stderr
    done = metaq("bench", "e2e", "--cpus", "0,0,0", "--servers", "127.0.0.1:1")
    assert done.returncode == 2 and "--cpus pins the embedded broker" in done.stderr


def test_produce_to_a_partition_of_a_missing_topic_is_an_error(broker: BrokerProcess) -> None:
    # before, the broker placed the lines of a topic it was creating: `-p 0` spread them over 4 partitions
    s = ["-s", broker.servers]
    for name, option in (("--partition", ["-p", "0"]), ("--key", ["-k", "user-7"])):
        done = metaq("produce", "fresh", *option, *s, input="a\nb\n")
        assert done.returncode == 1
        assert done.stderr == (f"Error: topic 'fresh' does not exist on {broker.servers}; {name} needs its "
                               "partitions: create it first (metaq topic create fresh)\n")
    assert metaq("topic", "create", "fresh", *s).returncode == 0
    lines = "".join(f"{i}\n" for i in range(20_000))
    assert metaq("produce", "fresh", "-p", "2", *s, input=lines).returncode == 0
    assert _values(broker.servers, "fresh") == [str(i).encode() for i in range(20_000)]
