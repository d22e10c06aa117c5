"""Each Kafka API as requests to the broker core: translation only.

Every answer comes from :meth:`metaq.broker.core.Broker.handle` with the connection's
:class:`~metaq.broker.session.Session`, so authentication (authRequired), ACLs, quotas, limits, the produce
path (one append per batch, the idempotent producer's duplicate check, the flush policy, sync replication)
and the group coordinator are the core's: nothing here decides what the core would decide differently.
What is here: Kafka's shapes, the partition mapping (:class:`Layout`), record batch conversion
(:mod:`metaq.protocol.kafka.records`) and error codes (:mod:`metaq.kafka.errors`).

The handlers are coroutines ``(ctx, header, body) -> response body`` (a kio dataclass of the request's
API and version, built with :func:`metaq.protocol.kafka.codec.build`), or None for a produce with acks=0.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from metaq.broker.session import FileReply, Session
from metaq.errors import CorruptRecordError, InvalidArgument, ProtocolError
from metaq.kafka.errors import kafka_code
from metaq.protocol import messages as m
from metaq.protocol.kafka import consumer as kc
from metaq.protocol.kafka import records as kr
from metaq.protocol.kafka.codec import RequestHeader, api_versions_body, build, response_class
from metaq.types import BROKER_ID_MAX, PartitionId

if TYPE_CHECKING:
    from metaq.broker.core import Broker

log = logging.getLogger("metaq.kafka")

NONE = 0
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
NOT_LEADER_OR_FOLLOWER = 6
COORDINATOR_NOT_AVAILABLE = 15
INCONSISTENT_GROUP_PROTOCOL = 23
UNKNOWN_MEMBER_ID = 25
ILLEGAL_GENERATION = 22
REBALANCE_IN_PROGRESS = 27
UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
UNSUPPORTED_VERSION = 35
INVALID_REQUEST = 42
TOPIC_ALREADY_EXISTS = 36

PROTOCOLS = {"range": "range", "roundrobin": "roundrobin"}
"""Kafka assignor name -> the metaq group strategy that computes the same split (docs/kafka.md)."""
KAFKA_NAMES = {v: k for k, v in PROTOCOLS.items()}
PRODUCER_EPOCH_MAX = (1 << 15) - 1


Peers = Callable[[], dict[int, tuple[str, int, int | None]]]
"""broker id -> (host, Kafka port, Kafka TLS port or None) of the cluster's other brokers that serve Kafka."""


@dataclass
class Advertised:
    """Where Kafka clients reach brokers: this one (its listener), and the others of the cluster."""

    host: str
    port: int
    tls_port: int | None = None


class Context:
    """One Kafka connection as the translation sees it: the broker core, the connection's session, and the
    address this listener advertises."""

    def __init__(self, broker: Broker, session: Session, advertised: Advertised, peers: Peers) -> None:
        self.broker = broker
        self.session = session
        self.advertised = advertised
        self.peers = peers
        """broker id -> (host, Kafka port, Kafka TLS port) of the cluster's other brokers that have one."""
        self.mute_ms = 0
        """A throttle told in a reply and not yet applied by the connection (it reads nothing that long)."""

    async def core(self, request: Any) -> Any:
        """The core's response to ``request`` (errors are in it, never raised)."""
        broker = self.broker
        result = broker.handle(request, self.session)
        if asyncio.iscoroutine(result):
            broker.request_started()
            try:
                result = await result
            finally:
                broker.request_finished()
        if isinstance(result, FileReply):  # not for the requests sent from here; kept safe all the same
            try:
                result.response.records = result.file_slice.read_bytes()
            finally:
                result.file_slice.release()
            result = result.response
        return result

    def throttle_ms(self) -> int:
        """The throttle the core set for the request just answered (the principal went over a byte-rate quota),
        for the reply's ``throttle_time_ms``; the connection is then muted as long (KIP-219: the reply first)."""
        ms, self.session.throttle_ms = self.session.throttle_ms, 0
        self.mute_ms = max(self.mute_ms, ms)
        return ms

    def own_address(self) -> tuple[str, int]:
        a = self.advertised
        if self.session.tls and a.tls_port is not None:
            return a.host, a.tls_port
        return a.host, a.port

    async def layouts(self, topics: list[str] | None, *, create: bool = False) -> tuple[
            m.MetadataResponse, dict[str, Layout]]:
        """The core's metadata for ``topics`` (None: all), and each known topic's partition mapping. With
        ``create``, unknown topics are created first where the broker's autoCreateTopics allows it."""
        response: m.MetadataResponse = await self.core(m.MetadataRequest(topics))
        if create and topics and self.broker.config.auto_create_topics:
            missing = [t.name for t in response.topics if t.error_code == UNKNOWN_TOPIC_OR_PARTITION]
            for name in missing:
                await self.core(m.CreateTopicRequest(name, -1))
            if missing:
                response = await self.core(m.MetadataRequest(topics))
        return response, {t.name: Layout(t) for t in response.topics if not t.error_code}

    async def layout(self, topic: str) -> Layout | None:
        _, layouts = await self.layouts([topic])
        return layouts.get(topic)


