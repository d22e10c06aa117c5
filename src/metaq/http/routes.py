"""The HTTP endpoints: each turns a request into the binary protocol's request dataclass, hands it to
:meth:`metaq.broker.core.Broker.handle` (as the TCP transport does), and writes the reply as JSON.

Nothing here reads a log, checks a size or validates a topic name itself: the core does, so a limit or
a rule holds the same over both protocols. What is checked here is the HTTP shape: content types, JSON,
query parameters. The table of endpoints is :data:`ROUTES` (the OpenAPI description documents each one,
and a test checks that they agree).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from metaq.broker.core import Broker
from metaq.broker.quotas import ANONYMOUS
from metaq.broker.session import FileReply, Session
from metaq.errors import (
    CorruptRecordError,
    InvalidArgument,
    OffsetOutOfRangeError,
    StoredDataCorruptError,
    TooManyConnectionsError,
)
from metaq.http.auth import PRINCIPAL_KEY
from metaq.http.codecs import ENCODINGS, OutgoingMessage, message_from_raw, message_to_json, messages_from_json
from metaq.http.errors import HttpInputError, WireError
from metaq.protocol import messages as m
from metaq.protocol.delayed import DELIVER_AT_HEADER, mark_delayed, pack_ms
from metaq.protocol.records import BatchBuilder, decode_fetched
from metaq.types import Message, format_message_id, parse_message_id

BROKER_KEY: web.AppKey[Broker] = web.AppKey("broker", Broker)
LONG_POLL_MAX_MS = 600_000
"""max_wait_ms above this is refused (the binary protocol silently cuts it to the same bound)."""
PRODUCE_TIMEOUT_MS = 30_000
JSON_TYPES = ("application/json",)
RAW_TYPES = ("application/octet-stream",)


# -- calling the core --------------------------------------------------------------------------------


async def call(request: web.Request, core_request: Any) -> Any:
    """The core's response to ``core_request``; WireError when it carries an error.

    A request in progress counts as one of its principal's connections (quotaMaxConnections): HTTP/1.1 holds
    one request per connection at a time, so that is what the binary protocol's count bounds."""
    broker = request.app[BROKER_KEY]
    session = Session(peer=request.remote or "?", tls=request.secure, principal=request.get(PRINCIPAL_KEY))
    refusal = broker.quotas.admit(session, session.principal or ANONYMOUS)
    if refusal is not None:
        broker.audit(session.principal, "connection", "cluster", "denied", session.peer, refusal)
        raise WireError(TooManyConnectionsError.code, refusal)
    result: Any = None
    try:
        result = broker.handle(core_request, session)
        if asyncio.iscoroutine(result):
            broker.request_started()
            try:
                result = await result
            finally:
                broker.request_finished()
        if session.throttle_ms:  # over a byte-rate quota: the reply waits, as a TCP connection is muted
            await asyncio.sleep(session.throttle_ms / 1000)
    except BaseException:
        if isinstance(result, FileReply):  # cancelled (the client hung up) while the reply waited
            result.file_slice.release()
        raise
    finally:
        broker.quotas.release(session)
    response = result.response if isinstance(result, FileReply) else result
    if response.error_code:
        if isinstance(result, FileReply):
            result.file_slice.release()
        raise WireError(response.error_code, response.error_message, **_error_extra(response))
    return result


def _error_extra(response: Any) -> dict[str, Any]:
    if isinstance(response, m.FetchResponse):
        extra: dict[str, Any] = {}
        if response.log_end_offset >= 0:  # the partition exists: its valid range helps to reposition
            extra.update(log_start_offset=response.log_start_offset, log_end_offset=response.log_end_offset)
        if response.damaged_offset >= 0:
            extra.update(damaged_offset=response.damaged_offset, resume_offset=response.resume_offset)
        return extra
    return {}


# -- request parsing ---------------------------------------------------------------------------------


