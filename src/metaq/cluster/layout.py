"""MetaQ's ZooKeeper layout (1.4.3 and later): paths and the data stored at them, without any I/O.

metaq writes the same znodes as MetaQ, so MetaQ-aware tools read a metaq cluster::

    <root>/brokers/ids/<id>/master                 ephemeral  meta://host:port
    <root>/brokers/ids/<id>/slave<n>               ephemeral  meta://host:port   (HA: a slave of <id>)
    <root>/brokers/topics-pub/<topic>/<id>-m       ephemeral  {"numParts":N,"broker":"<id>-m"}  (acceptPublish)
    <root>/brokers/topics-sub/<topic>/<id>-m       ephemeral  same, for acceptSubscribe; <id>-s<n> for a slave
    <root>/consumers/<group>/ids/<consumerId>      ephemeral  the subscribed topics, comma-separated
    <root>/consumers/<group>/owners/<topic>/<b-p>  ephemeral  the owning consumer's id
    <root>/consumers/<group>/offsets/<topic>/<b-p> persistent <messageId>-<offset> (or a bare offset)

``<b-p>`` is the partition id ``brokerId-partition`` (``str(PartitionId)``; ``PartitionId.parse`` reads
it). Everything read from ZooKeeper is parsed by the
functions here, which raise :class:`LayoutError` on garbage; callers log it and skip the znode rather
than crash (a cluster must survive a stray or damaged znode).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from metaq.errors import MetaqError

DEFAULT_ROOT = "/meta"

_BROKER_URL = re.compile(r"^meta://(?P<host>[^:/?#\s]+|\[[0-9A-Fa-f:.]+\]):(?P<port>\d{1,5})(?:\?.*)?$")
_TOPIC_BROKER_NAME = re.compile(r"^(?P<id>\d{1,9})-(?:m|s(?P<slave>\d{1,9}))$")
_SLAVE_NODE = re.compile(r"^slave(?P<slave>\d{1,9})$")


class LayoutError(MetaqError, ValueError):
    """A znode name or its data does not follow MetaQ's layout."""


def normalize_root(root: str) -> str:
    """``meta`` / ``/meta/`` -> ``/meta`` (MetaQ's MetaZookeeper.normalize); ``/`` -> ``""``."""
    root = root.strip()
    if not root.startswith("/"):
        root = "/" + root
    root = root.rstrip("/")
    if "//" in root:
        raise LayoutError(f"ZooKeeper root {root!r} has an empty path segment")
    return root


@dataclass(frozen=True, slots=True)
class Paths:
    """Every path of the layout under one root."""

    root: str = DEFAULT_ROOT

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", normalize_root(self.root))

    @property
    def broker_ids(self) -> str:
        return f"{self.root}/brokers/ids"

    @property
    def topics_pub(self) -> str:
        return f"{self.root}/brokers/topics-pub"

    @property
    def topics_sub(self) -> str:
        return f"{self.root}/brokers/topics-sub"

    @property
    def consumers(self) -> str:
        return f"{self.root}/consumers"

    def broker(self, broker_id: int) -> str:
        return f"{self.broker_ids}/{broker_id}"

    @property
    def users(self) -> str:
        """metaq's addition (SASL/SCRAM): one persistent node per user, its hashed credential as JSON."""
        return f"{self.root}/metaq-security/users"

    def user(self, name: str) -> str:
        return f"{self.users}/{name}"

    @property
    def acls(self) -> str:
        """metaq's addition: the ACL document (persistent JSON, metaq.security.acl)."""
        return f"{self.root}/metaq-security/acls"

    def master_config(self, broker_id: int) -> str:
        """metaq's addition (autoSyncMasterConfig): ephemeral, the master's topic options as JSON."""
        return f"{self.root}/brokers/topic-configs/{broker_id}"

    @property
    def replica_groups(self) -> str:
        return f"{self.root}/brokers/replica-groups"

    def replica_group(self, broker_id: int) -> str:
        """metaq's addition (HA, docs/replication.md): the persistent state of broker id's replica group,
        ``{"epoch":E,"master":<replica id>,"isr":[<replica id>...]}``, written with version checks."""
        return f"{self.replica_groups}/{broker_id}"

    def broker_node(self, broker_id: int, slave_id: int = -1) -> str:
        """``ids/<id>/master``, or ``ids/<id>/slave<n>`` for a slave (MetaZookeeper.brokerIdsPathOf)."""
        return f"{self.broker(broker_id)}/{'master' if slave_id < 0 else f'slave{slave_id}'}"

    def topic_broker(self, topic: str, broker_id: int, slave_id: int = -1, *, publish: bool) -> str:
        parent = self.topics_pub if publish else self.topics_sub
        return f"{parent}/{topic}/{topic_broker_name(broker_id, slave_id)}"

    def group(self, group: str) -> str:
        return f"{self.consumers}/{group}"

    def group_ids(self, group: str) -> str:
        return f"{self.group(group)}/ids"

    def group_member(self, group: str, consumer_id: str) -> str:
        return f"{self.group_ids(group)}/{consumer_id}"

    def group_owners(self, group: str, topic: str) -> str:
        return f"{self.group(group)}/owners/{topic}"

    def group_owner(self, group: str, topic: str, partition_name: str) -> str:
        return f"{self.group_owners(group, topic)}/{partition_name}"

    def group_offsets(self, group: str, topic: str) -> str:
        return f"{self.group(group)}/offsets/{topic}"

    def group_offset(self, group: str, topic: str, partition_name: str) -> str:
        return f"{self.group_offsets(group, topic)}/{partition_name}"


