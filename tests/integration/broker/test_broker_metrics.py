"""Prometheus metrics (``dashboardHttpPort``) of real broker processes, scraped over HTTP and parsed
with prometheus_client's own parser: the numbers must be the ones `metaq stats` shows and what the test
produced and fetched."""

from __future__ import annotations

import json
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_process import metaq
from prometheus_client.parser import text_string_to_metric_families

from metaq.client import Message, connect
from metaq.testing import BrokerProcess, wait_until
from metaq.testing.ports import start_broker_on_a_taken_port

METRICS_LINE = re.compile(r"metaq broker metrics (http://\S+)")
OPERATIONS_MD = Path(__file__).resolve().parents[3] / "docs" / "operations.md"


def metrics_url(broker: BrokerProcess) -> str:
    found = [METRICS_LINE.search(line) for line in broker.log_lines]
    urls = [m.group(1) for m in found if m]
    assert urls, "the broker printed no metrics address:\n" + broker.output()
    return urls[-1]


def scrape(url: str) -> tuple[str, dict[str, dict[tuple[tuple[str, str], ...], float]]]:
    """(content type, metric sample name -> {sorted labels: value})."""
    with urllib.request.urlopen(url, timeout=10) as reply:
        content_type = reply.headers["Content-Type"]
        text = reply.read().decode()
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return content_type, samples


def by_partition(samples: dict[str, Any], name: str, topic: str) -> dict[str, float]:
    return {dict(labels)["partition"]: value for labels, value in samples.get(name, {}).items()
            if dict(labels).get("topic") == topic}


def cli_stats(broker: BrokerProcess, topic: str) -> dict[str, Any]:
    done = metaq("stats", "--json", "-t", topic, "-s", broker.servers)
    assert done.returncode == 0, done.stderr
    (doc,) = json.loads(done.stdout)
    return dict(doc)


