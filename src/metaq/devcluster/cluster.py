"""A local cluster on loopback: a real ZooKeeper and N broker processes in ZooKeeper mode.

What ``metaq cluster up``, ``python -m metaq.demo --brokers N`` and ``metaq bench --brokers N`` run::

    with DevCluster("metaq-cluster", brokers=3) as cluster:   # ZooKeeper, then brokers 1..3
        use(cluster.servers, cluster.zk_connect)
                                                               # brokers stopped (SIGTERM), then ZooKeeper

``secure=True`` runs ZooKeeper with SASL (one user, ``metaq``, the brokers' identity, its password made at the
first start and kept in ``zookeeper/metaq.password``, mode 0600) and the brokers with ``zk.zkSaslUser=metaq``
and ``zk.zkSetAcl=true``: anonymous ZooKeeper clients may read the layout but change nothing of metaq's
(docs/security.md#zookeeper).

Everything lives under one directory: ``zookeeper/`` (its config, data and log), ``broker-<id>/`` (a
broker's data), ``broker-<id>-server.ini`` and ``broker-<id>.log``. Starting again on the same
directory keeps the brokers' topics and messages, and what ZooKeeper stores persistently (consumer
offsets). Brokers run detached from the terminal (:class:`~metaq.devcluster.broker.DetachedBroker`) and
ZooKeeper in its own session, so that Ctrl-C reaches only this process, which stops the brokers first
(each deregisters, drains and flushes) and ZooKeeper last; both also stop by themselves when this
process is killed. Every wait has a deadline.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import threading
import time
import types
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from metaq.broker.launcher import BrokerLaunchError
from metaq.cluster.layout import DEFAULT_ROOT, normalize_root
from metaq.cluster.zk_security import ZK_PASSWORD_ENV, ZkSecurity
from metaq.devcluster.broker import DetachedBroker, cluster_server_ini
from metaq.devcluster.zookeeper import ZooKeeperServer, ZooKeeperUnavailable
from metaq.errors import MetaqError

__all__ = ["BrokerInfo", "DevCluster", "DevClusterError", "ZooKeeperUnavailable"]

BROKERS_MAX = 16
"""More would only share the same cores; a dev cluster shows the behaviour with 2-5."""
SLAVES_MAX = 4
BROKER_STOP_TIMEOUT_S = 15.0
"""How long a broker may take to drain and flush after SIGTERM before it is killed."""
ZOOKEEPER_STOP_TIMEOUT_S = 30.0
EXIT_INTERRUPTED = 130
"""128 + SIGINT, what a shell expects of a command stopped by Ctrl-C."""


ZK_USER = "metaq"
"""The brokers' ZooKeeper identity in a ``secure`` dev cluster."""


def _zk_password(directory: Path) -> str:
    """The brokers' ZooKeeper password of a secure dev cluster: made once, kept beside ZooKeeper's data (0600)."""
    path = directory / "metaq.password"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    directory.mkdir(parents=True, exist_ok=True)
    password = secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(password + "\n")
    return password


class DevClusterError(MetaqError):
    """The cluster could not start; the message says which process and why, in one line."""


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    broker_id: int
    address: str
    """``host:port`` it serves on (and is registered with in ZooKeeper)."""
    pid: int
    data_dir: Path
    config_path: Path
    log_path: Path