# -- brokers ------------------------------------------------------------------------------------

def broker_url(host: str, port: int, tls_port: int | None = None, ports: Mapping[str, int] | None = None) -> str:
    """What ``ids/<id>/master`` holds: MetaQ's Broker.getZKString, ``meta://host:port``; with a TLS port
    (sslPort), ``meta://host:port?sslPort=N``: a query MetaQ's readers (and older metaq) ignore. ``ports``:
    more named ports of the broker's other listeners (``kafkaPort``...), in the same query."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 literal
    query = ([f"sslPort={tls_port}"] if tls_port is not None else []) + [
        f"{name}={value}" for name, value in sorted((ports or {}).items())]
    return f"meta://{host}:{port}" + ("?" + "&".join(query) if query else "")


_NAMED_PORT = re.compile(r"[?&](?P<name>[A-Za-z]{1,40}Port)=(?P<port>\d{1,5})(?=&|$)")


def parse_broker_ports(data: bytes | str) -> dict[str, int]:
    """The named ports of a broker URL's query other than sslPort (``kafkaPort``...), those that are ports."""
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    return {m.group("name"): int(m.group("port")) for m in _NAMED_PORT.finditer(text.strip())
            if m.group("name") != "sslPort" and 0 < int(m.group("port")) < 65536}


_SSL_PORT = re.compile(r"[?&]sslPort=(?P<port>\d{1,5})(?:&|$)")


def parse_broker_tls_port(data: bytes | str) -> int | None:
    """The ``sslPort`` of a broker URL (:func:`broker_url`), None when it has none or it is not a port."""
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    match = _SSL_PORT.search(text.strip())
    if match is None:
        return None
    port = int(match.group("port"))
    return port if 0 < port < 65536 else None


def parse_broker_url(data: bytes | str) -> tuple[str, int]:
    """(host, port) from ``meta://host:port`` (a ``?slaveId=n`` query, as MetaQ appends, is ignored)."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError:
        raise LayoutError(f"broker address {data[:100]!r} is not UTF-8") from None
    match = _BROKER_URL.match(text.strip())
    if match is None:
        raise LayoutError(f"broker address {text[:100]!r} is not meta://host:port")
    port = int(match.group("port"))
    if not 0 < port < 65536:
        raise LayoutError(f"broker address {text[:100]!r} has port {port}")
    return match.group("host").strip("[]"), port


def parse_slave_node(name: str) -> int | None:
    """The slave id of an ``ids/<id>/`` child named ``slave<n>``; None for other children (``master``)."""
    match = _SLAVE_NODE.match(name)
    return int(match.group("slave")) if match else None


# -- topics -------------------------------------------------------------------------------------

def topic_broker_name(broker_id: int, slave_id: int = -1) -> str:
    """``<id>-m`` for a master, ``<id>-s<n>`` for a slave."""
    return f"{broker_id}-m" if slave_id < 0 else f"{broker_id}-s{slave_id}"


def parse_topic_broker_name(name: str) -> tuple[int, int]:
    """(broker id, slave id or -1) from a ``topics-pub|sub/<topic>/`` child name."""
    match = _TOPIC_BROKER_NAME.match(name)
    if match is None:
        raise LayoutError(f"topic registration {name!r} is not <brokerId>-m or <brokerId>-s<n>")
    slave = match.group("slave")
    return int(match.group("id")), -1 if slave is None else int(slave)


def topic_broker_data(num_partitions: int, broker_id: int, slave_id: int = -1) -> bytes:
    """MetaQ's TopicBroker JSON: ``{"numParts":N,"broker":"<id>-m"}``."""
    return json.dumps({"numParts": num_partitions, "broker": topic_broker_name(broker_id, slave_id)},
                      separators=(",", ":")).encode()


