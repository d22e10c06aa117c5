"""The ZooKeeper registry: MetaQ's layout through kazoo (the only package of metaq that imports it).

:class:`ZooKeeperRegistry` is the registry seam (:mod:`metaq.cluster.registry`) over one ZooKeeper
session; each job is a module of its own, all sharing that session and its lock:

* :mod:`~metaq.cluster.zookeeper.session`: the kazoo client, its state (SUSPENDED, LOST, CONNECTED), the
  worker thread, and the ephemeral nodes this process keeps (made again after a session expiry);
* :mod:`~metaq.cluster.zookeeper.view`: the watched, cached cluster view (brokers, topics) every broker and
  client reads, never ZooKeeper per message;
* :mod:`~metaq.cluster.zookeeper.brokers`: a broker's own registration, its topics, and its replica
  group's state (epochs, failover);
* :mod:`~metaq.cluster.zookeeper.groups`: consumer groups' members, owners and offsets;
* :mod:`~metaq.cluster.zookeeper.users`: SASL/SCRAM users and ACLs (:class:`~metaq.cluster.registry.UserAclStore`);
* :mod:`~metaq.cluster.zookeeper.secure`: ZooKeeper ACLs put on an existing tree (``metaq cluster secure``).

Authentication to ZooKeeper and the ACLs of new znodes: :mod:`metaq.cluster.zk_security`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from metaq.cluster import layout
from metaq.cluster.layout import Paths, ReplicaGroupState
from metaq.cluster.registry import (
    Address,
    ClusterRegistry,
    ClusterSnapshot,
    GroupRegistry,
    SnapshotListener,
    UserAclStore,
)
from metaq.cluster.zk_security import ZkSecurity
from metaq.cluster.zookeeper.brokers import BrokerRegistration
from metaq.cluster.zookeeper.groups import GroupNodes
from metaq.cluster.zookeeper.secure import SecureReport, secure_tree
from metaq.cluster.zookeeper.session import ZooKeeperSession
from metaq.cluster.zookeeper.users import UserAclNodes
from metaq.cluster.zookeeper.view import ClusterView
from metaq.types import PartitionId

__all__ = ["ZooKeeperRegistry"]


class ZooKeeperRegistry(ClusterRegistry, GroupRegistry):
    """MetaQ's znodes under ``root`` on the ZooKeeper ensemble ``connect`` (``host:port[,host:port]``)."""

    def __init__(self, connect: str, root: str = layout.DEFAULT_ROOT, *, session_timeout_ms: int = 30_000,
                 connection_timeout_ms: int = 30_000, watch_cluster: bool = True, read_only: bool = False,
                 security: ZkSecurity | None = None, layout_owner: bool = True) -> None:
        """``watch_cluster``: keep the snapshot of brokers and topics; ``read_only``: a reader (``metaq
        cluster``, the Spark driver) that creates nothing, not even the layout's parent nodes, so that a
        mistyped root leaves no trace (nodes that do not exist read as empty). ``security``: SASL, TLS and
        ACLs (:mod:`metaq.cluster.zk_security`). ``layout_owner`` false (a client): with ACLs on, the
        layout's parent nodes are the brokers' to create, so that they get the brokers' identity."""
        self.connect = connect
        self.read_only = read_only
        self.layout_owner = layout_owner
        self.paths = Paths(root)
        self.session = ZooKeeperSession(connect, self.paths, session_timeout_ms=session_timeout_ms,
                                        connection_timeout_ms=connection_timeout_ms, security=security,
                                        layout_owner=layout_owner)
        self.session_timeout_s = self.session.session_timeout_s
        self.connection_timeout_s = self.session.connection_timeout_s
        self.view = ClusterView(self.session)
        self.brokers = BrokerRegistration(self.session)
        self.group_nodes = GroupNodes(self.session)
        self.users = UserAclNodes(self.session)
        self._watch_cluster = watch_cluster

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> ZooKeeperRegistry:
        """Connect (RegistryError if ZooKeeper cannot be reached in the connection timeout) and, for a
        cluster watcher, read and watch the brokers and topics."""
        self.session.start()
        if not self.read_only and (self.layout_owner or not self.session.security.set_acl):
            for path in (self.paths.broker_ids, self.paths.topics_pub, self.paths.topics_sub, self.paths.consumers):
                self.session.ensure(path)
        if self._watch_cluster:
            self.view.start()
        return self

    def close(self) -> None:
        """Drop the session (its ephemeral nodes vanish at once) and stop the threads."""
        self.session.close()

    @property
    def connected(self) -> bool:
        return self.session.connected

    @property
    def session_id(self) -> int:
        return self.session.session_id

    def add_session_listener(self, listener: Callable[[str], None]) -> None:
        self.session.add_session_listener(listener)

    def remove_session_listener(self, listener: Callable[[str], None]) -> None:
        self.session.remove_session_listener(listener)

    @property
    def security(self) -> ZkSecurity:
        return self.session.security

    def secure(self, *, group_owner: str | None = None, dry_run: bool = False) -> SecureReport:
        """Put the ACLs of :mod:`metaq.cluster.zk_security` on every node under the root that exists now
        (``metaq cluster secure``); see :func:`metaq.cluster.zookeeper.secure.secure_tree`."""
        return secure_tree(self.session, group_owner=group_owner, dry_run=dry_run)

    def raw_client(self) -> Any:
        """The kazoo client, for tools that read more of the tree (``metaq cluster``) and for tests."""
        return self.session.client

    # ------------------------------------------------------------------ the cluster view

    def snapshot(self) -> ClusterSnapshot:
        return self.view.snapshot()

    def add_listener(self, listener: SnapshotListener) -> None:
        self.view.add_listener(listener)

    def watch_topic_partitions(self, topic: str, listener: Callable[[], None]) -> None:
        self.view.watch_topic_partitions(topic, listener)

    # ------------------------------------------------------------------ this broker and its replica group

    def register_broker(self, broker_id: int, address: Address, *, slave_id: int = -1) -> None:
        self.brokers.register(broker_id, address, slave_id=slave_id, tls_port=self.tls_port, ports=self.ports)

    def registered_at(self, broker_id: int) -> float | None:
        return self.brokers.registered_at(broker_id)

    def publish_topic(self, topic: str, num_partitions: int, *, accept_publish: bool, accept_subscribe: bool,
                      broker_id: int | None = None, slave_id: int | None = None) -> None:
        self.brokers.publish_topic(topic, num_partitions, accept_publish=accept_publish,
                                   accept_subscribe=accept_subscribe, broker_id=broker_id, slave_id=slave_id)

    def withdraw_topic(self, topic: str) -> None:
        self.brokers.withdraw_topic(topic)

    def deregister(self, timeout_s: float = 5.0) -> None:
        self.brokers.deregister(timeout_s)

    def read_replica_group(self, broker_id: int) -> tuple[ReplicaGroupState | None, int]:
        return self.brokers.read_replica_group(broker_id)

    def write_replica_group(self, broker_id: int, state: ReplicaGroupState, version: int) -> int:
        return self.brokers.write_replica_group(broker_id, state, version)

    def take_mastership(self, broker_id: int, address: Address, state: ReplicaGroupState, version: int) -> int:
        return self.brokers.take_mastership(broker_id, address, state, version, tls_port=self.tls_port,
                                             ports=self.ports)

    def become_slave(self, broker_id: int, address: Address, slave_id: int) -> None:
        self.brokers.become_slave(broker_id, address, slave_id, tls_port=self.tls_port, ports=self.ports)

    def publish_master_config(self, broker_id: int, document: dict[str, object]) -> None:
        self.brokers.publish_master_config(broker_id, document)

    def watch_master_config(self, broker_id: int, listener: Callable[[dict[str, object] | None], None]) -> None:
        self.brokers.watch_master_config(broker_id, listener)

    def master_session_ok(self, broker_id: int) -> bool:
        return self.brokers.master_session_ok(broker_id)

    # ------------------------------------------------------------------ users and ACLs

    def user_acl_store(self) -> UserAclStore:
        return self.users

    # ------------------------------------------------------------------ consumer groups

    def register_member(self, group: str, consumer_id: str, topics: Iterable[str]) -> None:
        self.group_nodes.register_member(group, consumer_id, topics)

    def unregister_member(self, group: str, consumer_id: str) -> None:
        self.group_nodes.unregister_member(group, consumer_id)

    def members(self, group: str) -> dict[str, list[str]]:
        return self.group_nodes.members(group)

    def watch_members(self, group: str, listener: Callable[[], None]) -> None:
        self.group_nodes.watch_members(group, listener)

    def claim(self, group: str, topic: str, partition: PartitionId, owner: str) -> bool:
        return self.group_nodes.claim(group, topic, partition, owner)

    def alive(self, group: str, consumer_id: str) -> bool:
        return self.group_nodes.alive(group, consumer_id)

    def release(self, group: str, topic: str, partition: PartitionId, owner: str) -> None:
        self.group_nodes.release(group, topic, partition, owner)

    def release_all(self, group: str, owner: str) -> None:
        self.group_nodes.release_all(group, owner)

    def owners(self, group: str, topic: str) -> dict[PartitionId, str]:
        return self.group_nodes.owners(group, topic)

    def load_offset(self, group: str, topic: str, partition: PartitionId) -> int | None:
        return self.group_nodes.load_offset(group, topic, partition)

    def commit_offsets(self, group: str, offsets: Mapping[tuple[str, PartitionId], int]) -> None:
        self.group_nodes.commit_offsets(group, offsets)

    def groups(self) -> list[str]:
        """Every consumer group with a node under ``consumers/`` (members, owners or offsets)."""
        return self.group_nodes.groups()

    def group_topics(self, group: str) -> list[str]:
        """The topics a group owns partitions of or has offsets for."""
        return self.group_nodes.group_topics(group)

    def offsets(self, group: str, topic: str) -> dict[PartitionId, int]:
        """Every committed offset of ``group`` in ``topic`` (partition -> next offset to read)."""
        return self.group_nodes.offsets(group, topic)
