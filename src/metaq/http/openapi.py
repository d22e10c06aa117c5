"""The OpenAPI 3 description of the HTTP API, served at ``/openapi.json``.

Written by hand next to :data:`metaq.http.routes.ROUTES`; a test checks that every route the listener
serves is described here (and nothing else), and that real replies match the schemas.
"""

from __future__ import annotations

from typing import Any

from metaq import __version__
from metaq.broker.core import Broker

_INT = {"type": "integer"}
_STR = {"type": "string"}
_BOOL = {"type": "boolean"}


def _obj(required: list[str], **props: Any) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": props}


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    """A request object: a field it does not name is refused (400), so the description says so."""
    return {**schema, "additionalProperties": False}


def _arr(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


_PARTITION_REF = {"broker_id": _INT, "partition": _INT,
                  "partition_id": {"type": "string", "description": "brokerId-partition, MetaQ's partition name"}}

SCHEMAS: dict[str, Any] = {
    "Error": _obj(["error"], error=_obj(
        ["status", "code", "name", "message", "retriable"], status=_INT,
        code={"type": "integer", "nullable": True, "description": "the wire error code (docs/protocol.md)"},
        name=_STR, message=_STR, retriable=_BOOL, hint=_STR,
        log_start_offset=_INT, log_end_offset=_INT, damaged_offset=_INT, resume_offset=_INT,
        results=_arr(_ref("CommittedOffset")))),
    "OutgoingMessage": {**_strict(_obj(["payload"], payload=_STR,
                               encoding={"type": "string", "enum": ["text", "base64"], "default": "text"},
                               key=_STR, attribute=_STR,
                               headers={"oneOf": [{"type": "object", "additionalProperties": _STR},
                                                  _arr(_arr(_STR))]},
                               timestamp_ms=_INT, deliver_at=_INT, delay_ms=_INT)),
                        "description": "encoding applies to payload, key and header values; deliver_at (ms since "
                                       "the epoch) or delay_ms: delayed delivery (docs/delayed.md)"},
    "ProduceBatch": _strict(_obj(["messages"], messages={**_arr(_ref("OutgoingMessage")), "minItems": 1,
                                                         "maxItems": 100_000},
                                 encoding={"type": "string", "enum": ["text", "base64"]},
                                 partition={"type": "integer", "minimum": -1, "maximum": 2**31 - 1})),
    "ProduceResult": _obj(["topic", "broker_id", "partition", "partition_id", "offset", "id", "count",
                           "append_time_ms", "messages"], topic=_STR, **_PARTITION_REF, offset=_INT,
                          id=_STR, count=_INT, append_time_ms=_INT,
                          messages=_arr(_obj(["offset", "id"], offset=_INT, id=_STR))),
    "Message": _obj(["offset", "id", "partition", "timestamp_ms", "append_time_ms", "encoding", "payload"],
                    offset=_INT, id=_STR, partition=_INT, timestamp_ms=_INT, append_time_ms=_INT,
                    encoding={"type": "string", "enum": ["text", "base64"]}, payload=_STR, key=_STR,
                    attribute=_STR, headers=_arr(_arr(_STR))),
    "FetchResult": _obj(["topic", "broker_id", "partition", "partition_id", "offset", "next_offset",
                         "log_start_offset", "log_end_offset", "messages"], topic=_STR, **_PARTITION_REF,
                        offset=_INT, next_offset=_INT, log_start_offset=_INT, log_end_offset=_INT,
                        reset_offset=_INT, group=_STR, messages=_arr(_ref("Message"))),
    "Partition": _obj(["broker_id", "partition", "partition_id", "accept_publish", "accept_subscribe"],
                      **_PARTITION_REF, accept_publish=_BOOL, accept_subscribe=_BOOL, log_start_offset=_INT,
                      log_end_offset=_INT),
    "Topic": _obj(["name", "partitions"], name=_STR, partitions=_arr(_ref("Partition"))),
    "Topics": _obj(["brokers", "topics"],
                   brokers=_arr(_obj(["broker_id", "host", "port"], broker_id=_INT, host=_STR, port=_INT)),
                   topics=_arr(_ref("Topic"))),
    "Offsets": _obj(["topic", "broker_id", "partition", "partition_id", "time", "offset", "log_start_offset",
                     "log_end_offset"], topic=_STR, **_PARTITION_REF, time=_STR, offset=_INT,
                    log_start_offset=_INT, log_end_offset=_INT),
    "Lookup": _obj(["id", "topic", "broker_id", "partition", "partition_id", "offset"], id=_STR, topic=_STR,
                   **_PARTITION_REF, offset=_INT, message=_ref("Message")),
    "Found": _obj(["topic", "messages", "truncated", "scanned_segments", "problems"], topic=_STR,
                  messages=_arr(_obj(["id", "broker_id", "partition", "partition_id", "offset", "timestamp_ms",
                                      "key"], id=_STR, **_PARTITION_REF, offset=_INT, timestamp_ms=_INT,
                                     key={"type": "string", "nullable": True})),
                  truncated=_BOOL, scanned_segments=_INT, problems=_arr(_STR)),
    "Groups": _obj(["groups"], groups=_arr(_STR)),
    "Assignment": _arr(_obj(["topic", "partitions"], topic=_STR,
                            partitions=_arr(_obj(["broker_id", "partition", "partition_id"], **_PARTITION_REF)))),
    "Group": _obj(["group", "state", "generation", "strategy", "members"], group=_STR, state=_STR,
                  generation=_INT, strategy=_STR,
                  members=_arr(_obj(["member_id", "client_id", "host", "assignment"], member_id=_STR,
                                    client_id=_STR, host=_STR, assignment=_ref("Assignment")))),
    "CommittedOffset": _obj(["topic", "broker_id", "partition", "partition_id", "offset"], topic=_STR,
                            **_PARTITION_REF, offset=_INT, metadata={"type": "string", "nullable": True},
                            error_code=_INT),
    "GroupOffsets": _obj(["group", "offsets"], group=_STR, offsets=_arr(_ref("CommittedOffset"))),
    "CommitRequest": _strict(_obj(["offsets"], generation={"type": "integer", "default": -1}, member_id=_STR,
                                  offsets=_arr(_strict(_obj(["topic", "partition", "offset"], topic=_STR,
                                                            broker_id=_INT, partition=_INT, offset=_INT,
                                                            metadata=_STR))))),
    "JoinRequest": _strict(_obj(["topics"], topics=_arr(_STR), member_id=_STR, client_id=_STR,
                                session_timeout_ms=_INT, rebalance_timeout_ms=_INT,
                                strategy={"type": "string", "enum": ["range", "consistent_hash", "roundrobin"]})),
    "JoinResult": _obj(["group", "generation", "member_id", "members", "assignment"], group=_STR,
                       generation=_INT, member_id=_STR, members=_arr(_STR), assignment=_ref("Assignment")),
    "HeartbeatRequest": _strict(_obj(["generation"], generation=_INT)),
    "HeartbeatResult": _obj(["group", "member_id", "generation"], group=_STR, member_id=_STR, generation=_INT),
    "LeaveResult": _obj(["group", "member_id", "left"], group=_STR, member_id=_STR, left=_BOOL),
}


def _param(name: str, where: str, schema: dict[str, Any], description: str, required: bool = False) -> dict[str, Any]:
    return {"name": name, "in": where, "required": required or where == "path", "schema": schema,
            "description": description}


_TOPIC = _param("topic", "path", {"type": "string", "minLength": 1, "maxLength": 249,
                                  "pattern": r"^([A-Za-z0-9._-]+|%DLQ%[A-Za-z0-9._@-]+)$"},
                "topic name: letters, digits, '-', '_', '.' (1-249 characters; not '.' or '..'), or %DLQ%<group>")
_PARTITION = _param("partition", "path", {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
                    "the partition number on this broker")
_GROUP = _param("group", "path", {"type": "string", "minLength": 1, "maxLength": 249,
                                  "pattern": r"^[A-Za-z0-9._@-]+$"}, "consumer group name")
_MEMBER = _param("member_id", "path", _STR, "member id from the join reply")
_FORMAT = _param("format", "query", {"type": "string", "enum": ["text", "base64"], "default": "text"},
                 "how bytes are written: text (UTF-8; a message that is not is written base64) or base64")

_ERRORS = {str(status): {"description": text, "content": {"application/json": {"schema": _ref("Error")}}}
           for status, text in ((400, "bad input"),
                                (401, "authRequired: no or wrong HTTP Basic credentials (WWW-Authenticate)"),
                                (403, "aclEnabled: the principal may not (TOPIC_/GROUP_/CLUSTER_/TRANSACTIONAL_ID_"
                                      "AUTHORIZATION_FAILED); a partition closed for publishing; Basic credentials "
                                      "on plain HTTP"),
                                (404, "unknown topic, partition, group or message"),
                                (409, "not master / group generation conflicts (retriable)"),
                                (429, "too many long polls waiting (TOO_MANY_REQUESTS, with Retry-After)"),
                                (500, "stored data damaged, or an unexpected failure (logged)"),
                                (503, "broker stopping, storage failing, or the principal's connection quota "
                                      "(retriable, with Retry-After)"),
                                (507, "the disk is full"))}


def _ok(schema: str, description: str = "success") -> dict[str, Any]:
    return {"200": {"description": description, "content": {"application/json": {"schema": _ref(schema)}}},
            **_ERRORS}


def _json_body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


_WRONG_TYPE = {"415": {"description": "a Content-Type other than application/json",
                       "content": {"application/json": {"schema": _ref("Error")}}}}


_PRODUCE_BODY = {"required": True, "content": {
    "application/json": {"schema": {"oneOf": [_ref("OutgoingMessage"), _ref("ProduceBatch")]}},
    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}
_PRODUCE_PARAMS = [
    _param("key", "query", _STR, "raw body: the message key (or the X-Metaq-Key header)"),
    _param("attribute", "query", _STR, "raw body: the message attribute (or the X-Metaq-Attribute header)"),
]
_PRODUCE_RESPONSES = {**_ok("ProduceResult"),
                      "413": {"description": "message or batch over maxMessageSize / maxBatchSize",
                              "content": {"application/json": {"schema": _ref("Error")}}},
                      "415": {"description": "wrong Content-Type",
                              "content": {"application/json": {"schema": _ref("Error")}}}}


def _paths() -> dict[str, Any]:
    return {
        "/topics": {"get": {"summary": "every topic and its partitions (the cluster's, in ZooKeeper mode)",
                            "operationId": "listTopics", "responses": _ok("Topics")}},
        "/topics/{topic}": {"get": {"summary": "a topic's partitions, with offsets for this broker's",
                                    "operationId": "describeTopic", "parameters": [_TOPIC],
                                    "responses": _ok("Topic")}},
        "/topics/{topic}/messages": {"post": {
            "summary": "produce one message or a batch; the broker picks an open partition unless given one",
            "operationId": "produce",
            "parameters": [_TOPIC, _param("partition", "query", {"type": "integer", "minimum": -1,
                                                                 "maximum": 2**31 - 1},
                                          "partition (-1 or absent: broker's choice)"),
                           *_PRODUCE_PARAMS],
            "requestBody": _PRODUCE_BODY, "responses": _PRODUCE_RESPONSES}},
        "/topics/{topic}/partitions/{partition}/messages": {
            "post": {"summary": "produce one message or a batch to one partition",
                     "operationId": "produceToPartition", "parameters": [_TOPIC, _PARTITION, *_PRODUCE_PARAMS],
                     "requestBody": _PRODUCE_BODY, "responses": _PRODUCE_RESPONSES},
            "get": {"summary": "fetch messages from an offset (or a group's committed offset), long polling",
                    "operationId": "fetch",
                    "parameters": [
                        _TOPIC, _PARTITION,
                        _param("offset", "query", {"type": "integer", "minimum": 0},
                               "first offset wanted (required unless group is given)"),
                        _param("group", "query", _STR, "start at this group's committed offset when offset is "
                                                       "absent; also selects the group's server-side filter"),
                        _param("reset", "query", {"type": "string", "enum": ["earliest", "latest"]},
                               "with group and no committed offset: where to start (default earliest)"),
                        _param("max_wait_ms", "query", {"type": "integer", "minimum": 0, "maximum": 600_000},
                               "long poll: wait up to this long for data"),
                        _param("max_bytes", "query", {"type": "integer", "minimum": 1, "maximum": 2**31 - 1},
                               "at most this many stored bytes (default and cap: maxTransferSize)"),
                        _param("max_messages", "query", {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
                               "at most this many messages (0: no limit)"),
                        _FORMAT],
                    "responses": {**_ok("FetchResult"),
                                  "416": {"description": "offset out of range (the body gives the valid range)",
                                          "content": {"application/json": {"schema": _ref("Error")}}}}}},
        "/topics/{topic}/partitions/{partition}/offsets": {"get": {
            "summary": "the earliest, latest or first offset at or after a time",
            "operationId": "offsets",
            "parameters": [_TOPIC, _PARTITION,
                           _param("time", "query", {"type": "string", "pattern": r"^(earliest|latest|[0-9]{1,18})$"},
                                  "earliest, latest (default) or a timestamp in ms")],
            "responses": _ok("Offsets")}},
        "/messages/{message_id}": {"get": {
            "summary": "look a message up by id: where it is stored, and the message",
            "operationId": "lookupMessage",
            "parameters": [_param("message_id", "path", {"type": "string", "pattern": "^[0-9a-fA-F]{32}$"},
                                  "32 hex digits, as a produce reply gives it"),
                           _FORMAT],
            "responses": _ok("Lookup")}},
        "/topics/{topic}/find": {"get": {
            "summary": "find messages of this broker's partitions by key and/or timestamp range",
            "operationId": "findMessages",
            "parameters": [_TOPIC, _param("key", "query", _STR, "only messages with exactly this key (UTF-8)"),
                           _param("from", "query", {"type": "integer", "minimum": 0},
                                  "only timestamps >= this (ms since the epoch)"),
                           _param("to", "query", {"type": "integer", "minimum": 0},
                                  "only timestamps <= this (ms since the epoch)"),
                           _param("partition", "query", {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
                                  "only this partition (default: all on this broker)"),
                           _param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 10_000},
                                  "at most this many (default 100)")],
            "responses": _ok("Found")}},
        "/groups": {"get": {"summary": "consumer groups known to this broker", "operationId": "listGroups",
                            "responses": _ok("Groups")}},
        "/groups/{group}": {"get": {"summary": "a group's state, generation and members",
                                    "operationId": "describeGroup", "parameters": [_GROUP],
                                    "responses": _ok("Group")}},
        "/groups/{group}/offsets": {
            "get": {"summary": "a group's committed offsets", "operationId": "groupOffsets",
                    "parameters": [_GROUP, _param("topic", "query", _STR, "only this topic's")],
                    "responses": _ok("GroupOffsets")},
            "post": {"summary": "commit offsets (generation -1 outside membership, or as a member)",
                     "operationId": "commitOffsets", "parameters": [_GROUP],
                     "requestBody": _json_body(_ref("CommitRequest")),
                     "responses": {**_ok("GroupOffsets"), **_WRONG_TYPE}}},
        "/groups/{group}/members": {"post": {
            "summary": "join the group; answered once its rebalance completes, with this member's partitions",
            "operationId": "joinGroup", "parameters": [_GROUP], "requestBody": _json_body(_ref("JoinRequest")),
            "responses": {**_ok("JoinResult"), **_WRONG_TYPE}}},
        "/groups/{group}/members/{member_id}/heartbeat": {"post": {
            "summary": "keep the membership alive; 409 REBALANCE_IN_PROGRESS means commit and join again",
            "operationId": "heartbeat", "parameters": [_GROUP, _MEMBER],
            "requestBody": _json_body(_ref("HeartbeatRequest")),
            "responses": {**_ok("HeartbeatResult"), **_WRONG_TYPE}}},
        "/groups/{group}/members/{member_id}": {"delete": {
            "summary": "leave the group", "operationId": "leaveGroup", "parameters": [_GROUP, _MEMBER],
            "responses": _ok("LeaveResult")}},
        "/openapi.json": {"get": {"summary": "this description", "operationId": "openapi", "security": [],
                                  "responses": {"200": {"description": "OpenAPI 3 document",
                                                        "content": {"application/json": {"schema": {
                                                            "type": "object"}}}}}}},
    }


def openapi_document(broker: Broker) -> dict[str, Any]:
    c = broker.config
    return {
        "openapi": "3.0.3",
        "info": {"title": "metaq HTTP API", "version": __version__,
                 "description": (f"Broker {c.broker_id}. Limits as over the binary protocol: maxMessageSize="
                                 f"{c.max_message_bytes} bytes, maxBatchSize={c.max_batch_bytes} bytes, "
                                 f"maxTransferSize={c.max_transfer_bytes} bytes. Any other method on a path "
                                 "(TRACE, PUT, ...) is answered 405, any other path 404, a body over the read "
                                 "limit 413, all with the Error body. See docs/http.md.")},
        "paths": _paths(),
        "security": [{"basic": []}] if c.auth_required else [],
        "components": {"schemas": SCHEMAS,
                       "securitySchemes": {"basic": {"type": "http", "scheme": "basic",
                                                     "description": "a metaq user (metaq acl user add), over HTTPS "
                                                                    "(docs/security.md#http-authentication)"}}},
    }