def test_metrics_match_what_was_produced_fetched_and_metaq_stats(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 2, "unflushThreshold": 1, "dashboardHttpPort": 0})
    url = metrics_url(broker)
    assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
    payloads = [f"message-{i}".encode() * (1 + i % 7) for i in range(500)]
    with connect(broker.servers) as session:
        session.admin().create_topic("metered", 2)
        producer = session.create_producer()
        for start in range(0, 500, 50):  # 10 batches, spread over both partitions
            result = producer.send_batch("metered", payloads[start:start + 50], partition=(start // 50) % 2)
            assert result.success
        consumer = session.create_pull_consumer()
        fetched = [m for p in session.partitions("metered")
                   for m in consumer.iterate("metered", p, "earliest", stop_at_end=True)]
    assert sorted(bytes(m.data) for m in fetched) == sorted(payloads)
    # a group that committed offset 100 of 0-0 and nothing of 0-1: lag 150 on 0-0
    done = metaq("group", "reset", "billing", "metered", "--to", "100", "-p", "0-0", "-s", broker.servers)
    assert done.returncode == 0, done.stderr

    content_type, samples = scrape(url)
    assert content_type.startswith("text/plain; version=")
    doc = cli_stats(broker, "metered")
    parts = doc["topics"]["metered"]["partitions"]
    assert by_partition(samples, "metaq_messages_in_total", "metered") == {"0-0": 250, "0-1": 250}
    assert by_partition(samples, "metaq_produce_requests_total", "metered") == {"0-0": 5, "0-1": 5}
    assert by_partition(samples, "metaq_messages_out_total", "metered") == {"0-0": 250, "0-1": 250}
    for p in ("0", "1"):
        key = f"0-{p}"
        assert by_partition(samples, "metaq_bytes_in_total", "metered")[key] == parts[p]["put_bytes"] > 0
        assert by_partition(samples, "metaq_bytes_out_total", "metered")[key] == parts[p]["get_bytes"] > 0
        assert by_partition(samples, "metaq_messages_out_total", "metered")[key] == parts[p]["get_messages"]
        assert by_partition(samples, "metaq_fetch_requests_total", "metered")[key] == parts[p]["get_requests"]
        assert by_partition(samples, "metaq_partition_log_end_offset", "metered")[key] == parts[p][
            "log_end_offset"] == 250
        assert by_partition(samples, "metaq_partition_log_start_offset", "metered")[key] == 0
        assert by_partition(samples, "metaq_partition_size_bytes", "metered")[key] == parts[p]["put_bytes"]
        assert by_partition(samples, "metaq_partition_closed", "metered")[key] == 0
    # one append observed per batch; unflushThreshold=1 syncs at least once per batch
    assert samples["metaq_append_duration_seconds_count"][()] == 10 == doc["latency"]["append"]["count"]
    assert samples["metaq_append_duration_seconds_bucket"][(("le", "+Inf"),)] == 10
    assert samples["metaq_fsync_duration_seconds_count"][()] >= 10
    assert samples["metaq_fetch_duration_seconds_count"][()] >= 2
    assert samples["metaq_append_duration_seconds_sum"][()] > 0
    group_lag = {dict(k)["partition"]: v for k, v in samples["metaq_consumer_group_lag_messages"].items()
                 if dict(k)["group"] == "billing"}
    assert group_lag == {"0-0": 150}
    assert samples["metaq_waiting_fetches"][()] == 0
    assert samples["metaq_connections"][()] >= 0 and samples["metaq_connections_opened_total"][()] >= 3
    assert samples["metaq_data_dir_free_bytes"][()] > 0
    (info,) = samples["metaq_broker_info"]
    assert dict(info)["role"] == "master" and dict(info)["broker_id"] == "0"
    documented = set(re.findall(r"`(metaq_[a-z_]+)`", OPERATIONS_MD.read_text()))
    served = {re.sub(r"_(bucket|count|sum)$", "", name) if "duration" in name else name for name in samples}
    assert served <= documented, f"served but not in docs/operations.md: {sorted(served - documented)}"

    # counters only grow, scrape after scrape
    with connect(broker.servers) as session:
        assert session.create_producer().send(Message("metered", b"one more")).success
    _, later = scrape(url)
    assert sum(by_partition(later, "metaq_messages_in_total", "metered").values()) == 501
    with urllib.request.urlopen(url.removesuffix("/metrics") + "/", timeout=10) as reply:
        assert b"/metrics" in reply.read()
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(url.removesuffix("/metrics") + "/nope", timeout=10)
    assert missing.value.code == 404


def test_a_long_poll_is_a_waiting_fetch_in_the_metrics(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 1, "dashboardHttpPort": 0})
    url = metrics_url(broker)
    got: list[bytes] = []
    with connect(broker.servers) as session:
        session.admin().create_topic("idle", 1)
        (partition,) = session.partitions("idle")
        consumer = session.create_pull_consumer()
        reader = threading.Thread(target=lambda: got.extend(
            bytes(m.data) for m in consumer.iterate("idle", partition, 0, max_wait_ms=30_000, max_messages=1)),
            daemon=True)
        reader.start()
        wait_until(lambda: scrape(url)[1]["metaq_waiting_fetches"][()] == 1, 30, message="a waiting fetch")
        with connect(broker.servers) as other:
            assert other.create_producer().send(Message("idle", b"wake")).success
        reader.join(30)
    assert got == [b"wake"]
    assert scrape(url)[1]["metaq_waiting_fetches"][()] == 0


def test_metrics_are_off_unless_configured(broker: BrokerProcess) -> None:
    assert not [line for line in broker.log_lines if METRICS_LINE.search(line)]


def test_a_taken_metrics_port_stops_the_start_before_the_data_directory(tmp_path: Path) -> None:
    data = tmp_path / "data"
    port, result = start_broker_on_a_taken_port(data, "dashboardHttpPort")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr and "ready" not in result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert errors == [f"Error: cannot listen for metrics on 127.0.0.1:{port} (dashboardHttpPort): the address is "
                      "already in use (another broker? choose another dashboardHttpPort, or 0)"]
    assert not data.exists()


@pytest.mark.slow
def test_a_slave_reports_its_replication_lag(cluster_factory: Callable[..., BrokerProcess]) -> None:
    topics = "[topic=mirrored]\nnumPartitions=2\n"
    master = cluster_factory(1, topics=topics)
    slave = cluster_factory(1, topics=topics, name="broker-1-slave-0", args=["--slave", "--slave-id", "0"],
                            dashboardHttpPort=0)
    url = metrics_url(slave)
    with connect(master.servers) as session:
        producer = session.create_producer()
        for p in (0, 1):
            assert producer.send_batch("mirrored", [b"m"] * (100 + p), partition=p).success

    def caught_up() -> bool:
        samples = scrape(url)[1]
        ends = by_partition(samples, "metaq_partition_log_end_offset", "mirrored")
        lags = by_partition(samples, "metaq_replication_lag_messages", "mirrored")
        return ends == {"1-0": 100, "1-1": 101} and lags == {"1-0": 0, "1-1": 0}

    wait_until(caught_up, 60, message="the slave's metrics to show it caught up")
    samples = scrape(url)[1]
    (info,) = samples["metaq_broker_info"]
    assert dict(info)["role"] == "slave"
    assert set(by_partition(samples, "metaq_replication_lag_seconds", "mirrored")) == {"1-0", "1-1"}
    assert by_partition(samples, "metaq_replication_stalled", "mirrored") == {"1-0": 0, "1-1": 0}
    stats = cli_stats(slave, "mirrored")
    assert stats["replication"]["max_lag_messages"] == 0


@pytest.mark.slow
def test_a_sync_master_reports_its_in_sync_slaves(cluster_factory: Callable[..., BrokerProcess]) -> None:
    topics = "[topic=synced]\nnumPartitions=2\n"
    ha = {"syncReplication": "true", "minInSyncSlaves": 1, "inSyncMaxLagMs": 1500, "degradeToAsync": "false",
          "unflushThreshold": 0, "dashboardHttpPort": 0}
    master = cluster_factory(1, topics=topics, zk_session_timeout_ms=2000, name="replica-0",
                             args=["--slave-id", "0"], **ha)
    slave = cluster_factory(1, topics=topics, zk_session_timeout_ms=2000, name="replica-1",
                            args=["--slave", "--slave-id", "1"], **ha)
    for proc in (master, slave):
        proc.allow_log(r"replica \S+: |cannot|deposed|no longer master|took over")
    url = metrics_url(master)

    def in_sync(value: int) -> bool:
        samples = scrape(url)[1]
        return samples.get("metaq_replica_slave_in_sync", {}).get((("slave", "1"),)) == value

    wait_until(lambda: in_sync(1), 60, message="the slave in the master's in-sync set, in its metrics")
    with connect(master.servers) as session:
        assert session.create_producer().send_batch("synced", [b"s"] * 40, partition=0).success
    samples = scrape(url)[1]
    assert samples["metaq_replica_group_in_sync_slaves"][()] == 1
    assert samples["metaq_replica_group_min_in_sync_slaves"][()] == 1
    assert samples["metaq_replica_group_epoch"][()] >= 1
    assert samples["metaq_replica_slave_lag_messages"][(("slave", "1"),)] == 0  # a sync ack: the slave has it
    (info,) = samples["metaq_broker_info"]
    assert dict(info)["role"] == "master"
    (slave_info,) = scrape(metrics_url(slave))[1]["metaq_broker_info"]
    assert dict(slave_info)["role"] == "slave"

    slave.kill()
    wait_until(lambda: in_sync(0), 30, message="the dead slave out of the in-sync set, in the master's metrics")
    assert scrape(url)[1]["metaq_replica_group_in_sync_slaves"][()] == 0


@pytest.mark.parametrize("syncfs", ["auto", "off"])
def test_metaq_stats_and_the_metrics_say_whether_flushes_use_syncfs(broker_factory: Callable[..., BrokerProcess],
                                                                   syncfs: str) -> None:
    """The data directory of these tests is on ext4 or tmpfs, both known to honour syncfs: used unless the
    operator turned it off (the FUSE case: tests/system/storage/test_storage_power_loss.py)."""
    broker = broker_factory({"dashboardHttpPort": 0, "syncfs": syncfs})
    text = metaq("stats", "-s", broker.servers)
    assert text.returncode == 0, text.stderr
    (line,) = [line for line in text.stdout.splitlines() if line.startswith("# data directory on ")]
    doc = cli_stats(broker, "none")["durability"]
    assert doc["filesystem"] in ("ext4", "tmpfs"), doc
    assert doc["syncfs"] is (syncfs == "auto"), doc
    assert ("syncfs used" if syncfs == "auto" else "syncfs not used: turned off (syncfs=off)") in line
    assert any(doc["syncfs_reason"] in log_line for log_line in broker.log_lines)
    used = scrape(metrics_url(broker))[1]["metaq_storage_syncfs_used"]
    assert used == {(("filesystem", doc["filesystem"]),): 1.0 if syncfs == "auto" else 0.0}
