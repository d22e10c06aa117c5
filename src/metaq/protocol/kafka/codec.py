"""The Kafka wire protocol, sans-IO: frames in, typed requests out, typed responses back to bytes.

A Kafka request frame::

    size            int32   bytes after this field
    api_key         int16
    api_version     int16
    correlation_id  int32
    client_id       nullable string (int16 length)
    [tagged fields]         header v2, for the "flexible" versions of an API
    body                    the API's request schema at that version

and a response frame is ``size, correlation_id, [tagged fields], body`` (the tagged fields for flexible
versions, except ApiVersions, whose response header never has them so that a client can read the
answer to a version it guessed too high).

The schemas are the classes of `kio <https://pypi.org/project/kio/>`_, generated from the message
specifications in Apache Kafka's source (``clients/src/main/resources/common/message/*.json``): one
frozen dataclass per API and version, read and written by its reader and writer. :data:`SERVED` is
the table of what the listener answers (API key -> versions); everything else is answered with an
error response of the API asked (UNSUPPORTED_VERSION), never by closing the connection.

:class:`KafkaServerConnection` is the state machine (after h11): ``receive_data`` buffers,
``next_event`` returns a :class:`KafkaRequest`, an :class:`UnsupportedRequest` or :data:`NEED_DATA`,
``encode_response`` gives the bytes of an answer.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import io
import struct
import types
import typing
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kio.index import load_payload_module
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

from metaq.errors import ProtocolError

NEED_DATA = object()
"""What :meth:`KafkaServerConnection.next_event` returns while no whole frame is buffered."""

UNSUPPORTED_VERSION = 35

SERVED: Mapping[int, tuple[str, int, int]] = {
    0: ("Produce", 3, 9),
    1: ("Fetch", 4, 12),
    2: ("ListOffsets", 1, 6),
    3: ("Metadata", 0, 8),
    8: ("OffsetCommit", 2, 8),
    9: ("OffsetFetch", 1, 7),
    10: ("FindCoordinator", 0, 3),
    11: ("JoinGroup", 0, 7),
    12: ("Heartbeat", 0, 4),
    13: ("LeaveGroup", 0, 4),
    14: ("SyncGroup", 0, 5),
    15: ("DescribeGroups", 0, 5),
    16: ("ListGroups", 0, 4),
    17: ("SaslHandshake", 1, 1),
    18: ("ApiVersions", 0, 3),
    19: ("CreateTopics", 2, 5),
    20: ("DeleteTopics", 1, 5),
    22: ("InitProducerId", 0, 4),
    32: ("DescribeConfigs", 1, 4),
    36: ("SaslAuthenticate", 0, 2),
}
"""API key -> (name, lowest version, highest version) this listener answers (docs/kafka.md has the table
and why each range stops where it does)."""

API_VERSIONS = 18
_HEAD = struct.Struct(">hhih")
_SIZE = struct.Struct(">i")
_CORRELATION = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


@dataclass(frozen=True, slots=True)
class KafkaRequest:
    """A decoded request: its header and its body (a kio request dataclass of that API and version)."""

    header: RequestHeader
    body: Any


@dataclass(frozen=True, slots=True)
class UnsupportedRequest:
    """A whole frame of an API or version not in :data:`SERVED` (or whose body did not decode): answered
    with :func:`error_body` of it, the connection kept."""

    header: RequestHeader
    reason: str


def request_class(api_key: int, version: int) -> Any:
    return _schema(api_key, version, EntityType.request)


def response_class(api_key: int, version: int) -> Any:
    return _schema(api_key, version, EntityType.response)


_SCHEMAS: dict[tuple[int, int, EntityType], Any] = {}


def _schema(api_key: int, version: int, kind: EntityType) -> Any:
    key = (api_key, version, kind)
    cls = _SCHEMAS.get(key)
    if cls is None:
        module = load_payload_module(api_key, version, kind)  # type: ignore[arg-type]
        name = {EntityType.request: "Request", EntityType.response: "Response"}[kind]
        cls = next(v for k, v in vars(module).items()
                   if k.endswith(name) and isinstance(v, type) and getattr(v, "__type__", None) is kind)
        _SCHEMAS[key] = cls
    return cls


def _readers_for(api_key: int, version: int) -> Any:
    return entity_reader(request_class(api_key, version))


class KafkaServerConnection:
    """One client connection's bytes: requests out of the stream, responses into it."""

    def __init__(self, max_frame_bytes: int) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()

    def receive_data(self, data: bytes) -> None:
        self._buf += data

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf)

    def next_event(self) -> KafkaRequest | UnsupportedRequest | object:
        """The next whole request, or NEED_DATA. ProtocolError for a frame that cannot be a Kafka request
        (a negative or oversized length, a header cut short): the connection must be closed."""
        buf = self._buf
        if len(buf) < 4:
            return NEED_DATA
        (size,) = _SIZE.unpack_from(buf, 0)
        if size < 8 or size > self.max_frame_bytes:
            raise ProtocolError(f"Kafka request frame of {size} bytes (at most {self.max_frame_bytes}; at least 8)")
        if len(buf) < 4 + size:
            return NEED_DATA
        frame = bytes(buf[4:4 + size])
        del buf[:4 + size]
        return decode_request(frame)


