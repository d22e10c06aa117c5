"""Options of the ``metaq`` Spark format, parsed and checked before anything touches the network.

Every error is a :class:`~metaq.errors.ConfigError` whose message starts with the option's name, so a
user sees ``option 'startingOffsets': ...`` in the Spark exception rather than a stack of internals.
Pure Python: no pyspark import here, so the parsing is unit-testable and cheap to run on the driver.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from metaq.client import DEFAULT_SERVERS, ClientTls, Compression, ZooKeeperBrokers, parse_servers
from metaq.errors import ConfigError, InvalidArgument, MetaqError
from metaq.types import DEFAULT_MAX_BATCH_BYTES, PartitionId, validate_topic

EARLIEST = -2
LATEST = -1
DEFAULT_ZK_ROOT = ZooKeeperBrokers.DEFAULT_ROOT

OffsetSpec = Literal["earliest", "latest"] | dict[PartitionId | int, int]
"""'earliest', 'latest', or explicit offsets per partition (-2 earliest, -1 latest), keyed by
``brokerId-partition`` or by a bare number (resolved against the topic's partitions when planning:
it must be unambiguous)."""

DEFAULT_MAX_BYTES_PER_FETCH = 4 * 1024 * 1024
DEFAULT_BATCH_BYTES = 1024 * 1024
DEFAULT_TIMEOUT_MS = 30_000
DEFAULT_MAX_IN_FLIGHT = 16
AT_LEAST_ONCE, EXACTLY_ONCE = "at-least-once", "exactly-once"
"""The values of the sink's ``deliveryGuarantee`` option."""


def _get(options: Mapping[str, str], name: str) -> str | None:
    # Spark hands a case-insensitive dict (keys lower-cased); a plain dict from a test may not be.
    if name in options:
        return options[name]
    lowered = name.lower()
    for key, value in options.items():
        if key.lower() == lowered:
            return value
    return None


def _int_option(options: Mapping[str, str], name: str, default: int | None, minimum: int) -> int | None:
    raw = _get(options, name)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ConfigError(f"option {name!r}: {raw!r} is not an integer") from None
    if value < minimum:
        raise ConfigError(f"option {name!r}: must be >= {minimum}; got {value}")
    return value


def _credentials(options: Mapping[str, str]) -> dict[str, str | None]:
    """``user`` and ``password`` (both or neither)."""
    user, password = _get(options, "user"), _get(options, "password")
    if (user is None) != (password is None):
        raise ConfigError("options 'user' and 'password' go together")
    return {"user": user, "password": password}


def _tls(options: Mapping[str, str]) -> ClientTls | None:
    """The TLS options (``tls``, ``tlsCaFile``, ``tlsCertFile``, ``tlsKeyFile``, ``tlsCheckHostname``): a
    ClientTls, or None for plain TCP. Files are local paths on the driver and on every executor."""
    files = {name: _get(options, name) for name in ("tlsCaFile", "tlsCertFile", "tlsKeyFile")}
    if not _bool_option(options, "tls", False) and not any(files.values()):
        return None
    paths = {name: local_path(str(value), name) if value else None for name, value in files.items()}
    if paths["tlsKeyFile"] and not paths["tlsCertFile"]:
        raise ConfigError("option 'tlsKeyFile': needs 'tlsCertFile' (the client certificate)")
    return ClientTls(paths["tlsCaFile"], paths["tlsCertFile"], paths["tlsKeyFile"],
                     _bool_option(options, "tlsCheckHostname", True))


