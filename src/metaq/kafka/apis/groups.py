"""The Kafka APIs of consumer groups and their offsets: FindCoordinator, JoinGroup, SyncGroup, Heartbeat,
LeaveGroup, OffsetCommit, OffsetFetch, DescribeGroups, ListGroups.

Kafka's classic protocol over metaq's group coordinator: the core forms the generation and computes the
assignment with the strategy that splits as the client's own assignor would (:data:`PROTOCOLS`), so every
member is told it is a follower and SyncGroup hands each its share.
"""

from __future__ import annotations

import logging
from typing import Any

from metaq.errors import ProtocolError
from metaq.kafka.apis.context import Context, _ms, _response
from metaq.kafka.errors import (
    COORDINATOR_NOT_AVAILABLE,
    ILLEGAL_GENERATION,
    INCONSISTENT_GROUP_PROTOCOL,
    REBALANCE_IN_PROGRESS,
    UNKNOWN_MEMBER_ID,
    UNKNOWN_TOPIC_OR_PARTITION,
    kafka_code,
)
from metaq.protocol import messages as m
from metaq.protocol.kafka import consumer as kc
from metaq.protocol.kafka.codec import RequestHeader
from metaq.types import BROKER_ID_MAX, PartitionId

log = logging.getLogger("metaq.kafka")

PROTOCOLS = {"range": "range", "roundrobin": "roundrobin"}
"""Kafka assignor name -> the metaq group strategy that computes the same split (docs/kafka.md)."""
KAFKA_NAMES = {v: k for k, v in PROTOCOLS.items()}


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