def decode_request(frame: bytes) -> KafkaRequest | UnsupportedRequest:
    """A request from one frame (without its size prefix)."""
    if len(frame) < 10:
        raise ProtocolError("Kafka request header is cut short")
    api_key, version, correlation_id, client_len = _HEAD.unpack_from(frame, 0)
    pos = 10
    client_id = None
    if client_len >= 0:
        client_id = frame[pos:pos + client_len].decode("utf-8", "replace")
        pos += client_len
    header = RequestHeader(api_key, version, correlation_id, client_id)
    served = SERVED.get(api_key)
    if served is None:
        return UnsupportedRequest(header, f"API key {api_key} is not served by metaq's Kafka listener")
    name, low, high = served
    if not low <= version <= high:
        return UnsupportedRequest(header, f"{name} v{version} is not served (versions {low}-{high})")
    cls = request_class(api_key, version)
    try:
        if cls.__flexible__:
            pos = _skip_tagged_fields(frame, pos)
        body, used = entity_reader(cls)(frame, pos)
    except Exception as exc:  # the reader's own errors: a malformed body
        return UnsupportedRequest(header, f"{name} v{version} request body does not decode: {exc}")
    if pos + used != len(frame):
        return UnsupportedRequest(header, f"{name} v{version} request has {len(frame) - pos - used} bytes "
                                          "after its body")
    return KafkaRequest(header, body)


def _read_uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    result, shift = 0, 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 35:
            raise ProtocolError("unsigned varint longer than 5 bytes in a request header")


def _skip_tagged_fields(buf: bytes, pos: int) -> int:
    count, pos = _read_uvarint(buf, pos)
    for _ in range(count):
        _tag, pos = _read_uvarint(buf, pos)
        size, pos = _read_uvarint(buf, pos)
        pos += size
    if pos > len(buf):
        raise ProtocolError("tagged fields of a request header run past the frame")
    return pos


def encode_response(header: RequestHeader, body: Any) -> bytes:
    """The frame answering ``header`` with ``body`` (a kio response dataclass of the request's API and
    version)."""
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    out.write(_CORRELATION.pack(header.correlation_id))
    if type(body).__flexible__ and header.api_key != API_VERSIONS:
        out.write(b"\0")  # no tagged fields in the response header
    entity_writer(type(body))(out, body)
    size = out.tell() - 4
    out.seek(0)
    out.write(_SIZE.pack(size))
    return out.getvalue()


