"""Many partitions on one broker with a small descriptor budget (maxOpenFiles): every partition is written
and read correctly, the broker's open descriptors stay under the budget plus what a broker with one
partition holds, and a kill -9 under load loses nothing that was acknowledged (history check)."""

from __future__ import annotations

import os
from collections.abc import Callable

from metaq.client import connect
from metaq.testing import BrokerProcess, wait_until
from metaq.testing.history import ProduceLoad, check_history, read_back

PARTITIONS = 200
MAX_OPEN_FILES = 16
CONNECTIONS_SLACK = 6
"""Descriptors that may differ between the two brokers compared: client connections come and go."""


def _config(partitions: int) -> str:
    return f"[system]\nnumPartitions=1\n\n[topic=wide]\nnumPartitions={partitions}\n"


def _fds(broker: BrokerProcess) -> int:
    return len(os.listdir(f"/proc/{broker.pid}/fd"))


def _descriptors_of_one_partition(broker_factory: Callable[..., BrokerProcess]) -> int:
    """Open descriptors of a broker holding one partition, written and read by a connected client."""
    narrow = broker_factory({"maxOpenFiles": MAX_OPEN_FILES, "unflushThreshold": 0}, name="narrow",
                            config_text=_config(1))
    with connect(narrow.servers) as session:
        assert session.create_producer().send_batch("wide", [b"x"] * 10).success
        consumer = session.create_pull_consumer()
        assert sum(len(b) for b in consumer.iterate_batches("wide", session.partitions("wide")[0], "earliest",
                                                            stop_at_end=True)) == 10
        base = _fds(narrow)
    narrow.stop()
    return base


def test_a_broker_capped_at_16_open_files_writes_and_reads_200_partitions_and_survives_a_kill_9(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    base = _descriptors_of_one_partition(broker_factory)
    bound = base + MAX_OPEN_FILES + CONNECTIONS_SLACK
    broker = broker_factory({"maxOpenFiles": MAX_OPEN_FILES, "unflushThreshold": 0}, config_text=_config(PARTITIONS))
    seen: list[int] = []

    def sample() -> int:
        seen.append(_fds(broker))
        return seen[-1]

    load = ProduceLoad({"servers": broker.servers, "request_timeout_s": 10, "reconnect_attempts": 50},
                       "wide", window=800, time_limit_s=60, limit=200_000).start()
    try:  # round robin: every 200 acknowledged messages touch every partition once
        wait_until(lambda: sample() and len(load.acked) >= 6 * PARTITIONS, timeout_s=30,
                   message="acknowledged messages in every partition")
        broker.kill()
        broker.start()
        before = len(load.acked)
        wait_until(lambda: sample() and len(load.acked) >= before + 6 * PARTITIONS, timeout_s=30,
                   message="acknowledged messages after the restart")
    finally:
        load.stop()
    with connect(broker.servers) as session:
        assert len(session.partitions("wide")) == PARTITIONS
        read = read_back(session, "wide")
        sample()
    problems = check_history(read, load.acked, load.failed)
    assert not problems, problems[:10]
    assert all(read[pid] for pid in read) and len(read) == PARTITIONS, "every partition holds messages"
    assert len(load.acked) + len(load.failed) == load.sent
    assert max(seen) <= bound, f"{max(seen)} descriptors open; a broker with one partition holds {base}, " \
                               f"the budget is {MAX_OPEN_FILES}"
