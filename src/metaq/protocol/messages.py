"""Every request and response metaq speaks, declared once (see schema/wire.py for the types).

Each API is a (request, response) pair registered under an api key. Every response starts with
``error_code`` (i16, 0 = none) and ``error_message`` so any failure, including a request the broker
could not decode, can be answered with the API's own response type.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from metaq.protocol.schema import (
    BOOL,
    BYTES,
    INT8,
    INT16,
    INT32,
    INT64,
    NULLABLE_BYTES,
    NULLABLE_STRING,
    RECORDS,
    STRING,
    UINT128,
    Array,
    Field,
    Struct,
    check_schema,
)

# Sentinels shared by clients and brokers.
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
ANY_PARTITION = -1
"""Produce to partition -1: the broker picks an open partition at random (MetaQ's behaviour)."""
NO_GENERATION = -1


@dataclass(frozen=True)
class ApiSpec:
    key: int
    name: str
    request: type
    response: type
    min_version: int = 0
    max_version: int = 0


APIS: dict[int, ApiSpec] = {}


def _api(key: int, name: str, request: type, response: type, max_version: int = 0) -> None:
    assert key not in APIS, key
    for cls in (request, response):
        cls.API_KEY = key  # type: ignore[attr-defined]
        cls.API_NAME = name  # type: ignore[attr-defined]
        check_schema(cls)
    assert response.FIELDS[0].name == "error_code" and response.FIELDS[1].name == "error_message", name  # type: ignore[attr-defined]
    APIS[key] = ApiSpec(key, name, request, response, 0, max_version)


_ERR = (Field("error_code", INT16), Field("error_message", NULLABLE_STRING))


class _Base:
    API_KEY: ClassVar[int]
    API_NAME: ClassVar[str]
    FIELDS: ClassVar[tuple[Field, ...]]


# -- nested structs -----------------------------------------------------------------------------

@dataclass
class ApiVersionRange:
    api_key: int = 0
    min_version: int = 0
    max_version: int = 0
    FIELDS: ClassVar = (Field("api_key", INT16), Field("min_version", INT16), Field("max_version", INT16))


@dataclass
class BrokerInfo:
    broker_id: int = 0
    host: str = ""
    port: int = 0
    FIELDS: ClassVar = (Field("broker_id", INT32), Field("host", STRING), Field("port", INT32))


@dataclass
class PartitionInfo:
    partition: int = 0
    broker_id: int = 0
    error_code: int = 0
    accept_publish: bool = True
    accept_subscribe: bool = True
    FIELDS: ClassVar = (Field("partition", INT32), Field("broker_id", INT32), Field("error_code", INT16),
                        Field("accept_publish", BOOL), Field("accept_subscribe", BOOL))


@dataclass
class TopicInfo:
    name: str = ""
    error_code: int = 0
    partitions: list[PartitionInfo] = field(default_factory=list)
    FIELDS: ClassVar = (Field("name", STRING), Field("error_code", INT16),
                        Field("partitions", Array(Struct(PartitionInfo))))


@dataclass
class ConfigEntry:
    key: str = ""
    value: str = ""
    FIELDS: ClassVar = (Field("key", STRING), Field("value", STRING))


@dataclass
class BrokerPartition:
    """A partition's identity, ``brokerId-partition`` (metaq.types.PartitionId on the wire)."""

    broker_id: int = 0
    partition: int = 0
    FIELDS: ClassVar = (Field("broker_id", INT32), Field("partition", INT32))


@dataclass
class TopicAssignment:
    topic: str = ""
    partitions: list[BrokerPartition] = field(default_factory=list)
    FIELDS: ClassVar = (Field("topic", STRING), Field("partitions", Array(Struct(BrokerPartition))))


@dataclass
class GroupMember:
    member_id: str = ""
    client_id: str = ""
    host: str = ""
    assignment: list[TopicAssignment] = field(default_factory=list)
    FIELDS: ClassVar = (Field("member_id", STRING), Field("client_id", STRING), Field("host", STRING),
                        Field("assignment", Array(Struct(TopicAssignment))))


@dataclass
class OffsetEntry:
    topic: str = ""
    broker_id: int = 0
    partition: int = 0
    offset: int = -1
    metadata: str | None = None
    error_code: int = 0
    FIELDS: ClassVar = (Field("topic", STRING), Field("broker_id", INT32), Field("partition", INT32),
                        Field("offset", INT64), Field("metadata", NULLABLE_STRING), Field("error_code", INT16))


@dataclass
class TopicPartitionRef:
    topic: str = ""
    broker_id: int = 0
    partition: int = 0
    FIELDS: ClassVar = (Field("topic", STRING), Field("broker_id", INT32), Field("partition", INT32))


# -- 0 ApiVersions (handshake) -------------------------------------------------------------------

@dataclass
class ApiVersionsRequest(_Base):
    client_software: str = "metaq-python"
    replica_id: int = -1
    """v1: >= 0 on a slave's replica fetcher, saying at the handshake that this connection fetches as replica
    ``replica_id`` (its Fetches carry the same id); the broker then also checks who it authenticated as."""
    FIELDS: ClassVar = (Field("client_software", STRING), Field("replica_id", INT32, since=1))


@dataclass
class ApiVersionsResponse(_Base):
    error_code: int = 0
    error_message: str | None = None
    broker_id: int = -1
    server_version: str = ""
    apis: list[ApiVersionRange] = field(default_factory=list)
    FIELDS: ClassVar = (*_ERR, Field("broker_id", INT32), Field("server_version", STRING),
                        Field("apis", Array(Struct(ApiVersionRange))))


# -- 1 Metadata ---------------------------------------------------------------------------------

@dataclass
class MetadataRequest(_Base):
    topics: list[str] | None = None
    """None = every topic."""
    FIELDS: ClassVar = (Field("topics", Array(STRING, nullable=True)),)


@dataclass
class PublishRefusal:
    """A topic a broker takes no messages for by its configuration (acceptPublish=false), and what to change."""

    topic: str = ""
    broker_id: int = 0
    reason: str = ""
    FIELDS: ClassVar = (Field("topic", STRING), Field("broker_id", INT32), Field("reason", STRING))


@dataclass
class MetadataResponse(_Base):
    error_code: int = 0
    error_message: str | None = None
    brokers: list[BrokerInfo] = field(default_factory=list)
    topics: list[TopicInfo] = field(default_factory=list)
    publish_refused: list[PublishRefusal] = field(default_factory=list)
    """v1: the answering broker's topics (of those answered) closed for publishing by acceptPublish=false."""
    FIELDS: ClassVar = (*_ERR, Field("brokers", Array(Struct(BrokerInfo))),
                        Field("topics", Array(Struct(TopicInfo))),
                        Field("publish_refused", Array(Struct(PublishRefusal)), since=1))


# -- 2 CreateTopic / 3 DeleteTopic -----------------------------------------------------------

@dataclass
class CreateTopicRequest(_Base):
    topic: str = ""
    num_partitions: int = -1
    """-1 = the broker's numPartitions."""
    configs: list[ConfigEntry] = field(default_factory=list)
    FIELDS: ClassVar = (Field("topic", STRING), Field("num_partitions", INT32),
                        Field("configs", Array(Struct(ConfigEntry))))


@dataclass
class CreateTopicResponse(_Base):
    error_code: int = 0
    error_message: str | None = None
    num_partitions: int = 0
    FIELDS: ClassVar = (*_ERR, Field("num_partitions", INT32))


@dataclass
class DeleteTopicRequest(_Base):
    topic: str = ""
    FIELDS: ClassVar = (Field("topic", STRING),)


@dataclass
class DeleteTopicResponse(_Base):
    error_code: int = 0
    error_message: str | None = None
    FIELDS: ClassVar = _ERR


# -- 4 Produce ----------------------------------------------------------------------------------

@dataclass
class ProduceRequest(_Base):
    topic: str = ""
    partition: int = ANY_PARTITION
    acks: int = 1
    """1 = answer after the flush policy allows; 0 = one-way, the broker sends no response."""
    timeout_ms: int = 30000
    records: bytes | memoryview = b""
    """Exactly one record batch."""
    transaction_id: str = ""
    """v1: non-empty puts the batch into that open transaction of this broker (docs/transactions.md):
    nothing is visible until the transaction commits. The batch must carry a producer block of the
    transaction's producer id (its sequences start at 0 per partition)."""
    FIELDS: ClassVar = (Field("topic", STRING), Field("partition", INT32), Field("acks", INT16),
                        Field("timeout_ms", INT32), Field("transaction_id", STRING, since=1),
                        Field("records", RECORDS))


@dataclass
class ProduceResponse(_Base):
    error_code: int = 0
    error_message: str | None = None
    partition: int = -1
    base_offset: int = -1
    base_message_id: int = -1
    """Message i of the batch has id base_message_id + i and offset base_offset + i."""
    append_time_ms: int = -1
    throttle_time_ms: int = 0
    """v2: how long the broker will not read this connection (the principal is over its produce quota);
    the client sends nothing more to this broker until then."""
    FIELDS: ClassVar = (*_ERR, Field("partition", INT32), Field("base_offset", INT64),
                        Field("base_message_id", UINT128), Field("append_time_ms", INT64),
                        Field("throttle_time_ms", INT32, since=2))


# -- 5 Fetch ------------------------------------------------------------------------------------

@dataclass
class FetchRequest(_Base):
    topic: str = ""
    partition: int = 0
    offset: int = 0
    max_bytes: int = 1024 * 1024
    max_wait_ms: int = 0
    """Long polling: hold the request up to this long while nothing is at ``offset``."""
    group: str = ""
    """The consumer group, for a server-side filter configured on the broker ('' = none)."""
    replica_id: int = -1
    """v2: >= 0 when a slave's replica fetcher asks (its slaveId): the fetch offset then tells the master
    what that slave holds (docs/replication.md). -1 for consumers."""
    replica_epoch: int = -1
    """v2: the master epoch the fetching slave knows; a master that sees a newer one is deposed."""
    last_fetched_epoch: int = -1
    """v2: the epoch of the slave's last stored batch, so the master can say where its log diverges."""
    FIELDS: ClassVar = (Field("topic", STRING), Field("partition", INT32), Field("offset", INT64),
                        Field("max_bytes", INT32), Field("max_wait_ms", INT32), Field("group", STRING),
                        Field("replica_id", INT32, since=2), Field("replica_epoch", INT32, since=2),
                        Field("last_fetched_epoch", INT32, since=2))


@dataclass
class FetchResponse(_Base):
    error_code: int = 0
    error_message: str | None = None
    log_start_offset: int = -1
    log_end_offset: int = -1
    reset_offset: int = -1
    """>= 0 when the asked offset was out of range and the broker (updateConsumerOffsets=true)
    served from this offset instead."""
    damaged_offset: int = -1
    """v1: with STORED_DATA_CORRUPT, where the damaged stored data starts (-1 otherwise)."""
    resume_offset: int = -1
    """v1: with STORED_DATA_CORRUPT, the first offset after the damage whose batch is intact (-1: none
    found before the end of its segment)."""
    master_epoch: int = -1
    """v2: the answering master's epoch (-1 where replication epochs are not in use)."""
    high_watermark: int = -1
    """v2: sync replication: offsets below it are held by every in-sync slave (-1: not tracked)."""
    records_epoch: int = -1
    """v2, replica fetches: the epoch that wrote ``records`` (a reply never spans two epochs)."""
    diverging_epoch: int = -1
    """v2, replica fetches: >= -1 with ``diverging_end_offset`` >= 0 when the slave's log is not a prefix of
    the master's: the last common epoch."""
    diverging_end_offset: int = -1
    """v2: where the slave must cut its log (it holds batches the master never had past it)."""
    throttle_time_ms: int = 0
    """v3: as ProduceResponse's, for the principal's fetch quota."""
    records: bytes | memoryview = b""
    """Whole stored batches starting at the one holding the asked offset; the last may be cut off."""
    FIELDS: ClassVar = (*_ERR, Field("log_start_offset", INT64), Field("log_end_offset", INT64),
                        Field("reset_offset", INT64), Field("damaged_offset", INT64, since=1),
                        Field("resume_offset", INT64, since=1), Field("master_epoch", INT32, since=2),
                        Field("high_watermark", INT64, since=2), Field("records_epoch", INT32, since=2),
                        Field("diverging_epoch", INT32, since=2), Field("diverging_end_offset", INT64, since=2),
                        Field("throttle_time_ms", INT32, since=3), Field("records", RECORDS))


# -- 6 ListOffsets ------------------------------------------------------------------------------

@dataclass
class ListOffsetsRequest(_Base):
    topic: str = ""
    partition: int = 0
    timestamp_ms: int = LATEST_TIMESTAMP
    """-2 earliest, -1 latest (the next offset to be written), else the first offset at or after."""
    FIELDS: ClassVar = (Field("topic", STRING), Field("partition", INT32), Field("timestamp_ms", INT64))


@dataclass
class ListOffsetsResponse(_Base):
    error_code: int = 0
    error_message: str | None = None
    offset: int = -1
    log_start_offset: int = -1
    log_end_offset: int = -1
    FIELDS: ClassVar = (*_ERR, Field("offset", INT64), Field("log_start_offset", INT64),
                        Field("log_end_offset", INT64))


# -- 7 JoinGroup / 8 Heartbeat / 9 LeaveGroup ------------------------------------------------

@dataclass
class JoinGroupRequest(_Base):
    group: str = ""
    member_id: str = ""
    """'' on first join: the coordinator assigns one."""
    client_id: str = ""
    session_timeout_ms: int = 10000
    rebalance_timeout_ms: int = 30000
    topics: list[str] = field(default_factory=list)
    strategy: str = "range"
    """'range' (MetaQ's sorted range split) or 'consistent_hash'."""
    partitions: list[TopicAssignment] = field(default_factory=list)
    """The subscribed topics' partitions as this member sees them: informational (checked, not used to
    balance: each standalone broker assigns only its own partitions)."""
    FIELDS: ClassVar = (Field("group", STRING), Field("member_id", STRING), Field("client_id", STRING),
                        Field("session_timeout_ms", INT32), Field("rebalance_timeout_ms", INT32),
                        Field("topics", Array(STRING)), Field("strategy", STRING),
                        Field("partitions", Array(Struct(TopicAssignment))))


@dataclass
class JoinGroupResponse(_Base):
    error_code: int = 0
    error_message: str | None = None
    generation: int = NO_GENERATION
    member_id: str = ""
    members: list[str] = field(default_factory=list)
    assignment: list[TopicAssignment] = field(default_factory=list)
    FIELDS: ClassVar = (*_ERR, Field("generation", INT32), Field("member_id", STRING),
                        Field("members", Array(STRING)), Field("assignment", Array(Struct(TopicAssignment))))


@dataclass
class HeartbeatRequest(_Base):
    group: str = ""
    generation: int = NO_GENERATION
    member_id: str = ""
    FIELDS: ClassVar = (Field("group", STRING), Field("generation", INT32), Field("member_id", STRING))


@dataclass
class HeartbeatResponse(_Base):
    error_code: int = 0
    error_message: str | None = None
    FIELDS: ClassVar = _ERR


@dataclass
class LeaveGroupRequest(_Base):
    group: str = ""
    member_id: str = ""
    FIELDS: ClassVar = (Field("group", STRING), Field("member_id", STRING))


@dataclass
class LeaveGroupResponse(_Base):
    error_code: int = 0
    error_message: str | None = None
    FIELDS: ClassVar = _ERR


# -- 10 OffsetCommit / 11 OffsetFetch --------------------------------------------------------

@dataclass
class OffsetCommitRequest(_Base):
    group: str = ""
    generation: int = NO_GENERATION
    """NO_GENERATION: a commit outside group membership (broadcast members, admin resets)."""
    member_id: str = ""
    offsets: list[OffsetEntry] = field(default_factory=list)
    FIELDS: ClassVar = (Field("group", STRING), Field("generation", INT32), Field("member_id", STRING),
                        Field("offsets", Array(Struct(OffsetEntry))))


@dataclass
class OffsetCommitResponse(_Base):
    error_code: int = 0
    error_message: str | None = None
    results: list[OffsetEntry] = field(default_factory=list)
    FIELDS: ClassVar = (*_ERR, Field("results", Array(Struct(OffsetEntry))))


@dataclass
class OffsetFetchRequest(_Base):
    group: str = ""
    partitions: list[TopicPartitionRef] | None = None
    """None = every partition the group has committed."""
    FIELDS: ClassVar = (Field("group", STRING), Field("partitions", Array(Struct(TopicPartitionRef), nullable=True)))


@dataclass
class OffsetFetchResponse(_Base):
    error_code: int = 0
    error_message: str | None = None
    offsets: list[OffsetEntry] = field(default_factory=list)
    FIELDS: ClassVar = (*_ERR, Field("offsets", Array(Struct(OffsetEntry))))


# -- 12 Stats -----------------------------------------------------------------------------------

@dataclass
class StatsRequest(_Base):
    topic: str | None = None
    FIELDS: ClassVar = (Field("topic", NULLABLE_STRING),)


@dataclass
class StatsResponse(_Base):
    error_code: int = 0
    error_message: str | None = None
    stats_json: bytes = b"{}"
    """UTF-8 JSON: broker uptime and, per topic and partition, put/get counts, bytes, TPS."""
    FIELDS: ClassVar = (*_ERR, Field("stats_json", BYTES))


# -- 13 ListGroups / 14 DescribeGroup ------------------------------------------------------------

@dataclass
class ListGroupsRequest(_Base):
    FIELDS: ClassVar = ()


@dataclass
class ListGroupsResponse(_Base):
    error_code: int = 0
    error_message: str | None = None
    groups: list[str] = field(default_factory=list)
    FIELDS: ClassVar = (*_ERR, Field("groups", Array(STRING)))


@dataclass
class DescribeGroupRequest(_Base):
    group: str = ""
    FIELDS: ClassVar = (Field("group", STRING),)


@dataclass
class DescribeGroupResponse(_Base):
    error_code: int = 0
    error_message: str | None = None
    state: str = ""
    generation: int = NO_GENERATION
    strategy: str = ""
    members: list[GroupMember] = field(default_factory=list)
    FIELDS: ClassVar = (*_ERR, Field("state", STRING), Field("generation", INT32), Field("strategy", STRING),
                        Field("members", Array(Struct(GroupMember))))


# -- 15 PartitionState (metaq topic close|open) / 16 Reload --------------------------------------

@dataclass
class PartitionStateRequest(_Base):
    topic: str = ""
    partition: int = -1
    """-1 = every partition of the topic."""
    open: bool = True
    FIELDS: ClassVar = (Field("topic", STRING), Field("partition", INT32), Field("open", BOOL))


@dataclass
class PartitionStateResponse(_Base):
    error_code: int = 0
    error_message: str | None = None
    FIELDS: ClassVar = _ERR


@dataclass
class ReloadRequest(_Base):
    FIELDS: ClassVar = ()


@dataclass
class ReloadResponse(_Base):
    error_code: int = 0
    error_message: str | None = None
    changed_topics: list[str] = field(default_factory=list)
    restart_required: list[str] = field(default_factory=list)
    """v1: changed options the reload could not apply (server.ini keys; they wait for a restart)."""
    FIELDS: ClassVar = (*_ERR, Field("changed_topics", Array(STRING)),
                        Field("restart_required", Array(STRING), since=1))


# -- 17 LookupMessage ---------------------------------------------------------------------------

@dataclass
class LookupMessageRequest(_Base):
    message_id: int = 0
    FIELDS: ClassVar = (Field("message_id", UINT128),)


@dataclass
class LookupMessageResponse(_Base):
    error_code: int = 0
    error_message: str | None = None
    topic: str = ""
    partition: int = -1
    offset: int = -1
    FIELDS: ClassVar = (*_ERR, Field("topic", STRING), Field("partition", INT32), Field("offset", INT64))


# -- 18 Verify (metaq admin verify) -------------------------------------------------------------

@dataclass
class VerifyRequest(_Base):
    topic: str | None = None
    """None = every topic."""
    partition: int = -1
    """-1 = every partition of the topic."""
    FIELDS: ClassVar = (Field("topic", NULLABLE_STRING), Field("partition", INT32))


@dataclass
class VerifyResponse(_Base):
    error_code: int = 0
    error_message: str | None = None
    report_json: bytes = b"[]"
    """UTF-8 JSON: one object per partition checked (segments, batches, messages, damaged ranges, index
    problems), as metaq.storage.verify.PartitionReport.to_json gives it."""
    FIELDS: ClassVar = (*_ERR, Field("report_json", BYTES))


# -- 19 Promote ----------------------------------------------------------------------------------

@dataclass
class PromoteRequest(_Base):
    replica_id: int = -1
    """The slave (its slaveId) to hand the mastership to; -1: any in-sync slave."""
    timeout_ms: int = 30_000
    """How long the master may wait for the slave to hold everything (writes are refused meanwhile)."""
    FIELDS: ClassVar = (Field("replica_id", INT32), Field("timeout_ms", INT32))


@dataclass
class PromoteResponse(_Base):
    error_code: int = 0
    error_message: str | None = None
    new_master: int = -1
    """The replica id now master of the broker id."""
    epoch: int = -1
    """Its epoch."""
    FIELDS: ClassVar = (*_ERR, Field("new_master", INT32), Field("epoch", INT32))


# -- 20 FindMessages (metaq admin find) -----------------------------------------------------------

MAX_FIND_RESULTS = 10_000


@dataclass
class FindMessagesRequest(_Base):
    topic: str = ""
    partition: int = -1
    """-1 = every partition of the topic on this broker."""
    key: bytes | None = None
    """Only records with exactly this key; None = any record (a time range search)."""
    from_ms: int = -1
    """Only records with timestamp >= from_ms; -1 = open."""
    to_ms: int = -1
    """Only records with timestamp <= to_ms; -1 = open."""
    max_results: int = 100
    """1..MAX_FIND_RESULTS."""
    FIELDS: ClassVar = (Field("topic", STRING), Field("partition", INT32), Field("key", NULLABLE_BYTES),
                        Field("from_ms", INT64), Field("to_ms", INT64), Field("max_results", INT32))


@dataclass
class FoundMessage(_Base):
    partition: int = -1
    offset: int = -1
    message_id: int = 0
    timestamp_ms: int = -1
    key: bytes | None = None
    FIELDS: ClassVar = (Field("partition", INT32), Field("offset", INT64), Field("message_id", UINT128),
                        Field("timestamp_ms", INT64), Field("key", NULLABLE_BYTES))


@dataclass
class FindMessagesResponse(_Base):
    error_code: int = 0
    error_message: str | None = None
    messages: list[FoundMessage] = field(default_factory=list)
    """In (partition, offset) order."""
    truncated: bool = False
    """More records matched than max_results."""
    scanned_segments: int = 0
    """Segments searched by scanning their records because their key index was full (or damaged)."""
    problems: list[str] = field(default_factory=list)
    """Damage met while searching (those stretches were not searched)."""
    FIELDS: ClassVar = (*_ERR, Field("messages", Array(Struct(FoundMessage))), Field("truncated", BOOL),
                        Field("scanned_segments", INT32), Field("problems", Array(STRING)))


# -- 30 SaslHandshake, 31 SaslAuthenticate (docs/security.md) ----------------------------------------

@dataclass
class SaslHandshakeRequest(_Base):
    mechanism: str = "SCRAM-SHA-256"
    FIELDS: ClassVar = (Field("mechanism", STRING),)


@dataclass
class SaslHandshakeResponse(_Base):
    error_code: int = 0
    error_message: str | None = None
    mechanisms: list[str] = field(default_factory=list)
    """The mechanisms this broker accepts."""
    FIELDS: ClassVar = (*_ERR, Field("mechanisms", Array(STRING)))


@dataclass
class SaslAuthenticateRequest(_Base):
    auth_bytes: bytes = b""
    """The client's next SCRAM message."""
    FIELDS: ClassVar = (Field("auth_bytes", BYTES),)


@dataclass
class SaslAuthenticateResponse(_Base):
    error_code: int = 0
    error_message: str | None = None
    auth_bytes: bytes = b""
    """The server's next SCRAM message."""
    principal: str | None = None
    """Once authenticated: the principal the connection acts as (``User:alice``)."""
    FIELDS: ClassVar = (*_ERR, Field("auth_bytes", BYTES), Field("principal", NULLABLE_STRING))


# -- 21 Transaction (local and XA transactions) -------------------------------------------------------

TX_BEGIN = 0
TX_PREPARE = 1
TX_COMMIT = 2
TX_ROLLBACK = 3
TX_RECOVER = 4
TX_STATUS = 5
TX_OPS = {TX_BEGIN: "begin", TX_PREPARE: "prepare", TX_COMMIT: "commit", TX_ROLLBACK: "rollback",
          TX_RECOVER: "recover", TX_STATUS: "status"}


@dataclass
class TransactionRequest(_Base):
    op: int = TX_BEGIN
    """begin (0), prepare (1: XA phase one), commit (2: one phase from open, or phase two from prepared),
    rollback (3), recover (4: list the prepared transactions' xids), status (5: where ``transaction_id``
    is: open, prepared, committing, committed, "rolled back (reason)" or unknown, as the one string of
    ``xids``)."""
    transaction_id: str = ""
    """The client's name for the transaction (unique; 1-128 characters); unused by recover."""
    xid: str = ""
    """prepare: the XA transaction id to remember (what recover lists)."""
    timeout_ms: int = 0
    """begin: roll the transaction back if it is not committed within this (0: maxTxTimeoutInSeconds)."""
    producer_group: str = ""
    """begin: the producer group (half messages: whose checker is asked; informational otherwise)."""
    FIELDS: ClassVar = (Field("op", INT8), Field("transaction_id", STRING), Field("xid", STRING),
                        Field("timeout_ms", INT32), Field("producer_group", STRING))


@dataclass
class CommittedBatch(_Base):
    topic: str = ""
    partition: int = -1
    base_offset: int = -1
    base_message_id: int = -1
    record_count: int = 0
    FIELDS: ClassVar = (Field("topic", STRING), Field("partition", INT32), Field("base_offset", INT64),
                        Field("base_message_id", UINT128), Field("record_count", INT32))


@dataclass
class TransactionResponse(_Base):
    error_code: int = 0
    error_message: str | None = None
    committed: list[CommittedBatch] = field(default_factory=list)
    """commit: where each batch of the transaction was stored, in the order they were put."""
    xids: list[str] = field(default_factory=list)
    """recover: the prepared transactions' xids; status: one string, the transaction's state."""
    FIELDS: ClassVar = (*_ERR, Field("committed", Array(Struct(CommittedBatch))), Field("xids", Array(STRING)))


# -- 22 CheckTransactions (half messages: a producer group's checker asks what to decide) -----------------

CHECK_TRANSACTIONS_MAX = 10_000
"""Half transactions one CheckTransactions may ask for (``max_transactions`` is 1..this)."""


@dataclass
class CheckTransactionsRequest(_Base):
    producer_group: str = ""
    max_wait_ms: int = 0
    """Long poll: answer as soon as a transaction of the group needs a decision, or after this."""
    max_transactions: int = 100
    """1..CHECK_TRANSACTIONS_MAX (anything else is INVALID_REQUEST)."""
    FIELDS: ClassVar = (Field("producer_group", STRING), Field("max_wait_ms", INT32),
                        Field("max_transactions", INT32))


@dataclass
class HalfBatch(_Base):
    """One batch of a half transaction, as its producer put it (no offsets or ids yet)."""

    topic: str = ""
    partition: int = -1
    records: bytes = b""
    FIELDS: ClassVar = (Field("topic", STRING), Field("partition", INT32), Field("records", BYTES))


@dataclass
class HalfTransaction(_Base):
    """A half transaction handed to its group's checker: its id, which check this is, and its messages."""

    transaction_id: str = ""
    check: int = 0
    """1 for the first check; transactionCheckMax checks without a decision roll it back."""
    begun_ms: int = -1
    batches: list[HalfBatch] = field(default_factory=list)
    """Its messages (empty when they would make the reply larger than CHECK_REPLY_BYTES_MAX)."""
    FIELDS: ClassVar = (Field("transaction_id", STRING), Field("check", INT32), Field("begun_ms", INT64),
                        Field("batches", Array(Struct(HalfBatch))))


@dataclass
class CheckTransactionsResponse(_Base):
    error_code: int = 0
    error_message: str | None = None
    transaction_ids: list[str] = field(default_factory=list)
    """Prepared transactions of the group that need the checker's decision (commit or roll back)."""
    transactions: list[HalfTransaction] = field(default_factory=list)
    """v1: the same transactions, each with its messages (RocketMQ's check gets the half message)."""
    FIELDS: ClassVar = (*_ERR, Field("transaction_ids", Array(STRING)),
                        Field("transactions", Array(Struct(HalfTransaction)), since=1))


CHECK_REPLY_BYTES_MAX = 4 << 20
"""Bytes of messages one CheckTransactions reply carries; a transaction past it is sent without them."""


# -- 25 ListTransactions (metaq admin transactions) ---------------------------------------------------

@dataclass
class ListTransactionsRequest(_Base):
    producer_group: str = ""
    """Only this producer group's transactions ('': every transaction)."""
    max_transactions: int = 1000
    """At most this many of each list (1..CHECK_TRANSACTIONS_MAX)."""
    FIELDS: ClassVar = (Field("producer_group", STRING), Field("max_transactions", INT32))


@dataclass
class TransactionInfo(_Base):
    transaction_id: str = ""
    state: str = ""
    """open, prepared, committing, or how a timed-out one ended ("rolled back (timed out: ...)")."""
    producer_group: str = ""
    xid: str | None = None
    begun_ms: int = -1
    ended_ms: int = -1
    """When the broker rolled it back (timed-out ones); -1 for a live one."""
    deadline_ms: int = -1
    """A live one: when the broker rolls it back by timeout (-1: never, a prepared half message)."""
    next_check_ms: int = -1
    """A half message: when it is next due for a check (-1: none)."""
    checks: int = 0
    messages: int = 0
    partitions: list[str] = field(default_factory=list)
    """``topic-partition`` of each batch it holds (partitions of the answering broker)."""
    FIELDS: ClassVar = (Field("transaction_id", STRING), Field("state", STRING), Field("producer_group", STRING),
                        Field("xid", NULLABLE_STRING), Field("begun_ms", INT64), Field("ended_ms", INT64),
                        Field("deadline_ms", INT64), Field("next_check_ms", INT64), Field("checks", INT32),
                        Field("messages", INT32), Field("partitions", Array(STRING)))


@dataclass
class ListTransactionsResponse(_Base):
    error_code: int = 0
    error_message: str | None = None
    live: list[TransactionInfo] = field(default_factory=list)
    """Open, prepared and committing transactions, oldest first."""
    timed_out: list[TransactionInfo] = field(default_factory=list)
    """The last transactions the broker rolled back by itself (timeout, or a half message's checks used
    up), newest first; the broker keeps the last 1000 (in memory: a restart empties it)."""
    checkers: list[str] = field(default_factory=list)
    """Producer groups whose checker asked in the last minute."""
    FIELDS: ClassVar = (*_ERR, Field("live", Array(Struct(TransactionInfo))),
                        Field("timed_out", Array(Struct(TransactionInfo))), Field("checkers", Array(STRING)))


# -- 23 MultiFetch (many partitions in one request; its reply may overtake earlier ones) ---------------

MULTI_FETCH_PARTITIONS_MAX = 10_000
"""Partitions one MultiFetch may name (a bigger request is INVALID_REQUEST)."""


@dataclass
class FetchPartition:
    """One partition of a MultiFetch: where to read and how much of it at most."""

    topic: str = ""
    partition: int = 0
    offset: int = 0
    partition_max_bytes: int = 1024 * 1024
    FIELDS: ClassVar = (Field("topic", STRING), Field("partition", INT32), Field("offset", INT64),
                        Field("partition_max_bytes", INT32))


@dataclass
class MultiFetchRequest(_Base):
    max_wait_ms: int = 0
    """Long polling: hold the request up to this long while none of the partitions has ``min_bytes``."""
    min_bytes: int = 1
    """Answer once this many bytes (over all partitions) are there; <= 1: as soon as any partition has data."""
    max_bytes: int = 4 * 1024 * 1024
    """The whole reply's records at most (and at most the broker's maxTransferSize)."""
    group: str = ""
    """The consumer group, for a server-side filter configured on the broker ('' = none)."""
    partitions: list[FetchPartition] = field(default_factory=list)
    FIELDS: ClassVar = (Field("max_wait_ms", INT32), Field("min_bytes", INT32), Field("max_bytes", INT32),
                        Field("group", STRING), Field("partitions", Array(Struct(FetchPartition))))


@dataclass
class FetchedPartition:
    """One partition of a MultiFetch reply: what a single Fetch reply of it would say."""

    topic: str = ""
    partition: int = 0
    error_code: int = 0
    error_message: str | None = None
    log_start_offset: int = -1
    log_end_offset: int = -1
    reset_offset: int = -1
    damaged_offset: int = -1
    resume_offset: int = -1
    high_watermark: int = -1
    records: bytes | memoryview = b""
    FIELDS: ClassVar = (Field("topic", STRING), Field("partition", INT32), Field("error_code", INT16),
                        Field("error_message", NULLABLE_STRING), Field("log_start_offset", INT64),
                        Field("log_end_offset", INT64), Field("reset_offset", INT64), Field("damaged_offset", INT64),
                        Field("resume_offset", INT64), Field("high_watermark", INT64), Field("records", RECORDS))


@dataclass
class MultiFetchResponse(_Base):
    error_code: int = 0
    error_message: str | None = None
    partitions: list[FetchedPartition] = field(default_factory=list)
    """One entry per partition asked, in the request's order."""
    throttle_time_ms: int = 0
    """Since v1: 0, or how long the broker reads nothing from this connection (the principal went over
    its fetch byte rate); the client sends nothing more to this broker before then."""
    FIELDS: ClassVar = (*_ERR, Field("throttle_time_ms", INT32, since=1),
                        Field("partitions", Array(Struct(FetchedPartition))))


# -- 24 MultiProduce (one record batch for each of many partitions, in one request) ---------------

MULTI_PRODUCE_PARTITIONS_MAX = 10_000
"""Batches one MultiProduce may carry (a bigger request is INVALID_REQUEST)."""


@dataclass
class ProducePartition:
    """One batch of a MultiProduce: what a single Produce of it would carry."""

    topic: str = ""
    partition: int = ANY_PARTITION
    records: bytes | memoryview = b""
    """Exactly one record batch, as for Produce."""
    FIELDS: ClassVar = (Field("topic", STRING), Field("partition", INT32), Field("records", RECORDS))


@dataclass
class MultiProduceRequest(_Base):
    acks: int = 1
    """As Produce's, for every batch: 1 = answer once every batch is acknowledged by the flush policy (and sync
    replication); 0 = one-way, no response."""
    timeout_ms: int = 30000
    transaction_id: str = ""
    """As Produce v1's, for every batch of the request ('' = ordinary appends)."""
    partitions: list[ProducePartition] = field(default_factory=list)
    FIELDS: ClassVar = (Field("acks", INT16), Field("timeout_ms", INT32), Field("transaction_id", STRING),
                        Field("partitions", Array(Struct(ProducePartition))))


@dataclass
class ProducedPartition:
    """One batch of a MultiProduce reply: what a single Produce reply of it would say."""

    topic: str = ""
    partition: int = -1
    """Where the batch went (the partition asked, or the one the broker chose for -1)."""
    error_code: int = 0
    error_message: str | None = None
    base_offset: int = -1
    base_message_id: int = -1
    append_time_ms: int = -1
    FIELDS: ClassVar = (Field("topic", STRING), Field("partition", INT32), Field("error_code", INT16),
                        Field("error_message", NULLABLE_STRING), Field("base_offset", INT64),
                        Field("base_message_id", UINT128), Field("append_time_ms", INT64))


@dataclass
class MultiProduceResponse(_Base):
    error_code: int = 0
    """Non-zero: the whole request failed (no batch of it was stored) and ``partitions`` is empty."""
    error_message: str | None = None
    throttle_time_ms: int = 0
    """As Produce v2's: the principal went over its produce byte rate (all the request's records count)."""
    partitions: list[ProducedPartition] = field(default_factory=list)
    """One entry per batch of the request, in the request's order."""
    FIELDS: ClassVar = (*_ERR, Field("throttle_time_ms", INT32), Field("partitions", Array(Struct(ProducedPartition))))


_api(0, "ApiVersions", ApiVersionsRequest, ApiVersionsResponse, max_version=1)
_api(1, "Metadata", MetadataRequest, MetadataResponse, max_version=1)
_api(2, "CreateTopic", CreateTopicRequest, CreateTopicResponse)
_api(3, "DeleteTopic", DeleteTopicRequest, DeleteTopicResponse)
_api(4, "Produce", ProduceRequest, ProduceResponse, max_version=2)
_api(5, "Fetch", FetchRequest, FetchResponse, max_version=3)
_api(6, "ListOffsets", ListOffsetsRequest, ListOffsetsResponse)
_api(7, "JoinGroup", JoinGroupRequest, JoinGroupResponse)
_api(8, "Heartbeat", HeartbeatRequest, HeartbeatResponse)
_api(9, "LeaveGroup", LeaveGroupRequest, LeaveGroupResponse)
_api(10, "OffsetCommit", OffsetCommitRequest, OffsetCommitResponse)
_api(11, "OffsetFetch", OffsetFetchRequest, OffsetFetchResponse)
_api(12, "Stats", StatsRequest, StatsResponse)
_api(13, "ListGroups", ListGroupsRequest, ListGroupsResponse)
_api(14, "DescribeGroup", DescribeGroupRequest, DescribeGroupResponse)
_api(15, "PartitionState", PartitionStateRequest, PartitionStateResponse)
_api(16, "Reload", ReloadRequest, ReloadResponse, max_version=1)
_api(17, "LookupMessage", LookupMessageRequest, LookupMessageResponse)
_api(18, "Verify", VerifyRequest, VerifyResponse)
_api(19, "Promote", PromoteRequest, PromoteResponse)
_api(20, "FindMessages", FindMessagesRequest, FindMessagesResponse)
_api(21, "Transaction", TransactionRequest, TransactionResponse)
_api(22, "CheckTransactions", CheckTransactionsRequest, CheckTransactionsResponse, max_version=1)
_api(23, "MultiFetch", MultiFetchRequest, MultiFetchResponse, max_version=1)
_api(24, "MultiProduce", MultiProduceRequest, MultiProduceResponse)
_api(25, "ListTransactions", ListTransactionsRequest, ListTransactionsResponse)
_api(30, "SaslHandshake", SaslHandshakeRequest, SaslHandshakeResponse)
_api(31, "SaslAuthenticate", SaslAuthenticateRequest, SaslAuthenticateResponse)


REPLIES_OUT_OF_ORDER: frozenset[int] = frozenset({MultiFetchRequest.API_KEY})
"""APIs whose replies the broker sends as soon as they are ready, not in request order (matched by
correlation id); every other reply keeps request order among the others (docs/protocol.md)."""


def spec_for(obj_or_cls: Any) -> ApiSpec:
    cls: Any = obj_or_cls if isinstance(obj_or_cls, type) else type(obj_or_cls)
    return APIS[cls.API_KEY]


@dataclass
class ErrorResponse(_Base):
    """What answers a request whose api key the broker does not know: only the error fields."""

    error_code: int = 0
    error_message: str | None = None
    FIELDS: ClassVar = _ERR


def error_response(api_key: int, error_code: int, message: str) -> Any:
    """The API's own response type carrying only an error (for requests that failed early)."""
    spec = APIS.get(api_key)
    if spec is None:
        return ErrorResponse(error_code=error_code, error_message=message)
    return spec.response(error_code=error_code, error_message=message)