class Layout:
    """A topic's partitions as Kafka numbers them: metaq's ``brokerId-partition`` ordered by (broker id,
    partition) are Kafka partitions 0..N-1."""

    __slots__ = ("index", "infos", "partitions")

    def __init__(self, info: m.TopicInfo) -> None:
        self.infos = sorted(info.partitions, key=lambda p: (p.broker_id, p.partition))
        self.partitions = [PartitionId(p.broker_id, p.partition) for p in self.infos]
        self.index = {pid: i for i, pid in enumerate(self.partitions)}

    def get(self, index: int) -> PartitionId | None:
        return self.partitions[index] if 0 <= index < len(self.partitions) else None


def _ms(value: Any) -> int:
    return int(value.total_seconds() * 1000) if hasattr(value, "total_seconds") else int(value)


def _response(header: RequestHeader, values: dict[str, Any]) -> Any:
    return build(response_class(header.api_key, header.api_version), values)


# -- ApiVersions, Metadata -----------------------------------------------------------------------------

async def api_versions(ctx: Context, header: RequestHeader, req: Any) -> Any:
    return api_versions_body(header.api_version)


async def metadata(ctx: Context, header: RequestHeader, req: Any) -> Any:
    topics = None if req.topics is None else [t.name for t in req.topics]
    if header.api_version == 0 and not topics:
        topics = None  # v0: an empty list means every topic
    allow = getattr(req, "allow_auto_topic_creation", True)
    response, layouts = await ctx.layouts(topics, create=bool(allow))
    if response.error_code:
        return _response(header, {"brokers": [], "topics": [], "throttle_time": ctx.throttle_ms()})
    own_id = ctx.broker.config.broker_id
    host, port = ctx.own_address()
    peers = ctx.peers()
    brokers: list[dict[str, Any]] = []
    if own_id not in peers:  # this process leads its broker id's partitions (else: a slave, its master does)
        brokers.append({"node_id": own_id, "host": host, "port": port, "rack": None})
    for b in response.brokers:
        if b.broker_id in peers and b.broker_id not in {x["node_id"] for x in brokers}:
            phost, pport, ptls = peers[b.broker_id]
            brokers.append({"node_id": b.broker_id, "host": phost,
                            "port": ptls if ctx.session.tls and ptls is not None else pport, "rack": None})
    for node_id, (phost, pport, ptls) in sorted(peers.items()):  # slaves: nodes that lead nothing (HA)
        if node_id > BROKER_ID_MAX:
            brokers.append({"node_id": node_id, "host": phost,
                            "port": ptls if ctx.session.tls and ptls is not None else pport, "rack": None})
    listed: set[int] = {b["node_id"] for b in brokers if b["node_id"] <= BROKER_ID_MAX}
    if not listed:  # no master registered to send clients to yet (a slave before its master's registration)
        brokers.append({"node_id": own_id, "host": host, "port": port, "rack": None})
        listed = {own_id}
    out = []
    for t in response.topics:
        layout = layouts.get(t.name)
        if layout is None:
            out.append({"error_code": kafka_code(t.error_code), "name": t.name, "partitions": []})
            continue
        parts = []
        for i, p in enumerate(layout.infos):
            leader = p.broker_id if p.broker_id in listed else -1
            parts.append({"error_code": 5 if leader < 0 else kafka_code(p.error_code),  # 5: LEADER_NOT_AVAILABLE
                          "partition_index": i, "leader_id": leader, "leader_epoch": 0,
                          "replica_nodes": [p.broker_id], "isr_nodes": [p.broker_id] if leader >= 0 else [],
                          "offline_replicas": [] if leader >= 0 else [p.broker_id]})
        out.append({"error_code": 0, "name": t.name, "is_internal": False, "partitions": parts,
                    "topic_authorized_operations": -2147483648})
    return _response(header, {"brokers": brokers, "cluster_id": f"metaq-{min(listed)}",
                              "controller_id": min(listed), "topics": out,
                              "cluster_authorized_operations": -2147483648, "throttle_time": ctx.throttle_ms()})