def parse_topic_broker_data(data: bytes) -> int:
    """The partition count of a topic registration; a bare number (MetaQ before 1.4.3) is accepted."""
    try:
        text = data.decode("utf-8").strip()
        value = json.loads(text) if text else None
    except (UnicodeDecodeError, ValueError):
        raise LayoutError(f"topic registration data {data[:100]!r} is not JSON") from None
    if isinstance(value, int) and not isinstance(value, bool):
        count = value
    elif isinstance(value, dict) and isinstance(value.get("numParts"), int) and \
            not isinstance(value.get("numParts"), bool):
        count = value["numParts"]
    else:
        raise LayoutError(f"topic registration data {data[:100]!r} has no numParts")
    if not 1 <= count <= 10_000:
        raise LayoutError(f"topic registration data says numParts={count}; 1..10000 expected")
    return count


# -- replica groups (HA) ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ReplicaGroupState:
    """Who is master of a broker id and in which epoch, and which slaves are in sync (replica ids are
    the brokers' ``slaveId``s)."""

    epoch: int
    master: int
    isr: tuple[int, ...] = ()
    successor: int = -1
    """Set by a master handing over (``metaq admin promote``): the one slave that should take over."""

    def to_bytes(self) -> bytes:
        doc: dict[str, object] = {"epoch": self.epoch, "master": self.master, "isr": sorted(self.isr)}
        if self.successor >= 0:
            doc["successor"] = self.successor
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> ReplicaGroupState:
        try:
            value = json.loads(data.decode("utf-8"))
            epoch, master, isr = value["epoch"], value["master"], value["isr"]
            if not (isinstance(epoch, int) and isinstance(master, int) and isinstance(isr, list)
                    and all(isinstance(r, int) and not isinstance(r, bool) for r in isr)):
                raise TypeError
        except (UnicodeDecodeError, ValueError, KeyError, TypeError):
            raise LayoutError(f"replica group state {data[:100]!r} is not "
                              '{"epoch":E,"master":M,"isr":[...]}') from None
        successor = value.get("successor", -1)
        if not isinstance(successor, int):
            raise LayoutError(f"replica group state {data[:100]!r}: successor is not a number")
        return cls(epoch, master, tuple(sorted(set(isr))), successor)


# -- partitions, consumers and offsets ------------------------------------------------------------

def member_data(topics: list[str]) -> bytes:
    """What ``ids/<consumerId>`` holds: the subscribed topics, comma-separated (MetaQ's topicString)."""
    return ",".join(topics).encode()


def parse_member_data(data: bytes) -> list[str]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise LayoutError(f"consumer registration {data[:100]!r} is not UTF-8") from None
    return [t for t in (part.strip() for part in text.split(",")) if t]


def offset_data(offset: int, message_id: int = -1) -> bytes:
    """MetaQ's ZkOffsetStorage value since 1.4: ``<msgId>-<offset>`` (msgId -1 when unknown)."""
    return f"{message_id}-{offset}".encode()


def parse_offset_data(data: bytes) -> tuple[int, int]:
    """(offset, message id or -1) from ``<msgId>-<offset>`` or a bare ``<offset>`` (before MetaQ 1.4)."""
    try:
        text = data.decode("ascii").strip()
        head, sep, tail = text.rpartition("-")
        if sep and head:
            offset, message_id = int(tail), int(head)
        else:
            offset, message_id = int(text), -1
    except (UnicodeDecodeError, ValueError):
        raise LayoutError(f"offset data {data[:100]!r} is not <msgId>-<offset> or <offset>") from None
    if offset < 0:
        raise LayoutError(f"offset data {data[:100]!r} holds a negative offset")
    return offset, message_id
