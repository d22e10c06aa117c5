"""FrameBuffer's two ways in (feed, and get_buffer + buffer_updated as a socket's recv_into does) and its
big frames, received into buffers of their own: every split of a stream gives back the same frames, a
big frame's memory is never written again once handed out, and the limits hold as before."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaq.errors import ProtocolError
from metaq.protocol.codec import ClientConnection, FrameBuffer, RequestHeader, ServerConnection
from metaq.protocol.messages import FetchRequest, FetchResponse


def framed(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


def receive(frames: FrameBuffer, data: bytes) -> None:
    """What a socket's recv_into loop does: write into the lent memory, at most as much as it holds."""
    view = memoryview(data)
    while view:
        target = frames.get_buffer(-1)
        n = min(len(target), len(view))
        assert n > 0
        target[:n] = view[:n]
        frames.buffer_updated(n)
        view = view[n:]


def drain(frames: FrameBuffer) -> list[bytes]:
    out = []
    while (frame := frames.next_frame()) is not None:
        out.append(bytes(frame))
    return out


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 300), min_size=1, max_size=12), big=st.sampled_from([0, 1, 16, 100]),
       seed=st.integers(0, 2**32 - 1))
def test_any_split_of_the_stream_gives_the_same_frames(sizes: list[int], big: int, seed: int) -> None:
    rnd = random.Random(seed)
    bodies = [bytes(rnd.getrandbits(8) for _ in range(n)) for n in sizes]
    stream = b"".join(map(framed, bodies))
    frames = FrameBuffer(max_frame_bytes=1000, big_frame_bytes=big)
    got: list[bytes] = []
    pos = 0
    while pos < len(stream):
        n = rnd.randint(1, 64)
        chunk = stream[pos:pos + n]
        if rnd.random() < 0.5:
            frames.feed(chunk)
        else:
            receive(frames, chunk)
        pos += n
        if rnd.random() < 0.7:
            got += drain(frames)
    got += drain(frames)
    assert got == bodies
    assert frames.buffered_bytes == 0


def test_a_big_frame_is_received_straight_into_its_own_buffer() -> None:
    body = bytes(range(256)) * 400  # 102,400 B
    frames = FrameBuffer(big_frame_bytes=64 * 1024)
    receive(frames, framed(body)[:1000])  # the head arrives: the frame gets a buffer of its size
    rest = frames.get_buffer(-1)
    assert len(rest) == len(body) - 996  # exactly the rest of this frame, nothing of the next
    rest[:] = body[996:]
    frames.buffer_updated(len(rest))
    frame = frames.next_frame()
    assert isinstance(frame, memoryview) and frame.readonly and frame == body
    assert frames.next_frame() is None and frames.buffered_bytes == 0


def test_a_big_frame_handed_out_is_never_written_again() -> None:
    """A fetch's payloads are slices of its frame: later frames must not land in the same memory."""
    frames = FrameBuffer(big_frame_bytes=1024)
    first = b"a" * 5000
    receive(frames, framed(first))
    kept = frames.next_frame()
    assert kept is not None
    payload = kept[100:200]
    for fill in (b"b", b"c"):
        receive(frames, framed(fill * 5000) + framed(fill * 10))
        assert drain(frames) == [fill * 5000, fill * 10]
    assert kept == first and payload == b"a" * 100


def test_small_frames_stay_bytes_and_big_ones_only_when_asked() -> None:
    for big, expected in ((0, bytes), (1 << 20, bytes), (100, memoryview)):
        frames = FrameBuffer(big_frame_bytes=big)
        receive(frames, framed(b"x" * 500)[:50])
        receive(frames, framed(b"x" * 500)[50:])
        frame = frames.next_frame()
        assert type(frame) is expected and frame == b"x" * 500
    frames = FrameBuffer(big_frame_bytes=100)
    receive(frames, framed(b"y" * 500))  # whole in one read: copied out of the stream buffer, as bytes
    assert frames.next_frame() == b"y" * 500


def test_an_oversized_frame_is_refused_and_gets_no_buffer() -> None:
    frames = FrameBuffer(max_frame_bytes=1_000_000, big_frame_bytes=100)
    receive(frames, (1_000_001).to_bytes(4, "big") + b"x" * 50)
    assert len(frames.get_buffer(-1)) < 1_000_000  # no buffer of the claimed size was made
    with pytest.raises(ProtocolError):
        frames.next_frame()


def test_discarding_a_partial_big_frame_keeps_the_stream_in_step() -> None:
    frames = FrameBuffer(big_frame_bytes=100)
    body = bytes(range(200)) * 5
    stream = framed(body) + framed(b"next")
    receive(frames, stream[:300])
    assert frames.next_frame() is None
    assert frames.buffered_bytes == 300
    assert frames.peek(8) == stream[:8]
    assert frames.discard_partial(50) == stream[:50]
    assert frames.skipping_bytes == len(body) + 4 - 300
    receive(frames, stream[300:])
    assert drain(frames) == [b"next"]


def test_client_decodes_a_big_reply_without_copying_its_records() -> None:
    records = bytes(range(256)) * 1024
    client = ClientConnection(big_frame_bytes=64 * 1024)
    cid, _ = client.send(FetchRequest("t", 0, 0, 1 << 20, 0, ""))
    reply = ServerConnection().encode_response(RequestHeader(FetchRequest.API_KEY, client.version_for(
        FetchRequest.API_KEY), cid, ""), FetchResponse(records=records))
    view = memoryview(reply)
    while view:
        target = client.get_buffer()
        n = min(len(target), len(view))
        target[:n] = view[:n]
        client.buffer_updated(n)
        view = view[n:]
    event = client.next_event()
    got = event.response.records  # type: ignore[union-attr]
    assert isinstance(got, memoryview) and got.readonly and got == records
