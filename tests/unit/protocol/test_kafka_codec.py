"""The Kafka codec (metaq.protocol.kafka.codec): every served API and version has a request reader and a
response that builds and encodes from plain values (so one handler serves all versions); flexible versions
carry tagged fields in the request header and ApiVersions never in its response header; what is not
served comes back as an UnsupportedRequest answered with UNSUPPORTED_VERSION; random frames raise only
ProtocolError."""

from __future__ import annotations

import io
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.serial import entity_reader, entity_writer

from metaq.errors import ProtocolError
from metaq.protocol.kafka import codec, consumer


def frame(api_key: int, version: int, correlation: int, body: bytes, *, flexible: bool = False) -> bytes:
    head = struct.pack(">hhih", api_key, version, correlation, 4) + b"test" + (b"\0" if flexible else b"")
    return head + body


@pytest.mark.parametrize(("api_key", "version"), [(k, v) for k, (_n, lo, hi) in codec.SERVED.items()
                                                  for v in range(lo, hi + 1)])
def test_every_served_version_decodes_its_request_and_builds_its_response(api_key: int, version: int) -> None:
    req_cls = codec.request_class(api_key, version)
    request = codec.build(req_cls, {})
    buf = io.BytesIO()
    entity_writer(req_cls)(buf, request)
    event = codec.decode_request(frame(api_key, version, 9, buf.getvalue(), flexible=req_cls.__flexible__))
    assert isinstance(event, codec.KafkaRequest), event
    assert event.body == request and event.header.correlation_id == 9
    response = codec.build(codec.response_class(api_key, version), {"error_code": 0, "throttle_time": 5})
    out = codec.encode_response(event.header, response)
    (size, correlation) = struct.unpack_from(">ii", out)
    assert size == len(out) - 4 and correlation == 9
    tagged = response.__flexible__ and api_key != codec.API_VERSIONS
    decoded, used = entity_reader(type(response))(out, 9 if tagged else 8)
    assert decoded == response and 8 + tagged + used == len(out)


def test_api_versions_lists_what_is_served() -> None:
    body = codec.api_versions_body(3)
    assert {(k.api_key, k.min_version, k.max_version) for k in body.api_keys} == {
        (k, lo, hi) for k, (_n, lo, hi) in codec.SERVED.items()}


def test_unserved_versions_and_apis_are_unsupported_requests_not_errors() -> None:
    event = codec.decode_request(frame(0, 2, 1, b""))  # Produce v2: before record batches v2
    assert isinstance(event, codec.UnsupportedRequest) and "versions 3-9" in event.reason
    body = codec.error_body(event.header, codec.UNSUPPORTED_VERSION)
    assert body is None  # no schema of Produce v2 in kio: the bare error is sent
    assert codec.encode_unsupported(event.header, body) == struct.pack(">iih", 6, 1, 35)
    event = codec.decode_request(frame(26, 3, 2, b""))  # EndTxn: a schema exists, answered with it
    assert isinstance(event, codec.UnsupportedRequest)
    answer = codec.error_body(event.header, codec.UNSUPPORTED_VERSION)
    assert answer is not None and answer.error_code.value == 35
    event = codec.decode_request(frame(18, 9, 3, b""))  # ApiVersions too new: v0 answer, with the list
    answer = codec.error_body(event.header, codec.UNSUPPORTED_VERSION)
    assert answer.error_code.value == 35 and len(answer.api_keys) == len(codec.SERVED)


def test_a_frame_is_only_taken_whole_and_oversized_frames_are_refused() -> None:
    conn = codec.KafkaServerConnection(1024)
    req = frame(18, 0, 5, b"")
    data = struct.pack(">i", len(req)) + req
    for b in data[:-1]:
        conn.receive_data(bytes([b]))
        assert conn.next_event() is codec.NEED_DATA
    conn.receive_data(data[-1:])
    event = conn.next_event()
    assert isinstance(event, codec.KafkaRequest) and event.header.correlation_id == 5
    conn.receive_data(struct.pack(">i", 4096))
    with pytest.raises(ProtocolError, match="at most 1024"):
        conn.next_event()


@settings(max_examples=500, deadline=None)
@given(st.integers(0, 40), st.integers(0, 13), st.binary(max_size=120))
def test_random_bodies_are_unsupported_requests_never_exceptions(api_key: int, version: int, body: bytes) -> None:
    try:
        event = codec.decode_request(frame(api_key, version, 1, body))
    except ProtocolError:
        return
    assert isinstance(event, (codec.KafkaRequest, codec.UnsupportedRequest))


def test_consumer_protocol_subscription_and_assignment() -> None:
    assert consumer.subscription_topics(consumer.encode_subscription(["a", "b"])) == ["a", "b"]
    # version 1 (owned partitions after user data) is read past
    v1 = struct.pack(">hi", 1, 1) + struct.pack(">h", 1) + b"t" + struct.pack(">i", -1) + struct.pack(">i", 0)
    assert consumer.subscription_topics(v1) == ["t"]
    assert consumer.decode_assignment(consumer.encode_assignment({"t": [2, 0], "u": []})) == {"t": [0, 2], "u": []}
    with pytest.raises(ProtocolError):
        consumer.subscription_topics(b"\x00")
