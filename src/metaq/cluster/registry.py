"""The registry seam: what brokers, topics, partitions, group members, owners and offsets exist.

Brokers and clients see the cluster through :class:`ClusterRegistry` and consumer groups coordinate
through :class:`GroupRegistry`, never through ZooKeeper directly. Two implementations:

* **embedded** (the default, :mod:`metaq.cluster.embedded`): one broker holds the truth in memory;
  clients learn it from that broker's Metadata answers, and groups are coordinated by that broker's
  group coordinator over the wire. No external service.
* **zookeeper** (:mod:`metaq.cluster.zookeeper`, the only module importing kazoo): MetaQ's znode layout
  (:mod:`metaq.cluster.layout`). Brokers register themselves and their topics as ephemeral nodes;
  every broker and client keeps a watched, cached :class:`ClusterSnapshot`, so nothing reads ZooKeeper
  per message; consumers of a group register, claim owners and store offsets there, as MetaQ does.

Everything here is plain data and abstract methods: no I/O, no threads, no asyncio.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

from metaq.cluster.layout import ReplicaGroupState
from metaq.errors import MetaqError
from metaq.types import PartitionId


class RegistryError(MetaqError):
    """The registry cannot do what was asked (ZooKeeper unreachable, a conflicting registration)."""


class BrokerIdTaken(RegistryError):
    """Another live broker is registered under this broker id."""


class Address(NamedTuple):
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class BrokerEntry:
    """One broker id (a replica group): its master's address, and its slaves' (HA) by slave id."""

    broker_id: int
    master: Address | None
    slaves: Mapping[int, Address] = field(default_factory=lambda: MappingProxyType({}))
    tls_ports: Mapping[int, int] = field(default_factory=lambda: MappingProxyType({}))
    """Replica (-1: the master, else the slave id) -> its TLS port (sslPort), for those that have one."""
    ports: Mapping[int, Mapping[str, int]] = field(default_factory=lambda: MappingProxyType({}))
    """Replica -> the named ports of its other listeners (``kafkaPort``, ``kafkaSslPort``), as registered."""

    def over_tls(self) -> BrokerEntry:
        """The same replicas at their TLS addresses; a replica without a TLS port is left out (a TLS client
        cannot reach it)."""
        master = self.master
        if master is not None:
            tls = self.tls_ports.get(-1)
            master = Address(master.host, tls) if tls is not None else None
        slaves = {s: Address(a.host, self.tls_ports[s]) for s, a in self.slaves.items() if s in self.tls_ports}
        return BrokerEntry(self.broker_id, master, MappingProxyType(slaves), self.tls_ports, self.ports)


@dataclass(frozen=True, slots=True)
class TopicEntry:
    """Which brokers hold a topic, and how many partitions each: ``publish`` lists the masters that
    accept producers, ``subscribe`` the masters that serve consumers (broker id -> partition count).
    ``subscribe_slaves`` adds the slaves serving consumers ((broker id, slave id) -> count)."""

    topic: str
    publish: Mapping[int, int]
    subscribe: Mapping[int, int]
    subscribe_slaves: Mapping[tuple[int, int], int] = field(default_factory=lambda: MappingProxyType({}))

    def partitions(self, *, publish: bool) -> list[PartitionId]:
        """The partitions in MetaQ's order: by broker id, then partition."""
        counts = self.publish if publish else self.subscribe
        return [PartitionId(b, p) for b in sorted(counts) for p in range(counts[b])]


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """An immutable view of the cluster; a registry swaps in a new one on every change."""

    brokers: Mapping[int, BrokerEntry] = field(default_factory=lambda: MappingProxyType({}))
    topics: Mapping[str, TopicEntry] = field(default_factory=lambda: MappingProxyType({}))
    version: int = 0
    """Grows with every change (listeners can tell a newer snapshot from an older one)."""

    def address(self, broker_id: int) -> Address | None:
        entry = self.brokers.get(broker_id)
        return entry.master if entry is not None else None

    def over_tls(self) -> ClusterSnapshot:
        """The cluster as a TLS client sees it: every replica at its TLS port (:meth:`BrokerEntry.over_tls`)."""
        brokers = {b: e.over_tls() for b, e in self.brokers.items()}
        return dataclasses.replace(self, brokers=MappingProxyType(brokers))

    def servers(self) -> str:
        """Every registered master as ``host:port,...`` in broker id order ('' if none): a client's ``servers``."""
        return ",".join(str(e.master) for _, e in sorted(self.brokers.items()) if e.master is not None)

    def partitions(self, topic: str, *, publish: bool) -> list[PartitionId]:
        """The topic's partitions on brokers that are registered right now, MetaQ's order."""
        entry = self.topics.get(topic)
        if entry is None:
            return []
        return [p for p in entry.partitions(publish=publish) if self.address(p.broker_id) is not None]