# -- Produce -------------------------------------------------------------------------------------------

async def produce(ctx: Context, header: RequestHeader, req: Any) -> Any:
    """Every partition's Kafka batches converted and appended through one core MultiProduce, each
    batch as the core's produce handles it."""
    own_id = ctx.broker.config.broker_id
    max_bytes = ctx.broker.config.max_batch_bytes
    batches: list[m.ProducePartition] = []
    slots: list[tuple[str, int, int, int, str | None, int]] = []
    """(topic, index, error, first batch's position in ``batches``, message, batch count)."""
    layouts: dict[str, Layout | None] = {}
    for td in req.topic_data:
        if td.name not in layouts:
            layouts[td.name] = await ctx.layout(td.name)
        layout = layouts[td.name]
        for pd in td.partition_data:
            pid = layout.get(pd.index) if layout is not None else None
            if pid is None:
                slots.append((td.name, pd.index, UNKNOWN_TOPIC_OR_PARTITION, -1,
                              f"topic {td.name!r} has no partition {pd.index}", 0))
                continue
            if pid.broker_id != own_id:
                slots.append((td.name, pd.index, NOT_LEADER_OR_FOLLOWER, -1,
                              f"partition {pd.index} is {pid} on broker {pid.broker_id}", 0))
                continue
            try:
                converted = [kr.to_metaq(b) for b in kr.iter_kafka_batches(pd.records or b"", max_bytes)]
            except CorruptRecordError as exc:
                slots.append((td.name, pd.index, CORRUPT_MESSAGE, -1, str(exc), 0))
                continue
            except (InvalidArgument, ProtocolError) as exc:
                slots.append((td.name, pd.index, UNSUPPORTED_FOR_MESSAGE_FORMAT, -1, str(exc), 0))
                continue
            slots.append((td.name, pd.index, NONE, len(batches), None, len(converted)))
            batches += [m.ProducePartition(td.name, pid.partition, b) for b in converted]
    results: list[m.ProducedPartition] = []
    throttle = 0
    if batches:
        response = await ctx.core(m.MultiProduceRequest(acks=1, partitions=batches))
        throttle = ctx.throttle_ms()
        if response.error_code:
            results = [m.ProducedPartition(error_code=response.error_code, error_message=response.error_message)
                       for _ in batches]
        else:
            results = response.partitions
    if req.acks == 0:
        return None
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for topic, index, error, first, message, count in slots:
        base_offset = -1
        if error == NONE:
            for r in results[first:first + count]:
                if r.error_code:
                    error, message = kafka_code(r.error_code), r.error_message
                    break
            else:
                base_offset = results[first].base_offset
        by_topic.setdefault(topic, []).append({
            "index": index, "error_code": error, "base_offset": base_offset, "log_append_time": None,
            "log_start_offset": -1, "record_errors": [], "error_message": message})
    return _response(header, {"responses": [{"name": t, "partition_responses": ps} for t, ps in by_topic.items()],
                              "throttle_time": throttle})


# -- Fetch, ListOffsets --------------------------------------------------------------------------------

