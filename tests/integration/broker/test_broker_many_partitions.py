"""Many partitions on one broker with a small descriptor budget (maxOpenFiles): every partition is written
and read correctly, the broker's open descriptors stay under the budget plus what a broker with one
partition holds, and a kill -9 under load loses nothing that was acknowledged (history check). And a
broker whose open-files limit falls below what its budget assumed sheds descriptors instead of failing
appends or taking partitions offline, and one started under a limit too low for its options gives the
storage less, so that connections keep room; by default (maxOpenFiles=auto) a broker raises its soft limit
to the hard one and gives the storage what that leaves. And group commit rounds synced by one syncfs lose nothing
across a kill -9, nor does a clean stop made durable by one syncfs (and trusted by the next start), nor do acks
per append (unflushThreshold=1) over a few partitions, whose rounds use a syncfs while the machine is quiet."""

from __future__ import annotations

import os
import re
import resource
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from metaq.client import connect
from metaq.storage.checkpoint import read_clean_states
from metaq.storage.manager import CHECKPOINT_FILE
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

    load = _wide_load(broker)
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


def test_a_broker_out_of_file_descriptors_sheds_idle_ones_and_fails_no_append(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    """The default budget (auto: what the open-files limit leaves) with the process's limit cut, under load,
    to 60 below what it holds, and 1 KiB segments so that rolls keep opening files (a low ``ulimit -n``, or
    connections taking the rest): every open of a segment, index or directory then fails with EMFILE until
    the storage's pool closes idle descriptors. Nothing may fail: no refused append, no partition taken
    offline by a flush that could not open its file; every acknowledged message reads back in order."""
    # small segments: rolls keep opening new segment, index and directory descriptors under the cut limit
    broker = broker_factory({"unflushThreshold": 0, "maxSegmentSize": 1024}, config_text=_config(PARTITIONS))
    load = ProduceLoad({"servers": broker.servers, "request_timeout_s": 10}, "wide", window=800,
                       time_limit_s=60, limit=200_000).start()
    limits = resource.prlimit(broker.pid, resource.RLIMIT_NOFILE)
    try:
        wait_until(lambda: len(load.acked) >= 2 * PARTITIONS, timeout_s=30,
                   message="acknowledged messages in every partition")
        resource.prlimit(broker.pid, resource.RLIMIT_NOFILE, (_fds(broker) - 60, limits[1]))
        before = len(load.acked)
        wait_until(lambda: len(load.acked) >= before + 40 * PARTITIONS, timeout_s=30,
                   message="acknowledged messages with the limit cut")
    finally:
        load.stop()
        resource.prlimit(broker.pid, resource.RLIMIT_NOFILE, limits)
    assert "out of file descriptors" in broker.output(), "the cut limit was never reached"
    assert not load.failed, list(load.failed.items())[:5]
    with connect(broker.servers) as session:
        read = read_back(session, "wide")
    problems = check_history(read, load.acked, load.failed)
    assert not problems, problems[:10]
    assert len(load.acked) == load.sent


class _LimitedBroker(BrokerProcess):
    """A broker started under a hard open-files limit of ``nofile`` it cannot raise (what ``prlimit --nofile=N:N``
    or ``ulimit -Hn N`` does): a small Python program sets it and execs the broker's command in its place."""

    nofile = 150
    nofile_soft: int | None = None
    """The soft limit it starts with (the hard one when None)."""

    def command(self) -> list[str]:
        soft = self.nofile if self.nofile_soft is None else self.nofile_soft
        limited = ("import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, "
                   f"({soft}, {self.nofile})); os.execv(sys.argv[1], sys.argv[1:])")
        return [sys.executable, "-c", limited, *super().command()]


def _three_messages_to_every_partition(broker: BrokerProcess, partitions: int) -> ProduceLoad:
    """Round robin until each of the topic's partitions has three messages; all acknowledged."""
    load = ProduceLoad({"servers": broker.servers, "request_timeout_s": 10}, "wide", window=800,
                       time_limit_s=60, limit=3 * partitions).start()
    wait_until(lambda: len(load.acked) + len(load.failed) >= 3 * partitions, timeout_s=60,
               message="three messages to every partition")
    load.stop()
    assert not load.failed and len(load.acked) == 3 * partitions
    return load


def _soft_nofile(pid: int) -> int:
    return resource.prlimit(pid, resource.RLIMIT_NOFILE)[0]


def test_by_default_a_broker_takes_the_descriptors_its_hard_limit_allows(tmp_path: Path) -> None:
    """maxOpenFiles=auto (the default) under a soft limit of 1,024 and a hard one of 3,000 (systemd's soft
    default below a larger hard one): the broker raises its soft limit to the hard one, as MetaQ's JVM does,
    and gives the storage what is left after connections (at most half) and 256: 1,244 descriptors, no
    WARNING. 1,100 partitions written in turn then all keep their file open (with a budget of 1,024, as
    before, about a hundred of them reopened theirs at every write), and every message reads back."""
    partitions = 1100
    broker = _LimitedBroker(tmp_path / "broker", {"unflushThreshold": 0, "dashboardHttpPort": 0},
                            config_text=_config(partitions))
    broker.nofile, broker.nofile_soft = 3000, 1024
    broker.start()
    try:
        assert _soft_nofile(broker.pid) == 3000
        assert "maxOpenFiles=auto: the open-files limit is 3000; the storage keeps up to 1244 files open" \
            in broker.output(), broker.output()
        assert "WARNING" not in broker.output()
        load = _three_messages_to_every_partition(broker, partitions)
        samples = _samples(broker)
        assert samples["metaq_storage_open_files_budget"] == 1244
        assert samples["metaq_storage_open_files"] >= partitions  # every partition's segment still open
        with connect(broker.servers) as session:
            assert not check_history(read_back(session, "wide"), load.acked, load.failed)
    finally:
        broker.stop_or_kill(15)


def test_a_broker_under_a_low_open_files_limit_keeps_room_for_connections(tmp_path: Path) -> None:
    """A hard limit of 150 descriptors (as ``ulimit -Hn 150`` gives) against maxOpenFiles 5,000: the broker
    gives its storage 64 (the least) and says so, writes 200 partitions through them, and 40 more clients
    still connect. Before, the storage took every descriptor the limit allowed and new connections could
    not be accepted."""
    broker = _LimitedBroker(tmp_path / "broker", {"maxOpenFiles": 5000, "unflushThreshold": 0},
                            config_text=_config(PARTITIONS))
    broker.start()
    sessions = []
    try:
        assert "the storage keeps at most 64 files open" in broker.output(), broker.output()
        load = _three_messages_to_every_partition(broker, PARTITIONS)
        assert _fds(broker) <= 64 + 40, f"{_fds(broker)} descriptors open with a storage budget of 64"
        for _ in range(40):
            session = connect(broker.servers, request_timeout_s=10, reconnect_attempts=1)
            sessions.append(session)
            assert len(session.partitions("wide")) == PARTITIONS
        read = read_back(sessions[0], "wide")
        assert not check_history(read, load.acked, load.failed)
    finally:
        for session in sessions:
            session.close()
        broker.stop_or_kill(15)


def test_group_commit_rounds_synced_by_syncfs_lose_no_acknowledged_message_across_a_kill_9(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    """Group commit over 200 partitions with ``syncfsMinPartitions`` 8: rounds of many partitions are made
    durable by one syncfs of the data directory's filesystem (the metrics count them) instead of 200
    fdatasyncs. Every ack still follows a sync of its batch: under load, a kill -9 and a restart, every
    acknowledged message reads back in order, nothing fails and no partition goes offline."""
    broker = broker_factory({"unflushThreshold": 0, "syncfsMinPartitions": 8, "dashboardHttpPort": 0},
                            config_text=_config(PARTITIONS))
    load = _wide_load(broker)
    try:
        wait_until(lambda: len(load.acked) >= 6 * PARTITIONS and _filesystem_syncs(broker) > 0, timeout_s=30,
                   message="acknowledged messages in every partition, and a round synced by syncfs")
        broker.kill()
        broker.start()
        before = len(load.acked)
        wait_until(lambda: len(load.acked) >= before + 6 * PARTITIONS and _filesystem_syncs(broker) > 0,
                   timeout_s=30, message="acknowledged messages after the restart, and a round synced by syncfs")
    finally:
        load.stop()
    _assert_every_acknowledged_message_reads_back(broker, load)
    assert _samples(broker)["metaq_storage_filesystem_sync_failures_total"] == 0


def test_acks_per_append_over_four_partitions_synced_by_quiet_syncfs_rounds_lose_nothing_across_a_kill_9(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    """unflushThreshold=1 over four partitions with the default syncfsQuietMinPartitions (2): a round of two or
    more is made durable by one syncfs while the machine has little to write back, and by an fdatasync each
    otherwise (the metrics count both). Either way every ack follows a sync of its batch: through a kill -9
    and a restart every acknowledged message reads back in order, and nothing fails."""
    partitions = 4
    broker = broker_factory({"unflushThreshold": 1, "dashboardHttpPort": 0}, config_text=_config(partitions))

    def rounds_of_several() -> float:
        samples = _samples(broker)
        return (samples.get("metaq_storage_filesystem_syncs_total", 0)
                + samples.get("metaq_storage_filesystem_sync_busy_skips_total", 0))

    load = _wide_load(broker)
    try:
        wait_until(lambda: len(load.acked) >= 2000 and rounds_of_several() > 0, timeout_s=30,
                   message="acknowledged messages, and a round of several partitions")
        broker.kill()
        broker.start()
        before = len(load.acked)
        wait_until(lambda: len(load.acked) >= before + 2000 and rounds_of_several() > 0, timeout_s=30,
                   message="acknowledged messages after the restart, and a round of several partitions")
    finally:
        load.stop()
    _assert_every_acknowledged_message_reads_back(broker, load, partitions)
    assert _samples(broker)["metaq_storage_filesystem_sync_failures_total"] == 0


def test_a_clean_stop_of_many_partitions_under_load_loses_nothing_and_the_restart_trusts_it(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    """A SIGTERM under group commit over 200 partitions (the default ``syncfsMinPartitions``, 32): the stop
    makes them durable with one syncfs, writes no index file for a small active segment, and records all of
    them clean; the restart trusts that record (no recovery), and every acknowledged message reads back in
    order, through another kill -9 too."""
    broker = broker_factory({"unflushThreshold": 0}, config_text=_config(PARTITIONS))
    load = _wide_load(broker)
    try:
        wait_until(lambda: len(load.acked) >= 6 * PARTITIONS, timeout_s=30,
                   message="acknowledged messages in every partition")
        broker.stop()
        data = Path(broker.data_dir)
        recorded = read_clean_states(data / CHECKPOINT_FILE)
        assert sorted(recorded) == sorted(f"wide-{p}" for p in range(PARTITIONS)) and None not in recorded.values()
        assert not list(data.glob("wide-*/*index")), "index files created by the stop"
        after_stop = len(broker.log_lines)
        broker.start()
        before = len(load.acked)
        wait_until(lambda: len(load.acked) >= before + 6 * PARTITIONS, timeout_s=30,
                   message="acknowledged messages after the clean restart")
        assert not [line for line in broker.log_lines[after_stop:] if "unclean" in line or "recovered" in line]
        after_clean_run = len(broker.log_lines)
        broker.kill()
        broker.start()
        before = len(load.acked)
        wait_until(lambda: len(load.acked) >= before + 6 * PARTITIONS, timeout_s=30,
                   message="acknowledged messages after the kill -9")
        unclean = [line for line in broker.log_lines[after_clean_run:] if "recovered from an unclean stop" in line]
        assert unclean, "the start after kill -9 did not say it recovered partitions"
    finally:
        load.stop()
    _assert_every_acknowledged_message_reads_back(broker, load)


def _wide_load(broker: BrokerProcess) -> ProduceLoad:
    """Produce to every partition of ``wide``, through restarts, until stopped (bounded in count and time)."""
    return ProduceLoad({"servers": broker.servers, "request_timeout_s": 10, "reconnect_attempts": 50},
                       "wide", window=800, time_limit_s=60, limit=200_000).start()


def _assert_every_acknowledged_message_reads_back(broker: BrokerProcess, load: ProduceLoad,
                                                  partitions: int = PARTITIONS) -> None:
    """The history check: every acknowledged message read back in order per partition, none that was not."""
    with connect(broker.servers) as session:
        read = read_back(session, "wide")
    problems = check_history(read, load.acked, load.failed)
    assert not problems, problems[:10]
    assert all(read[pid] for pid in read) and len(read) == partitions, "every partition holds messages"
    assert len(load.acked) + len(load.failed) == load.sent


def _samples(broker: BrokerProcess) -> dict[str, float]:
    """The broker's unlabelled metric samples (dashboardHttpPort), by name."""
    found = [re.search(r"metaq broker metrics (http://\S+)", line) for line in broker.log_lines]
    urls = [m.group(1) for m in found if m]
    assert urls, "the broker printed no metrics address:\n" + broker.output()
    with urllib.request.urlopen(urls[-1], timeout=10) as reply:
        text = reply.read().decode()
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples
            if not s.labels}


def _filesystem_syncs(broker: BrokerProcess) -> float:
    return _samples(broker).get("metaq_storage_filesystem_syncs_total", 0)
