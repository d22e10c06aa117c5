"""Broker registration and replica groups: what a broker writes about itself.

A broker registers ``brokers/ids/<id>/master`` (or ``slave<n>``) and announces its topics under
``topics-pub``/``topics-sub``, all ephemeral and kept by the session (made again after an expiry). A
replica group's state (its epoch, docs/replication.md) is one persistent node written with version checks,
and a failover takes the state and the master node in one transaction.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.recipe.watchers import DataWatch

from metaq.cluster import layout
from metaq.cluster.layout import LayoutError, ReplicaGroupState
from metaq.cluster.registry import Address, BrokerIdTaken, RegistryError, ReplicaGroupChanged
from metaq.cluster.zookeeper.session import ZooKeeperSession

log = logging.getLogger("metaq.cluster.zookeeper")


class BrokerRegistration:
    """This process's broker and topic nodes, and the replica group's state of a broker id."""

    def __init__(self, session: ZooKeeperSession) -> None:
        self._session = session
        self.paths = session.paths
        self._own_slave_id = -1
        """The slave id this process registered as (-1: a master)."""

    @property
    def _mine_prefix(self) -> str:
        """Every broker and topic node of this process lies under it."""
        return f"{self.paths.root}/brokers/"

    def register(self, broker_id: int, address: Address, *, slave_id: int = -1, tls_port: int | None,
                 ports: Mapping[str, int] | None = None) -> None:
        """As :meth:`metaq.cluster.registry.ClusterRegistry.register_broker`: a node of this broker id still
        held by a previous session at the same address (a killed broker) is waited for up to the session
        timeout; another address, or the same one past that, is BrokerIdTaken."""
        session = self._session
        path = self.paths.broker_node(broker_id, slave_id)
        data = layout.broker_url(address.host, address.port, tls_port, ports).encode()
        self._own_slave_id = slave_id
        deadline = time.monotonic() + session.handover_wait_s
        while True:
            try:
                session.keep(path, data)
                break
            except NodeExistsError:
                try:
                    held, _ = session.client.get(path)
                except NoNodeError:
                    continue  # it just went away: try again
                if held != data:
                    raise BrokerIdTaken(
                        f"broker id {broker_id} is already registered in ZooKeeper ({path} = "
                        f"{held.decode(errors='replace')}) by another live broker; give this one another "
                        "brokerId") from None
                if time.monotonic() > deadline:
                    raise BrokerIdTaken(
                        f"{path} still names this address ({data.decode()}) after the session timeout: another "
                        "live broker with the same brokerId and address?") from None
                log.info("%s is held by a previous session of this broker (killed?); waiting for it to expire "
                         "(up to %.0fs)", path, session.session_timeout_s)
                gone = threading.Event()
                if session.client.exists(path, watch=lambda _e, g=gone: g.set()) is not None:
                    gone.wait(max(0.1, deadline - time.monotonic()))
        log.info("registered %s = %s", path, data.decode())

    def registered_at(self, broker_id: int) -> float | None:
        """When broker ``broker_id``'s master registered, by ZooKeeper's clock (its node's ctime, seconds
        since the epoch); None if it is not registered. One read (benchmarks, not per message)."""
        try:
            stat = self._session.client.exists(self.paths.broker_node(broker_id, -1))
        except KazooException as exc:
            raise RegistryError(f"cannot read broker {broker_id}'s registration: {exc}") from None
        return None if stat is None else stat.ctime / 1000

    def publish_topic(self, topic: str, num_partitions: int, *, accept_publish: bool, accept_subscribe: bool,
                      broker_id: int | None = None, slave_id: int | None = None) -> None:
        """As the registry's; ``broker_id`` / ``slave_id`` default to this process's registration, so a
        slave announces ``topics-sub/<topic>/<id>-s<slaveId>`` (and never a topics-pub node)."""
        broker_id = self._own_broker_id() if broker_id is None else broker_id
        if slave_id is None:
            slave_id = self._own_slave_id
        data = layout.topic_broker_data(num_partitions, broker_id, slave_id)
        for publish, wanted in ((True, accept_publish and slave_id < 0), (False, accept_subscribe)):
            path = self.paths.topic_broker(topic, broker_id, slave_id, publish=publish)
            if wanted:
                self._session.keep(path, data, wait_for_owner_s=self._session.handover_wait_s)
            else:
                self._session.drop(path)

    def withdraw_topic(self, topic: str) -> None:
        for path in self._session.owned((f"{self.paths.topics_pub}/{topic}/", f"{self.paths.topics_sub}/{topic}/")):
            self._session.drop(path)

    def deregister(self, timeout_s: float = 5.0) -> None:
        """Delete this process's broker and topic nodes, spending at most ``timeout_s``. Without a
        connection nothing is tried: closing the session (or its expiry) removes them anyway."""
        session = self._session
        mine = session.take_owned(self._mine_prefix)
        if not session.connected:
            return
        session_id = session.session_id
        deadline = time.monotonic() + timeout_s
        for path in sorted(mine, key=lambda p: "/ids/" in p):  # topics first, the broker node last
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:  # async calls with a timeout: no retry loop may hold a stopping broker
                _, stat = session.client.get_async(path).get(timeout=remaining)
                if stat.ephemeralOwner == session_id:
                    session.client.delete_async(path).get(timeout=max(0.1, deadline - time.monotonic()))
            except (KazooException, KazooTimeoutError):
                continue

    def _own_broker_id(self) -> int:
        for path in self._session.owned(self.paths.broker_ids + "/"):
            return int(path[len(self.paths.broker_ids) + 1:].split("/", 1)[0])
        raise RegistryError("register_broker() must come before publish_topic()")

    # ------------------------------------------------------------------ replica groups (HA)

    def read_replica_group(self, broker_id: int) -> tuple[ReplicaGroupState | None, int]:
        path = self.paths.replica_group(broker_id)
        try:
            data, stat = self._session.client.get(path)
        except NoNodeError:
            return None, -1
        except KazooException as exc:
            raise RegistryError(f"cannot read {path}: {exc}") from None
        try:
            return ReplicaGroupState.from_bytes(data), stat.version
        except LayoutError as exc:
            raise RegistryError(f"{path}: {exc}") from None

    def write_replica_group(self, broker_id: int, state: ReplicaGroupState, version: int) -> int:
        client = self._session.client
        path = self.paths.replica_group(broker_id)
        try:
            if version < 0:
                self._session.ensure(self.paths.replica_groups)
                client.create(path, state.to_bytes(), acl=self._session.acl(path))
                return 0
            return int(client.set(path, state.to_bytes(), version=version).version)
        except (BadVersionError, NodeExistsError, NoNodeError):
            raise ReplicaGroupChanged(f"{path} changed since version {version} (another master or a failover)") \
                from None
        except KazooException as exc:
            raise RegistryError(f"cannot write {path}: {exc}") from None

    def take_mastership(self, broker_id: int, address: Address, state: ReplicaGroupState, version: int, *,
                        tls_port: int | None, ports: Mapping[str, int] | None = None) -> int:
        session = self._session
        client = session.client
        path = self.paths.replica_group(broker_id)
        master = self.paths.broker_node(broker_id, -1)
        url = layout.broker_url(address.host, address.port, tls_port, ports).encode()
        try:
            session.ensure(self.paths.replica_groups)
            session.ensure(self.paths.broker(broker_id))
            tx = client.transaction()
            if version < 0:
                tx.create(path, state.to_bytes(), acl=session.acl(path))
            else:
                tx.set_data(path, state.to_bytes(), version=version)
            tx.create(master, url, acl=session.acl(master), ephemeral=True)
            results = tx.commit()
        except KazooException as exc:
            raise RegistryError(f"cannot take the mastership of broker {broker_id}: {exc}") from None
        failed = [r for r in results if isinstance(r, Exception)]
        if failed:
            raise ReplicaGroupChanged(f"broker {broker_id}: the replica group moved or a master is registered "
                                      f"({', '.join(type(r).__name__ for r in failed)})")
        new_version = next((r.version for r in results if hasattr(r, "version")), version + 1)
        with session.lock:
            mine = session.take_owned(self._mine_prefix)
            session.remember(master, url)
            self._own_slave_id = -1
        for p in mine:
            if p != master:
                with contextlib.suppress(KazooException):
                    _, stat = client.get(p)
                    if stat.ephemeralOwner == session.session_id:
                        client.delete(p)
        log.info("took the mastership of broker %d (epoch %d): %s = %s", broker_id, state.epoch, master,
                 url.decode())
        return int(new_version)

    def become_slave(self, broker_id: int, address: Address, slave_id: int, *, tls_port: int | None,
                     ports: Mapping[str, int] | None = None) -> None:
        for p in self._session.owned(self._mine_prefix):
            self._session.drop(p)
        self.register(broker_id, address, slave_id=slave_id, tls_port=tls_port, ports=ports)

    def publish_master_config(self, broker_id: int, document: dict[str, object]) -> None:
        path, data = self.paths.master_config(broker_id), json.dumps(document, sort_keys=True).encode()
        self._session.remember(path, data)  # kept first: if the session is lost now, the next session writes it
        self._session.create_ephemeral(path, data, wait_for_owner_s=self._session.handover_wait_s)

    def watch_master_config(self, broker_id: int, listener: Callable[[dict[str, object] | None], None]) -> None:
        session = self._session
        path = self.paths.master_config(broker_id)

        def on_data(data: bytes | None, _stat: Any) -> bool:
            if session.closed:
                return False
            document: dict[str, object] | None = None
            if data:
                try:
                    parsed = json.loads(data.decode("utf-8"))
                except (UnicodeDecodeError, ValueError):
                    parsed = None
                if isinstance(parsed, dict):
                    document = parsed
                else:
                    session.bad(path, "not a JSON object")
            listener(document)
            return True

        DataWatch(session.client, path, on_data)

    def master_session_ok(self, broker_id: int) -> bool:
        try:
            stat = self._session.client.exists(self.paths.broker_node(broker_id, -1))
        except KazooException as exc:
            raise RegistryError(f"cannot read broker {broker_id}'s registration: {exc}") from None
        return stat is not None and stat.ephemeralOwner == self._session.session_id