async def fetch(ctx: Context, header: RequestHeader, req: Any) -> Any:
    """One core MultiFetch for every partition asked (long polling with max_wait and min_bytes), each
    partition's stored batches converted to Kafka batches."""
    own_id = ctx.broker.config.broker_id
    asked: list[m.FetchPartition] = []
    entries: list[tuple[str, int, int, int]] = []
    """(topic, index, error, position in ``asked`` or -1)."""
    for t in req.topics:
        layout = await ctx.layout(t.topic)
        for p in t.partitions:
            pid = layout.get(p.partition) if layout is not None else None
            if pid is None:
                entries.append((t.topic, p.partition, UNKNOWN_TOPIC_OR_PARTITION, -1))
            elif pid.broker_id != own_id:
                entries.append((t.topic, p.partition, NOT_LEADER_OR_FOLLOWER, -1))
            else:
                entries.append((t.topic, p.partition, NONE, len(asked)))
                asked.append(m.FetchPartition(t.topic, pid.partition, p.fetch_offset, p.partition_max_bytes))
    fetched: list[m.FetchedPartition] = []
    if asked:
        response = await ctx.core(m.MultiFetchRequest(
            max_wait_ms=_ms(req.max_wait), min_bytes=req.min_bytes,
            max_bytes=getattr(req, "max_bytes", 64 << 20), partitions=asked))
        if response.error_code:
            return _response(header, {"error_code": kafka_code(response.error_code), "responses": [],
                                      "throttle_time": ctx.throttle_ms()})
        fetched = response.partitions
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for topic, index, error, at in entries:
        part: dict[str, Any] = {"partition_index": index, "error_code": error, "high_watermark": -1,
                                "last_stable_offset": -1, "log_start_offset": -1, "aborted_transactions": None,
                                "preferred_read_replica": -1, "records": None}
        if at >= 0:
            f = fetched[at]
            records, part["error_code"] = await _kafka_records(ctx, asked[at], f)
            end = f.high_watermark if f.high_watermark >= 0 else f.log_end_offset
            part.update(high_watermark=end, last_stable_offset=end, log_start_offset=f.log_start_offset,
                        records=records)
        by_topic.setdefault(topic, []).append(part)
    return _response(header, {"error_code": 0, "session_id": 0,
                              "responses": [{"topic": t, "partitions": ps} for t, ps in by_topic.items()],
                              "throttle_time": ctx.throttle_ms()})


async def _kafka_records(ctx: Context, asked: m.FetchPartition, f: m.FetchedPartition) -> tuple[bytes, int]:
    if f.error_code:
        return b"", kafka_code(f.error_code)
    start = f.reset_offset if f.reset_offset >= 0 else asked.offset
    try:
        records, cut = kr.to_kafka(f.records, start)
        if not records and cut:  # a batch bigger than the bytes asked: Kafka's rule is one batch at least
            again = await ctx.core(m.MultiFetchRequest(max_wait_ms=0, min_bytes=1, max_bytes=cut, partitions=[
                m.FetchPartition(asked.topic, asked.partition, asked.offset, cut)]))
            g = again.partitions[0] if not again.error_code and again.partitions else None
            if g is None or g.error_code:
                return b"", kafka_code(g.error_code if g is not None else again.error_code)
            records, _ = kr.to_kafka(g.records, start)
    except CorruptRecordError as exc:
        log.warning("Kafka fetch of %s-%d at %d: %s", asked.topic, asked.partition, asked.offset, exc)
        return b"", CORRUPT_MESSAGE
    return records, NONE


async def list_offsets(ctx: Context, header: RequestHeader, req: Any) -> Any:
    own_id = ctx.broker.config.broker_id
    topics = []
    for t in req.topics:
        layout = await ctx.layout(t.name)
        parts = []
        for p in t.partitions:
            pid = layout.get(p.partition_index) if layout is not None else None
            entry = {"partition_index": p.partition_index, "error_code": 0, "timestamp": -1, "offset": -1,
                     "leader_epoch": 0}
            if pid is None:
                entry["error_code"] = UNKNOWN_TOPIC_OR_PARTITION
            elif pid.broker_id != own_id:
                entry["error_code"] = NOT_LEADER_OR_FOLLOWER
            else:
                r = await ctx.core(m.ListOffsetsRequest(t.name, pid.partition, p.timestamp))
                entry.update(error_code=kafka_code(r.error_code), offset=r.offset)
            parts.append(entry)
        topics.append({"name": t.name, "partitions": parts})
    return _response(header, {"topics": topics, "throttle_time": ctx.throttle_ms()})


