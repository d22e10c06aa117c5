"""The Kafka APIs of the data path: Metadata (where a topic's partitions are), Produce, Fetch, ListOffsets.

Each is one request (or a few) to the broker core: a produce is one core MultiProduce of every
partition's converted batches, a fetch one core MultiFetch (long polling with max_wait and min_bytes)
whose stored batches are converted back to Kafka's (:mod:`metaq.protocol.kafka.records`).
"""

from __future__ import annotations

import logging
from typing import Any

from metaq.errors import CorruptRecordError, InvalidArgument, ProtocolError
from metaq.kafka.apis.context import Context, Layout, _ms, _response
from metaq.kafka.errors import (
    CORRUPT_MESSAGE,
    NONE,
    NOT_LEADER_OR_FOLLOWER,
    UNKNOWN_TOPIC_OR_PARTITION,
    UNSUPPORTED_FOR_MESSAGE_FORMAT,
    kafka_code,
)
from metaq.protocol import messages as m
from metaq.protocol.kafka import records as kr
from metaq.protocol.kafka.codec import RequestHeader
from metaq.types import BROKER_ID_MAX

log = logging.getLogger("metaq.kafka")


# -- Metadata -----------------------------------------------------------------------------------------------

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

