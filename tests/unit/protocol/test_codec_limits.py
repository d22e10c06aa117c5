"""The codec's hooks for a broker's limits: peeking a header, counting and dropping an unfinished frame."""

from __future__ import annotations

import pytest

from metaq.errors import ProtocolError
from metaq.protocol import messages as m
from metaq.protocol.codec import NEED_DATA, ClientConnection, RequestEvent, ServerConnection
from metaq.protocol.records import encode_values


def _produce_frame(client: ClientConnection, size: int) -> bytes:
    return client.send(m.ProduceRequest("t", 0, 1, 5000, encode_values([b"x" * size], 1)))[1]


def test_peek_header_needs_only_the_fixed_part_and_consumes_nothing() -> None:
    client, server = ClientConnection("cid"), ServerConnection()
    frame = client.send(m.MetadataRequest(None))[1]
    server.receive_data(frame[:11])
    assert server.peek_header() is None
    server.receive_data(frame[11:12])
    header = server.peek_header()
    assert header is not None
    assert (header.api_key, header.api_version, header.correlation_id) == (1, m.APIS[1].max_version, 1)
    server.receive_data(frame[12:])
    event = server.next_event()
    assert isinstance(event, RequestEvent) and event.header.client_id == "cid"


def test_peek_header_refuses_what_next_event_would() -> None:
    server = ServerConnection(max_frame_bytes=1024)
    server.receive_data(b"\x00\x10\x00\x00" + b"\x00" * 8)
    with pytest.raises(ProtocolError, match="larger than the limit"):
        server.peek_header()
    short = ServerConnection()
    short.receive_data(b"\x00\x00\x00\x09" + b"\x00" * 8)
    with pytest.raises(ProtocolError, match="shorter than a request header"):
        short.peek_header()


def test_partial_frame_bytes_count_only_the_unfinished_frame() -> None:
    client, server = ClientConnection(), ServerConnection()
    whole = client.send(m.ApiVersionsRequest())[1]
    big = _produce_frame(client, 100_000)
    server.receive_data(whole + big[:50_000])
    assert isinstance(server.next_event(), RequestEvent)
    assert server.next_event() is NEED_DATA
    assert server.partial_frame_bytes == 50_000 - 4
    server.receive_data(big[50_000:])
    assert isinstance(server.next_event(), RequestEvent)
    assert server.next_event() is NEED_DATA and server.partial_frame_bytes == 0


@pytest.mark.parametrize("cut", [20, 3_000, 60_000, 99_000])
def test_a_discarded_frame_is_skipped_as_it_arrives_and_the_stream_stays_in_sync(cut: int) -> None:
    client, server = ClientConnection("c"), ServerConnection()
    big = _produce_frame(client, 100_000)
    after = client.send(m.MetadataRequest(["t"]))[1]
    server.receive_data(big[:cut])
    assert server.next_event() is NEED_DATA
    dropped = server.discard_partial_frame()
    assert dropped is not None
    header, body_head = dropped
    assert (header.api_key, header.correlation_id, header.client_id) == (4, 1, "c")
    assert body_head.startswith(b"\x00\x01t")  # the request's leading fields, to decide how to answer
    assert server.partial_frame_bytes == 0
    rest = big[cut:] + after
    for i in range(0, len(rest), 7_777):  # the rest of the dropped frame arrives in pieces
        server.receive_data(rest[i:i + 7_777])
    event = server.next_event()
    assert isinstance(event, RequestEvent) and event.request == m.MetadataRequest(["t"])
    assert event.header.correlation_id == 2


def test_a_frame_dropped_before_its_header_arrived_cannot_be_answered() -> None:
    client, server = ClientConnection(), ServerConnection()
    server.receive_data(_produce_frame(client, 10)[:9])
    assert server.next_event() is NEED_DATA
    assert server.discard_partial_frame() is None