# -- groups --------------------------------------------------------------------------------------------

async def find_coordinator(ctx: Context, header: RequestHeader, req: Any) -> Any:
    gate = await ctx.core(m.MetadataRequest([]))  # authentication and authorization are the core's
    if gate.error_code:
        return _response(header, {"error_code": kafka_code(gate.error_code), "error_message": gate.error_message,
                                  "node_id": -1, "host": "", "port": -1})
    if getattr(req, "key_type", 0) != 0:
        return _response(header, {"error_code": COORDINATOR_NOT_AVAILABLE, "node_id": -1, "host": "", "port": -1,
                                  "error_message": "transactions are not served by metaq's Kafka listener"})
    # one coordinator per cluster, whichever broker a client asks: the lowest broker id serving Kafka (the
    # broker metaq's own clients pick among their servers), which balances every broker's partitions
    node_id = ctx.broker.config.broker_id
    host, port = ctx.own_address()
    peers = ctx.peers()
    lowest = min((p for p in peers if p <= BROKER_ID_MAX), default=node_id)
    if lowest < node_id or (lowest == node_id and node_id in peers):
        phost, pport, ptls = peers[lowest]
        node_id, host, port = lowest, phost, ptls if ctx.session.tls and ptls is not None else pport
    return _response(header, {"error_code": 0, "node_id": node_id, "host": host, "port": port,
                              "throttle_time": ctx.throttle_ms()})


async def join_group(ctx: Context, header: RequestHeader, req: Any) -> Any:
    """The core's JoinGroup with the strategy computing the client's own assignor's split; every member is
    told it is a follower (no leader): its SyncGroup is answered with the core's assignment."""
    def fail(code: int, message: str = "") -> Any:
        if message:
            log.info("Kafka JoinGroup of %s refused: %s", req.group_id, message)
        return _response(header, {"error_code": code, "generation_id": -1, "protocol_type": "consumer",
                                  "protocol_name": None, "leader": "", "member_id": req.member_id, "members": []})

    if req.protocol_type != "consumer":
        return fail(INCONSISTENT_GROUP_PROTOCOL, f"protocol type {req.protocol_type!r}: only 'consumer' is served")
    offered = [p for p in req.protocols if p.name in PROTOCOLS]
    if not offered:
        return fail(INCONSISTENT_GROUP_PROTOCOL, "none of the member's assignors "
                    f"{[p.name for p in req.protocols]} is served (range, roundrobin)")
    chosen = offered[0]
    described = await ctx.core(m.DescribeGroupRequest(req.group_id))
    if not described.error_code and described.members and described.strategy in KAFKA_NAMES:
        for p in offered:  # the group's current strategy, if this member offers it too
            if PROTOCOLS[p.name] == described.strategy:
                chosen = p
    try:
        topics = kc.subscription_topics(chosen.metadata)
    except ProtocolError as exc:
        return fail(INCONSISTENT_GROUP_PROTOCOL, str(exc))
    _, layouts = await ctx.layouts(sorted(set(topics)))
    reported = [m.TopicAssignment(t, [m.BrokerPartition(p.broker_id, p.partition) for p in layout.partitions])
                for t, layout in sorted(layouts.items())]
    session_ms = _ms(req.session_timeout)
    rebalance_ms = _ms(getattr(req, "rebalance_timeout", req.session_timeout))
    r = await ctx.core(m.JoinGroupRequest(req.group_id, req.member_id, header.client_id or "", session_ms,
                                          rebalance_ms, sorted(set(topics)), PROTOCOLS[chosen.name], reported))
    if r.error_code:
        return fail(kafka_code(r.error_code), r.error_message or "")
    return _response(header, {"error_code": 0, "generation_id": r.generation, "protocol_type": "consumer",
                              "protocol_name": chosen.name, "leader": "", "member_id": r.member_id, "members": [],
                              "throttle_time": ctx.throttle_ms()})