def encode_unsupported(header: RequestHeader, body: Any | None) -> bytes:
    """The frame answering an :class:`UnsupportedRequest`: its API's response with UNSUPPORTED_VERSION where
    there is a schema for it, else just the error code (what a client of an API unknown here can read)."""
    if body is not None:
        return encode_response(header, body)
    return _SIZE.pack(6) + _CORRELATION.pack(header.correlation_id) + struct.pack(">h", UNSUPPORTED_VERSION)


# -- building responses ------------------------------------------------------------------------------


def error_code(code: int) -> ErrorCode:
    try:
        return ErrorCode(code)
    except ValueError:
        return ErrorCode.unknown_server_error


def build(cls: Any, values: Mapping[str, Any]) -> Any:
    """An instance of kio dataclass ``cls`` from plain values: the fields this version of the schema has are
    taken from ``values`` (the others ignored), missing ones get their schema default or a zero value;
    nested entities are built from dicts, error codes from ints, durations from milliseconds. So one dict
    serves every version of a response."""
    kwargs: dict[str, Any] = {}
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in values:
            kwargs[f.name] = _convert(hints[f.name], values[f.name])
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kwargs[f.name] = _zero(hints[f.name])
    return cls(**kwargs)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


def _optional_inner(tp: Any) -> tuple[Any, bool]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _convert(tp: Any, value: Any) -> Any:
    inner, optional = _optional_inner(tp)
    if value is None:
        return None if optional else _zero(inner)
    if typing.get_origin(inner) is tuple:
        item = typing.get_args(inner)[0]
        if isinstance(item, type) and dataclasses.is_dataclass(item):
            return tuple(v if isinstance(v, item) else build(item, v) for v in value)
        return tuple(_convert(item, v) for v in value)
    if isinstance(inner, type):
        if issubclass(inner, ErrorCode):
            return value if isinstance(value, ErrorCode) else error_code(int(value))
        if issubclass(inner, datetime.timedelta):
            return value if isinstance(value, datetime.timedelta) else datetime.timedelta(milliseconds=value)
        if dataclasses.is_dataclass(inner):
            return value if isinstance(value, inner) else build(inner, value)
        if issubclass(inner, datetime.datetime):
            return value
    return value


def _zero(tp: Any) -> Any:
    inner, optional = _optional_inner(tp)
    if optional:
        return None
    if typing.get_origin(inner) is tuple:
        return ()
    if isinstance(inner, type):
        if issubclass(inner, ErrorCode):
            return ErrorCode.none
        if issubclass(inner, datetime.timedelta):
            return datetime.timedelta(0)
        if issubclass(inner, bool):
            return False
        if issubclass(inner, int):
            return 0
        if issubclass(inner, str):
            return ""
        if issubclass(inner, bytes):
            return b""
        if issubclass(inner, uuid.UUID):
            return uuid.UUID(int=0)
        if issubclass(inner, enum.Enum):
            return next(iter(inner))
        if dataclasses.is_dataclass(inner):
            return build(inner, {})
    raise TypeError(f"no zero value for {tp!r}")


def error_body(header: RequestHeader, code: int) -> Any | None:
    """The response of ``header``'s API and version with ``code`` as its top-level error (every error_code
    field there is; arrays empty), or None when kio has no schema of it. ApiVersions of an unsupported
    version is answered in version 0, with the versions this listener serves (Kafka's rule)."""
    if header.api_key == API_VERSIONS:
        return api_versions_body(0, code)
    try:
        cls = response_class(header.api_key, header.api_version)
    except Exception:
        return None
    values: dict[str, Any] = {"error_code": code}
    return build(cls, values)


def api_versions_body(version: int, code: int = 0) -> Any:
    cls = response_class(API_VERSIONS, version)
    return build(cls, {"error_code": code, "api_keys": [
        {"api_key": key, "min_version": low, "max_version": high} for key, (_n, low, high) in sorted(SERVED.items())]})