SnapshotListener = Callable[[ClusterSnapshot], None]
"""Called after each change, on the registry's own thread: must not block (hop to a loop and return)."""


class ClusterRegistry(ABC):
    """Brokers and topics. Reads are cached (``snapshot()`` never does I/O); writes are blocking calls
    that a broker makes off its event loop, at start, on topic changes and at stop."""

    def start(self) -> ClusterRegistry:
        """Reach the registry's service (RegistryError saying why when it cannot); nothing to do in memory."""
        return self

    @abstractmethod
    def snapshot(self) -> ClusterSnapshot: ...

    @abstractmethod
    def add_listener(self, listener: SnapshotListener) -> None: ...

    tls_port: int | None = None
    """This broker's TLS port (sslPort), registered with its address (set before registering)."""
    ports: Mapping[str, int] = MappingProxyType({})
    """This broker's other listeners' ports by name (``kafkaPort``...), registered with its address."""

    @abstractmethod
    def register_broker(self, broker_id: int, address: Address, *, slave_id: int = -1) -> None:
        """Register this process as broker ``broker_id`` (its master, or slave ``slave_id``).

        Raises BrokerIdTaken when another live process holds the registration. Registrations are
        kept: after a lost ZooKeeper session they are made again on the new one."""

    @abstractmethod
    def publish_topic(self, topic: str, num_partitions: int, *, accept_publish: bool, accept_subscribe: bool) -> None:
        """Say (or update) that this broker holds ``topic`` with ``num_partitions`` partitions."""

    @abstractmethod
    def withdraw_topic(self, topic: str) -> None: ...

    @abstractmethod
    def deregister(self) -> None:
        """Remove every registration of this process (a clean stop does it before draining)."""

    @abstractmethod
    def close(self) -> None: ...

    # -- replica groups (HA, docs/replication.md): ZooKeeper mode only --------------------------------

    def read_replica_group(self, broker_id: int) -> tuple[ReplicaGroupState | None, int]:
        """(state, version) of broker id's replica group; (None, -1) when it has none yet."""
        raise RegistryError("replication epochs and failover need ZooKeeper mode")

    def write_replica_group(self, broker_id: int, state: ReplicaGroupState, version: int) -> int:
        """Replace the state if its version is still ``version`` (-1: create it); the new version.
        ReplicaGroupChanged when someone else wrote it first."""
        raise RegistryError("replication epochs and failover need ZooKeeper mode")

    def take_mastership(self, broker_id: int, address: Address, state: ReplicaGroupState, version: int) -> int:
        """In one transaction: write ``state`` (version-checked as above) and register this process as
        the master of ``broker_id`` at ``address`` (its slave node and topic nodes go). The new version;
        ReplicaGroupChanged when the state moved or another master is registered."""
        raise RegistryError("replication epochs and failover need ZooKeeper mode")

    def become_slave(self, broker_id: int, address: Address, slave_id: int) -> None:
        """Give up the master registration (and its topic nodes) and register as slave ``slave_id``."""
        raise RegistryError("replication epochs and failover need ZooKeeper mode")

    def publish_master_config(self, broker_id: int, document: dict[str, object]) -> None:  # noqa: B027 - optional
        """A master's topic options for autoSyncMasterConfig slaves (ZooKeeper mode; nothing to do else)."""

    def watch_master_config(self, broker_id: int, listener: Callable[[dict[str, object] | None], None]) -> None:
        """Call ``listener`` with the master's published topic options now and on each change (None: none)."""
        raise RegistryError("autoSyncMasterConfig needs ZooKeeper mode")

    def master_session_ok(self, broker_id: int) -> bool:
        """One round trip: whether this process's current session holds ``ids/<broker_id>/master``."""
        raise RegistryError("replication epochs and failover need ZooKeeper mode")

    # -- users and ACLs (docs/security.md) --------------------------------------------------------------

    def user_acl_store(self) -> UserAclStore | None:
        """Where the cluster keeps its users and ACLs, so every broker reads the same (ZooKeeper mode);
        None when the registry keeps none (an embedded broker keeps them in files of its own)."""
        return None


