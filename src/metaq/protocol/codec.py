"""Sans-IO connections: bytes in, events out; requests in, bytes out.

Frames on the wire::

    u32 size                       bytes after this field (<= max_frame_bytes)
    request:  i16 api_key | i16 api_version | i32 correlation_id | string client_id | body
    response: i32 correlation_id | body

:class:`ClientConnection` and :class:`ServerConnection` hold no sockets (h11's shape):
``receive_data(bytes)`` buffers, ``next_event()`` returns one event or :data:`NEED_DATA`.
The asyncio broker, the asyncio client, the blocking client used by Spark executors and the fuzzer
all drive these same classes.

Correlation is strict: responses come back in request order, and a response whose correlation id is
not the oldest in flight is a ProtocolError (the connection must be closed). The one exception is the
APIs in :data:`~metaq.protocol.messages.REPLIES_OUT_OF_ORDER` (MultiFetch): their replies may overtake
any other and are matched by correlation id; the others keep their order among themselves.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass
from typing import Any, Final

from metaq.errors import InvalidArgument, ProtocolError, TooManyRequestsError, UnsupportedVersionError
from metaq.protocol import schema
from metaq.protocol.messages import APIS, REPLIES_OUT_OF_ORDER, spec_for

DEFAULT_MAX_FRAME_BYTES: Final = 64 * 1024 * 1024
DEFAULT_MAX_IN_FLIGHT: Final = 1024
PARTIAL_HEAD_BYTES: Final = 64 * 1024 + 64
"""Bytes of a discarded frame kept for answering it: the header with its client id, a topic name, a few fields."""
SCRATCH_BYTES: Final = 64 * 1024
"""What a FrameBuffer lends the socket per receive when the bytes go to its stream buffer."""
DEFAULT_BIG_FRAME_BYTES: Final = 64 * 1024
"""Clients receive a reply frame at least this large into a buffer of its own (FrameBuffer)."""

_VIEW_COPY_BYTES: Final = 64 * 1024
"""From this size a frame is copied out of the stream buffer through a memoryview (once, not twice)."""
_SIZE = struct.Struct(">I")
_REQ_HEAD = struct.Struct(">hhi")
_RESP_HEAD = struct.Struct(">i")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


class _NeedData:
    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = _NeedData()


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str


@dataclass(slots=True)
class RequestEvent:
    header: RequestHeader
    request: Any


@dataclass(slots=True)
class BadRequest:
    """A well-framed request the server cannot decode; answer it with an error and keep serving."""

    header: RequestHeader
    error: Exception
    error_code: int


@dataclass(slots=True)
class ResponseEvent:
    correlation_id: int
    response: Any
    request: Any
    """The request this answers (kept by the connection, so callers need no map of their own)."""


class FrameBuffer:
    """Accumulates bytes and yields whole frame bodies; refuses a frame over ``max_frame_bytes``.

    Two ways in: :meth:`feed` (bytes the caller already holds) or, to receive straight from a socket,
    :meth:`get_buffer` + :meth:`buffer_updated` (asyncio's ``BufferedProtocol`` and ``recv_into``).

    ``big_frame_bytes`` (0: off) is for readers of large replies: a frame of at least that many bytes whose
    size prefix has arrived without the rest gets a buffer of its own, the frame's size, that
    :meth:`get_buffer` hands to the socket, so the kernel copies the rest once, into the memory it is
    decoded from; :meth:`next_frame` returns it as a read-only memoryview of that buffer, which is never
    written again (values sliced from it, such as a fetch's payloads, stay valid). It allocates the
    frame's whole size when the prefix arrives, so it is meant for a client reading its broker, not for a
    server reading strangers. Other frames (smaller, or whole in one read) are bytes, copied once out of
    the stream buffer.
    """

    __slots__ = ("_big", "_big_filled", "_buf", "_into_big", "_pos", "_scratch", "_skip", "big_frame_bytes",
                 "max_frame_bytes")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, big_frame_bytes: int = 0) -> None:
        self._buf = bytearray()
        self._pos = 0
        self._skip = 0
        self.max_frame_bytes = max_frame_bytes
        self.big_frame_bytes = big_frame_bytes
        self._big: bytearray | None = None
        """The body of the frame at the head of the stream, received into its own buffer (big frames)."""
        self._big_filled = 0
        self._scratch: bytearray | None = None
        """What :meth:`get_buffer` lends the socket when the bytes go to the stream buffer (allocated once)."""
        self._into_big = False
        """The last :meth:`get_buffer` lent the big frame's buffer (so :meth:`buffer_updated` counts into it)."""

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._skip:
            n = min(self._skip, len(data))
            self._skip -= n
            data = memoryview(data)[n:]
            if not data:
                return
        big = self._big
        if big is not None and self._big_filled < len(big):
            filled = self._big_filled
            n = min(len(data), len(big) - filled)
            big[filled:filled + n] = memoryview(data)[:n]
            self._big_filled = filled + n
            if n == len(data):
                return
            data = memoryview(data)[n:]
        elif big is None and self.big_frame_bytes and self._pos == len(self._buf) and len(data) >= 4:
            # the head of a big frame at the start of what came in: straight into the frame's own buffer
            (size,) = _SIZE.unpack_from(data, 0)
            if self.big_frame_bytes <= size <= self.max_frame_bytes and len(data) < 4 + size:
                big = self._big = bytearray(size)
                big[:len(data) - 4] = memoryview(data)[4:]
                self._big_filled = len(data) - 4
                return
        if self._pos and self._pos >= len(self._buf) // 2:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data
        if self.big_frame_bytes and self._big is None:
            self._go_big()

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Memory for the next bytes from the socket (``BufferedProtocol.get_buffer``); then call
        :meth:`buffer_updated` with the count written. The rest of a big frame goes straight into its
        own buffer; anything else into a scratch buffer that :meth:`buffer_updated` feeds on."""
        if self.big_frame_bytes and self._big is None:
            self._go_big()
        big = self._big
        if big is not None and self._big_filled < len(big) and not self._skip:
            self._into_big = True
            return memoryview(big)[self._big_filled:]
        self._into_big = False
        if self._scratch is None:
            self._scratch = bytearray(SCRATCH_BYTES)
        return memoryview(self._scratch)

    def buffer_updated(self, nbytes: int) -> None:
        """``nbytes`` were written at the start of the memory the last :meth:`get_buffer` returned."""
        if self._into_big:
            self._into_big = False
            self._big_filled += nbytes
            return
        assert self._scratch is not None, "buffer_updated without get_buffer"
        with memoryview(self._scratch) as view:
            self.feed(view[:nbytes])

    def _go_big(self) -> None:
        """Move an unfinished big frame at the head of the stream into a buffer of its own size."""
        buf, pos = self._buf, self._pos
        avail = len(buf) - pos
        if avail < 4:
            return
        (size,) = _SIZE.unpack_from(buf, pos)
        if size < self.big_frame_bytes or size > self.max_frame_bytes or avail >= 4 + size:
            return  # small, refused by next_frame, or already whole
        big = bytearray(size)
        with memoryview(buf) as view:
            big[:avail - 4] = view[pos + 4:]
        self._big, self._big_filled = big, avail - 4
        buf.clear()
        self._pos = 0

    @property
    def buffered_bytes(self) -> int:
        n = len(self._buf) - self._pos
        if self._big is not None:
            n += 4 + self._big_filled
        return n

    @property
    def skipping_bytes(self) -> int:
        """Bytes of a discarded frame still to arrive (dropped as they come)."""
        return self._skip

    def discard_partial(self, keep_bytes: int) -> bytes:
        """Drop the unfinished frame at the head of the buffer, and the rest of it as it arrives.

        Call after :meth:`next_frame` returned None (so what is buffered is one unfinished frame).
        Returns its first ``keep_bytes`` bytes (size prefix included) so the caller can still answer it;
        the stream stays in sync. The buffer's memory is released.
        """
        big = self._big
        if big is not None:  # then the stream buffer is empty: everything since is the big frame's
            filled = self._big_filled
            head = _SIZE.pack(len(big)) + bytes(big[:min(filled, max(0, keep_bytes - 4))])
            self._skip = len(big) - filled
            self._big = None
            self._big_filled = 0
            return head
        buf, pos = self._buf, self._pos
        head = bytes(buf[pos:pos + keep_bytes])
        if len(buf) - pos >= 4:
            (size,) = _SIZE.unpack_from(buf, pos)
            self._skip = 4 + size - (len(buf) - pos)
        else:  # not even the size yet: nothing to skip, the prefix arrives later as a new frame
            head = b""
            self._skip = 0
            self._buf = bytearray(buf[pos:])
            self._pos = 0
            return head
        self._buf = bytearray()
        self._pos = 0
        return head

    def peek(self, n: int) -> bytes | None:
        """The next ``n`` buffered bytes without consuming them, or None if fewer are buffered."""
        big = self._big
        if big is not None:
            if 4 + self._big_filled < n:
                return None
            return (_SIZE.pack(len(big)) + bytes(big[:max(0, n - 4)]))[:n]
        if len(self._buf) - self._pos < n:
            return None
        return bytes(self._buf[self._pos:self._pos + n])

    def next_frame(self) -> bytes | memoryview | None:
        """The next whole frame's body, or None; a big frame (see the class) as a read-only memoryview."""
        big = self._big
        if big is not None:
            if self._big_filled < len(big):
                return None
            self._big = None
            self._big_filled = 0
            return memoryview(big).toreadonly()
        buf, pos = self._buf, self._pos
        if len(buf) - pos < 4:
            return None
        (size,) = _SIZE.unpack_from(buf, pos)
        if size > self.max_frame_bytes:
            raise ProtocolError(f"frame of {size} bytes is larger than the limit of {self.max_frame_bytes}")
        end = pos + 4 + size
        if len(buf) < end:
            return None
        if size < _VIEW_COPY_BYTES:
            frame = bytes(buf[pos + 4:end])  # two short copies cost less than making a view
        else:
            with memoryview(buf) as view:  # one copy, and no export left behind to block the buffer's resizing
                frame = bytes(view[pos + 4:end])
        self._pos = end
        if end == len(buf):
            buf.clear()
            self._pos = 0
        return frame


def _frame(parts: list[bytes], max_frame_bytes: int) -> bytes:
    size = sum(map(len, parts))
    if size > max_frame_bytes:
        raise InvalidArgument(f"frame of {size} bytes is larger than the limit of {max_frame_bytes}")
    return b"".join([_SIZE.pack(size), *parts])  # one copy of a batch's bytes, not two (join, then prefix)


def encode_request_header(header: RequestHeader) -> list[bytes]:
    raw = header.client_id.encode()
    return [_REQ_HEAD.pack(header.api_key, header.api_version, header.correlation_id), _I16.pack(len(raw)), raw]


def response_version(header: RequestHeader) -> int:
    """The version a response to ``header`` is encoded at: the request's, moved into the API's range.

    A request with a version the API does not have (a negative one included) is answered with
    UNSUPPORTED_VERSION in the layout of the nearest version the broker has, and an unknown api key
    with the bare error prefix at v0, so that every reply carries an error code.
    """
    spec = APIS.get(header.api_key)
    if spec is None:
        return 0
    version = header.api_version
    if version < spec.min_version:
        return spec.min_version
    if version > spec.max_version:
        return spec.max_version
    return version


class ServerConnection:
    """The broker side of one connection."""

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._frames = FrameBuffer(max_frame_bytes)
        self.max_frame_bytes = max_frame_bytes

    def set_max_frame_bytes(self, max_frame_bytes: int) -> None:
        """Change the largest frame accepted from now on (a broker allows larger ones once a connection has
        authenticated)."""
        self.max_frame_bytes = self._frames.max_frame_bytes = max_frame_bytes

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        self._frames.feed(data)

    @property
    def partial_frame_bytes(self) -> int:
        """Bytes buffered of a request frame not yet whole (its 4-byte size prefix not counted).

        Meaningful after :meth:`next_event` returned NEED_DATA: what is buffered then is one unfinished
        frame. A broker bounds the sum of these over its connections.
        """
        return max(0, self._frames.buffered_bytes - 4)

    def peek_header(self) -> RequestHeader | None:
        """The header of the next frame as soon as its fixed part is buffered (client id not read).

        Lets a broker answer a connection it refuses without buffering the request. None until the
        size, api key, version and correlation id have arrived; ProtocolError for an oversized frame.
        """
        head = self._frames.peek(4 + _REQ_HEAD.size)
        if head is None:
            return None
        (size,) = _SIZE.unpack_from(head, 0)
        if size > self.max_frame_bytes:
            raise ProtocolError(f"frame of {size} bytes is larger than the limit of {self.max_frame_bytes}")
        if size < _REQ_HEAD.size + 2:
            raise ProtocolError(f"request frame of {size} bytes is shorter than a request header")
        api_key, version, correlation_id = _REQ_HEAD.unpack_from(head, 4)
        return RequestHeader(api_key, version, correlation_id, "")

    def discard_partial_frame(self) -> tuple[RequestHeader, bytes] | None:
        """Drop the unfinished frame buffered (call after NEED_DATA), freeing its memory.

        The rest of that frame is skipped as it arrives, so the connection stays in sync and can be
        answered. Returns the frame's header and the first bytes of its body (up to 64 KiB: enough for
        the leading fields of any request), or None when even the header had not arrived (then the
        caller should close the connection).
        """
        head = self._frames.discard_partial(4 + PARTIAL_HEAD_BYTES)
        if len(head) < 4 + _REQ_HEAD.size + 2:
            return None
        api_key, version, correlation_id = _REQ_HEAD.unpack_from(head, 4)
        try:
            client_id, pos = schema.STRING.decode(head, 4 + _REQ_HEAD.size)
        except ProtocolError:
            return None
        return RequestHeader(api_key, version, correlation_id, client_id), head[pos:]

    def next_event(self) -> RequestEvent | BadRequest | _NeedData:
        """The next request; raises ProtocolError when the framing itself is broken (close then)."""
        frame = self._frames.next_frame()
        if frame is None:
            return NEED_DATA
        if len(frame) < _REQ_HEAD.size + 2:
            raise ProtocolError(f"request frame of {len(frame)} bytes is shorter than a request header")
        api_key, version, correlation_id = _REQ_HEAD.unpack_from(frame, 0)
        try:
            client_id, pos = schema.STRING.decode(frame, _REQ_HEAD.size)
        except ProtocolError as exc:
            raise ProtocolError(f"request header: {exc}") from None
        header = RequestHeader(api_key, version, correlation_id, client_id)
        spec = APIS.get(api_key)
        if spec is None:
            return BadRequest(header, ProtocolError(f"unknown api key {api_key}"), 42)
        if not spec.min_version <= version <= spec.max_version:
            err = UnsupportedVersionError(
                f"{spec.name} v{version} is not supported (v{spec.min_version}..v{spec.max_version})")
            return BadRequest(header, err, UnsupportedVersionError.code)
        try:
            request = schema.decode(spec.request, version, frame, pos)
        except ProtocolError as exc:
            return BadRequest(header, exc, 42)
        return RequestEvent(header, request)

    def encode_response(self, header: RequestHeader, response: Any) -> bytes:
        parts = [_RESP_HEAD.pack(header.correlation_id)]
        schema.encode(response, response_version(header), parts)
        return _frame(parts, self.max_frame_bytes)

    def encode_response_head(self, header: RequestHeader, response: Any, records_bytes: int) -> bytes:
        """Every byte of the response frame except its trailing RECORDS payload.

        The caller sends exactly ``records_bytes`` bytes after this (e.g. with ``sendfile``); the
        response's own ``records`` attribute is ignored.
        """
        parts = [_RESP_HEAD.pack(header.correlation_id)]
        fields = type(response).FIELDS
        assert fields[-1].type is schema.RECORDS, type(response)
        version = response_version(header)
        schema.encode_fields(response, tuple(f for f in fields[:-1] if f.since <= version), parts)
        parts.append(_I32.pack(records_bytes))
        head = b"".join(parts)
        size = len(head) + records_bytes
        if size > self.max_frame_bytes:
            raise InvalidArgument(f"response of {size} bytes is larger than the frame limit {self.max_frame_bytes}")
        return _SIZE.pack(size) + head


class ClientConnection:
    """The client side of one connection: numbers requests and matches responses in order (replies of
    REPLIES_OUT_OF_ORDER APIs by correlation id, whenever they come)."""

    def __init__(self, client_id: str = "metaq-python", max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 max_in_flight: int = DEFAULT_MAX_IN_FLIGHT, big_frame_bytes: int = DEFAULT_BIG_FRAME_BYTES) -> None:
        self.client_id = client_id
        self.max_frame_bytes = max_frame_bytes
        self.max_in_flight = max_in_flight
        self.big_frame_bytes = big_frame_bytes
        """Replies this large are received into buffers of their own (:class:`FrameBuffer`); their RECORDS
        then decode as read-only memoryviews of that buffer instead of bytes."""
        self._frames = FrameBuffer(max_frame_bytes, big_frame_bytes)
        self._next_correlation_id = 1
        self._in_flight: deque[tuple[int, int, Any]] = deque()
        self._unordered: dict[int, tuple[int, Any]] = {}
        """Requests whose replies may come in any order: correlation id -> (version, request)."""
        self._client_id_raw = client_id.encode()
        if len(self._client_id_raw) > 0x7FFF:
            raise InvalidArgument(f"client id is {len(self._client_id_raw)} bytes encoded; at most 32767")
        self._versions: dict[int, int] = {}

    @property
    def in_flight(self) -> int:
        return len(self._in_flight) + len(self._unordered)

    def set_versions(self, versions: dict[int, int]) -> None:
        """Highest version per api key both sides support (from the ApiVersions handshake)."""
        self._versions = dict(versions)

    def supports(self, api_key: int) -> bool:
        """Whether the peer serves ``api_key`` at a version this side speaks (after :meth:`set_versions`)."""
        return api_key in self._versions

    def version_for(self, api_key: int) -> int:
        return self._versions.get(api_key, APIS[api_key].max_version)

    def send(self, request: Any, *, expect_response: bool = True) -> tuple[int, bytes]:
        """(correlation_id, frame bytes) for ``request``; the caller writes the bytes."""
        if len(self._in_flight) + len(self._unordered) >= self.max_in_flight:
            raise TooManyRequestsError(f"{self.max_in_flight} requests already in flight on this connection")
        spec = spec_for(request)
        version = self.version_for(spec.key)
        correlation_id = self._next_correlation_id
        self._next_correlation_id = (correlation_id + 1) & 0x7FFFFFFF or 1
        parts = [_REQ_HEAD.pack(spec.key, version, correlation_id), _I16.pack(len(self._client_id_raw)),
                 self._client_id_raw]
        schema.encode(request, version, parts)
        data = _frame(parts, self.max_frame_bytes)
        if not expect_response:
            pass
        elif spec.key in REPLIES_OUT_OF_ORDER:
            self._unordered[correlation_id] = (version, request)
        else:
            self._in_flight.append((correlation_id, version, request))
        return correlation_id, data

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        self._frames.feed(data)

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Memory to receive the next bytes into (``recv_into``, ``BufferedProtocol``): a big reply's rest
        goes straight into its own buffer. Call :meth:`buffer_updated` with the count received."""
        return self._frames.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self._frames.buffer_updated(nbytes)

    def next_event(self) -> ResponseEvent | _NeedData:
        frame = self._frames.next_frame()
        if frame is None:
            return NEED_DATA
        if len(frame) < 4:
            raise ProtocolError("response frame shorter than its header")
        (correlation_id,) = _RESP_HEAD.unpack_from(frame, 0)
        unordered = self._unordered.get(correlation_id)
        if unordered is not None:
            version, request = unordered
            response = schema.decode(spec_for(request).response, version, frame, 4)
            del self._unordered[correlation_id]
            return ResponseEvent(correlation_id, response, request)
        if not self._in_flight:
            raise ProtocolError(f"response {correlation_id} arrived with no request in flight")
        expected, version, request = self._in_flight[0]
        if correlation_id != expected:
            raise ProtocolError(f"response correlation id {correlation_id}, expected {expected}")
        response = schema.decode(spec_for(request).response, version, frame, 4)
        self._in_flight.popleft()  # only now: a reply that does not decode leaves its request pending
        return ResponseEvent(correlation_id, response, request)

    def pending_requests(self) -> list[tuple[int, Any]]:
        """Requests still waiting for a reply, oldest first (to fail them when the connection drops)."""
        return [(cid, req) for cid, _v, req in self._in_flight] + [
            (cid, req) for cid, (_v, req) in self._unordered.items()]

    def clear(self) -> None:
        self._in_flight.clear()
        self._unordered.clear()
        self._frames = FrameBuffer(self.max_frame_bytes, self.big_frame_bytes)
