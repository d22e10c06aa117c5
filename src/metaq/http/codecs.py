"""JSON in and out: what a produce body may hold, and how fetched messages are written.

A message in a produce body (``encoding`` applies to its payload, key and header values)::

    {"payload": "hello", "encoding": "text" | "base64", "key": "k", "attribute": "tag",
     "headers": {"name": "value"} | [["name", "value"], ...], "timestamp_ms": 1700000000000}

A body is one such object, or ``{"messages": [...], "encoding": ...}`` (a batch: one record batch, one
append, one partition). A fetched message is written the same way, with ``offset``, ``id`` (32 hex
digits), ``partition``, ``timestamp_ms`` and ``append_time_ms`` added; under ``format=text`` a message
whose bytes are not all UTF-8 is written with ``"encoding": "base64"`` (every bytes field of it), so no
byte is ever lost to a replacement character.

Everything here is pure (no IO): the routes feed it parsed JSON and bytes.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from metaq.http.errors import HttpInputError
from metaq.types import Message, format_message_id

ENCODINGS = ("text", "base64")
MESSAGES_PER_REQUEST_MAX = 100_000
"""Messages in one produce body (the batch must also fit maxBatchSize, as over the binary protocol)."""
HEADER_PREFIX = "X-Metaq-Header-"
"""Raw produce: each ``X-Metaq-Header-<name>: <value>`` HTTP header becomes a message header."""


@dataclass(slots=True)
class OutgoingMessage:
    """One message of a produce request, decoded from JSON or a raw body."""

    payload: bytes
    key: bytes | None = None
    attribute: str | None = None
    headers: list[tuple[str, bytes]] | None = None
    timestamp_ms: int = -1
    deliver_at: int | None = None
    """Delayed delivery (docs/delayed.md): ms since the epoch; from ``deliver_at`` or ``delay_ms`` in JSON."""


def _decode(value: Any, encoding: str, field: str) -> bytes:
    if not isinstance(value, str):
        raise HttpInputError(f"{field} must be a string ({encoding}), not {_json_type(value)}")
    if encoding == "text":
        try:
            return value.encode()
        except UnicodeEncodeError:
            raise HttpInputError(f"{field} holds a lone surrogate, which is not UTF-8 text; "
                                 "send it with encoding base64") from None
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise HttpInputError(f"{field} is not valid base64") from None


def _json_type(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def _encoding(value: Any, default: str, where: str) -> str:
    if value is None:
        return default
    if value not in ENCODINGS:
        raise HttpInputError(f"{where}encoding must be 'text' or 'base64', not {value!r}")
    return str(value)


def _headers(value: Any, encoding: str, where: str) -> list[tuple[str, bytes]] | None:
    if value is None:
        return None
    if isinstance(value, Mapping):
        pairs = list(value.items())
    elif isinstance(value, list):
        pairs = []
        for item in value:
            if not isinstance(item, list) or len(item) != 2:
                raise HttpInputError(f"{where}headers must be an object or a list of [name, value] pairs")
            pairs.append((item[0], item[1]))
    else:
        raise HttpInputError(f"{where}headers must be an object or a list of [name, value] pairs, "
                             f"not {_json_type(value)}")
    out = []
    for name, hvalue in pairs:
        if not isinstance(name, str) or not name:
            raise HttpInputError(f"{where}header names must be non-empty strings")
        out.append((name, _decode(hvalue, encoding, f"{where}header {name!r}")))
    return out


def _int_field(value: Any, field: str, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise HttpInputError(f"{field} must be an integer >= {minimum}, not {value!r}")
    return value


def message_from_json(obj: Any, default_encoding: str, where: str = "") -> OutgoingMessage:
    if not isinstance(obj, Mapping):
        raise HttpInputError(f"{where or 'the body'} must be a JSON object, not {_json_type(obj)}")
    unknown = set(obj) - {"payload", "encoding", "key", "attribute", "headers", "timestamp_ms", "deliver_at",
                          "delay_ms"}
    if unknown:
        raise HttpInputError(f"{where}unknown field(s) {', '.join(sorted(unknown))}; a message has payload, "
                             "encoding, key, attribute, headers, timestamp_ms, deliver_at, delay_ms")
    if obj.get("deliver_at") is not None and obj.get("delay_ms") is not None:
        raise HttpInputError(f"{where}give deliver_at or delay_ms, not both")
    deliver_at = None
    if obj.get("deliver_at") is not None:
        deliver_at = _int_field(obj["deliver_at"], f"{where}deliver_at", 0)
    elif obj.get("delay_ms") is not None:
        deliver_at = int(time.time() * 1000) + _int_field(obj["delay_ms"], f"{where}delay_ms", 0)
    if "payload" not in obj:
        raise HttpInputError(f"{where}payload is missing")
    encoding = _encoding(obj.get("encoding"), default_encoding, where)
    key = obj.get("key")
    attribute = obj.get("attribute")
    if attribute is not None and not isinstance(attribute, str):
        raise HttpInputError(f"{where}attribute must be a string, not {_json_type(attribute)}")
    timestamp = obj.get("timestamp_ms")
    return OutgoingMessage(
        payload=_decode(obj["payload"], encoding, f"{where}payload"),
        key=_decode(key, encoding, f"{where}key") if key is not None else None,
        attribute=attribute,
        headers=_headers(obj.get("headers"), encoding, where),
        timestamp_ms=_int_field(timestamp, f"{where}timestamp_ms", 0) if timestamp is not None else -1,
        deliver_at=deliver_at,
    )


def messages_from_json(body: Any) -> tuple[list[OutgoingMessage], int | None]:
    """The messages of a JSON produce body, and its ``partition`` if it names one."""
    if not isinstance(body, Mapping):
        raise HttpInputError(f"the body must be a JSON object (a message, or {{\"messages\": [...]}}), "
                             f"not {_json_type(body)}")
    partition = body.get("partition")
    if partition is not None:
        partition = _int_field(partition, "partition", -1)
    if "messages" not in body:
        single = {k: v for k, v in body.items() if k != "partition"}
        return [message_from_json(single, "text")], partition
    unknown = set(body) - {"messages", "encoding", "partition"}
    if unknown:
        raise HttpInputError(f"unknown field(s) {', '.join(sorted(unknown))} beside messages; a batch has messages, "
                             "encoding, partition")
    items = body["messages"]
    if not isinstance(items, list) or not items:
        raise HttpInputError("messages must be a non-empty array")
    if len(items) > MESSAGES_PER_REQUEST_MAX:
        raise HttpInputError(f"{len(items)} messages in one request; at most {MESSAGES_PER_REQUEST_MAX}", 413)
    encoding = _encoding(body.get("encoding"), "text", "")
    return [message_from_json(item, encoding, f"messages[{i}].") for i, item in enumerate(items)], partition


def message_from_raw(payload: bytes, query: Mapping[str, str], headers: Mapping[str, str]) -> OutgoingMessage:
    """A raw (application/octet-stream) body: key and attribute from the query or X-Metaq-Key /
    X-Metaq-Attribute, message headers from X-Metaq-Header-<name> (values as UTF-8 text)."""
    key = query.get("key", headers.get("X-Metaq-Key"))
    attribute = query.get("attribute", headers.get("X-Metaq-Attribute"))
    out = [(name[len(HEADER_PREFIX):], value.encode()) for name, value in headers.items()
           if name.lower().startswith(HEADER_PREFIX.lower()) and len(name) > len(HEADER_PREFIX)]
    return OutgoingMessage(payload=payload, key=key.encode() if key is not None else None, attribute=attribute,
                           headers=out or None)


def _text(data: bytes) -> str | None:
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


def message_to_json(msg: Message, fmt: str) -> dict[str, Any]:
    """A fetched message as JSON (``fmt``: 'text' or 'base64'; see the module docstring)."""
    fields: list[bytes] = [msg.data]
    if msg.key is not None:
        fields.append(msg.key)
    if msg.headers:
        fields.extend(v for _, v in msg.headers)
    encoding = fmt
    if fmt == "text" and any(_text(f) is None for f in fields):
        encoding = "base64"

    def enc(data: bytes) -> str:
        return data.decode() if encoding == "text" else base64.b64encode(data).decode()

    out: dict[str, Any] = {"offset": msg.offset, "id": format_message_id(msg.id), "partition": msg.partition,
                           "timestamp_ms": msg.timestamp_ms, "append_time_ms": msg.append_time_ms,
                           "encoding": encoding, "payload": enc(bytes(msg.data))}
    if msg.key is not None:
        out["key"] = enc(msg.key)
    if msg.attribute is not None:
        out["attribute"] = msg.attribute
    if msg.headers:
        out["headers"] = [[name, enc(value)] for name, value in msg.headers]
    return out
