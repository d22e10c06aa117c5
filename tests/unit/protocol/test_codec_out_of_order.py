"""MultiFetch replies may overtake other replies on a connection; every other reply keeps request order."""

from __future__ import annotations

import pytest

from metaq.errors import ProtocolError
from metaq.protocol import messages as m
from metaq.protocol.codec import NEED_DATA, ClientConnection, RequestHeader, ResponseEvent, ServerConnection


def _serve(requests: bytes) -> tuple[ServerConnection, list]:
    server = ServerConnection()
    server.receive_data(requests)
    events = []
    while (event := server.next_event()) is not NEED_DATA:
        events.append(event)
    return server, events


def test_a_multi_fetch_reply_overtakes_and_is_overtaken_by_ordered_replies() -> None:
    client = ClientConnection()
    frames = [client.send(m.MultiFetchRequest(5000, 1, 1 << 20, "", [m.FetchPartition("t", 0, 0, 100)]))[1],
              client.send(m.MetadataRequest(["t"]))[1],
              client.send(m.MultiFetchRequest(0, 1, 1 << 20, "", [m.FetchPartition("t", 1, 7, 100)]))[1],
              client.send(m.HeartbeatRequest("g", 1, "member"))[1]]
    server, events = _serve(b"".join(frames))
    long_poll, metadata, quick, heartbeat = events
    # the broker answers: the quick MultiFetch, the metadata, the heartbeat, and last the long poll
    records = b"\x00stored bytes\xff"
    replies = [
        server.encode_response(quick.header, m.MultiFetchResponse(partitions=[
            m.FetchedPartition("t", 1, log_start_offset=0, log_end_offset=9, records=records)])),
        server.encode_response(metadata.header, m.MetadataResponse()),
        server.encode_response(heartbeat.header, m.HeartbeatResponse()),
        server.encode_response(long_poll.header, m.MultiFetchResponse(partitions=[m.FetchedPartition("t", 0)])),
    ]
    client.receive_data(b"".join(replies))
    got = []
    while (event := client.next_event()) is not NEED_DATA:
        assert isinstance(event, ResponseEvent)
        got.append((event.correlation_id, type(event.response).__name__))
    assert got == [(3, "MultiFetchResponse"), (2, "MetadataResponse"), (4, "HeartbeatResponse"),
                   (1, "MultiFetchResponse")]
    assert client.in_flight == 0


def test_ordered_replies_out_of_order_are_still_a_broken_stream() -> None:
    client = ClientConnection()
    frames = [client.send(m.MetadataRequest(None))[1], client.send(m.HeartbeatRequest("g", 1, "x"))[1],
              client.send(m.MultiFetchRequest(0, 1, 1, "", [m.FetchPartition("t", 0, 0, 1)]))[1]]
    server, (_metadata, heartbeat, _multi) = _serve(b"".join(frames))
    client.receive_data(server.encode_response(heartbeat.header, m.HeartbeatResponse()))
    with pytest.raises(ProtocolError, match="expected 1"):
        client.next_event()


def test_a_reply_with_an_unknown_correlation_id_is_a_broken_stream() -> None:
    client = ClientConnection()
    client.send(m.MultiFetchRequest(0, 1, 1, "", [m.FetchPartition("t", 0, 0, 1)]))
    server, _ = _serve(b"")
    client.receive_data(server.encode_response(RequestHeader(23, 0, 99, ""), m.MultiFetchResponse()))
    with pytest.raises(ProtocolError, match=r"expected|no request"):
        client.next_event()
    assert [cid for cid, _ in client.pending_requests()] == [1]


def test_multi_fetch_round_trip_keeps_every_partitions_records() -> None:
    client = ClientConnection()
    req = m.MultiFetchRequest(250, 10, 1 << 22, "billing", [m.FetchPartition(f"t{i}", i, i * 10, 1000 + i)
                                                            for i in range(300)])
    server, (event,) = _serve(client.send(req)[1])
    assert event.request == req
    resp = m.MultiFetchResponse(partitions=[m.FetchedPartition(f"t{i}", i, 0, None, 0, i, -1, -1, -1, -1,
                                                               bytes([i % 256]) * i) for i in range(300)])
    client.receive_data(server.encode_response(event.header, resp))
    got = client.next_event()
    assert isinstance(got, ResponseEvent)
    assert [bytes(p.records) for p in got.response.partitions] == [bytes([i % 256]) * i for i in range(300)]
    assert [(p.topic, p.partition, p.log_end_offset) for p in got.response.partitions] == \
        [(f"t{i}", i, i) for i in range(300)]