def int_param(request: web.Request, name: str, default: int | None, minimum: int, maximum: int = 2**63 - 1) -> int:
    text = request.query.get(name)
    if text is None:
        if default is None:
            raise HttpInputError(f"query parameter {name} is required")
        return default
    try:
        value = int(text)
    except ValueError:
        raise HttpInputError(f"query parameter {name} must be an integer, not {text[:64]!r}") from None
    if not minimum <= value <= maximum:
        raise HttpInputError(f"query parameter {name} must be in {minimum}..{maximum}, not {value}")
    return value


def path_int(request: web.Request, name: str, minimum: int = 0) -> int:
    text = request.match_info[name]
    try:
        value = int(text)
    except ValueError:
        raise HttpInputError(f"{name} in the path must be an integer, not {text[:64]!r}") from None
    if value < minimum or value > 2**31 - 1:
        raise HttpInputError(f"{name} in the path must be an integer {minimum}..{2**31 - 1}, not {value}")
    return value


def choice_param(request: web.Request, name: str, choices: tuple[str, ...], default: str) -> str:
    value = request.query.get(name, default)
    if value not in choices:
        raise HttpInputError(f"query parameter {name} must be one of {', '.join(choices)}, not {value[:64]!r}")
    return value


def content_type(request: web.Request, allowed: tuple[str, ...]) -> str:
    kind = request.content_type
    if kind not in allowed:
        raise HttpInputError(f"Content-Type must be {' or '.join(allowed)}, not {kind!r}", 415)
    return kind