def _bool_option(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _get(options, name)
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ConfigError(f"option {name!r}: {raw!r} is not true or false")


def _servers(options: Mapping[str, str]) -> str:
    servers = _get(options, "servers")
    if servers is None:
        servers = DEFAULT_SERVERS
    try:
        parse_servers(servers)
    except InvalidArgument as exc:
        raise ConfigError(f"option 'servers': {exc}") from None
    return servers


def _zookeeper(options: Mapping[str, str]) -> tuple[str | None, str]:
    """(zkConnect or None, zkRoot): where the driver finds the brokers instead of ``servers``."""
    connect = _get(options, "zkConnect")
    root = _get(options, "zkRoot") or DEFAULT_ZK_ROOT
    if connect is None or not connect.strip():
        if _get(options, "zkRoot") is not None:
            raise ConfigError("option 'zkRoot': only with option 'zkConnect'")
        return None, root
    if _get(options, "servers") is not None:
        raise ConfigError("option 'zkConnect': give either 'servers' or 'zkConnect', not both")
    connect = connect.strip()
    try:
        parse_servers(connect.split("/", 1)[0])
    except InvalidArgument as exc:
        raise ConfigError(f"option 'zkConnect': {exc}") from None
    try:
        root = ZooKeeperBrokers.normalize_root(root)
    except MetaqError as exc:
        raise ConfigError(f"option 'zkRoot': {exc}") from None
    return connect, root


def _topic(options: Mapping[str, str], required: bool) -> str | None:
    topic = _get(options, "topic")
    if topic is None or topic == "":
        if required:
            raise ConfigError("option 'topic': required (the metaq topic to read)")
        return None
    try:
        return validate_topic(topic)
    except InvalidArgument as exc:
        raise ConfigError(f"option 'topic': {exc}") from None


def parse_offset_spec(raw: str | None, name: str, topic: str, default: OffsetSpec,
                      allow_earliest: bool = True) -> OffsetSpec:
    """``earliest`` | ``latest`` | ``{"topic": {"1-0": 23, "2-0": -2}}`` (-2 earliest, -1 latest); a
    partition is ``brokerId-partition``, or a bare number where only one broker has it."""
    if raw is None or raw.strip() == "":
        return default
    text = raw.strip()
    if text.lower() == "earliest":
        if not allow_earliest:
            raise ConfigError(f"option {name!r}: 'earliest' is not allowed here; use 'latest' or JSON offsets")
        return "earliest"
    if text.lower() == "latest":
        return "latest"
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ConfigError(
            f"option {name!r}: {raw!r} is neither 'earliest', 'latest' nor JSON like "
            f'{{"{topic}": {{"0-0": 23, "0-1": -2}}}} ({exc})') from None
    if not isinstance(doc, dict) or not doc:
        raise ConfigError(f'option {name!r}: JSON offsets must be an object like {{"{topic}": {{"0-0": 23}}}}')
    others = sorted(k for k in doc if k != topic)
    if others:
        raise ConfigError(f"option {name!r}: names topic(s) {others}, but option 'topic' is {topic!r}")
    per_partition = doc[topic]
    if not isinstance(per_partition, dict):
        raise ConfigError(f'option {name!r}: offsets of topic {topic!r} must be an object like {{"0-0": 23}}')
    out: dict[PartitionId | int, int] = {}
    for key, value in per_partition.items():
        text = str(key).strip()
        partition: PartitionId | int
        if text.isascii() and text.isdigit():
            partition = int(text)
        else:
            try:
                partition = PartitionId.parse(text)
            except InvalidArgument:
                raise ConfigError(f"option {name!r}: partition {key!r} is not brokerId-partition (e.g. '0-3') "
                                  "or a partition number") from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"option {name!r}: offset of partition {partition} must be an integer; got {value!r}")
        if value < EARLIEST:
            raise ConfigError(f"option {name!r}: offset {value} of partition {partition} is invalid "
                              f"(use >= 0, -2 for earliest or -1 for latest)")
        if value == EARLIEST and not allow_earliest:
            raise ConfigError(f"option {name!r}: -2 (earliest) is not allowed for partition {partition}")
        out[partition] = value
    return dict(sorted(out.items(), key=lambda kv: (1, kv[0].broker_id, kv[0].partition)
                       if isinstance(kv[0], PartitionId) else (0, kv[0], 0)))


