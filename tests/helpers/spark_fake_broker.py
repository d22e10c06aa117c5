"""An in-memory broker on a thread, speaking the real wire protocol through ServerConnection.

Only for what a real broker cannot show on demand: dropping the head of a partition now (what
retention does on its schedule) and batches rewritten by a test. Everything else is tested against
real brokers (tests/integration/spark). It answers ApiVersions, Metadata, ListOffsets, Fetch and
Produce as the broker's handlers (src/metaq/broker/handlers/) do: whole batches only, the first one
whole even when it is larger than max_bytes, max_bytes capped at maxTransferSize's default, long
polling, an out-of-range offset answered in the FetchResponse with the partition's bounds, offsets by
record timestamp, and the broker's limits and error codes for a produced batch.
"""

from __future__ import annotations

import random
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from metaq.errors import (
    NONE,
    BrokerError,
    CorruptMessageError,
    InvalidArgument,
    InvalidRequestError,
    MessageTooLargeError,
    OffsetOutOfRangeError,
    ProtocolError,
    UnknownPartitionError,
    UnknownTopicError,
)
from metaq.protocol import messages as m
from metaq.protocol.codec import NEED_DATA, BadRequest, ServerConnection
from metaq.protocol.records import decode_batch, read_header, stamp, validate_batch
from metaq.types import make_message_id, partition_tag

MAX_TRANSFER_BYTES = 1 << 20
"""The broker's maxTransferSize default: a fetch never returns more (but its first batch whole)."""
MAX_MESSAGE_BYTES = 1 << 20
MAX_BATCH_BYTES = 16 << 20
"""maxMessageSize and maxBatchSize defaults."""
MAX_WAIT_MS_CAP = 600_000


@dataclass
class FakePartition:
    batches: list[bytes] = field(default_factory=list)
    log_start: int = 0
    log_end: int = 0


