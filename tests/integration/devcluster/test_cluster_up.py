"""`metaq cluster up` as a user runs it: a real ZooKeeper and broker processes, stopped by Ctrl-C, SIGTERM
or the death of the command itself, leaving no process behind; a start that cannot succeed says why in
one line and stops what it had started."""

from __future__ import annotations

import os
import re
import signal
import socket
from pathlib import Path

from cli_process import CliProcess, assert_quiet_interrupt, metaq

from metaq.client import Message, connect
from metaq.cluster.zookeeper import ZooKeeperRegistry
from metaq.testing import wait_until
from metaq.testing.processes import alive, processes_using
from metaq.types import PartitionId as P

LINE = re.compile(r"^(ZooKeeper|broker (\d+))\s+(\S+)\s+pid (\d+)")


def start_cluster(directory: Path, *args: str) -> tuple[CliProcess, dict[str, tuple[str, int]]]:
    """`metaq cluster up` on kernel-chosen ports; what it printed: name -> (address, pid)."""
    proc = CliProcess("cluster", "up", "--dir", str(directory), "--port", "0", "--zk-port", "0", *args)
    wait_until(lambda: any(line.startswith("Ctrl-C stops") for line in proc.stdout) or proc.proc.poll() is not None,
               90, message=f"the cluster to be up (stderr: {proc.stderr})")
    assert proc.proc.poll() is None, f"exited {proc.proc.returncode}: {proc.stderr}"
    running = {m.group(1): (m.group(3), int(m.group(4))) for m in map(LINE.match, proc.stdout) if m}
    return proc, running


def test_cluster_up_serves_a_topic_spread_over_three_brokers_until_ctrl_c(tmp_path: Path) -> None:
    directory = tmp_path / "cluster"
    proc, running = start_cluster(directory, "--brokers", "3", "-t", "orders")
    try:
        assert sorted(running) == ["ZooKeeper", "broker 1", "broker 2", "broker 3"]
        zk = running["ZooKeeper"][0]
        servers = ",".join(running[f"broker {b}"][0] for b in (1, 2, 3))
        assert f"servers     {servers}" in proc.stdout
        assert any(line.startswith(f"zk_connect  {zk}") for line in proc.stdout)

        registry = ZooKeeperRegistry(zk, "/meta").start()  # what it printed is what ZooKeeper holds
        try:
            brokers = registry.snapshot().brokers
            assert {b: str(e.master) for b, e in brokers.items()} == \
                {b: running[f"broker {b}"][0] for b in (1, 2, 3)}
            spread = [P(b, p) for b in (1, 2, 3) for p in (0, 1)]
            assert registry.snapshot().partitions("orders", publish=True) == spread
        finally:
            registry.close()

        with connect(running["broker 2"][0]) as session:  # any one broker: every broker's partitions
            producer = session.create_producer()
            landed = {producer.send(Message("orders", b"m%d" % i)).partition_id for i in range(12)}
        assert landed == {P(b, p) for b in (1, 2, 3) for p in (0, 1)}

        proc.interrupt()  # Ctrl-C: SIGINT to the command's process group, as a terminal sends it
        assert_quiet_interrupt(proc)
    finally:
        proc.kill()
    assert any("SIGINT: stopping the brokers" in line for line in proc.stderr) and proc.stderr[-1] == "stopped"
    assert not [pid for _, pid in running.values() if alive(pid)], "every process it started is gone"
    assert processes_using(directory) == []
    for b in (1, 2, 3):  # each broker stopped cleanly while ZooKeeper was still there to deregister from
        log = (directory / f"broker-{b}.log").read_text()
        assert "stopped cleanly" in log and "cannot deregister" not in log, log[-2000:]


