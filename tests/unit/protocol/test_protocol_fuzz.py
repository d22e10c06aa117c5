"""Garbage in, ProtocolError out: the decoders never raise anything else, never hang, never over-allocate.

The inputs are random bytes and valid frames or batches with mutations (bit flips, cuts, inserted and
deleted bytes, boundary integers written over length fields, huge frame length prefixes). Record
batches are also mutated with the CRC recomputed, so the record walk itself is exercised and not
only the checksum.
"""

from __future__ import annotations

import struct
import tracemalloc
from datetime import timedelta
from typing import Any

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from protocol_strategies import chunks, examples, instances, messages

from metaq.errors import (
    CorruptRecordError,
    InvalidArgument,
    InvalidRequestError,
    ProtocolError,
    UnsupportedVersionError,
)
from metaq.protocol import schema
from metaq.protocol.codec import (
    NEED_DATA,
    BadRequest,
    ClientConnection,
    FrameBuffer,
    RequestEvent,
    RequestHeader,
    ResponseEvent,
    ServerConnection,
    encode_request_header,
)
from metaq.protocol.messages import (
    APIS,
    REPLIES_OUT_OF_ORDER,
    FetchRequest,
    FetchResponse,
    HeartbeatRequest,
    error_response,
)
from metaq.protocol.records import (
    STAMPED_BYTES,
    Compression,
    decode_batch,
    decode_fetched,
    encode_messages,
    iter_batches,
    read_header,
    stamp,
    validate_batch,
)