def needs_persisted_start(spec: OffsetSpec) -> bool:
    """True when the start depends on the moment it is resolved (anything 'latest')."""
    if spec == "latest":
        return True
    return isinstance(spec, dict) and LATEST in spec.values()


def local_path(raw: str, name: str) -> str:
    """A local file-system path from a path or ``file:`` URI; other schemes are refused."""
    text = raw.strip()
    if text.startswith("file://"):
        text = text[len("file://"):]
    elif text.startswith("file:"):
        text = text[len("file:"):]
    elif "://" in text:
        raise ConfigError(f"option {name!r}: only local file-system paths are supported; got {raw!r}")
    if not text:
        raise ConfigError(f"option {name!r}: empty path")
    return os.path.abspath(text)


@dataclass(frozen=True)
class ReadOptions:
    servers: str
    """The ``servers`` option; with ``zkConnect``, the default (the driver hands its tasks the brokers it
    read from ZooKeeper)."""
    topic: str
    starting: OffsetSpec
    ending: OffsetSpec
    starting_raw: str
    min_partitions: int | None
    max_bytes_per_fetch: int
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    checkpoint_location: str | None
    timeout_ms: int
    zk_connect: str | None = None
    zk_root: str = DEFAULT_ZK_ROOT
    tls: ClientTls | None = None
    """TLS to the brokers (options ``tls``, ``tlsCaFile``, ``tlsCertFile``, ``tlsKeyFile``); None: plain TCP."""
    user: str | None = None
    """Authenticate as this user (options ``user`` and ``password``; SASL SCRAM-SHA-256)."""
    password: str | None = field(default=None, repr=False)

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool = False) -> ReadOptions:
        zk_connect, zk_root = _zookeeper(options)
        servers = _servers(options)
        topic = _topic(options, required=True)
        assert topic is not None
        starting_raw = _get(options, "startingOffsets") or "earliest"
        starting = parse_offset_spec(starting_raw, "startingOffsets", topic, "earliest")
        ending_raw = _get(options, "endingOffsets")
        if streaming and ending_raw is not None:
            raise ConfigError("option 'endingOffsets': not supported by streaming reads (a stream has no end)")
        ending = parse_offset_spec(ending_raw, "endingOffsets", topic, "latest", allow_earliest=False)
        checkpoint = _get(options, "checkpointLocation")
        checkpoint_location = local_path(checkpoint, "checkpointLocation") if checkpoint else None
        if streaming and needs_persisted_start(starting) and checkpoint_location is None:
            raise ConfigError(
                "option 'checkpointLocation': required on the metaq stream reader when "
                f"startingOffsets={starting_raw!r}: 'latest' is resolved once and must be remembered "
                "across restarts; pass the query's checkpoint directory (the source keeps its file under "
                "<dir>/metaq-source/), or start from 'earliest' or explicit offsets")
        max_bytes = _int_option(options, "maxBytesPerFetch", DEFAULT_MAX_BYTES_PER_FETCH, 1024)
        assert max_bytes is not None
        timeout_ms = _int_option(options, "timeoutMs", DEFAULT_TIMEOUT_MS, 1)
        assert timeout_ms is not None
        return cls(
            servers=servers,
            topic=topic,
            starting=starting,
            ending=ending,
            starting_raw=starting_raw,
            min_partitions=_int_option(options, "minPartitions", None, 1),
            max_bytes_per_fetch=max_bytes,
            max_offsets_per_trigger=_int_option(options, "maxOffsetsPerTrigger", None, 1),
            fail_on_data_loss=_bool_option(options, "failOnDataLoss", True),
            checkpoint_location=checkpoint_location,
            timeout_ms=timeout_ms,
            zk_connect=zk_connect,
            zk_root=zk_root,
            tls=_tls(options),
            **_credentials(options),
        )

    def start_file(self) -> str | None:
        """Where a stream keeps its resolved starting offsets (None without checkpointLocation)."""
        if self.checkpoint_location is None:
            return None
        digest = hashlib.sha256(json.dumps([self.topic, self.starting_raw]).encode()).hexdigest()[:12]
        return os.path.join(self.checkpoint_location, "metaq-source", f"{self.topic}-{digest}.json")