async def sync_group(ctx: Context, header: RequestHeader, req: Any) -> Any:
    """The member's share of the generation the core formed, as Kafka's assignment bytes."""
    def answer(code: int, assignment: bytes = b"") -> Any:
        return _response(header, {"error_code": code, "assignment": assignment, "protocol_type": "consumer",
                                  "protocol_name": getattr(req, "protocol_name", None),
                                  "throttle_time": ctx.throttle_ms()})

    d = await ctx.core(m.DescribeGroupRequest(req.group_id))
    if d.error_code:
        return answer(kafka_code(d.error_code))
    member = next((mb for mb in d.members if mb.member_id == req.member_id), None)
    if member is None:
        return answer(UNKNOWN_MEMBER_ID)
    if d.state != "Stable":
        return answer(REBALANCE_IN_PROGRESS)
    if d.generation != req.generation_id:
        return answer(ILLEGAL_GENERATION)
    _, layouts = await ctx.layouts(sorted({ta.topic for ta in member.assignment}) or [])
    assigned: dict[str, list[int]] = {}
    for ta in member.assignment:
        layout = layouts.get(ta.topic)
        if layout is None:
            continue
        assigned[ta.topic] = [layout.index[pid] for bp in ta.partitions
                              if (pid := PartitionId(bp.broker_id, bp.partition)) in layout.index]
    return answer(0, kc.encode_assignment(assigned))


async def heartbeat(ctx: Context, header: RequestHeader, req: Any) -> Any:
    r = await ctx.core(m.HeartbeatRequest(req.group_id, req.generation_id, req.member_id))
    return _response(header, {"error_code": kafka_code(r.error_code), "throttle_time": ctx.throttle_ms()})


async def leave_group(ctx: Context, header: RequestHeader, req: Any) -> Any:
    ids = [mb.member_id for mb in req.members] if hasattr(req, "members") else [req.member_id]
    members, first = [], 0
    for member_id in ids:
        r = await ctx.core(m.LeaveGroupRequest(req.group_id, member_id))
        code = kafka_code(r.error_code)
        first = first or code
        members.append({"member_id": member_id, "group_instance_id": None, "error_code": code})
    return _response(header, {"error_code": first if not hasattr(req, "members") else 0, "members": members,
                              "throttle_time": ctx.throttle_ms()})


async def offset_commit(ctx: Context, header: RequestHeader, req: Any) -> Any:
    entries: list[m.OffsetEntry] = []
    slots: list[tuple[str, int, int]] = []
    """(topic, index, error or -1: the next entry's result)."""
    for t in req.topics:
        layout = await ctx.layout(t.name)
        for p in t.partitions:
            pid = layout.get(p.partition_index) if layout is not None else None
            if pid is None:
                slots.append((t.name, p.partition_index, UNKNOWN_TOPIC_OR_PARTITION))
                continue
            slots.append((t.name, p.partition_index, -1))
            entries.append(m.OffsetEntry(t.name, pid.broker_id, pid.partition, p.committed_offset,
                                         p.committed_metadata))
    results: list[int] = []
    if entries:
        r = await ctx.core(m.OffsetCommitRequest(req.group_id, req.generation_id_or_member_epoch, req.member_id,
                                                 entries))
        results = ([kafka_code(r.error_code)] * len(entries) if r.error_code
                   else [kafka_code(e.error_code) for e in r.results])
    it = iter(results)
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for topic, index, error in slots:
        code = next(it) if error < 0 else error
        by_topic.setdefault(topic, []).append({"partition_index": index, "error_code": code})
    return _response(header, {"topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()],
                              "throttle_time": ctx.throttle_ms()})