class DevCluster:
    """ZooKeeper plus brokers ``1..brokers`` under ``directory`` (see the module docstring).

    ``port``: the first broker's port (broker *i* gets ``port + i - 1``); 0 lets the kernel choose each.
    ``zk_port`` likewise for ZooKeeper. ``partitions``: the brokers' ``numPartitions``, the partitions a
    topic gets on each broker. ``system``: more ``[system]`` options for every broker; ``topics``:
    ``[topic=NAME]`` sections for every broker (a topic there is spread over all of them at start).
    """

    def __init__(self, directory: str | Path, brokers: int = 3, *, port: int = 0, zk_port: int = 0,
                 zk_root: str = DEFAULT_ROOT, partitions: int = 2, session_timeout_ms: int = 10_000,
                 system: Mapping[str, Any] | None = None, topics: str = "", ready_timeout_s: float = 60.0,
                 slaves: int = 0, ha: bool = False, secure: bool = False) -> None:
        if not 1 <= brokers <= BROKERS_MAX:
            raise DevClusterError(f"a local cluster has 1 to {BROKERS_MAX} brokers, not {brokers}")
        self.directory = Path(directory).resolve()
        self.zk_root = normalize_root(zk_root)
        self.session_timeout_ms = session_timeout_ms
        self.ready_timeout_s = ready_timeout_s
        self.secure = secure
        self.zk_password = _zk_password(self.directory / "zookeeper") if secure else None
        """The brokers' ZooKeeper password (``secure``): what METAQ_ZK_PASSWORD must hold for the CLI."""
        self.zookeeper = ZooKeeperServer(self.directory / "zookeeper", port=zk_port, stop_with_parent=True,
                                         ready_timeout_s=ready_timeout_s,
                                         sasl_users={ZK_USER: self.zk_password} if self.zk_password else None)
        self.system = {"numPartitions": partitions, "unflushThreshold": 0, **(system or {})}
        """group commit: every acknowledged message is on disk, at a fraction of fsync-per-batch's cost"""
        self.topics = topics
        self.ha = ha
        """HA mode (docs/replication.md): every replica gets a replica id, the master 0 and slave s s + 1; the
        caller puts syncReplication / autoFailover in ``system``."""
        env = {ZK_PASSWORD_ENV: self.zk_password} if self.zk_password else None
        self.brokers: dict[int, DetachedBroker] = {
            b: DetachedBroker(self.directory / f"broker-{b}", port=port + b - 1 if port else 0,
                              ready_timeout_s=ready_timeout_s, log_path=self.directory / f"broker-{b}.log",
                              args=["--slave-id", "0"] if ha else [], env=env)
            for b in range(1, brokers + 1)}
        if not 0 <= slaves <= SLAVES_MAX:
            raise DevClusterError(f"a local cluster has 0 to {SLAVES_MAX} slaves per broker, not {slaves}")
        self.slaves: dict[tuple[int, int], DetachedBroker] = {
            (b, s): DetachedBroker(self.directory / f"broker-{b}-slave-{s}", ready_timeout_s=ready_timeout_s,
                                   log_path=self.directory / f"broker-{b}-slave-{s}.log",
                                   args=["--slave", "--slave-id", str(s + 1 if ha else s)], env=env)
            for b in range(1, brokers + 1) for s in range(slaves)}
        """Async slaves (docs/replication.md): slave ``s`` of broker ``b``, started after the masters."""
        self._reported_exits: set[int] = set()

    # -- what is running ------------------------------------------------------------------------

    @property
    def zk_connect(self) -> str:
        return self.zookeeper.connect_string

    @property
    def servers(self) -> str:
        """Every broker, ``host:port,...`` in broker id order (what a client's ``servers`` takes)."""
        return ",".join(b.servers for b in self.brokers.values())

    def _zk_options(self) -> dict[str, Any]:
        return {"zk.zkSaslUser": ZK_USER, "zk.zkSetAcl": True} if self.secure else {}

    def zk_security(self) -> ZkSecurity:
        """How a client of this cluster logs in to its ZooKeeper as the brokers do (anonymous unless ``secure``)."""
        if self.zk_password is None:
            return ZkSecurity()
        return ZkSecurity(sasl_user=ZK_USER, sasl_password=self.zk_password, set_acl=True)

    def info(self) -> list[BrokerInfo]:
        out = []
        for broker_id, proc in self.brokers.items():
            assert proc.log_path is not None
            out.append(BrokerInfo(broker_id, proc.servers, proc.pid, proc.data_dir, proc.config_path, proc.log_path))
        return out

    # -- start and stop --------------------------------------------------------------------------

    def start(self) -> Self:
        """ZooKeeper, then every broker (side by side), then a check that ZooKeeper lists them all.

        DevClusterError (ZooKeeperUnavailable when it is not installed) saying what failed; whatever
        had started is stopped again first, as on Ctrl-C meanwhile.
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            try:
                self.zookeeper.start()
            except ZooKeeperUnavailable:
                raise
            except RuntimeError as exc:
                raise DevClusterError(f"ZooKeeper did not start (its log: {self.zookeeper.log_path}): "
                                      f"{str(exc).splitlines()[0]}") from None
            for broker_id, proc in [*self.brokers.items(), *((b, p) for (b, _), p in self.slaves.items())]:
                proc.config_text = cluster_server_ini(broker_id, self.zk_connect, zk_root=self.zk_root,
                                                      session_timeout_ms=self.session_timeout_ms, system=self.system,
                                                      topics=self.topics, zookeeper=self._zk_options())
            with ThreadPoolExecutor(len(self.brokers), thread_name_prefix="metaq-devcluster") as pool:
                failures = [f for f in (pool.submit(self._start_broker, b) for b in self.brokers) if f.result()]
            if failures:
                raise DevClusterError("; ".join(f.result() for f in failures))
            self._wait_registered()
            for (broker_id, slave_id), proc in self.slaves.items():
                try:
                    proc.start()
                except BrokerLaunchError:
                    raise DevClusterError(f"slave {slave_id} of broker {broker_id} did not start; see "
                                          f"{proc.log_path}") from None
        except BaseException:
            self.stop()
            raise
        return self

    def _start_broker(self, broker_id: int) -> str:
        """Start one broker; '' when it is ready, else why not (one line)."""
        proc = self.brokers[broker_id]
        try:
            proc.start()
        except BrokerLaunchError:
            errors = [line for line in proc.log_lines if line.startswith("Error:")]
            why = errors[-1].removeprefix("Error: ") if errors else f"see {proc.log_path}"
            return f"broker {broker_id} did not start: {why}"
        return ""

    def _wait_registered(self) -> None:
        """Each broker prints its ready line once registered; this checks it from ZooKeeper's side."""
        from metaq.cluster.zookeeper import ZooKeeperRegistry  # kazoo only in ZooKeeper mode

        expected = {b: proc.servers for b, proc in self.brokers.items()}
        registry = ZooKeeperRegistry(self.zk_connect, self.zk_root, watch_cluster=True, read_only=True,
                                     connection_timeout_ms=int(self.ready_timeout_s * 1000),
                                     security=self.zk_security()).start()
        try:
            deadline = time.monotonic() + self.ready_timeout_s
            while True:
                brokers = registry.snapshot().brokers
                seen = {b: str(e.master) for b, e in brokers.items() if e.master is not None}
                if seen == expected:
                    return
                if time.monotonic() > deadline:
                    raise DevClusterError(f"ZooKeeper lists brokers {seen} under {self.zk_root}, expected {expected}")
                time.sleep(0.05)
        finally:
            registry.close()

    def stop(self) -> None:
        """Brokers first (SIGTERM, side by side; killed after BROKER_STOP_TIMEOUT_S), then ZooKeeper.
        Idempotent."""
        for slave in self.slaves.values():  # slaves first: they would only log their master's absence
            if slave.running:
                slave.stop_or_kill(BROKER_STOP_TIMEOUT_S)
        running = [proc for proc in self.brokers.values() if proc.running]
        if running:
            with ThreadPoolExecutor(len(running), thread_name_prefix="metaq-devcluster") as pool:
                list(pool.map(lambda p: p.stop_or_kill(BROKER_STOP_TIMEOUT_S), running))
        self.zookeeper.stop(ZOOKEEPER_STOP_TIMEOUT_S)

    def wipe(self) -> None:
        """Delete the directory (only while nothing runs)."""
        assert not self.zookeeper.running and not any(p.running for p in self.brokers.values())
        assert not any(p.running for p in self.slaves.values())
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- in the foreground -----------------------------------------------------------------------

    def exits(self) -> list[str]:
        """A line for each process that ended since the last call without being stopped by us."""
        lines = []
        for broker_id, proc in self.brokers.items():
            if proc.proc is not None and not proc.running and proc.pid not in self._reported_exits:
                self._reported_exits.add(proc.pid)
                lines.append(f"broker {broker_id} (pid {proc.pid}) exited: {_exit_text(proc.proc.returncode)}; "
                             f"its log: {proc.log_path}")
        return lines

    def serve(self, report: Callable[[str], None], poll_s: float = 0.5) -> int:
        """Keep the cluster up until SIGINT, SIGTERM or SIGHUP (or ZooKeeper exits), then stop it.

        ``report`` gets a line for each broker that exits meanwhile (a user may kill one to see what
        clients do) and for the stop itself. Returns the exit code: 130 after SIGINT (Ctrl-C), 0 after
        SIGTERM or SIGHUP, 1 if ZooKeeper died. Another Ctrl-C while stopping is answered with a line;
        the stop itself is bounded by its timeouts.
        """
        stop = threading.Event()
        received: list[int] = []

        def on_signal(signum: int, frame: types.FrameType | None) -> None:
            if stop.is_set():
                report("still stopping: brokers first, then ZooKeeper (at most "
                       f"{BROKER_STOP_TIMEOUT_S + ZOOKEEPER_STOP_TIMEOUT_S:.0f}s)")
                return
            received.append(signum)
            stop.set()
            report(f"{signal.Signals(signum).name}: stopping the brokers (SIGTERM: deregister, drain, flush), "
                   "then ZooKeeper ...")

        handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        previous = {sig: signal.signal(sig, on_signal) for sig in handled}
        code = 0
        try:
            while not stop.wait(poll_s):
                for line in self.exits():
                    report(line)
                if not self.zookeeper.running:
                    report(f"ZooKeeper exited; its log: {self.zookeeper.log_path}")
                    code = 1
                    stop.set()
            if received:
                code = EXIT_INTERRUPTED if received[0] == signal.SIGINT else 0
            self.stop()
            report("stopped")
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return code


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"