@dataclass(frozen=True)
class WriteOptions:
    servers: str
    topic: str | None
    batch_bytes: int
    compression: Compression
    acks: int
    max_in_flight: int
    timeout_ms: int
    zk_connect: str | None = None
    zk_root: str = DEFAULT_ZK_ROOT
    tls: ClientTls | None = None
    """TLS to the brokers (options ``tls``, ``tlsCaFile``, ``tlsCertFile``, ``tlsKeyFile``); None: plain TCP."""
    user: str | None = None
    """Authenticate as this user (options ``user`` and ``password``; SASL SCRAM-SHA-256)."""
    password: str | None = field(default=None, repr=False)
    exactly_once: bool = False
    """Option ``deliveryGuarantee``: ``exactly-once`` writes each task's rows in transactions that the
    driver commits (docs/spark.md); ``at-least-once`` (the default) appends them as they come."""
    transaction_timeout_ms: int = 0
    """Option ``transactionTimeoutMs`` (exactly-once): the brokers roll back a task's transaction that
    the driver has not committed within this (0: the broker's maxTxTimeoutInSeconds)."""
    checkpoint_scope: str | None = None
    """A digest of the ``checkpointLocation`` option: names a query's transactions should Spark not
    give a task the query's id."""

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> WriteOptions:
        raw_compression = _get(options, "compression")
        try:
            compression = Compression.parse(raw_compression)
        except (InvalidArgument, ValueError):
            raise ConfigError(f"option 'compression': {raw_compression!r} is not none, lz4 or zstd") from None
        acks = _int_option(options, "acks", 1, 0)
        if acks not in (0, 1):
            raise ConfigError(f"option 'acks': must be 1 (wait for the broker) or 0 (one-way); got {acks}")
        batch_bytes = _int_option(options, "batchBytes", DEFAULT_BATCH_BYTES, 1024)
        assert batch_bytes is not None
        if batch_bytes > DEFAULT_MAX_BATCH_BYTES:
            raise ConfigError(f"option 'batchBytes': at most {DEFAULT_MAX_BATCH_BYTES} (the broker's batch limit)")
        max_in_flight = _int_option(options, "maxInFlight", DEFAULT_MAX_IN_FLIGHT, 1)
        timeout_ms = _int_option(options, "timeoutMs", DEFAULT_TIMEOUT_MS, 1)
        assert max_in_flight is not None and timeout_ms is not None
        zk_connect, zk_root = _zookeeper(options)
        guarantee = (_get(options, "deliveryGuarantee") or AT_LEAST_ONCE).strip().lower()
        if guarantee not in (AT_LEAST_ONCE, EXACTLY_ONCE):
            raise ConfigError(f"option 'deliveryGuarantee': {guarantee!r} is not {AT_LEAST_ONCE} or {EXACTLY_ONCE}")
        exactly_once = guarantee == EXACTLY_ONCE
        if exactly_once and acks == 0:
            raise ConfigError("option 'acks': 0 (one-way) cannot be exactly-once; leave acks at 1")
        transaction_timeout_ms = _int_option(options, "transactionTimeoutMs", 0, 0)
        assert transaction_timeout_ms is not None
        checkpoint = _get(options, "checkpointLocation")
        checkpoint_scope = hashlib.sha256(checkpoint.encode()).hexdigest()[:32] if checkpoint else None
        return cls(servers=_servers(options), topic=_topic(options, required=False), batch_bytes=batch_bytes,
                   compression=compression, acks=acks, max_in_flight=max_in_flight, timeout_ms=timeout_ms,
                   zk_connect=zk_connect, zk_root=zk_root, tls=_tls(options), **_credentials(options),
                   exactly_once=exactly_once, transaction_timeout_ms=transaction_timeout_ms,
                   checkpoint_scope=checkpoint_scope)