async def offset_fetch(ctx: Context, header: RequestHeader, req: Any) -> Any:
    by_topic: dict[str, list[dict[str, Any]]] = {}
    if req.topics is None:
        r = await ctx.core(m.OffsetFetchRequest(req.group_id, None))
        if r.error_code:
            return _response(header, {"error_code": kafka_code(r.error_code), "topics": []})
        _, layouts = await ctx.layouts(sorted({e.topic for e in r.offsets}) or [])
        for e in r.offsets:
            layout = layouts.get(e.topic)
            index = layout.index.get(PartitionId(e.broker_id, e.partition)) if layout is not None else None
            if index is not None:
                by_topic.setdefault(e.topic, []).append({
                    "partition_index": index, "committed_offset": e.offset, "committed_leader_epoch": -1,
                    "metadata": e.metadata or "", "error_code": kafka_code(e.error_code)})
    else:
        refs: list[m.TopicPartitionRef] = []
        slots: list[tuple[str, int, bool]] = []
        for t in req.topics:
            layout = await ctx.layout(t.name)
            for index in t.partition_indexes:
                pid = layout.get(index) if layout is not None else None
                slots.append((t.name, index, pid is not None))
                if pid is not None:
                    refs.append(m.TopicPartitionRef(t.name, pid.broker_id, pid.partition))
        got: list[m.OffsetEntry] = []
        if refs:
            r = await ctx.core(m.OffsetFetchRequest(req.group_id, refs))
            if r.error_code:
                return _response(header, {"error_code": kafka_code(r.error_code), "topics": []})
            got = r.offsets
        it = iter(got)
        for topic, index, known in slots:
            e = next(it) if known else None
            by_topic.setdefault(topic, []).append({
                "partition_index": index, "committed_offset": e.offset if e is not None else -1,
                "committed_leader_epoch": -1, "metadata": (e.metadata or "") if e is not None else "",
                "error_code": kafka_code(e.error_code) if e is not None else UNKNOWN_TOPIC_OR_PARTITION})
    return _response(header, {"error_code": 0, "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()],
                              "throttle_time": ctx.throttle_ms()})


async def describe_groups(ctx: Context, header: RequestHeader, req: Any) -> Any:
    groups = []
    for name in req.groups:
        d = await ctx.core(m.DescribeGroupRequest(name))
        groups.append({"error_code": kafka_code(d.error_code), "group_id": name, "group_state": d.state or "Dead",
                       "protocol_type": "consumer", "protocol_data": KAFKA_NAMES.get(d.strategy, d.strategy),
                       "members": [{"member_id": mb.member_id, "group_instance_id": None, "client_id": mb.client_id,
                                    "client_host": mb.host, "member_metadata": b"", "member_assignment": b""}
                                   for mb in d.members],
                       "authorized_operations": -2147483648})
    return _response(header, {"groups": groups, "throttle_time": ctx.throttle_ms()})


async def list_groups(ctx: Context, header: RequestHeader, req: Any) -> Any:
    r = await ctx.core(m.ListGroupsRequest())
    return _response(header, {"error_code": kafka_code(r.error_code), "throttle_time": ctx.throttle_ms(),
                              "groups": [{"group_id": g, "protocol_type": "consumer", "group_state": ""}
                                         for g in r.groups]})


# -- topics, configs, producer ids ---------------------------------------------------------------------

async def create_topics(ctx: Context, header: RequestHeader, req: Any) -> Any:
    out = []
    for t in req.topics:
        count = t.num_partitions if t.num_partitions > 0 else -1
        entry = {"name": t.name, "error_code": 0, "error_message": None, "num_partitions": count,
                 "replication_factor": 1, "configs": None}
        if req.validate_only:
            r = await ctx.core(m.MetadataRequest([t.name]))
            if r.topics and not r.topics[0].error_code:
                entry.update(error_code=TOPIC_ALREADY_EXISTS, error_message=f"topic {t.name!r} already exists")
        else:
            r = await ctx.core(m.CreateTopicRequest(t.name, count))
            entry.update(error_code=kafka_code(r.error_code), error_message=r.error_message,
                         num_partitions=r.num_partitions if not r.error_code else -1)
        out.append(entry)
    return _response(header, {"topics": out, "throttle_time": ctx.throttle_ms()})


async def delete_topics(ctx: Context, header: RequestHeader, req: Any) -> Any:
    out = []
    for name in req.topic_names:
        r = await ctx.core(m.DeleteTopicRequest(name))
        out.append({"name": name, "error_code": kafka_code(r.error_code), "error_message": r.error_message})
    return _response(header, {"responses": out, "throttle_time": ctx.throttle_ms()})


_TOPIC, _BROKER = 2, 4


