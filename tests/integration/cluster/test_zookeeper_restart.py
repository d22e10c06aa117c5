"""A registry rides out a ZooKeeper restart on its own session, even when the restarting ZooKeeper accepts a
connection and never answers it (seen with ZooKeeper 3.8 after a kill -9: the client sat out its whole
session timeout in that connection, and its session had expired by the time it asked again)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from metaq.cluster.registry import Address
from metaq.cluster.zookeeper import ZooKeeperRegistry
from metaq.testing import wait_until
from metaq.testing.zookeeper import ZooKeeperServer, unique_root


class SilentListener:
    """Listens on a port, accepts every connection and reads what comes, and never answers. Closing it closes
    the listening socket only: the connections it accepted stay open (and silent) until :meth:`hang_up`."""

    def __init__(self, port: int) -> None:
        self.server = socket.create_server(("127.0.0.1", port), reuse_port=False)
        self.server.settimeout(0.1)
        self.accepted: list[socket.socket] = []
        self._open = True
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while self._open:
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        self._open = False
        self._thread.join(5)
        self.server.close()

    def hang_up(self) -> None:
        for conn in self.accepted:
            conn.close()


@contextmanager
def registry_on(zk: ZooKeeperServer, root: str, session_timeout_ms: int) -> Iterator[ZooKeeperRegistry]:
    registry = ZooKeeperRegistry(zk.connect_string, root, session_timeout_ms=session_timeout_ms,
                                 watch_cluster=False)
    registry.start()
    try:
        yield registry
    finally:
        registry.close()


def test_a_restarting_zookeeper_that_never_answers_a_connection_does_not_cost_the_session(tmp_path: Path) -> None:
    root = unique_root()
    with ZooKeeperServer(tmp_path / "zk") as zk, registry_on(zk, root, session_timeout_ms=30_000) as registry:
        registry.register_broker(1, Address("127.0.0.1", 9001))
        session = registry.session_id
        zk.kill()
        silent = SilentListener(zk.port)  # the restarting ZooKeeper that takes the connection and says nothing
        try:
            wait_until(lambda: len(silent.accepted) >= 1, 15, message="the registry to connect again")
        finally:
            silent.close()
        try:
            zk.start()  # the real one, on the same port, while the silent connection is still open
            back = time.monotonic()
            wait_until(lambda: registry.connected, 20,
                       message="the registry to give up on the silent connection and reach ZooKeeper")
            assert time.monotonic() - back < 15  # seconds, not the 30 s session timeout
            assert registry.session_id == session  # the same session: nothing expired
            raw = registry.raw_client()
            assert raw.get(f"{root}/brokers/ids/1/master")[1].ephemeralOwner == session
        finally:
            silent.hang_up()
