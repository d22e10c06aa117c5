"""What a new user ran into (issue 12), each through the real `metaq` command against a real broker:
closed partitions that reopened after a restart, headers the CLI could neither send nor show, and a
silent Ctrl-C on `consume --follow`."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable

from cli_process import CliProcess, assert_quiet_interrupt, metaq

from metaq.client import connect
from metaq.errors import PartitionClosedError
from metaq.testing.broker import BrokerProcess


def _publish_states(servers: str, topic: str) -> dict[str, str]:
    done = metaq("topic", "describe", topic, "--json", "-s", servers)
    assert done.returncode == 0, done.stderr
    return {row["partition"]: row["publish"] for row in json.loads(done.stdout)["partitions"]}


def _send_to(servers: str, topic: str, partition: int) -> bool:
    with connect(servers) as session:
        result = session.create_producer().send_batch(topic, [b"x"], partition=partition)
    if not result.success:
        assert isinstance(result.errors[0], PartitionClosedError), result.errors
        # named as everywhere else, brokerId-partition (it said "maint-1")
        assert f"partition 0-{partition} of topic {topic!r} is closed" in str(result.errors[0]), result.errors
    return result.success


def test_a_closed_partition_stays_closed_after_a_restart_and_a_crash(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 3, "unflushThreshold": 0})
    s = ["-s", broker.servers]
    assert metaq("topic", "create", "maint", *s).returncode == 0
    done = metaq("topic", "close", "maint", "-p", "1", *s)
    assert (done.returncode, done.stdout) == (0, "closed partition 0-1 of maint for publishing\n"), done.stderr

    broker.restart()
    assert _publish_states(broker.servers, "maint") == {"0-0": "open", "0-1": "closed", "0-2": "open"}
    assert not _send_to(broker.servers, "maint", 1)
    assert _send_to(broker.servers, "maint", 0)

    broker.signal(signal.SIGKILL)  # the state was stored before the close was answered: a crash keeps it
    broker.wait()
    broker.start()
    assert _publish_states(broker.servers, "maint") == {"0-0": "open", "0-1": "closed", "0-2": "open"}

    assert metaq("topic", "open", "maint", "-p", "1", *s).returncode == 0
    assert metaq("topic", "close", "maint", "-p", "2", *s).returncode == 0
    broker.restart()
    assert _publish_states(broker.servers, "maint") == {"0-0": "open", "0-1": "open", "0-2": "closed"}
    assert _send_to(broker.servers, "maint", 1)


def test_a_topic_deleted_and_created_again_starts_open(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 2, "unflushThreshold": 0})
    s = ["-s", broker.servers]
    assert metaq("topic", "create", "again", *s).returncode == 0
    assert metaq("topic", "close", "again", *s).returncode == 0
    unconfirmed = metaq("topic", "delete", "again", *s)  # no terminal to ask on: say --yes, not "Aborted!"
    assert unconfirmed.returncode == 2 and "add --yes" in unconfirmed.stderr and "Aborted" not in unconfirmed.stderr
    assert metaq("topic", "delete", "again", "--yes", *s).returncode == 0
    assert metaq("topic", "create", "again", *s).returncode == 0
    broker.restart()
    assert _publish_states(broker.servers, "again") == {"0-0": "open", "0-1": "open"}


def test_produce_sets_headers_and_attribute_and_consume_json_shows_them(broker: BrokerProcess) -> None:
    s = ["-s", broker.servers]
    assert metaq("topic", "create", "hdr", "-p", "1", *s).returncode == 0
    done = metaq("produce", "hdr", "-a", "tagA", "--header", "trace-id=abc123", "-H", "origin=cli",
                 "-H", "empty=", *s, input="first\nsecond\n")
    assert done.returncode == 0, done.stderr
    assert metaq("produce", "hdr", *s, input="plain\n").returncode == 0
    done = metaq("consume", "hdr", "--format", "json", *s)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["value"], r["attribute"], r["headers"]) for r in rows] == [
        ("first", "tagA", [["trace-id", "abc123"], ["origin", "cli"], ["empty", ""]]),
        ("second", "tagA", [["trace-id", "abc123"], ["origin", "cli"], ["empty", ""]]),
        ("plain", None, [])]
    with connect(broker.servers) as session:  # what a program reading the topic gets
        (first, *_) = session.create_pull_consumer().iterate("hdr", session.partitions("hdr")[0], "earliest",
                                                            stop_at_end=True)
        assert [(n, bytes(v)) for n, v in first.headers] == [("trace-id", b"abc123"), ("origin", b"cli"),
                                                             ("empty", b"")]


def test_produce_refuses_a_header_without_a_name_or_equals_sign(broker: BrokerProcess) -> None:
    for bad in ("novalue", "=v"):
        done = metaq("produce", "hdr", "--header", bad, "-s", broker.servers, input="x\n")
        assert done.returncode == 2
        assert f"{bad!r} is not NAME=VALUE" in done.stderr


def test_ctrl_c_on_consume_follow_prints_what_it_consumed_and_exits_130(broker: BrokerProcess) -> None:
    s = ["-s", broker.servers]
    assert metaq("topic", "create", "live", "-p", "2", *s).returncode == 0
    assert metaq("produce", "live", "-p", "0", *s, input="a\nb\n").returncode == 0
    with CliProcess("consume", "live", "--follow", *s) as proc:
        proc.wait_for_stdout(2)
        assert metaq("produce", "live", "-p", "1", *s, input="c\n").returncode == 0
        assert sorted(proc.wait_for_stdout(3)) == ["a", "b", "c"]
        proc.interrupt()
        assert_quiet_interrupt(proc)  # exit 130 as produce, bench and broker; no "Aborted!"
    assert [line for line in proc.stderr if line] == ["consumed 3 messages from live; interrupted"]


def test_an_oversized_line_names_the_setting_to_raise(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"maxMessageSize": "4m", "unflushThreshold": 0})
    s = ["-s", broker.servers]
    two_mb, five_mb = "x" * 2_000_000 + "\n", "y" * 5_000_000 + "\n"
    refused = metaq("produce", "big", *s, input=two_mb)  # over the producer's 1 MiB: the flag that raises it
    assert refused.returncode == 1 and "--max-message-bytes" in refused.stderr, refused.stderr
    sent = metaq("produce", "big", "--max-message-bytes", "3000000", *s, input=two_mb)
    assert sent.returncode == 0 and "sent 1 message" in sent.stderr, sent.stderr
    over_broker = metaq("produce", "big", "--max-message-bytes", "6000000", *s, input=five_mb)
    assert over_broker.returncode == 1 and "maxMessageSize" in over_broker.stderr, over_broker.stderr