async def describe_configs(ctx: Context, header: RequestHeader, req: Any) -> Any:
    """What metaq has of Kafka's topic and broker configs (read-only): enough for admin clients' listings."""
    config = ctx.broker.config
    results = []
    for res in req.resources:
        entry: dict[str, Any] = {"error_code": 0, "error_message": None, "resource_type": res.resource_type,
                                 "resource_name": res.resource_name, "configs": []}
        if res.resource_type == _TOPIC:
            r = await ctx.core(m.MetadataRequest([res.resource_name]))
            code = r.error_code or (r.topics[0].error_code if r.topics else UNKNOWN_TOPIC_OR_PARTITION)
            if code:
                entry.update(error_code=kafka_code(code), error_message=f"no topic {res.resource_name!r}")
            else:
                s = config.topic_settings(res.resource_name)
                values = {"cleanup.policy": "delete", "max.message.bytes": str(config.max_message_bytes),
                          "metaq.deletePolicy": str(s.delete_policy), "num.partitions": str(s.num_partitions)}
                entry["configs"] = _config_entries(values, res.configuration_keys)
        elif res.resource_type == _BROKER:
            gate = await ctx.core(m.MetadataRequest([]))
            if gate.error_code:
                entry.update(error_code=kafka_code(gate.error_code), error_message=gate.error_message)
            else:
                values = {"broker.id": str(config.broker_id), "message.max.bytes": str(config.max_batch_bytes),
                          "auto.create.topics.enable": "true" if config.auto_create_topics else "false",
                          "num.partitions": str(config.num_partitions)}
                entry["configs"] = _config_entries(values, res.configuration_keys)
        else:
            entry.update(error_code=INVALID_REQUEST, error_message=f"resource type {res.resource_type} is not served")
        results.append(entry)
    return _response(header, {"results": results, "throttle_time": ctx.throttle_ms()})


def _config_entries(values: dict[str, str], keys: Any) -> list[dict[str, Any]]:
    return [{"name": k, "value": v, "read_only": True, "config_source": 5, "is_sensitive": False, "synonyms": [],
             "config_type": 2, "documentation": None}
            for k, v in sorted(values.items()) if keys is None or k in keys]


async def init_producer_id(ctx: Context, header: RequestHeader, req: Any) -> Any:
    """An idempotent producer's id: random 62 bits, as metaq's own producers draw theirs (no broker keeps a
    counter); the same id with the next epoch when the client asks to bump its epoch."""
    gate = await ctx.core(m.MetadataRequest([]))
    if gate.error_code:
        return _response(header, {"error_code": kafka_code(gate.error_code), "producer_id": -1, "producer_epoch": -1})
    if req.transactional_id is not None:
        return _response(header, {"error_code": UNSUPPORTED_VERSION, "producer_id": -1, "producer_epoch": -1})
    pid, epoch = getattr(req, "producer_id", -1), getattr(req, "producer_epoch", -1)
    if pid > 0 and 0 <= epoch < PRODUCER_EPOCH_MAX:
        return _response(header, {"error_code": 0, "producer_id": pid, "producer_epoch": epoch + 1})
    return _response(header, {"error_code": 0, "producer_id": secrets.randbits(62) + 1, "producer_epoch": 0,
                              "throttle_time": ctx.throttle_ms()})


# -- SASL ------------------------------------------------------------------------------------------------

async def sasl_handshake(ctx: Context, header: RequestHeader, req: Any) -> Any:
    r = await ctx.core(m.SaslHandshakeRequest(req.mechanism))
    return _response(header, {"error_code": kafka_code(r.error_code), "mechanisms": r.mechanisms or ["SCRAM-SHA-256"]})


async def sasl_authenticate(ctx: Context, header: RequestHeader, req: Any) -> Any:
    r = await ctx.core(m.SaslAuthenticateRequest(req.auth_bytes))
    return _response(header, {"error_code": kafka_code(r.error_code), "error_message": r.error_message,
                              "auth_bytes": r.auth_bytes, "session_lifetime": 0})


HANDLERS: dict[int, Callable[[Context, RequestHeader, Any], Awaitable[Any]]] = {
    0: produce, 1: fetch, 2: list_offsets, 3: metadata, 8: offset_commit, 9: offset_fetch, 10: find_coordinator,
    11: join_group, 12: heartbeat, 13: leave_group, 14: sync_group, 15: describe_groups, 16: list_groups,
    17: sasl_handshake, 18: api_versions, 19: create_topics, 20: delete_topics, 22: init_producer_id,
    32: describe_configs, 36: sasl_authenticate,
}
