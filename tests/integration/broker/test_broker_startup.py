"""A broker that cannot start says why in one line and exits non-zero; a bad reload changes nothing.

Each case runs a real ``python -m metaq.broker`` process. Exit codes: 2 when the configuration (file
or flags) is wrong, 1 when a valid configuration cannot be served (port taken, data directory unusable).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_process import metaq

from metaq.client import Message, connect
from metaq.errors import InvalidRequestError
from metaq.protocol import messages as m
from metaq.protocol.records import encode_values
from metaq.testing import BrokerProcess, wait_until
from metaq.testing.raw import RawClient


def _broker(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """Run a broker that is expected to fail before it serves (a deadline bounds it otherwise)."""
    return subprocess.run([sys.executable, "-m", "metaq.broker", "--serverPort", "0", *args],
                          capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    assert "ready" not in result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def test_data_path_that_is_a_file(tmp_path: Path) -> None:
    a_file = tmp_path / "data"
    a_file.write_text("not a directory")
    result = _broker("--dataPath", str(a_file))
    assert result.returncode == 1
    assert _error_line(result) == f"Error: dataPath {a_file} is not a directory"


def test_data_path_under_a_file(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    result = _broker("--dataPath", str(a_file / "data"))
    assert result.returncode == 1
    line = _error_line(result)
    assert str(a_file / "data") in line and "Not a directory" in line


def test_data_path_in_use_by_another_broker(broker_factory: Callable[..., BrokerProcess]) -> None:
    first = broker_factory()
    result = _broker("--dataPath", str(first.data_dir))
    assert result.returncode == 1
    assert "in use by another process" in _error_line(result)
    assert first.running  # and the first broker is untouched
    with connect(first.servers) as session:
        assert session.create_producer().send(Message("still", b"here")).success


def test_port_in_use_is_found_before_the_data_directory_is_created(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        data = tmp_path / "data"
        result = _broker("--dataPath", str(data), "--serverPort", str(port))
    assert result.returncode == 1
    line = _error_line(result)
    assert f"127.0.0.1:{port}" in line and "in use" in line
    assert not data.exists()


def test_a_bad_configuration_exits_2(tmp_path: Path) -> None:
    ini = tmp_path / "server.ini"
    ini.write_text("[system]\nunflushTreshold=1\n")
    result = _broker("-f", str(ini), "--dataPath", str(tmp_path / "data"))
    assert result.returncode == 2
    assert "did you mean 'unflushThreshold'?" in _error_line(result)
    missing = _broker("-f", str(tmp_path / "nope.ini"))
    assert missing.returncode == 2 and "cannot read the configuration file" in _error_line(missing)


# -- reload -----------------------------------------------------------------------------------------

CONFIG = "[system]\nnumPartitions=1\n\n[topic=grow]\nnumPartitions=2\n"


@pytest.mark.parametrize("how", ["sighup", "admin"])
def test_a_reload_with_a_bad_file_keeps_the_running_configuration(
        broker_factory: Callable[..., BrokerProcess], how: str) -> None:
    broker = broker_factory(config_text=CONFIG)
    broker.allow_log(r"reload of .* refused: .*section appears twice")  # one line, no traceback: checked below
    c = RawClient.to(broker)
    broker.config_path.write_text(CONFIG + "[topic=grow]\nacceptPublish=false\n")  # a section twice
    if how == "sighup":
        broker.signal(signal.SIGHUP)
        wait_until(lambda: any("refused" in line for line in broker.log_lines), message="the refusal to be logged")
    else:
        reply = c.call(m.ReloadRequest())
        assert reply.error_code == InvalidRequestError.code
        assert "section appears twice (first at line 4)" in reply.error_message
        wait_until(lambda: any("refused" in line for line in broker.log_lines), message="the refusal to be logged")
    refusal = [line for line in broker.log_lines if "refused" in line]
    assert len(refusal) == 1 and "server.ini:6: [topic=grow]: section appears twice" in refusal[0]
    assert not any("Traceback" in line or "unexpected error" in line for line in broker.log_lines)
    # the old configuration keeps working
    reply = c.call(m.ProduceRequest("grow", 1, 1, 5000, encode_values([b"x"], 1)))
    assert reply.error_code == 0
    assert len(c.call(m.MetadataRequest(["grow"])).topics[0].partitions) == 2


@pytest.mark.parametrize("how", ["sighup", "admin"])
def test_a_reload_that_grows_num_partitions_makes_the_new_partitions_usable(
        broker_factory: Callable[..., BrokerProcess], how: str) -> None:
    broker = broker_factory(config_text=CONFIG)
    with connect(broker.servers) as session:
        producer = session.create_producer()
        assert producer.send_batch("grow", [b"before"], partition=1).success
        broker.config_path.write_text(CONFIG.replace("numPartitions=2", "numPartitions=4"))
        if how == "sighup":
            broker.signal(signal.SIGHUP)
            wait_until(lambda: any("reloaded" in line for line in broker.log_lines), message="the reload")
        else:
            assert session.admin().reload() == ["grow"]
        c = RawClient.to(broker)
        assert len(c.call(m.MetadataRequest(["grow"])).topics[0].partitions) == 4
        for partition in (2, 3):
            result = producer.send_batch("grow", [f"p{partition}".encode()], partition=partition)
            assert result.success, result.errors
        consumer = session.create_pull_consumer()
        assert [bytes(x.data) for x in consumer.get("grow", 3, 0)] == [b"p3"]


RESTART_BEFORE = "[system]\nnumPartitions=1\nmaxTransferSize=1m\n\n[topic=grow]\nnumPartitions=2\n"
RESTART_AFTER = ("[system]\nnumPartitions=1\nmaxTransferSize=2k\nmaxSegmentSize=64m\n\n[topic=grow]\nnumPartitions=3\n"
                 "\n[zookeeper]\nzk.zkConnect=127.0.0.1:1\n")


@pytest.mark.parametrize("how", ["sighup", "admin", "cli"])
def test_a_reload_names_the_changed_options_only_a_restart_applies_and_keeps_their_running_values(
        broker_factory: Callable[..., BrokerProcess], how: str) -> None:
    broker = broker_factory(config_text=RESTART_BEFORE)
    pending = "maxSegmentSize, maxTransferSize, [zookeeper]"
    warned = f"changed but applied only by a restart: {pending}"
    with connect(broker.servers) as session:
        producer = session.create_producer()
        for _ in range(4):  # four batches of 1.5 kB: maxTransferSize=2k would send one per fetch
            assert producer.send_batch("grow", [b"x" * 1500], partition=0).success
        broker.config_path.write_text(RESTART_AFTER)
        for _ in range(2):  # still pending on the next reload: the broker still runs with the old values
            seen = len([line for line in broker.log_lines if warned in line])
            if how == "admin":
                result = session.admin().reload()
                assert result == ["grow"] or result == []  # numPartitions applied live the first time
                assert result.restart_required == ["maxSegmentSize", "maxTransferSize", "[zookeeper]"]
            elif how == "cli":
                done = metaq("admin", "reload", "-s", broker.servers)
                assert done.returncode == 0, done.stderr
                assert done.stdout.startswith("reloaded; topics changed: ")
                assert done.stderr.strip() == f"not applied until the broker restarts: {pending}"
            else:
                broker.signal(signal.SIGHUP)
            wait_until(lambda seen=seen: len([line for line in broker.log_lines if warned in line]) > seen, 30,
                       message="the restart-only options to be named in the log")
        warning = next(line for line in broker.log_lines if warned in line)
        assert " WARNING " in warning and str(broker.config_path) in warning
        assert len(session.partitions("grow")) == 3  # what a reload can apply, it did
        # maxTransferSize=2k is not in force until a restart: one fetch still brings all four batches
        c = RawClient.to(broker)
        reply = c.call(m.FetchRequest("grow", 0, 0, 1 << 20, 0))
        assert reply.error_code == 0 and len(reply.records) > 4 * 1500


def test_stat_is_accepted_and_the_start_warns_that_it_has_no_effect(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory(config_text="[system]\nnumPartitions=1\nstat=true\n")
    warning = f"warning: {broker.config_path}:3: stat: MetaQ option accepted but without effect"
    wait_until(lambda: any(line.startswith(warning) for line in broker.log_lines), message="the warning")
    with connect(broker.servers) as session:  # and statistics are kept all the same
        assert session.create_producer().send(Message("counted", b"x")).success
        assert session.admin().stats("counted")["topics"]["counted"]["partitions"]["0"]["put_messages"] == 1


def test_a_broker_killed_with_kill_9_starts_again_at_once_on_the_same_ports(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    """kill -9 leaves the connections of each listener in TIME-WAIT (or FIN-WAIT) on the broker's side for
    about a minute; every listener binds with SO_REUSEADDR, so a restart on the same ports is not refused
    as "the address is already in use" (a listener without it was, for ~60 s after a Prometheus scrape)."""
    from metaq.testing.ports import unused_port

    ports = {"httpPort": unused_port(), "dashboardHttpPort": unused_port()}
    broker = broker_factory({"numPartitions": 1, **ports})
    for port in ports.values():  # a scrape each, whose connection the broker closes (it stays in TIME-WAIT)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as peer:
            path = b"/metrics" if port == ports["dashboardHttpPort"] else b"/topics"
            peer.sendall(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            reply = b""
            while chunk := peer.recv(65536):
                reply += chunk
            assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
    with connect(broker.servers) as session:  # and a client's connection to the broker's own port
        assert session.create_producer().send(Message("kept", b"before")).success
        broker.kill()
    broker.start()
    assert broker.metrics_url is not None and f":{ports['dashboardHttpPort']}/" in broker.metrics_url
    with connect(broker.servers) as session:
        assert session.create_producer().send(Message("kept", b"after")).success
