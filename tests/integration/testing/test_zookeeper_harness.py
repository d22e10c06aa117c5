"""The real ZooKeeper the cluster tests use: it starts, restarts on its port with its data, and a
session can be expired as ZooKeeper itself would (ephemeral nodes vanish, the client gets a new session)."""

from __future__ import annotations

from pathlib import Path

from kazoo.client import KazooClient

from metaq.testing import wait_until
from metaq.testing.zookeeper import ZooKeeperServer, expire_session, four_letter_word


def test_zookeeper_restarts_with_its_data_and_expires_sessions(tmp_path: Path) -> None:
    with ZooKeeperServer(tmp_path / "zk") as zk:
        assert four_letter_word(zk.host, zk.port, "ruok") == "imok"
        client = KazooClient(hosts=zk.connect_string, timeout=5)
        client.start(10)
        try:
            client.create("/kept", b"persistent")
            client.create("/mine", b"ephemeral", ephemeral=True)
            old_session = client.client_id[0]
            expire_session(client, zk)
            wait_until(lambda: client.connected and client.client_id[0] != old_session, 30,
                       message="a new session after the expiry")
            assert client.exists("/mine") is None, "the expired session's ephemeral node is gone"
            port = zk.port
            zk.stop()
            assert "Mode: standalone" not in four_letter_word(zk.host, port, "srvr", 0.5)
            zk.start()
            assert zk.port == port
            wait_until(lambda: client.connected, 30, message="the client to reconnect after the restart")
            assert client.get("/kept")[0] == b"persistent"
        finally:
            client.stop()
            client.close()