class UserAclStore(ABC):
    """The cluster's SASL/SCRAM users and its ACL document, kept by the registry. Every call is one
    blocking round trip (a broker makes them off its event loop); RegistryError when it cannot be made."""

    @abstractmethod
    def read_user(self, name: str) -> bytes | None:
        """The stored credential of user ``name`` (JSON bytes, :mod:`metaq.security.credentials`); None
        if there is none."""

    @abstractmethod
    def write_user(self, name: str, data: bytes) -> bool:
        """Store user ``name``'s credential; True if the user is new."""

    @abstractmethod
    def delete_user(self, name: str) -> bool:
        """Remove user ``name``; False if there was none."""

    @abstractmethod
    def list_users(self) -> list[str]:
        """Every user's name, sorted."""

    @abstractmethod
    def read_acls(self) -> tuple[bytes | None, int]:
        """The ACL document (JSON bytes, :mod:`metaq.security.acl`) and its version (-1: there is none)."""

    @abstractmethod
    def write_acls(self, data: bytes, version: int) -> bool:
        """Replace the ACL document if it is still at ``version`` (-1: create it); False when it moved."""


class ReplicaGroupChanged(RegistryError):
    """A version-checked write of a replica group's state lost: another replica (or a failover) got there first."""


class GroupRegistry(ABC):
    """Consumer groups the MetaQ way (cluster mode): members register, each computes the assignment,
    claims the partitions it gets as owner before fetching them, and stores offsets by partition name
    (``brokerId-partition``)."""

    @abstractmethod
    def register_member(self, group: str, consumer_id: str, topics: Iterable[str]) -> None: ...

    @abstractmethod
    def unregister_member(self, group: str, consumer_id: str) -> None: ...

    @abstractmethod
    def members(self, group: str) -> dict[str, list[str]]:
        """consumer id -> its subscribed topics."""

    @abstractmethod
    def watch_members(self, group: str, listener: Callable[[], None]) -> None:
        """Call ``listener`` (on the registry's thread, must not block) whenever the members change."""

    @abstractmethod
    def watch_topic_partitions(self, topic: str, listener: Callable[[], None]) -> None:
        """Call ``listener`` (must not block) when the partitions serving ``topic`` to consumers change."""

    @abstractmethod
    def claim(self, group: str, topic: str, partition: PartitionId, owner: str) -> bool:
        """Take ownership of ``partition``; False while someone else holds it."""

    @abstractmethod
    def release(self, group: str, topic: str, partition: PartitionId, owner: str) -> None:
        """Give up ownership (only if ``owner`` holds it)."""

    @abstractmethod
    def release_all(self, group: str, owner: str) -> None:
        """Give up every claim this process made for ``owner`` in ``group`` (a member leaving)."""

    @abstractmethod
    def owners(self, group: str, topic: str) -> dict[PartitionId, str]:
        """partition -> owning consumer id."""

    def alive(self, group: str, consumer_id: str) -> bool:
        """A round trip on this process's session: True while ``consumer_id`` is registered on it."""
        return consumer_id in self.members(group)

    def add_session_listener(self, listener: Callable[[str], None]) -> None:  # noqa: B027 - optional hook
        """Call ``listener("suspended" | "connected" | "lost")`` when the session's state changes
        (on the registry's thread, must not block); "lost": the session expired with its claims."""

    def remove_session_listener(self, listener: Callable[[str], None]) -> None:  # noqa: B027 - optional hook
        ...

    @abstractmethod
    def load_offset(self, group: str, topic: str, partition: PartitionId) -> int | None: ...

    @abstractmethod
    def commit_offsets(self, group: str, offsets: Mapping[tuple[str, PartitionId], int]) -> None:
        """(topic, partition) -> next offset to read, stored durably (persistent nodes)."""