class FakeBroker:
    """``topics``: name -> partition count; the topics are fixed (autoCreateTopics=false)."""

    def __init__(self, topics: dict[str, int] | None = None, broker_id: int = 0) -> None:
        self.broker_id = broker_id
        self.topics: dict[str, list[FakePartition]] = {
            name: [FakePartition() for _ in range(n)] for name, n in (topics or {}).items()}
        self.lock = threading.Lock()
        self.appended = threading.Condition(self.lock)
        """notified on every append and on stop (long-polling fetches wait on it)"""
        self.requests: list[Any] = []
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.port = self._sock.getsockname()[1]
        self._stopped = False
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        with self.lock:
            self._stopped = True
            self.appended.notify_all()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept(); close alone does not
        except OSError:
            pass
        self._sock.close()
        self._thread.join(5)
        for c in self._conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
                c.close()
            except OSError:
                pass

    # -- test helpers ---------------------------------------------------------------------------

    def drop_head(self, topic: str, partition: int, new_start: int) -> None:
        """Forget whole batches below ``new_start`` (like retention deleting old segments)."""
        with self.lock:
            part = self.topics[topic][partition]
            keep = []
            for b in part.batches:
                h = read_header(b)
                if h.next_offset <= new_start:
                    continue
                keep.append(b)
            part.batches = keep
            part.log_start = read_header(keep[0]).base_offset if keep else part.log_end

    def set_batch(self, topic: str, partition: int, index: int, batch: bytes) -> None:
        """Replace a stored batch (e.g. by a copy with records removed, as a server-side filter sends)."""
        with self.lock:
            self.topics[topic][partition].batches[index] = batch

    # -- serving -------------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._stopped:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        server = ServerConnection()
        try:
            while True:
                data = conn.recv(1 << 20)
                if not data:
                    return
                server.receive_data(data)
                while True:
                    event = server.next_event()
                    if event is NEED_DATA:
                        break
                    if isinstance(event, BadRequest):
                        resp = m.error_response(event.header.api_key, event.error_code, str(event.error))
                        conn.sendall(server.encode_response(event.header, resp))
                        continue
                    req = event.request
                    self.requests.append(req)
                    if isinstance(req, m.ProduceRequest) and req.acks == 0:
                        self._handle(req)
                        continue
                    try:
                        resp = self._handle(req)
                    except BrokerError as exc:
                        resp = m.error_response(event.header.api_key, exc.code, exc.message)
                    conn.sendall(server.encode_response(event.header, resp))
        except OSError:
            return
        finally:
            conn.close()

    def _part(self, topic: str, partition: int) -> FakePartition:
        parts = self.topics.get(topic)
        if parts is None:
            raise UnknownTopicError(f"topic {topic!r} does not exist")
        if not 0 <= partition < len(parts):
            raise UnknownPartitionError(f"no partition {partition}")
        return parts[partition]

    def _handle(self, req: Any) -> Any:
        with self.lock:
            if isinstance(req, m.ApiVersionsRequest):
                return m.ApiVersionsResponse(broker_id=self.broker_id, server_version="fake",
                                             apis=[m.ApiVersionRange(k, s.min_version, s.max_version)
                                                   for k, s in m.APIS.items()])
            if isinstance(req, m.MetadataRequest):
                names = sorted(self.topics) if req.topics is None else req.topics
                infos = []
                for name in names:
                    if name not in self.topics:
                        infos.append(m.TopicInfo(name, UnknownTopicError.code, []))
                    else:
                        infos.append(m.TopicInfo(name, NONE, [m.PartitionInfo(p, self.broker_id)
                                                              for p in range(len(self.topics[name]))]))
                return m.MetadataResponse(brokers=[m.BrokerInfo(self.broker_id, "127.0.0.1", self.port)],
                                          topics=infos)
            if isinstance(req, m.ListOffsetsRequest):
                part = self._part(req.topic, req.partition)
                if req.timestamp_ms == m.EARLIEST_TIMESTAMP:
                    off = part.log_start
                elif req.timestamp_ms == m.LATEST_TIMESTAMP:
                    off = part.log_end
                elif req.timestamp_ms < 0:
                    raise InvalidRequestError(
                        f"timestamp must be -2 (earliest), -1 (latest) or >= 0; got {req.timestamp_ms}")
                else:
                    off = self._offset_for_timestamp(req.topic, req.partition, req.timestamp_ms)
                return m.ListOffsetsResponse(offset=off, log_start_offset=part.log_start,
                                             log_end_offset=part.log_end)
            if isinstance(req, m.ProduceRequest):
                if req.topic not in self.topics:
                    raise UnknownTopicError(f"topic {req.topic!r} does not exist and autoCreateTopics=false")
                if req.partition == m.ANY_PARTITION:
                    req.partition = random.randrange(len(self.topics[req.topic]))
                part = self._part(req.topic, req.partition)
                try:
                    header = validate_batch(req.records, MAX_MESSAGE_BYTES, MAX_BATCH_BYTES)
                except InvalidArgument as exc:
                    raise MessageTooLargeError(str(exc)) from None
                except ProtocolError as exc:
                    raise CorruptMessageError(str(exc)) from None
                batch = bytearray(req.records)
                base = part.log_end
                base_id = make_message_id(self.broker_id, partition_tag(req.topic, req.partition), base)
                now = int(time.time() * 1000)
                stamp(batch, base, base_id, now)
                part.batches.append(bytes(batch))
                part.log_end += header.record_count
                self.appended.notify_all()
                return m.ProduceResponse(partition=req.partition, base_offset=base, base_message_id=base_id,
                                         append_time_ms=now)
            if isinstance(req, m.FetchRequest):
                return self._fetch(req)
            raise BrokerError(f"fake broker does not implement {type(req).__name__}")

    def _offset_for_timestamp(self, topic: str, partition: int, timestamp_ms: int) -> int:
        """The first offset whose record timestamp is >= ``timestamp_ms``; the log end when none is."""
        part = self.topics[topic][partition]
        for b in part.batches:
            header = read_header(b)
            if header.max_timestamp_ms < timestamp_ms:
                continue
            for message in decode_batch(b, topic, partition, header):
                if message.timestamp_ms >= timestamp_ms:
                    return message.offset
        return part.log_end

    def _fetch(self, req: m.FetchRequest) -> m.FetchResponse:
        """As metaq.broker.handlers.fetch; called with the lock held (long polling waits on ``appended``)."""
        part = self._part(req.topic, req.partition)
        if req.max_bytes <= 0:
            raise InvalidRequestError(f"max_bytes must be > 0; got {req.max_bytes}")
        if not (req.offset >= 0 and part.log_start <= req.offset <= part.log_end):
            # the valid range travels with the error
            return m.FetchResponse(error_code=OffsetOutOfRangeError.code,
                                   error_message=f"offset {req.offset} is out of range for {req.topic}-{req.partition}:"
                                                 f" valid offsets are {part.log_start}..{part.log_end}",
                                   log_start_offset=part.log_start, log_end_offset=part.log_end)
        if req.offset >= part.log_end and req.max_wait_ms > 0:
            self.appended.wait_for(lambda: part.log_end > req.offset or self._stopped,
                                   min(req.max_wait_ms, MAX_WAIT_MS_CAP) / 1000)
        max_bytes = min(req.max_bytes, MAX_TRANSFER_BYTES)
        out: list[bytes] = []
        size = 0
        for b in part.batches:
            if read_header(b).next_offset <= req.offset:
                continue
            if out and size + len(b) > max_bytes:
                break  # whole batches only; the first is sent whole even when larger than max_bytes
            out.append(b)
            size += len(b)
        return m.FetchResponse(log_start_offset=part.log_start, log_end_offset=part.log_end, records=b"".join(out))
