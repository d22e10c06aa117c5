"""An in-memory broker on a thread, speaking the real wire protocol through ServerConnection.

Only for unit tests of the blocking client and the Spark source's pure logic: it answers
ApiVersions, Metadata, ListOffsets, Fetch and Produce, stamps batches like a broker, and can drop the
head of a partition (what retention does) so data-loss handling can be tested without waiting for a
retention schedule. Integration tests use the real broker.
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
    OffsetOutOfRangeError,
    UnknownPartitionError,
    UnknownTopicError,
)
from metaq.protocol import messages as m
from metaq.protocol.codec import NEED_DATA, BadRequest, ServerConnection
from metaq.protocol.records import read_header, stamp, validate_batch
from metaq.types import make_message_id, partition_tag


@dataclass
class FakePartition:
    batches: list[bytes] = field(default_factory=list)
    log_start: int = 0
    log_end: int = 0


class FakeBroker:
    def __init__(self, topics: dict[str, int] | None = None, broker_id: int = 0,
                 max_fetch_batches: int | None = None, auto_create_partitions: int = 0) -> None:
        self.auto_create_partitions = auto_create_partitions
        self.broker_id = broker_id
        self.topics: dict[str, list[FakePartition]] = {
            name: [FakePartition() for _ in range(n)] for name, n in (topics or {}).items()}
        self.max_fetch_batches = max_fetch_batches
        self.lock = threading.Lock()
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
        self._stopped = True
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
                if req.timestamp_ms == -2:
                    off = part.log_start
                elif req.timestamp_ms == -1:
                    off = part.log_end
                else:
                    off = part.log_end
                    for b in part.batches:
                        h = read_header(b)
                        if h.max_timestamp_ms >= req.timestamp_ms:
                            off = h.base_offset
                            break
                return m.ListOffsetsResponse(offset=off, log_start_offset=part.log_start,
                                             log_end_offset=part.log_end)
            if isinstance(req, m.ProduceRequest):
                if req.topic not in self.topics and self.auto_create_partitions:
                    self.topics[req.topic] = [FakePartition() for _ in range(self.auto_create_partitions)]
                if req.partition == m.ANY_PARTITION and req.topic in self.topics:
                    req.partition = random.randrange(len(self.topics[req.topic]))
                part = self._part(req.topic, req.partition)
                header = validate_batch(req.records, 1 << 20, 16 << 20)
                batch = bytearray(req.records)
                base = part.log_end
                base_id = make_message_id(self.broker_id, partition_tag(req.topic, req.partition), base)
                now = int(time.time() * 1000)
                stamp(batch, base, base_id, now)
                part.batches.append(bytes(batch))
                part.log_end += header.record_count
                return m.ProduceResponse(partition=req.partition, base_offset=base, base_message_id=base_id,
                                         append_time_ms=now)
            if isinstance(req, m.FetchRequest):
                part = self._part(req.topic, req.partition)
                if not part.log_start <= req.offset <= part.log_end:
                    raise OffsetOutOfRangeError(
                        f"offset {req.offset} outside {part.log_start}..{part.log_end}")
                out: list[bytes] = []
                size = 0
                for b in part.batches:
                    h = read_header(b)
                    if h.next_offset <= req.offset:
                        continue
                    if size + len(b) > req.max_bytes:
                        # a cut-off tail, as a real broker reading a file slice would send
                        out.append(b[: max(0, req.max_bytes - size)])
                        break
                    out.append(b)
                    size += len(b)
                    if self.max_fetch_batches and len(out) >= self.max_fetch_batches:
                        break
                return m.FetchResponse(log_start_offset=part.log_start, log_end_offset=part.log_end,
                                       records=b"".join(out))
            raise BrokerError(f"fake broker does not implement {type(req).__name__}")