async def json_body(request: web.Request) -> Any:
    content_type(request, JSON_TYPES)
    raw = await request.read()
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HttpInputError(f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise HttpInputError("the body is not valid JSON: nested too deeply") from None


def partition_ref(broker_id: int, partition: int) -> dict[str, Any]:
    return {"broker_id": broker_id, "partition": partition, "partition_id": f"{broker_id}-{partition}"}


# -- topics ------------------------------------------------------------------------------------------


async def list_topics(request: web.Request) -> web.Response:
    response: m.MetadataResponse = await call(request, m.MetadataRequest(None))
    return web.json_response(_metadata_json(response))


def _metadata_json(response: m.MetadataResponse) -> dict[str, Any]:
    return {
        "brokers": [{"broker_id": b.broker_id, "host": b.host, "port": b.port} for b in response.brokers],
        "topics": [{"name": t.name, "partitions": [_partition_json(p) for p in t.partitions]}
                   for t in response.topics if not t.error_code],
    }


def _partition_json(p: m.PartitionInfo) -> dict[str, Any]:
    return {**partition_ref(p.broker_id, p.partition), "accept_publish": p.accept_publish,
            "accept_subscribe": p.accept_subscribe}


async def describe_topic(request: web.Request) -> web.Response:
    """A topic's partitions, with their earliest and latest offsets where this broker holds them."""
    topic = request.match_info["topic"]
    broker = request.app[BROKER_KEY]
    response: m.MetadataResponse = await call(request, m.MetadataRequest([topic]))
    info = response.topics[0]
    if info.error_code:
        raise WireError(info.error_code, f"topic {topic!r} does not exist" if info.error_code == 3 else None)
    partitions = []
    for p in info.partitions:
        entry = _partition_json(p)
        if p.broker_id == broker.config.broker_id:
            offsets: m.ListOffsetsResponse = await call(request, m.ListOffsetsRequest(topic, p.partition))
            entry.update(log_start_offset=offsets.log_start_offset, log_end_offset=offsets.log_end_offset)
        partitions.append(entry)
    return web.json_response({"name": topic, "partitions": partitions})


async def partition_offsets(request: web.Request) -> web.Response:
    """``time``: earliest, latest or a timestamp in ms (the first offset at or after it)."""
    topic = request.match_info["topic"]
    partition = path_int(request, "partition")
    when = request.query.get("time", "latest")
    stamps = {"earliest": m.EARLIEST_TIMESTAMP, "latest": m.LATEST_TIMESTAMP}
    timestamp = stamps[when] if when in stamps else int_param(request, "time", None, 0)
    response: m.ListOffsetsResponse = await call(request, m.ListOffsetsRequest(topic, partition, timestamp))
    return web.json_response({"topic": topic, **partition_ref(request.app[BROKER_KEY].config.broker_id, partition),
                              "time": when, "offset": response.offset, "log_start_offset": response.log_start_offset,
                              "log_end_offset": response.log_end_offset})


# -- produce -----------------------------------------------------------------------------------------


async def produce(request: web.Request) -> web.Response:
    """One message or a batch, as JSON or a raw body; one record batch, one append, one partition."""
    topic = request.match_info["topic"]
    kind = content_type(request, JSON_TYPES + RAW_TYPES)
    body_partition: int | None = None
    if kind in RAW_TYPES:
        messages = [message_from_raw(await request.read(), request.query, request.headers)]
    else:
        messages, body_partition = messages_from_json(await json_body(request))
    if "partition" in request.match_info:
        partition = path_int(request, "partition")
    else:
        partition = int_param(request, "partition", body_partition if body_partition is not None else -1, -1,
                              2**31 - 1)
    records = _batch(messages)
    response: m.ProduceResponse = await call(
        request, m.ProduceRequest(topic, partition, acks=1, timeout_ms=PRODUCE_TIMEOUT_MS, records=records))
    broker_id = request.app[BROKER_KEY].config.broker_id
    if response.base_message_id < 0:  # delayed (docs/delayed.md): offsets and ids are assigned at delivery
        results: list[dict[str, Any]] = [{"offset": -1, "id": "-1"} for _ in messages]
    else:
        results = [{"offset": response.base_offset + i, "id": format_message_id(response.base_message_id + i)}
                   for i in range(len(messages))]
    return web.json_response({"topic": topic, **partition_ref(broker_id, response.partition),
                              "offset": response.base_offset, "id": results[0]["id"], "count": len(messages),
                              "append_time_ms": response.append_time_ms, "messages": results})


def _batch(messages: list[OutgoingMessage]) -> bytes:
    now_ms = int(time.time() * 1000)
    builder = BatchBuilder(max_bytes=1 << 62)
    delayed = any(msg.deliver_at is not None for msg in messages)  # then the whole batch is (bit 7)
    try:
        for msg in messages:
            headers = msg.headers
            if delayed:
                due = msg.deliver_at if msg.deliver_at is not None else now_ms
                headers = [*(headers or ()), (DELIVER_AT_HEADER, pack_ms(due))]
            builder.try_append(msg.timestamp_ms if msg.timestamp_ms >= 0 else now_ms, msg.payload, msg.key,
                               msg.attribute, headers)
        return mark_delayed(builder.build()) if delayed else builder.build()
    except InvalidArgument as exc:
        raise HttpInputError(str(exc)) from None


# -- fetch -------------------------------------------------------------------------------------------


async def fetch(request: web.Request) -> web.Response:
    """Messages from ``offset`` (or the group's committed offset), long polling up to ``max_wait_ms``."""
    broker = request.app[BROKER_KEY]
    topic = request.match_info["topic"]
    partition = path_int(request, "partition")
    group = request.query.get("group", "")
    fmt = choice_param(request, "format", ENCODINGS, "text")
    max_bytes = int_param(request, "max_bytes", broker.config.max_transfer_bytes, 1, 2**31 - 1)
    max_wait_ms = int_param(request, "max_wait_ms", 0, 0, LONG_POLL_MAX_MS)
    max_messages = int_param(request, "max_messages", 0, 0, 2**31 - 1)
    if "offset" in request.query or not group:
        offset = int_param(request, "offset", None, 0)
    else:
        offset = await _group_start(request, topic, partition, group)
    response, records = await _fetch(request, m.FetchRequest(topic, partition, offset, max_bytes, max_wait_ms, group))
    start = response.reset_offset if response.reset_offset >= 0 else offset
    messages, next_offset = _decode(records, topic, partition, start, broker.config.broker_id, max_bytes)
    if max_messages and len(messages) > max_messages:
        messages = messages[:max_messages]
        next_offset = messages[-1].offset + 1
    body: dict[str, Any] = {"topic": topic, **partition_ref(broker.config.broker_id, partition), "offset": start,
                            "next_offset": next_offset, "log_start_offset": response.log_start_offset,
                            "log_end_offset": response.log_end_offset,
                            "messages": [message_to_json(msg, fmt) for msg in messages]}
    if response.reset_offset >= 0:
        body["reset_offset"] = response.reset_offset
    if group:
        body["group"] = group
    return web.json_response(body)


async def _fetch(request: web.Request, fetch_request: m.FetchRequest) -> tuple[m.FetchResponse, bytes]:
    result = await call(request, fetch_request)
    if isinstance(result, FileReply):
        try:
            return result.response, result.file_slice.read_bytes()
        finally:
            result.file_slice.release()
    return result, bytes(result.records)


def _decode(records: bytes, topic: str, partition: int, start: int, broker_id: int,
            max_bytes: int) -> tuple[list[Message], int]:
    try:
        messages, next_offset = decode_fetched(records, topic, partition, start, broker_id=broker_id)
    except CorruptRecordError as exc:
        raise WireError(StoredDataCorruptError.code, str(exc), damaged_offset=exc.offset,
                        resume_offset=exc.resume_offset) from None
    if records and not messages and next_offset == start:
        raise HttpInputError(f"the record batch at offset {start} is larger than max_bytes={max_bytes}; "
                             "ask for more (up to the broker's maxTransferSize)")
    return messages, next_offset


async def _group_start(request: web.Request, topic: str, partition: int, group: str) -> int:
    """Where a group resumes: its committed offset, else ``reset`` (earliest or latest)."""
    broker_id = request.app[BROKER_KEY].config.broker_id
    reset = choice_param(request, "reset", ("earliest", "latest"), "earliest")
    ref = m.TopicPartitionRef(topic, broker_id, partition)
    committed: m.OffsetFetchResponse = await call(request, m.OffsetFetchRequest(group, [ref]))
    for entry in committed.offsets:
        if entry.error_code:
            raise WireError(entry.error_code, None)
        if entry.offset >= 0:
            return entry.offset
    stamp = m.EARLIEST_TIMESTAMP if reset == "earliest" else m.LATEST_TIMESTAMP
    listed: m.ListOffsetsResponse = await call(request, m.ListOffsetsRequest(topic, partition, stamp))
    return listed.offset


# -- lookups -----------------------------------------------------------------------------------------


async def find_messages(request: web.Request) -> web.Response:
    """Messages of this broker's partitions of a topic by ``key`` and/or timestamp range ``from``..``to`` (ms)."""
    broker_id = request.app[BROKER_KEY].config.broker_id
    topic = request.match_info["topic"]
    key_text = request.query.get("key")
    from_ms = int_param(request, "from", -1, -1)
    to_ms = int_param(request, "to", -1, -1)
    if key_text is None and from_ms < 0 and to_ms < 0:
        raise HttpInputError("give key, from or to (or several)")
    limit = int_param(request, "limit", 100, 1, m.MAX_FIND_RESULTS)
    partition = int_param(request, "partition", -1, -1, 2**31 - 1)
    key = key_text.encode() if key_text is not None else None
    found: m.FindMessagesResponse = await call(request, m.FindMessagesRequest(topic, partition, key, from_ms, to_ms,
                                                                              limit))
    return web.json_response({
        "topic": topic, "truncated": found.truncated, "scanned_segments": found.scanned_segments,
        "problems": found.problems,
        "messages": [{"id": format_message_id(f.message_id), **partition_ref(broker_id, f.partition),
                      "offset": f.offset, "timestamp_ms": f.timestamp_ms,
                      "key": f.key.decode(errors="replace") if f.key is not None else None}
                     for f in found.messages]})


async def lookup_message(request: web.Request) -> web.Response:
    """Where a message id is stored, and the message itself."""
    broker = request.app[BROKER_KEY]
    text = request.match_info["message_id"]
    try:
        message_id = parse_message_id(text[:64])
    except InvalidArgument as exc:
        raise HttpInputError(f"{exc} (32 hex digits, as a produce reply gives it)") from None
    fmt = choice_param(request, "format", ENCODINGS, "text")
    where: m.LookupMessageResponse = await call(request, m.LookupMessageRequest(message_id))
    body: dict[str, Any] = {"id": format_message_id(message_id), "topic": where.topic,
                            **partition_ref(broker.config.broker_id, where.partition), "offset": where.offset}
    try:
        _response, records = await _fetch(request, m.FetchRequest(where.topic, where.partition, where.offset,
                                                                  broker.config.max_transfer_bytes, 0))
    except WireError as exc:
        if exc.code != OffsetOutOfRangeError.code:
            raise
        records = b""
    messages, _ = _decode(records, where.topic, where.partition, where.offset, broker.config.broker_id,
                          broker.config.max_transfer_bytes)
    found = [msg for msg in messages if msg.offset == where.offset]
    if found:
        body["message"] = message_to_json(found[0], fmt)
    return web.json_response(body)


# -- groups ------------------------------------------------------------------------------------------


async def list_groups(request: web.Request) -> web.Response:
    response: m.ListGroupsResponse = await call(request, m.ListGroupsRequest())
    return web.json_response({"groups": response.groups})


async def describe_group(request: web.Request) -> web.Response:
    group = request.match_info["group"]
    response: m.DescribeGroupResponse = await call(request, m.DescribeGroupRequest(group))
    return web.json_response({
        "group": group, "state": response.state, "generation": response.generation, "strategy": response.strategy,
        "members": [{"member_id": mem.member_id, "client_id": mem.client_id, "host": mem.host,
                     "assignment": _assignment_json(mem.assignment)} for mem in response.members]})


def _assignment_json(assignment: list[m.TopicAssignment]) -> list[dict[str, Any]]:
    return [{"topic": a.topic, "partitions": [partition_ref(p.broker_id, p.partition) for p in a.partitions]}
            for a in assignment]


async def group_offsets(request: web.Request) -> web.Response:
    group = request.match_info["group"]
    topic = request.query.get("topic")
    response: m.OffsetFetchResponse = await call(request, m.OffsetFetchRequest(group, None))
    entries = [_offset_json(entry) for entry in response.offsets if topic is None or entry.topic == topic]
    return web.json_response({"group": group, "offsets": entries})


def _offset_json(entry: m.OffsetEntry) -> dict[str, Any]:
    return {"topic": entry.topic, **partition_ref(entry.broker_id, entry.partition), "offset": entry.offset,
            "metadata": entry.metadata}


async def commit_offsets(request: web.Request) -> web.Response:
    """Commit offsets: outside membership (generation -1, only while the group has no members) or as a
    member of a generation (``generation`` and ``member_id`` from the join)."""
    group = request.match_info["group"]
    broker_id = request.app[BROKER_KEY].config.broker_id
    body = await json_body(request)
    if not isinstance(body, dict) or not isinstance(body.get("offsets"), list) or not body["offsets"]:
        raise HttpInputError('the body must be {"offsets": [{"topic": ..., "partition": ..., "offset": ...}, ...]} '
                             '(with "generation" and "member_id" when committing as a group member)')
    generation = _json_int(body.get("generation", m.NO_GENERATION), "generation", -1)
    member_id = body.get("member_id", "")
    if not isinstance(member_id, str):
        raise HttpInputError("member_id must be a string")
    entries = []
    for i, item in enumerate(body["offsets"]):
        if not isinstance(item, dict) or not isinstance(item.get("topic"), str):
            raise HttpInputError(f"offsets[{i}] must be an object with topic, partition and offset")
        metadata = item.get("metadata")
        if metadata is not None and not isinstance(metadata, str):
            raise HttpInputError(f"offsets[{i}].metadata must be a string")
        entries.append(m.OffsetEntry(item["topic"],
                                     _json_int(item.get("broker_id", broker_id), f"offsets[{i}].broker_id", 0),
                                     _json_int(item.get("partition"), f"offsets[{i}].partition", 0),
                                     _json_int(item.get("offset"), f"offsets[{i}].offset", -1), metadata))
    response: m.OffsetCommitResponse = await call(request, m.OffsetCommitRequest(group, generation, member_id, entries))
    results = [{**_offset_json(entry), "error_code": entry.error_code} for entry in response.results]
    failed = next((entry for entry in response.results if entry.error_code), None)
    if failed is not None:
        # the entries with error_code 0 are committed all the same: the body lists which
        raise WireError(failed.error_code, response.error_message, results=results)
    return web.json_response({"group": group, "offsets": results})


def _json_int(value: Any, field: str, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= 2**63 - 1:
        raise HttpInputError(f"{field} must be an integer >= {minimum}, not {value!r}")
    return value


async def join_group(request: web.Request) -> web.Response:
    """JoinGroup: answered once the group's rebalance completes, with this member's partitions."""
    group = request.match_info["group"]
    body = await json_body(request)
    if not isinstance(body, dict):
        raise HttpInputError('the body must be {"topics": [...]} (and optionally member_id, client_id, '
                             'session_timeout_ms, rebalance_timeout_ms, strategy)')
    topics = body.get("topics")
    if not isinstance(topics, list) or not topics or not all(isinstance(t, str) for t in topics):
        raise HttpInputError("topics must be a non-empty array of topic names")
    strings = {k: body.get(k, d) for k, d in (("member_id", ""), ("client_id", "http"), ("strategy", "range"))}
    for key, value in strings.items():
        if not isinstance(value, str):
            raise HttpInputError(f"{key} must be a string")
    req = m.JoinGroupRequest(group, strings["member_id"], strings["client_id"],
                             _json_int(body.get("session_timeout_ms", 10_000), "session_timeout_ms", 1),
                             _json_int(body.get("rebalance_timeout_ms", 30_000), "rebalance_timeout_ms", 1),
                             topics, strings["strategy"])
    response: m.JoinGroupResponse = await call(request, req)
    return web.json_response({"group": group, "generation": response.generation, "member_id": response.member_id,
                              "members": response.members, "assignment": _assignment_json(response.assignment)})


async def heartbeat(request: web.Request) -> web.Response:
    group, member = request.match_info["group"], request.match_info["member_id"]
    body = await json_body(request)
    if not isinstance(body, dict):
        raise HttpInputError('the body must be {"generation": N}')
    generation = _json_int(body.get("generation"), "generation", -1)
    await call(request, m.HeartbeatRequest(group, generation, member))
    return web.json_response({"group": group, "member_id": member, "generation": generation})


async def leave_group(request: web.Request) -> web.Response:
    group, member = request.match_info["group"], request.match_info["member_id"]
    await call(request, m.LeaveGroupRequest(group, member))
    return web.json_response({"group": group, "member_id": member, "left": True})


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

ROUTES: tuple[tuple[str, str, Handler], ...] = (
    ("GET", "/topics", list_topics),
    ("GET", "/topics/{topic}", describe_topic),
    ("POST", "/topics/{topic}/messages", produce),
    ("POST", "/topics/{topic}/partitions/{partition}/messages", produce),
    ("GET", "/topics/{topic}/partitions/{partition}/messages", fetch),
    ("GET", "/topics/{topic}/partitions/{partition}/offsets", partition_offsets),
    ("GET", "/messages/{message_id}", lookup_message),
    ("GET", "/topics/{topic}/find", find_messages),
    ("GET", "/groups", list_groups),
    ("GET", "/groups/{group}", describe_group),
    ("GET", "/groups/{group}/offsets", group_offsets),
    ("POST", "/groups/{group}/offsets", commit_offsets),
    ("POST", "/groups/{group}/members", join_group),
    ("POST", "/groups/{group}/members/{member_id}/heartbeat", heartbeat),
    ("DELETE", "/groups/{group}/members/{member_id}", leave_group),
)
"""(method, path, handler) of every endpoint but /openapi.json."""
