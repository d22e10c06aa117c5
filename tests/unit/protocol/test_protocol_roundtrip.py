"""Every request and response of every API survives client -> bytes -> server and back.

The instances come from the declared FIELDS (protocol_strategies.for_type), so an API or field added
to messages.py is covered here without touching this file. Bytes are delivered in random chunks, and
several frames share one stream, as they do on a socket.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from protocol_strategies import chunks, examples, instances, normalized

from metaq.errors import InvalidArgument, TooManyRequestsError
from metaq.protocol import schema
from metaq.protocol.codec import (
    NEED_DATA,
    ClientConnection,
    RequestEvent,
    ResponseEvent,
    ServerConnection,
)
from metaq.protocol.messages import APIS, FetchRequest, FetchResponse, ProduceRequest, spec_for

API_VERSIONS = [(key, version) for key, spec in sorted(APIS.items())
                for version in range(spec.min_version, spec.max_version + 1)]
API_IDS = [f"{APIS[key].name}-v{version}" for key, version in API_VERSIONS]

ROUND_TRIP = settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def drain(conn: ServerConnection | ClientConnection) -> list[Any]:
    events = []
    while (event := conn.next_event()) is not NEED_DATA:
        events.append(event)
    return events


def deliver(draw: st.DrawFn, conn: ServerConnection | ClientConnection, data: bytes) -> list[Any]:
    """Feed ``data`` in random chunks, collecting events as a socket loop would."""
    events = []
    for chunk in chunks(draw, data):
        conn.receive_data(chunk)
        events.extend(drain(conn))
    return events


def test_every_api_has_request_and_response_with_error_prefix() -> None:
    assert APIS, "no API registered"
    for key, spec in APIS.items():
        assert key == spec.key and {spec.request.API_KEY, spec.response.API_KEY} == {key}
        assert [f.name for f in spec.response.FIELDS[:2]] == ["error_code", "error_message"]
        assert spec.min_version <= spec.max_version


@pytest.mark.parametrize(("api_key", "version"), API_VERSIONS, ids=API_IDS)
@ROUND_TRIP
@given(data=st.data())
def test_round_trip(api_key: int, version: int, data: st.DataObject) -> None:
    spec = APIS[api_key]
    requests = data.draw(st.lists(instances(spec.request, version), min_size=1, max_size=3), label="requests")
    client = ClientConnection(client_id=data.draw(st.text(max_size=8), label="client_id"))
    client.set_versions({api_key: version})
    server = ServerConnection()

    sent = [client.send(r) for r in requests]
    assert client.in_flight == len(requests)
    assert len({cid for cid, _ in sent}) == len(sent)
    events = deliver(data.draw, server, b"".join(frame for _, frame in sent))

    assert len(events) == len(requests)
    for event, request, (cid, _) in zip(events, requests, sent, strict=True):
        assert isinstance(event, RequestEvent), event
        assert event.header.api_key == api_key
        assert event.header.api_version == version
        assert event.header.correlation_id == cid
        assert event.header.client_id == client.client_id
        assert type(event.request) is spec.request
        assert normalized(event.request) == normalized(request)

    responses = [data.draw(instances(spec.response, version), label="response") for _ in requests]
    frames = [server.encode_response(e.header, r) for e, r in zip(events, responses, strict=True)]
    if spec.response.FIELDS and spec.response.FIELDS[-1].type is schema.RECORDS:
        # The broker's sendfile path: the encoded head, then the stored bytes unchanged.
        for event, response, frame in zip(events, responses, frames, strict=True):
            records = bytes(getattr(response, spec.response.FIELDS[-1].name))
            assert server.encode_response_head(event.header, response, len(records)) + records == frame

    got = deliver(data.draw, client, b"".join(frames))
    assert client.in_flight == 0
    assert len(got) == len(requests)
    for event, request, response, (cid, _) in zip(got, requests, responses, sent, strict=True):
        assert isinstance(event, ResponseEvent)
        assert event.correlation_id == cid
        assert event.request is request
        assert type(event.response) is spec.response
        assert normalized(event.response) == normalized(response)


@pytest.mark.parametrize("api_key", sorted(APIS), ids=[APIS[k].name for k in sorted(APIS)])
def test_default_instances_round_trip(api_key: int) -> None:
    """The dataclass defaults (what callers usually send) are themselves encodable."""
    spec = APIS[api_key]
    client, server = ClientConnection(), ServerConnection()
    request = spec.request()
    server.receive_data(client.send(request)[1])
    event = server.next_event()
    assert isinstance(event, RequestEvent)
    assert normalized(event.request) == normalized(request)
    client.receive_data(server.encode_response(event.header, spec.response()))
    reply = client.next_event()
    assert isinstance(reply, ResponseEvent)
    assert normalized(reply.response) == normalized(spec.response())


def test_uint128_all_ones_is_the_no_id_sentinel() -> None:
    out = schema.encode(APIS[17].request(message_id=-1), 0)
    assert b"".join(out) == b"\xff" * 16
    assert schema.decode(APIS[17].request, 0, b"\xff" * 16).message_id == -1
    top = (1 << 128) - 2
    assert schema.decode(APIS[17].request, 0, b"".join(schema.encode(APIS[17].request(message_id=top), 0))
                         ).message_id == top


def test_string_length_limit() -> None:
    client, server = ClientConnection(), ServerConnection()
    longest = "x" * 0x7FFF
    server.receive_data(client.send(FetchRequest(topic=longest))[1])
    event = server.next_event()
    assert isinstance(event, RequestEvent) and event.request.topic == longest
    # Local misuse: refused before anything is sent, and nothing is left in flight.
    with pytest.raises(InvalidArgument):
        client.send(FetchRequest(topic="é" * 0x4000))  # 32768 bytes encoded
    assert client.in_flight == 1


def test_unencodable_values_are_local_errors() -> None:
    client = ClientConnection()
    for bad in (FetchRequest(partition=1 << 31), FetchRequest(topic=None),  # type: ignore[arg-type]
                FetchRequest(offset="0")):  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):
            client.send(bad)
    assert client.in_flight == 0
    server = ServerConnection()
    server.receive_data(client.send(FetchRequest())[1])
    event = server.next_event()
    assert isinstance(event, RequestEvent)
    with pytest.raises(InvalidArgument):
        server.encode_response(event.header, FetchResponse(log_end_offset=1 << 63))
    with pytest.raises(InvalidArgument):
        server.encode_response_head(event.header, FetchResponse(log_end_offset=1 << 63), 0)


def test_one_way_send_leaves_nothing_in_flight() -> None:
    client, server = ClientConnection(), ServerConnection()
    cid0, one_way = client.send(ProduceRequest(acks=0), expect_response=False)
    cid1, normal = client.send(FetchRequest())
    assert client.in_flight == 1 and cid1 != cid0
    server.receive_data(one_way + normal)
    produce, fetch = drain(server)
    assert isinstance(produce, RequestEvent) and produce.request.acks == 0
    assert isinstance(fetch, RequestEvent)
    client.receive_data(server.encode_response(fetch.header, FetchResponse(records=b"abc")))
    (reply,) = drain(client)
    assert reply.correlation_id == cid1 and bytes(reply.response.records) == b"abc"
    assert client.pending_requests() == []


def test_in_flight_limit_and_pending_requests() -> None:
    client = ClientConnection(max_in_flight=2)
    first, second = FetchRequest(offset=1), FetchRequest(offset=2)
    c1, _ = client.send(first)
    c2, _ = client.send(second)
    with pytest.raises(TooManyRequestsError):
        client.send(FetchRequest())
    assert client.pending_requests() == [(c1, first), (c2, second)]
    client.clear()
    assert client.in_flight == 0
    client.send(FetchRequest())


def test_correlation_ids_stay_positive_when_they_wrap() -> None:
    client = ClientConnection()
    client._next_correlation_id = 0x7FFFFFFF  # white-box: skip two billion sends
    assert client.send(FetchRequest(), expect_response=False)[0] == 0x7FFFFFFF
    assert client.send(FetchRequest(), expect_response=False)[0] == 1


def test_frame_size_limit_on_send() -> None:
    client = ClientConnection(max_frame_bytes=100)
    with pytest.raises(InvalidArgument):
        client.send(ProduceRequest(records=b"x" * 100))
    assert client.in_flight == 0
    server = ServerConnection(max_frame_bytes=100)
    server.receive_data(ClientConnection().send(FetchRequest())[1])
    event = server.next_event()
    assert isinstance(event, RequestEvent)
    with pytest.raises(InvalidArgument):
        server.encode_response(event.header, FetchResponse(records=b"x" * 100))
    with pytest.raises(InvalidArgument):
        server.encode_response_head(event.header, FetchResponse(), 100)


def test_version_negotiation_is_per_api() -> None:
    client = ClientConnection()
    assert all(client.version_for(k) == spec.max_version for k, spec in APIS.items())
    client.set_versions({5: 0})
    assert client.version_for(5) == 0
    assert spec_for(FetchRequest).key == 5 and spec_for(FetchRequest()).name == "Fetch"



def test_client_id_length_limit() -> None:
    with pytest.raises(InvalidArgument):
        ClientConnection(client_id="x" * 0x8000)
    ClientConnection(client_id="x" * 0x7FFF)