MAX_FRAME = 4096
FUZZ = settings(max_examples=examples(300), deadline=timedelta(seconds=2),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

BOUNDARY_INTS = [0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF,
                 MAX_FRAME, MAX_FRAME + 1, (1 << 63) - 1, (1 << 64) - 1]


@st.composite
def mutated(draw: st.DrawFn, data: bytes) -> bytes:
    """``data`` with one to four random edits."""
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 4), label="edits")):
        op = draw(st.sampled_from(["flip", "cut", "insert", "delete", "int", "huge_prefix"]), label="op")
        pos = draw(st.integers(0, len(buf)), label="pos")
        if op == "flip" and buf:
            bit = draw(st.integers(0, len(buf) * 8 - 1), label="bit")
            buf[bit // 8] ^= 1 << (bit % 8)
        elif op == "cut":
            buf = buf[:pos]
        elif op == "insert":
            buf[pos:pos] = draw(st.binary(min_size=1, max_size=8), label="inserted")
        elif op == "delete":
            del buf[pos:pos + draw(st.integers(1, 8), label="deleted")]
        elif op == "int":
            width = draw(st.sampled_from([1, 2, 4, 8]), label="width")
            value = draw(st.sampled_from(BOUNDARY_INTS), label="value") & ((1 << (8 * width)) - 1)
            buf[pos:pos + width] = value.to_bytes(width, "big")
        else:  # a frame length prefix far over the limit
            size = draw(st.sampled_from([MAX_FRAME + 1, 1 << 31, 0xFFFFFFFF]), label="size")
            buf[pos:pos + 4] = size.to_bytes(4, "big")
    return bytes(buf)


@st.composite
def request_stream(draw: st.DrawFn) -> bytes:
    """One to three valid request frames of random APIs, as a client sends them."""
    client = ClientConnection(max_frame_bytes=MAX_FRAME)
    out = []
    for _ in range(draw(st.integers(1, 3))):
        spec = APIS[draw(st.sampled_from(sorted(APIS)))]
        request = draw(instances(spec.request))
        try:
            out.append(client.send(request)[1])
        except InvalidArgument:  # over MAX_FRAME: skip it
            pass
    return b"".join(out)


def run_server(draw: st.DrawFn, data: bytes) -> list[Any]:
    server = ServerConnection(max_frame_bytes=MAX_FRAME)
    events: list[Any] = []
    try:
        for chunk in chunks(draw, data):
            server.receive_data(chunk)
            while (event := server.next_event()) is not NEED_DATA:
                assert isinstance(event, (RequestEvent, BadRequest)), event
                events.append(event)
    except ProtocolError:
        pass
    for event in events:
        if isinstance(event, BadRequest):
            assert event.error_code in (InvalidRequestError.code, UnsupportedVersionError.code)
            if event.header.api_key in APIS:  # the broker can always answer it with the API's own response
                reply = error_response(event.header.api_key, event.error_code, str(event.error))
                server.encode_response(event.header, reply)
        else:
            # The wire format is canonical: what decodes re-encodes to the same bytes.
            spec = APIS[event.header.api_key]
            body = b"".join(schema.encode(event.request, event.header.api_version))
            head = b"".join(encode_request_header(event.header))
            assert (head + body) in data
            assert type(event.request) is spec.request
    return events


@FUZZ
@given(data=st.binary(max_size=2 * MAX_FRAME), draw=st.data())
def test_server_random_bytes(data: bytes, draw: st.DataObject) -> None:
    run_server(draw.draw, data)


@FUZZ
@given(stream=request_stream().flatmap(mutated), draw=st.data())
def test_server_mutated_frames(stream: bytes, draw: st.DataObject) -> None:
    run_server(draw.draw, stream)


@st.composite
def client_with_responses(draw: st.DrawFn) -> tuple[ClientConnection, bytes]:
    """A client with requests in flight, and the valid response frames for them."""
    client = ClientConnection(max_frame_bytes=MAX_FRAME)
    frames = []
    for _ in range(draw(st.integers(1, 3))):
        spec = APIS[draw(st.sampled_from(sorted(APIS)))]
        cid, _ = client.send(spec.request())
        header = RequestHeader(spec.key, 0, cid, "")
        try:
            frames.append(ServerConnection(MAX_FRAME).encode_response(header, draw(instances(spec.response))))
        except InvalidArgument:
            frames.append(ServerConnection(MAX_FRAME).encode_response(header, spec.response()))
    return client, b"".join(frames)


def run_client(draw: st.DrawFn, client: ClientConnection, data: bytes) -> None:
    pending = [cid for cid, req in client.pending_requests() if req.API_KEY not in REPLIES_OUT_OF_ORDER]
    any_order = {cid for cid, req in client.pending_requests() if req.API_KEY in REPLIES_OUT_OF_ORDER}
    try:
        for chunk in chunks(draw, data):
            client.receive_data(chunk)
            while (event := client.next_event()) is not NEED_DATA:
                assert isinstance(event, ResponseEvent), event
                if event.correlation_id in any_order:  # MultiFetch: matched by id, whenever it comes
                    any_order.remove(event.correlation_id)
                else:
                    assert event.correlation_id == pending.pop(0)  # the others strictly in order
                assert type(event.response) is APIS[event.request.API_KEY].response
    except ProtocolError:
        pass


@FUZZ
@given(setup=client_with_responses(), noise=st.binary(max_size=MAX_FRAME), draw=st.data())
def test_client_random_bytes(setup: tuple[ClientConnection, bytes], noise: bytes, draw: st.DataObject) -> None:
    run_client(draw.draw, setup[0], noise)


@FUZZ
@given(setup=client_with_responses(), draw=st.data())
def test_client_mutated_responses(setup: tuple[ClientConnection, bytes], draw: st.DataObject) -> None:
    client, frames = setup
    run_client(draw.draw, client, draw.draw(mutated(frames), label="mutated"))


@pytest.mark.parametrize("api_key", sorted(APIS), ids=[APIS[k].name for k in sorted(APIS)])
@settings(max_examples=examples(40), deadline=timedelta(seconds=2), suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_schema_decode_of_mutated_bodies(api_key: int, data: st.DataObject) -> None:
    """Per message class: decode raises only ProtocolError, and whatever decodes re-encodes identically."""
    for cls in (APIS[api_key].request, APIS[api_key].response):
        body = b"".join(schema.encode(data.draw(instances(cls)), 0))
        bad = data.draw(mutated(body) | st.binary(max_size=64), label="body")
        try:
            obj = schema.decode(cls, 0, bad)
        except ProtocolError:
            continue
        assert b"".join(schema.encode(obj, 0)) == bad


# -- framing ---------------------------------------------------------------------------------------

def test_oversized_frame_refused_from_its_prefix_alone() -> None:
    for conn in (ServerConnection(max_frame_bytes=MAX_FRAME), ClientConnection(max_frame_bytes=MAX_FRAME)):
        if isinstance(conn, ClientConnection):
            conn.send(FetchRequest())
        conn.receive_data((MAX_FRAME + 1).to_bytes(4, "big"))  # nothing of the body has arrived
        with pytest.raises(ProtocolError):
            conn.next_event()
    frames = FrameBuffer(max_frame_bytes=MAX_FRAME)
    frames.feed(b"\xff\xff\xff\xff")
    with pytest.raises(ProtocolError):
        frames.next_frame()


def test_frame_of_exactly_the_limit_is_accepted() -> None:
    frames = FrameBuffer(max_frame_bytes=10)
    frames.feed(b"\x00\x00\x00\x0a" + b"x" * 10 + b"\x00\x00\x00\x00")
    assert frames.next_frame() == b"x" * 10
    assert frames.next_frame() == b""
    assert frames.next_frame() is None and frames.buffered_bytes == 0


def test_frame_buffer_reassembles_byte_by_byte() -> None:
    stream = b"".join(b"\x00\x00\x00\x03" + bytes([i]) * 3 for i in range(50))
    frames = FrameBuffer()
    got = []
    for i in range(len(stream)):
        frames.feed(stream[i:i + 1])
        if (frame := frames.next_frame()) is not None:
            got.append(frame)
    assert got == [bytes([i]) * 3 for i in range(50)]
    assert frames.buffered_bytes == 0


def test_short_request_header_is_a_protocol_error() -> None:
    for body in (b"", b"\x00\x05\x00\x00\x00\x00\x00\x01",  # no client id length
                 b"\x00\x05\x00\x00\x00\x00\x00\x01\x00\x09ab",  # client id cut off
                 b"\x00\x05\x00\x00\x00\x00\x00\x01\xff\xff"):  # null client id
        server = ServerConnection()
        server.receive_data(len(body).to_bytes(4, "big") + body)
        with pytest.raises(ProtocolError):
            server.next_event()


# -- strict correlation ----------------------------------------------------------------------------

def response_frame(correlation_id: int, response: Any) -> bytes:
    return ServerConnection().encode_response(RequestHeader(response.API_KEY, 0, correlation_id, ""), response)


def test_response_out_of_order_is_a_protocol_error() -> None:
    client = ClientConnection()
    client.send(FetchRequest())
    second, _ = client.send(FetchRequest())
    client.receive_data(response_frame(second, FetchResponse()))
    with pytest.raises(ProtocolError):
        client.next_event()


def test_response_with_unknown_correlation_id_is_a_protocol_error() -> None:
    client = ClientConnection()
    cid, _ = client.send(FetchRequest())
    client.receive_data(response_frame(cid + 100, FetchResponse()))
    with pytest.raises(ProtocolError):
        client.next_event()


def test_response_with_nothing_in_flight_is_a_protocol_error() -> None:
    client = ClientConnection()
    client.receive_data(response_frame(1, FetchResponse()))
    with pytest.raises(ProtocolError):
        client.next_event()
    client = ClientConnection()
    client.send(FetchRequest(), expect_response=False)
    client.receive_data(response_frame(1, FetchResponse()))
    with pytest.raises(ProtocolError):
        client.next_event()


def test_response_of_the_wrong_type_is_a_protocol_error() -> None:
    client = ClientConnection()
    cid, _ = client.send(FetchRequest())
    client.receive_data(response_frame(cid, APIS[0].response(server_version="x")))
    with pytest.raises(ProtocolError):
        client.next_event()


# -- a bad request inside a good frame is answered, and the connection goes on ---------------------

def raw_request(api_key: int, version: int, correlation_id: int, body: bytes) -> bytes:
    frame = b"".join(encode_request_header(RequestHeader(api_key, version, correlation_id, "c"))) + body
    return len(frame).to_bytes(4, "big") + frame


@pytest.mark.parametrize(("frame", "code"), [
    (raw_request(999, 0, 7, b""), InvalidRequestError.code),
    (raw_request(-1, 0, 7, b"\x00\x00"), InvalidRequestError.code),
    (raw_request(5, APIS[5].max_version + 1, 7, b""), UnsupportedVersionError.code),
    (raw_request(5, -1, 7, b""), UnsupportedVersionError.code),
    (raw_request(8, 0, 7, b"\x00\x01g"), InvalidRequestError.code),  # body cut off
    (raw_request(8, 0, 7, b"".join(schema.encode(HeartbeatRequest(), 0)) + b"!"), InvalidRequestError.code),
    (raw_request(8, 0, 7, b"\x00\x02\xff\xfe\x00\x00\x00\x00\x00\x00"), InvalidRequestError.code),  # not UTF-8
    (raw_request(15, 0, 7, b"\x00\x00\x00\x00\x00\x00\x02"), InvalidRequestError.code),  # bool of 2
], ids=["unknown-api", "negative-api", "version-too-new", "negative-version", "cut-body", "trailing-bytes",
        "bad-utf8", "bad-bool"])
def test_bad_request_is_returned_and_decoding_goes_on(frame: bytes, code: int) -> None:
    server = ServerConnection()
    good = ClientConnection(client_id="next")
    cid, next_frame = good.send(HeartbeatRequest(group="g", generation=3, member_id="m"))
    server.receive_data(frame + next_frame)
    bad = server.next_event()
    assert isinstance(bad, BadRequest)
    assert bad.error_code == code
    assert bad.header.correlation_id == 7 and bad.header.client_id == "c"
    assert isinstance(bad.error, Exception) and str(bad.error)
    event = server.next_event()
    assert isinstance(event, RequestEvent)
    assert event.header.correlation_id == cid and event.request == HeartbeatRequest("g", 3, "m")
    assert server.next_event() is NEED_DATA


# -- record batches --------------------------------------------------------------------------------

BIG = 1 << 30


@st.composite
def batches(draw: st.DrawFn) -> bytes:
    sent = draw(st.lists(messages("t"), min_size=1, max_size=4))
    buf = bytearray(encode_messages(sent, draw(st.sampled_from(list(Compression)))))
    stamp(buf, draw(st.integers(0, 1 << 40)), draw(st.integers(0, 1 << 100)), 5)
    return bytes(buf)


def fix_crc(batch: bytes) -> bytes:
    """Recompute the CRC (when the header is long enough) so a mutation reaches the record walk."""
    if len(batch) < STAMPED_BYTES:
        return batch
    return batch[:37] + crc32c.crc32c(batch[STAMPED_BYTES:]).to_bytes(4, "big") + batch[STAMPED_BYTES:]


def check_batch_readers(data: bytes) -> None:
    """Every batch reader on ``data``: only ProtocolError (or InvalidArgument for size limits)."""
    header = None
    try:
        header = validate_batch(data, max_message_bytes=1 << 16, max_batch_bytes=1 << 16)
    except (ProtocolError, InvalidArgument):
        pass
    if header is not None:
        # The broker's promise: a batch it validated (and so stored) is readable by every consumer.
        got = decode_batch(data, "t", 0)
        assert len(got) == header.record_count
        assert [m.offset for m in got] == list(range(header.base_offset, header.next_offset))
    for verify in (True, False):
        try:
            decode_batch(data, verify=verify)
        except ProtocolError:
            pass
    try:
        read_header(data)
    except ProtocolError:
        pass
    try:
        list(iter_batches(data))
    except ProtocolError:
        pass
    try:
        decode_fetched(data, "t", 0, 0)
    except ProtocolError:
        pass


@FUZZ
@given(data=st.binary(max_size=512))
def test_batch_readers_on_random_bytes(data: bytes) -> None:
    check_batch_readers(data)
    check_batch_readers(fix_crc(data))


@FUZZ
@given(data=batches().flatmap(mutated))
def test_batch_readers_on_mutated_batches(data: bytes) -> None:
    check_batch_readers(data)
    check_batch_readers(fix_crc(data))


@FUZZ
@given(body=st.lists(batches(), min_size=1, max_size=3).map(b"".join).flatmap(mutated))
def test_fetch_body_readers_on_mutated_concatenations(body: bytes) -> None:
    try:
        decode_fetched(body, "t", 0, 0)
    except ProtocolError:
        pass
    try:
        for pos, header in iter_batches(body):
            assert pos + header.total_bytes <= len(body)
    except ProtocolError:
        pass


@pytest.mark.parametrize("codec", [Compression.LZ4, Compression.ZSTD], ids=["lz4", "zstd"])
def test_decompression_is_bounded(codec: Compression) -> None:
    """A tiny compressed batch that inflates to many megabytes is refused without inflating it.

    validate_batch allows 4x max_batch_bytes of decompressed records; a zstd frame declares its size
    and lz4 is decompressed incrementally, so neither may allocate the whole bomb.
    """
    from metaq.protocol.records import encode_values

    bomb = encode_values([b"\0" * (16 << 20)], 1, codec)
    assert len(bomb) < 100_000
    tracemalloc.start()
    try:
        with pytest.raises(CorruptRecordError):
            validate_batch(bomb, max_message_bytes=BIG, max_batch_bytes=len(bomb))
        with pytest.raises(CorruptRecordError):
            decode_batch(bomb, max_uncompressed_bytes=1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"peak {peak} bytes while refusing a compressed batch"


def test_records_field_length_must_fit_the_frame() -> None:
    client = ClientConnection()
    cid, _ = client.send(FetchRequest())
    frame = bytearray(response_frame(cid, FetchResponse(records=b"abc")))
    struct.pack_into(">i", frame, len(frame) - 7, 4)  # records length 4, only 3 bytes follow
    client.receive_data(bytes(frame))
    with pytest.raises(ProtocolError):
        client.next_event()


def test_undecodable_response_leaves_its_request_pending() -> None:
    """After a ProtocolError the caller fails pending_requests(): the request whose reply was garbage
    must still be among them, or it would wait forever."""
    client = ClientConnection()
    first, second = FetchRequest(offset=1), FetchRequest(offset=2)
    cid, _ = client.send(first)
    client.send(second)
    frame = response_frame(cid, FetchResponse())
    body = frame[4:-1]  # the records length field loses its last byte
    client.receive_data(len(body).to_bytes(4, "big") + body)
    with pytest.raises(ProtocolError):
        client.next_event()
    assert [req for _, req in client.pending_requests()] == [first, second]