def test_sigterm_exits_0_and_a_restart_on_the_same_directory_keeps_the_messages(tmp_path: Path) -> None:
    directory = tmp_path / "cluster"
    proc, running = start_cluster(directory, "--brokers", "2", "-t", "kept", "-p", "1")
    try:
        with connect(running["broker 1"][0]) as session:
            result = session.create_producer().send_batch("kept", [b"a", b"b", b"c", b"d"])
            assert result.success
        os.kill(proc.proc.pid, signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        proc.kill()
    assert not [pid for _, pid in running.values() if alive(pid)]

    again, running = start_cluster(directory, "--brokers", "2", "-p", "1")
    try:
        with connect(running["broker 2"][0]) as session:
            stored = {d.partition.id: d.latest for d in session.admin().describe_topic("kept").partitions}
        assert sum(stored.values()) == 4 and set(stored) == {P(1, 0), P(2, 0)}
        os.kill(again.proc.pid, signal.SIGTERM)
        assert again.wait(60) == 0
    finally:
        again.kill()
    assert processes_using(directory) == []


def test_a_killed_cluster_up_takes_zookeeper_and_its_brokers_with_it(tmp_path: Path) -> None:
    directory = tmp_path / "cluster"
    proc, running = start_cluster(directory, "--brokers", "2")
    proc.kill()  # SIGKILL: no chance to stop anything
    wait_until(lambda: not processes_using(directory) and not [pid for _, pid in running.values() if alive(pid)],
               30, message="ZooKeeper (parent-death signal) and the brokers (they watch their parent) to stop")


def test_without_zookeeper_installed_it_says_how_to_get_it(tmp_path: Path) -> None:
    empty = tmp_path / "no-jars"
    empty.mkdir()
    env = {**os.environ, "METAQ_ZOOKEEPER_CLASSPATH": str(empty)}
    result = metaq("cluster", "up", "--dir", str(tmp_path / "cluster"), "--port", "0", "--zk-port", "0",
                   env=env)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "without jars" in errors[0] and "apt-get install zookeeper" in errors[0], result.stderr
    assert "Traceback" not in result.stderr


def test_a_broker_that_cannot_start_is_named_and_nothing_is_left_running(tmp_path: Path) -> None:
    directory = tmp_path / "cluster"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = metaq("cluster", "up", "--dir", str(directory), "--brokers", "2", "--port", str(port),
                       "--zk-port", "0", timeout_s=120)
    assert result.returncode == 1, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and errors[0].startswith("Error: broker 1 did not start:") and "in use" in errors[0], \
        result.stderr
    assert "Traceback" not in result.stderr
    assert processes_using(directory) == []


def test_cluster_up_secure_runs_a_cluster_only_its_zookeeper_user_may_change(tmp_path: Path) -> None:
    from kazoo.client import KazooClient
    from kazoo.exceptions import NoAuthError

    directory = tmp_path / "cluster"
    proc, running = start_cluster(directory, "--brokers", "1", "-t", "orders", "--secure")
    try:
        password_file = directory / "zookeeper" / "metaq.password"
        assert password_file.stat().st_mode & 0o777 == 0o600
        assert any("METAQ_ZK_USER=metaq" in line and "metaq.password" in line for line in proc.stdout)
        zk = running["ZooKeeper"][0]
        env = {**os.environ, "METAQ_ZK_USER": "metaq", "METAQ_ZK_PASSWORD": password_file.read_text().strip(),
               "METAQ_PASSWORD": "a password for alice"}
        added = metaq("acl", "user", "add", "alice", "-z", zk, env=env)
        assert added.returncode == 0, added.stderr
        shown = metaq("cluster", "-z", zk, env=env)
        assert shown.returncode == 0 and f"1   master  {running['broker 1'][0]}" in shown.stdout, shown

        anonymous = KazooClient(hosts=zk)
        anonymous.start(20)
        try:
            assert anonymous.get("/meta/brokers/ids/1/master")[0].decode() == f"meta://{running['broker 1'][0]}"
            for attempt in (lambda: anonymous.get("/meta/metaq-security/users/alice"),
                            lambda: anonymous.set("/meta/metaq-security/users/alice", b"{}"),
                            lambda: anonymous.delete("/meta/brokers/topics-pub/orders/1-m")):
                try:
                    attempt()
                except NoAuthError:
                    continue
                raise AssertionError("an anonymous ZooKeeper client changed or read a secured node")
        finally:
            anonymous.stop()
            anonymous.close()
        with connect(running["broker 1"][0]) as session:
            assert session.create_producer().send(Message("orders", b"x")).success
        os.kill(proc.proc.pid, signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        proc.kill()
    assert processes_using(directory) == []
