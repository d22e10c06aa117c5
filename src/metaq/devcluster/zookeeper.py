"""A real ZooKeeper server in a child process, on 127.0.0.1, for a local dev cluster and for tests.

It runs the ZooKeeper that Debian's ``zookeeper`` package installs (``/usr/share/java/zookeeper.jar``,
its dependencies on the jar's Class-Path) with the machine's Java: standalone mode, one data
directory, the admin HTTP server off, the four-letter words ``ruok``/``srvr``/``stat``/``mntr``/``cons``
allowed. ``start()`` returns once ``ruok`` answers ``imok`` and ``srvr`` says ``Mode: standalone``
(ZooKeeper answers ``ruok`` before it accepts sessions), within a deadline. ``stop()`` and ``start()``
again keep the port and the data: what a ZooKeeper restart looks like to its clients.

Set ``METAQ_ZOOKEEPER_CLASSPATH`` to use another installation (a directory of jars or a class path).

Secured (docs/security.md#zookeeper): ``sasl_users`` (name -> password) writes a JAAS ``Server`` section
with ZooKeeper's ``DigestLoginModule`` and turns on ``authProvider.sasl``, so clients may log in with SASL
DIGEST-MD5 and ZooKeeper knows them as ``sasl:<name>``; ``require_sasl`` also refuses every request of a
session that has not (ZooKeeper 3.7's ``enforce.auth.enabled``). ``tls`` adds the TLS client port
(``secureClientPort``, served by ZooKeeper's Netty connection factory) with a PEM certificate and key, the
plain port staying for the readiness check and for clients that do not use TLS.

``stop_with_parent=True`` (what ``metaq cluster up`` and the demo use) has the kernel send the server
SIGTERM when the thread that started it dies, even by SIGKILL: the server runs in its own session, out
of reach of the terminal's signals, and would otherwise outlive a killed parent holding its port.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

DEBIAN_CLASSPATH = "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar"
MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
NETTY_JARS = ("/usr/share/java/netty-codec.jar", "/usr/share/java/netty-resolver.jar")
"""What ZooKeeper's Netty factory (its TLS port) needs beyond the Class-Path of Debian's zookeeper.jar."""
NETTY_FACTORY = "org.apache.zookeeper.server.NettyServerCnxnFactory"


@dataclass(frozen=True)
class ZooKeeperTls:
    """The TLS client port's certificate (PEM), its key (PEM, PKCS#8), and the CA client certificates are
    checked against; ``client_auth``: ``none``, ``want`` or ``need``."""

    cert_file: Path
    key_file: Path
    ca_file: Path
    client_auth: str = "none"


class ZooKeeperUnavailable(RuntimeError):
    """Java or the ZooKeeper jars are not installed (scripts/system-deps.sh installs Debian's zookeeper)."""


def zookeeper_classpath() -> str:
    configured = os.environ.get("METAQ_ZOOKEEPER_CLASSPATH")
    if configured:
        path = Path(configured)
        if path.is_dir():
            jars = sorted(path.glob("*.jar"))
            if not jars:
                raise ZooKeeperUnavailable(f"METAQ_ZOOKEEPER_CLASSPATH={configured} is a directory without jars")
            return os.pathsep.join(str(p) for p in jars)
        return configured
    if not Path("/usr/share/java/zookeeper.jar").exists():
        raise ZooKeeperUnavailable("ZooKeeper is not installed (no /usr/share/java/zookeeper.jar): run "
                                   "scripts/system-deps.sh (apt-get install zookeeper), or set "
                                   "METAQ_ZOOKEEPER_CLASSPATH")
    return DEBIAN_CLASSPATH


def four_letter_word(host: str, port: int, word: str, timeout_s: float = 2.0) -> str:
    """Send one of ZooKeeper's four-letter commands; its answer ('' if the server does not answer)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(word.encode())
            chunks = []
            while True:
                data = sock.recv(65536)
                if not data:
                    break
                chunks.append(data)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


def _parent_death_signal() -> Callable[[], None] | None:
    """A ``preexec_fn`` asking Linux for SIGTERM when the parent dies (prctl PR_SET_PDEATHSIG); None elsewhere.

    The libc function is looked up here, before the fork: the child only makes the one call.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def ask() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)

    return ask


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ZooKeeperServer:
    """One standalone ZooKeeper: ``with ZooKeeperServer(dir) as zk: zk.connect_string``."""

    def __init__(self, directory: str | Path, *, port: int = 0, tick_ms: int = 200,
                 min_session_timeout_ms: int = 1000, max_session_timeout_ms: int = 60_000,
                 ready_timeout_s: float = 60.0, stop_with_parent: bool = False,
                 sasl_users: Mapping[str, str] | None = None, require_sasl: bool = False,
                 tls: ZooKeeperTls | None = None) -> None:
        if require_sasl and not sasl_users:
            raise ValueError("require_sasl needs sasl_users")
        self.directory = Path(directory)
        self.sasl_users = dict(sasl_users or {})
        self.require_sasl = require_sasl
        self.tls = tls
        self.secure_port = 0
        """The TLS client port (with ``tls``), chosen at the first start and kept on restarts."""
        self.stop_with_parent = stop_with_parent
        self.host = "127.0.0.1"
        self.port = port
        self.tick_ms = tick_ms
        self.min_session_timeout_ms = min_session_timeout_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.ready_timeout_s = ready_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def connect_string(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def secure_connect_string(self) -> str:
        """``host:port`` of the TLS client port (with ``tls``)."""
        if self.tls is None:
            raise ValueError("this ZooKeeper has no TLS port (tls=None)")
        return f"{self.host}:{self.secure_port}"

    @property
    def log_path(self) -> Path:
        return self.directory / "zookeeper.out"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _write_config(self) -> Path:
        data = self.directory / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.directory / "zoo.cfg"
        config.write_text(
            f"tickTime={self.tick_ms}\n"
            f"dataDir={data}\n"
            f"clientPort={self.port}\n"
            f"clientPortAddress={self.host}\n"
            f"minSessionTimeout={self.min_session_timeout_ms}\n"
            f"maxSessionTimeout={self.max_session_timeout_ms}\n"
            "maxClientCnxns=0\n"
            "admin.enableServer=false\n"
            "4lw.commands.whitelist=ruok,srvr,stat,mntr,cons\n"
            "autopurge.purgeInterval=0\n"
            + self._security_config())
        return config

    def _security_config(self) -> str:
        lines = []
        if self.sasl_users:
            lines.append("authProvider.sasl=org.apache.zookeeper.server.auth.SASLAuthenticationProvider")
        if self.require_sasl:
            lines += ["enforce.auth.enabled=true", "enforce.auth.schemes=sasl"]
        if self.tls is not None:
            keystore = self.directory / "keystore.pem"  # ZooKeeper's PEM key store: key and chain in one file
            keystore.write_bytes(self.tls.key_file.read_bytes() + b"\n" + self.tls.cert_file.read_bytes())
            keystore.chmod(0o600)
            lines += [f"secureClientPort={self.secure_port}", f"secureClientPortAddress={self.host}",
                      f"serverCnxnFactory={NETTY_FACTORY}",
                      f"ssl.keyStore.location={keystore}", "ssl.keyStore.type=PEM",
                      f"ssl.trustStore.location={self.tls.ca_file}", "ssl.trustStore.type=PEM",
                      f"ssl.clientAuth={self.tls.client_auth}"]
        return "".join(line + "\n" for line in lines)

    def _write_jaas(self) -> Path | None:
        """The JAAS file of the SASL users (ZooKeeper keeps their passwords in clear there: mode 0600)."""
        if not self.sasl_users:
            return None
        jaas = self.directory / "jaas.conf"
        users = "".join(f'    user_{name}="{password}"\n' for name, password in self.sasl_users.items())
        jaas.write_text("Server {\n    org.apache.zookeeper.server.auth.DigestLoginModule required\n"
                        f"{users.rstrip()};\n}};\n")
        jaas.chmod(0o600)
        return jaas

    def start(self) -> ZooKeeperServer:
        """Start (or restart on the same port and data); returns once it accepts sessions."""
        if self.running:
            return self
        java = shutil.which("java")
        if java is None:
            raise ZooKeeperUnavailable("java is not on PATH (ZooKeeper needs a Java runtime)")
        classpath = zookeeper_classpath()
        self.directory.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + self.ready_timeout_s
        fixed_port = self.port != 0
        while True:
            if not fixed_port:
                self.port = _free_port()
            if self.tls is not None and (not fixed_port or self.secure_port == 0):
                self.secure_port = _free_port()
            config = self._write_config()
            jaas = self._write_jaas()
            java_options = [f"-Djava.security.auth.login.config={jaas}"] if jaas is not None else []
            if self.tls is not None:
                classpath = os.pathsep.join([classpath, *(j for j in NETTY_JARS if Path(j).exists())])
            self._log = open(self.log_path, "ab")  # noqa: SIM115 - kept open for the child's lifetime
            self.proc = subprocess.Popen(
                [java, "-Xmx256m", "-Dzookeeper.admin.enableServer=false", *java_options, "-cp", classpath,
                 MAIN_CLASS, str(config)],
                stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                preexec_fn=_parent_death_signal() if self.stop_with_parent else None)
            if self._wait_ready(deadline):
                return self
            code = self.proc.poll()
            self._reap()
            if code is not None and not fixed_port and time.monotonic() < deadline:
                continue  # most likely the free port was taken meanwhile: another one
            raise RuntimeError(f"ZooKeeper did not start on {self.connect_string} within {self.ready_timeout_s}s "
                               f"(exit code {code}); its output:\n{self.output()}")

    def _wait_ready(self, deadline: float) -> bool:
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            if four_letter_word(self.host, self.port, "ruok", 0.5) == "imok" and \
                    "Mode: standalone" in four_letter_word(self.host, self.port, "srvr", 0.5):
                return True
            time.sleep(0.05)
        return False

    def output(self, max_bytes: int = 20_000) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-max_bytes:].decode(errors="replace")

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM and wait (ZooKeeper's sessions then expire on their own timeouts)."""
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout_s)
        self._reap()

    def kill(self) -> None:
        if self.running:
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait(30)
        self._reap()

    def restart(self) -> ZooKeeperServer:
        self.stop()
        return self.start()

    def _reap(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
