"""The broker: an asyncio server that owns the partition logs and answers the wire protocol.

One connection = one :class:`BrokerProtocol`; what connections share (their count against
maxConnections, the idle and handshake timeouts, the budget of unfinished frames) is a
:class:`ConnectionRegistry`. :class:`Broker` is the network-free core: it sees a connection only as a
:class:`Session`. Requests on a connection are handled concurrently
(a produce waiting for its group-commit fsync does not hold up the next produce: that is what lets one
fsync cover many batches) but answered strictly in request order, as the protocol requires.
A fetch reply sends the stored batches straight from the segment file with ``loop.sendfile``.
"""

from __future__ import annotations

import asyncio
import asyncio.selector_events
import contextlib
import dataclasses
import functools
import json
import logging
import os
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from metaq import __version__
from metaq.broker.config import (
    BrokerConfig,
    TopicConfig,
    TopicSettings,
    diff_topics,
    load_config,
    merge_topic_configs,
    parse_config,
    parse_topic_options,
    topic_options_text,
)
from metaq.broker.filters import filter_fetched, group_filter
from metaq.broker.groups import GroupCoordinator, validate_group
from metaq.broker.stats import BrokerStats
from metaq.broker.topic_options import TopicOptionsStore
from metaq.broker.waiters import FetchWaiters
from metaq.errors import (
    BrokerError,
    BrokerStoppingError,
    ConfigError,
    CorruptMessageError,
    DiskFullError,
    InvalidArgument,
    InvalidRequestError,
    InvalidTopicError,
    MessageNotFoundError,
    MessageTooLargeError,
    OffsetOutOfRangeError,
    PartitionClosedError,
    ProtocolError,
    StorageError,
    StorageFailureError,
    StoredDataCorruptError,
    TooManyConnectionsError,
    TooManyRequestsError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownServerError,
    UnknownTopicError,
)
from metaq.protocol import messages as m
from metaq.protocol import schema
from metaq.protocol.codec import NEED_DATA, BadRequest, RequestEvent, RequestHeader, ServerConnection
from metaq.protocol.records import validate_batch
from metaq.storage import LogConfig, LogManager, OffsetOutOfRange, PartitionLog
from metaq.storage.errors import DamagedData, DiskFull
from metaq.types import validate_topic

log = logging.getLogger("metaq.broker")

SENDFILE_MIN_BYTES = 16 * 1024
"""Smaller fetch replies are read into memory and written in one go: cheaper than a sendfile round."""
MAX_PIPELINED_REQUESTS = 1024
"""Per connection; past it the broker stops reading the socket until replies drain (backpressure)."""
DEFAULT_PARTITIONS = -1
"""CreateTopic's num_partitions for "the broker's numPartitions"; any other value must be in range."""
PARTITIONS_PER_TOPIC_MAX = 10_000
LONG_POLL_MAX_MS = 600_000
"""A fetch's max_wait_ms is cut to this."""
_PRODUCE = m.ProduceRequest.API_KEY
_FETCH = m.FetchRequest.API_KEY


@dataclass(slots=True)
class Session:
    """A client connection as the request handlers see it: the transport creates one per connection."""

    peer: str = "?"
    waiting_fetches: int = 0
    """Long polls of this connection waiting now (bounded by maxWaitingFetchesPerConnection)."""


def _topic_error_code(name: str) -> int:
    """INVALID_TOPIC for a name no topic can have, else UNKNOWN_TOPIC (per-topic codes in Metadata)."""
    try:
        validate_topic(name)
    except InvalidArgument:
        return InvalidTopicError.code
    return UnknownTopicError.code


@dataclass
class TopicState:
    settings: TopicSettings
    num_partitions: int
    closed: set[int] = field(default_factory=set)
    """Partitions closed for publishing (MetaQ's `metaq topic close`): produce gets 403."""


class _Reply:
    """One answer slot; replies leave the connection in slot order."""

    __slots__ = ("data", "done", "file_slice", "header")

    def __init__(self, header: RequestHeader | None) -> None:
        self.header = header
        self.done = False
        self.data: bytes = b""
        self.file_slice: Any = None


class _SliceFile:
    """What ``loop.sendfile`` needs from a file: the fd, plus seek/readinto for its copying fallback.

    Reads use pread with our own position, so the log's shared fd offset is never moved.
    """

    def __init__(self, fd: int, position: int) -> None:
        self._fd = fd
        self._pos = position

    def fileno(self) -> int:
        return self._fd

    def seek(self, position: int, whence: int = 0) -> int:
        self._pos = position
        return position

    def readinto(self, buf: Any) -> int:
        data = os.pread(self._fd, len(buf), self._pos)
        n = len(data)
        buf[:n] = data
        self._pos += n
        return n


class Broker:
    """Topics, partitions and the request handlers. Network-free: :class:`BrokerProtocol` feeds it."""

    def __init__(self, config: BrokerConfig, *, config_path: str | None = None,
                 sync: Callable[[int], None] = os.fdatasync) -> None:
        """``sync`` is the fdatasync the logs use; tests inject one that is held, counted or fails."""
        self.config = config
        """The effective configuration: server.ini and flags, plus the options of created topics."""
        self._file_config = config
        self.config_path = config_path
        self.topic_options = TopicOptionsStore(config.data_path)
        self._created: dict[str, TopicConfig] = {}
        """Options of topics created with CreateTopic configs (as if server.ini had their sections)."""
        self._creating: set[str] = set()
        self.stats = BrokerStats()
        self.waiters = FetchWaiters(config.max_waiting_fetches, config.max_waiting_fetches_per_connection)
        self.logs = LogManager(config.data_path, config.broker_id, self._log_config(None),
                               load_in_parallel=config.load_message_stores_in_parallel, sync=sync)
        self.topics: dict[str, TopicState] = {}
        self.stopping = False
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._handlers: dict[int, Callable[[Any], Any]] = {
            0: self.handle_api_versions, 1: self.handle_metadata, 2: self.handle_create_topic,
            3: self.handle_delete_topic, 4: self.handle_produce, 5: self.handle_fetch,
            6: self.handle_list_offsets, 12: self.handle_stats, 15: self.handle_partition_state,
            16: self.handle_reload, 17: self.handle_lookup_message, 18: self.handle_verify,
        }
        self.port = 0
        self.host = config.host_name
        self.groups = GroupCoordinator(self.partition_refs, config.data_path, broker_id=config.broker_id)
        self._handlers.update(self.groups.handlers())

    # -- configuration ------------------------------------------------------------------------

    def _log_config(self, topic: str | None) -> LogConfig:
        c = self.config
        s = c.topic_settings(topic) if topic else None
        return LogConfig(
            segment_bytes_max=c.max_segment_bytes,
            unflush_threshold=s.unflush_threshold if s else c.unflush_threshold,
            unflush_interval_ms=s.unflush_interval_ms if s else c.unflush_interval_ms,
            delete_policy=s.delete_policy if s else c.delete_policy,
            max_message_bytes=c.max_message_bytes,
            max_batch_bytes=c.max_batch_bytes,
        )

    def _effective(self, file_config: BrokerConfig) -> BrokerConfig:
        """``file_config`` with the created topics' options as [topic=...] sections under its own.

        Where both set a key, server.ini's section wins: the operator's file is what a reload applies.
        """
        if not self._created:
            return file_config
        topics = dict(self._created)
        for name, section in file_config.topics.items():
            topics[name] = merge_topic_configs(topics[name], section) if name in topics else section
        return dataclasses.replace(file_config, topics=topics)

    def open(self) -> None:
        """Load existing partitions and the configured topics (blocking: call before serving)."""
        self.logs.open()
        self._created = self.topic_options.load()
        self.config = self._effective(self._file_config)
        for topic, partitions in self.logs.topics().items():
            self.logs.set_topic_config(topic, self._log_config(topic))
            self._topic_state(topic, max(partitions) + 1)
        for topic in self.config.topics:
            self._ensure_topic(topic, None)
        self.groups.open()

    def partition_refs(self, topic: str) -> list[tuple[int, int]]:
        """(broker id, partition) of a topic's partitions here, for the group coordinator."""
        state = self.topics.get(topic)
        return [(self.config.broker_id, p) for p in range(state.num_partitions)] if state else []

    def _topic_state(self, topic: str, num_partitions: int) -> TopicState:
        """Create or update a topic's state; a topic never shrinks (its partitions hold data)."""
        state = self.topics.get(topic)
        settings = self.config.topic_settings(topic)
        if state is None:
            state = self.topics[topic] = TopicState(settings, num_partitions)
        else:
            state.settings = settings
            state.num_partitions = max(state.num_partitions, num_partitions)
        return state

    def _ensure_topic(self, topic: str, num_partitions: int | None) -> TopicState:
        """Open (creating if needed) every partition of a topic.

        ``num_partitions``: an explicit count (CreateTopic); None uses the topic's numPartitions — for a
        topic with a [topic=...] section that count also grows an existing topic on reload.
        """
        settings = self.config.topic_settings(topic)
        if num_partitions and num_partitions > 0:
            n = num_partitions
        elif topic in self.topics and not settings.configured:
            n = self.topics[topic].num_partitions
        else:
            n = settings.num_partitions
        self.logs.set_topic_config(topic, self._log_config(topic))
        state = self._topic_state(topic, n)
        for p in range(state.num_partitions):
            self.logs.get_or_create(topic, p)
        return state

    def reload(self, new_config: BrokerConfig) -> list[str]:
        """Apply `[topic=…]` changes live (SIGHUP / metaq admin reload); [system] needs a restart."""
        self._file_config = new_config
        new_config = self._effective(new_config)
        diff = diff_topics(self.config, new_config)
        self.config = new_config
        affected = set(self.topics) | set(new_config.topics) if diff.defaults_changed else set(diff.topics)
        for topic in sorted(affected):
            if topic in self.topics or topic in new_config.topics:
                self._ensure_topic(topic, None)
        return sorted(affected)

    def apply_retention(self, topics: list[str]) -> RetentionOutcome:
        """deletePolicy for these topics' partitions (blocking: run in an executor). A partition that
        fails is logged and named in the outcome; it does not hold back the others (retried next run)."""
        outcome = RetentionOutcome()
        for topic in topics:
            for partition in self.logs.partitions(topic):
                plog = self.logs.get(topic, partition)
                if plog is None:
                    continue
                try:
                    gone = plog.apply_retention()
                except StorageError as exc:
                    outcome.failures[f"{topic}-{partition}"] = str(exc)
                    log.error("retention of %s-%d failed (retried at the next run): %s", topic, partition, exc)
                    continue
                if gone:
                    outcome.removed[f"{topic}-{partition}"] = gone
        return outcome

    # -- request plumbing ---------------------------------------------------------------------

    def dispatch(self, event: RequestEvent, session: Session | None = None) -> Any:
        """The response, or an awaitable of it. Errors become the API's own error response.

        ``session`` is the connection the request came on, as the handlers see it (a fetch counts its
        long polls against it).
        """
        api_key = event.header.api_key
        handler = self._handlers.get(api_key)
        if handler is None:
            name = m.APIS[api_key].name
            return m.error_response(api_key, InvalidRequestError.code,
                                    f"{name} is not served by this broker version (consumer groups come later)")
        if self.stopping and api_key in (_PRODUCE, _FETCH):
            return m.error_response(api_key, BrokerStoppingError.code, BrokerStoppingError.hint)
        try:
            if api_key == _FETCH:
                return self.handle_fetch(event.request, session)
            return handler(event.request)
        except Exception as exc:
            return self.error_reply(api_key, exc)

    def error_reply(self, api_key: int, exc: BaseException) -> Any:
        if isinstance(exc, BrokerError):
            code, msg = exc.code, exc.message
        elif isinstance(exc, OffsetOutOfRange):
            code, msg = OffsetOutOfRangeError.code, str(exc)
        elif isinstance(exc, DamagedData):
            code, msg = StoredDataCorruptError.code, str(exc)
        elif isinstance(exc, DiskFull):
            code, msg = DiskFullError.code, str(exc)
        elif isinstance(exc, (InvalidArgument, ConfigError)):
            code, msg = InvalidRequestError.code, str(exc)
        elif isinstance(exc, ProtocolError):
            code, msg = CorruptMessageError.code, str(exc)
        elif isinstance(exc, StorageError):
            code, msg = StorageFailureError.code, str(exc)
        else:
            log.exception("unexpected error handling %s", m.APIS[api_key].name)
            code, msg = UnknownServerError.code, f"{type(exc).__name__}: {exc}"
        return m.error_response(api_key, code, msg)

    # -- topics and partitions ----------------------------------------------------------------

    def _check_topic_name(self, topic: str) -> None:
        try:
            validate_topic(topic)
        except InvalidArgument as exc:
            raise InvalidTopicError(str(exc)) from None

    def _partition_log(self, topic: str, partition: int, *, create: bool = False) -> tuple[TopicState, PartitionLog]:
        self._check_topic_name(topic)
        state = self.topics.get(topic)
        if state is None:
            if not (create and self.config.auto_create_topics):
                raise UnknownTopicError(f"topic {topic!r} does not exist on broker {self.config.broker_id}")
            state = self._ensure_topic(topic, None)
        if not 0 <= partition < state.num_partitions:
            raise UnknownPartitionError(
                f"topic {topic!r} has partitions 0..{state.num_partitions - 1} on this broker; got {partition}")
        plog = self.logs.get(topic, partition) or self.logs.get_or_create(topic, partition)
        return state, plog

    # -- handlers -----------------------------------------------------------------------------

    def handle_api_versions(self, req: m.ApiVersionsRequest) -> m.ApiVersionsResponse:
        apis = [m.ApiVersionRange(k, s.min_version, s.max_version) for k, s in sorted(m.APIS.items())
                if k in self._handlers]
        return m.ApiVersionsResponse(broker_id=self.config.broker_id, server_version=__version__, apis=apis)

    def handle_metadata(self, req: m.MetadataRequest) -> m.MetadataResponse:
        brokers = [m.BrokerInfo(self.config.broker_id, self.host, self.port)]
        names = sorted(self.topics) if req.topics is None else req.topics
        out = []
        for name in names:
            state = self.topics.get(name)
            if state is None:
                out.append(m.TopicInfo(name, _topic_error_code(name), []))
                continue
            s = state.settings
            parts = [m.PartitionInfo(p, self.config.broker_id, 0, s.accept_publish and p not in state.closed,
                                     s.accept_subscribe) for p in range(state.num_partitions)]
            out.append(m.TopicInfo(name, 0, parts))
        return m.MetadataResponse(brokers=brokers, topics=out)

    def handle_create_topic(self, req: m.CreateTopicRequest) -> Any:
        topic = req.topic
        self._check_topic_name(topic)
        if topic in self.topics:
            raise TopicExistsError(f"topic {topic!r} already exists with "
                                   f"{self.topics[topic].num_partitions} partitions")
        if topic in self._creating:
            raise TopicExistsError(f"topic {topic!r} is being created by another request")
        if req.num_partitions != DEFAULT_PARTITIONS and not 1 <= req.num_partitions <= PARTITIONS_PER_TOPIC_MAX:
            raise InvalidRequestError(
                f"num_partitions must be 1..{PARTITIONS_PER_TOPIC_MAX} or -1 (broker default); "
                f"got {req.num_partitions}")
        if not req.configs:
            state = self._ensure_topic(topic, req.num_partitions)
            return m.CreateTopicResponse(num_partitions=state.num_partitions)
        try:
            options = parse_topic_options(topic, [(e.key, e.value) for e in req.configs], filters=False)
        except ConfigError as exc:
            raise InvalidRequestError(str(exc)) from None
        if options.num_partitions is not None and req.num_partitions not in (DEFAULT_PARTITIONS,
                                                                             options.num_partitions):
            raise InvalidRequestError(f"num_partitions {req.num_partitions} and configs numPartitions="
                                      f"{options.num_partitions} disagree; give one of them")
        count = (req.num_partitions if req.num_partitions != DEFAULT_PARTITIONS
                 else options.num_partitions or self.config.topic_settings(topic).num_partitions)
        self._creating.add(topic)
        return self._create_with_options(dataclasses.replace(options, num_partitions=count))

    async def _create_with_options(self, options: TopicConfig) -> m.CreateTopicResponse:
        """Store the options (off the event loop), then create the topic as if server.ini named it."""
        topic = options.name
        try:
            try:
                await asyncio.get_running_loop().run_in_executor(
                    None, self.topic_options.save, topic, topic_options_text(options))
            except OSError as exc:
                raise StorageFailureError(f"cannot store the options of topic {topic!r}: {exc}") from None
            self._created[topic] = options
            self.config = self._effective(self._file_config)
            try:
                state = self._ensure_topic(topic, options.num_partitions)
            except Exception:  # no topic: no stored options either
                del self._created[topic]
                self.config = self._effective(self._file_config)
                await asyncio.get_running_loop().run_in_executor(None, self.topic_options.remove, topic)
                raise
        finally:
            self._creating.discard(topic)
        return m.CreateTopicResponse(num_partitions=state.num_partitions)

    def handle_delete_topic(self, req: m.DeleteTopicRequest) -> m.DeleteTopicResponse:
        self._check_topic_name(req.topic)
        if req.topic not in self.topics:
            raise UnknownTopicError(f"topic {req.topic!r} does not exist")
        del self.topics[req.topic]
        self.logs.delete_topic(req.topic)
        if self._created.pop(req.topic, None) is not None:
            self.topic_options.remove(req.topic)
            self.config = self._effective(self._file_config)
        self.stats.forget_topic(req.topic)
        self.waiters.notify_all()
        return m.DeleteTopicResponse()

    def handle_produce(self, req: m.ProduceRequest) -> Any:
        topic, partition = req.topic, req.partition
        self._check_topic_name(topic)
        state = self.topics.get(topic)
        if partition < m.ANY_PARTITION:  # refused before a dynamic topic is created for it
            valid = f"partitions 0..{state.num_partitions - 1} or" if state is not None else "a partition >= 0 or"
            raise UnknownPartitionError(f"topic {topic!r} takes {valid} -1 (any open partition); got {partition}")
        if state is None:
            if not self.config.auto_create_topics:
                raise UnknownTopicError(f"topic {topic!r} does not exist and autoCreateTopics=false")
            state = self._ensure_topic(topic, None)
        if not state.settings.accept_publish:
            raise PartitionClosedError(f"topic {topic!r} does not accept publishing (acceptPublish=false)")
        if partition == m.ANY_PARTITION:
            open_parts = [p for p in range(state.num_partitions) if p not in state.closed]
            if not open_parts:
                raise PartitionClosedError(f"every partition of topic {topic!r} is closed")
            partition = random.choice(open_parts)
        elif partition in state.closed:
            raise PartitionClosedError(f"partition {topic}-{partition} is closed for publishing")
        _state, plog = self._partition_log(topic, partition)
        counters = self.stats.partition(topic, partition)
        try:
            header = validate_batch(req.records, self.config.max_message_bytes, self.config.max_batch_bytes)
        except InvalidArgument as exc:
            counters.put_failures += 1
            raise MessageTooLargeError(str(exc)) from None
        except ProtocolError as exc:
            counters.put_failures += 1
            raise CorruptMessageError(str(exc)) from None
        result = plog.append(req.records, header)
        counters.put_requests += 1
        counters.put_messages += header.record_count
        counters.put_bytes += header.total_bytes
        self.waiters.notify(topic, partition)
        response = m.ProduceResponse(partition=partition, base_offset=result.base_offset,
                                     base_message_id=result.base_message_id, append_time_ms=result.append_time_ms)
        if result.wait_for_durable and not result.durable.done():
            return self._await_durable(result.durable, response)
        return response

    async def _await_durable(self, durable: Any, response: m.ProduceResponse) -> m.ProduceResponse:
        try:
            await asyncio.wrap_future(durable)
        except Exception as exc:
            return m.ProduceResponse(error_code=StorageFailureError.code,
                                     error_message=f"the batch was written but not made durable: {exc}")
        return response

    def _resolve_fetch_offset(self, plog: PartitionLog, offset: int) -> tuple[int, int]:
        """(offset to read, reset_offset) applying updateConsumerOffsets to an out-of-range offset."""
        start, end = plog.log_start_offset, plog.log_end_offset
        if start <= offset <= end:
            return offset, -1
        if not self.config.update_consumer_offsets:
            raise OffsetOutOfRangeError(
                f"offset {offset} is out of range for {plog.topic}-{plog.partition}: valid offsets are "
                f"{start}..{end} (earliest..latest)")
        nearest = start if offset < start else end
        return nearest, nearest

    def handle_fetch(self, req: m.FetchRequest, session: Session | None = None) -> Any:
        state, plog = self._partition_log(req.topic, req.partition)
        if req.group:
            validate_group(req.group)
        if not state.settings.accept_subscribe:
            raise PartitionClosedError(f"topic {req.topic!r} does not accept subscribing (acceptSubscribe=false)")
        if req.max_bytes <= 0:
            raise InvalidRequestError(f"max_bytes must be > 0; got {req.max_bytes}")
        try:
            if req.offset < 0:
                raise OffsetOutOfRangeError(f"offset must be >= 0; got {req.offset}")
            offset, reset = self._resolve_fetch_offset(plog, req.offset)
        except OffsetOutOfRangeError as exc:
            # the valid range travels with the error, so a consumer can reposition without asking again
            return m.FetchResponse(error_code=exc.code, error_message=exc.message,
                                   log_start_offset=plog.log_start_offset, log_end_offset=plog.log_end_offset)
        if offset >= plog.log_end_offset and req.max_wait_ms > 0:
            return self._long_poll(req, plog, offset, reset, session)
        return self._fetch_now(req, plog, offset, reset)

    async def _long_poll(self, req: m.FetchRequest, plog: PartitionLog, offset: int, reset: int,
                         session: Session | None) -> Any:
        deadline = time.monotonic() + min(req.max_wait_ms, LONG_POLL_MAX_MS) / 1000
        while offset >= plog.log_end_offset and not self.stopping:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            await self.waiters.wait(req.topic, req.partition, remaining, session)
            if self.logs.get(req.topic, req.partition) is not plog:
                raise UnknownTopicError(f"topic {req.topic!r} was deleted while the fetch waited")
        return self._fetch_now(req, plog, offset, reset)

    def _fetch_now(self, req: m.FetchRequest, plog: PartitionLog, offset: int, reset: int) -> Any:
        max_bytes = min(req.max_bytes, self.config.max_transfer_bytes)
        counters = self.stats.partition(req.topic, req.partition)
        counters.get_requests += 1
        try:
            try:
                fslice = plog.read(offset, max_bytes)
            except OffsetOutOfRange:
                offset, reset = self._resolve_fetch_offset(plog, offset)
                fslice = plog.read(offset, max_bytes)
        except DamagedData as exc:
            counters.corrupt_reads += 1
            return m.FetchResponse(error_code=StoredDataCorruptError.code, error_message=str(exc),
                                   log_start_offset=plog.log_start_offset, log_end_offset=plog.log_end_offset,
                                   damaged_offset=exc.offset, resume_offset=exc.resume_offset)
        response = m.FetchResponse(log_start_offset=plog.log_start_offset, log_end_offset=plog.log_end_offset,
                                   reset_offset=reset)
        if fslice.size == 0:
            fslice.release()
            counters.get_misses += 1
            return response
        counters.get_bytes += fslice.size
        accept = group_filter(self.topics[req.topic].settings, req.group) if req.group else None
        if accept is not None:
            # a server-side filter for this group ([topic=...] group.NAME=module:callable): the
            # stored bytes are decoded and re-encoded without the rejected messages, so no sendfile
            try:
                data = fslice.read_bytes()
            finally:
                fslice.release()
            response.records = filter_fetched(data, accept, req.topic, req.partition)
            return response
        if fslice.size < SENDFILE_MIN_BYTES:
            try:
                response.records = fslice.read_bytes()
            finally:
                fslice.release()
            return response
        return _FileReply(response, fslice)

    def handle_list_offsets(self, req: m.ListOffsetsRequest) -> m.ListOffsetsResponse:
        _state, plog = self._partition_log(req.topic, req.partition)
        if req.timestamp_ms == m.EARLIEST_TIMESTAMP:
            offset = plog.log_start_offset
        elif req.timestamp_ms == m.LATEST_TIMESTAMP:
            offset = plog.log_end_offset
        elif req.timestamp_ms < 0:
            raise InvalidRequestError(f"timestamp must be -2 (earliest), -1 (latest) or >= 0; got {req.timestamp_ms}")
        else:
            offset = plog.offset_for_timestamp(req.timestamp_ms)
        return m.ListOffsetsResponse(offset=offset, log_start_offset=plog.log_start_offset,
                                     log_end_offset=plog.log_end_offset)

    def handle_stats(self, req: m.StatsRequest) -> m.StatsResponse:
        if req.topic is not None:
            self._check_topic_name(req.topic)
        snap = self.stats.snapshot(req.topic)
        snap["broker_id"] = self.config.broker_id
        snap["waiting_fetches"] = self.waiters.waiting
        snap["version"] = __version__
        for tname, tstats in snap["topics"].items():
            for pname, pstats in tstats["partitions"].items():
                plog = self.logs.get(tname, int(pname))
                if plog is not None:
                    pstats["log_start_offset"] = plog.log_start_offset
                    pstats["log_end_offset"] = plog.log_end_offset
        snap["storage"] = self.storage_report(req.topic)
        return m.StatsResponse(stats_json=json.dumps(snap).encode())

    def storage_report(self, topic: str | None) -> dict[str, Any]:
        """Partitions with something to say about their data: a recovery cut at open, damaged ranges."""
        out: dict[str, Any] = {}
        for plog in sorted(self.logs.logs(), key=lambda lg: (lg.topic, lg.partition)):
            tname, partition = plog.topic, plog.partition
            if topic is not None and tname != topic:
                continue
            entry: dict[str, Any] = {}
            if not plog.recovery.clean:
                entry["recovery"] = plog.recovery.to_json()
            damaged = plog.damaged_ranges
            if damaged:
                entry["damaged"] = [r.to_json() for r in damaged]
            if entry:
                out[f"{tname}-{partition}"] = entry
        return out

    def handle_partition_state(self, req: m.PartitionStateRequest) -> m.PartitionStateResponse:
        self._check_topic_name(req.topic)
        state = self.topics.get(req.topic)
        if state is None:
            raise UnknownTopicError(f"topic {req.topic!r} does not exist")
        if req.partition == -1:
            targets = list(range(state.num_partitions))
        elif 0 <= req.partition < state.num_partitions:
            targets = [req.partition]
        else:
            raise UnknownPartitionError(f"topic {req.topic!r} has no partition {req.partition}")
        for p in targets:
            if req.open:
                state.closed.discard(p)
            else:
                state.closed.add(p)
        return m.PartitionStateResponse()

    def handle_reload(self, req: m.ReloadRequest) -> m.ReloadResponse:
        if not self.config_path:
            raise InvalidRequestError("the broker was started without -f server.ini: nothing to reload")
        try:
            changed = self.reload(load_broker_config(self.config_path, self.cli_overrides))
        except ConfigError as exc:  # the operator's mistake, not the broker's: one line, no traceback
            log.error("reload of %s refused: %s", self.config_path, exc)
            raise InvalidRequestError(f"{exc} (the running configuration is unchanged)") from None
        log.info("reloaded %s: topics changed: %s", self.config_path, ", ".join(changed) or "none")
        return m.ReloadResponse(changed_topics=changed)

    cli_overrides: dict[str, str] = {}

    def handle_lookup_message(self, req: m.LookupMessageRequest) -> m.LookupMessageResponse:
        try:
            topic, partition, offset = self.logs.resolve_message_id(req.message_id)
        except StorageError as exc:
            raise MessageNotFoundError(str(exc)) from None
        plog = self.logs.get(topic, partition)
        if plog is None or not plog.log_start_offset <= offset < plog.log_end_offset:
            raise MessageNotFoundError(f"message {req.message_id:032x} is no longer stored (retention)")
        return m.LookupMessageResponse(topic=topic, partition=partition, offset=offset)

    async def handle_verify(self, req: m.VerifyRequest) -> m.VerifyResponse:
        """Scrub partitions (every byte and index entry) in a worker thread; reads go on meanwhile."""
        if req.topic is not None:
            self._check_topic_name(req.topic)
            if req.topic not in self.topics:
                raise UnknownTopicError(f"topic {req.topic!r} does not exist")
        if req.partition < -1:
            raise UnknownPartitionError(f"partition must be >= 0, or -1 for every partition; got {req.partition}")
        targets = [plog for plog in sorted(self.logs.logs(), key=lambda lg: (lg.topic, lg.partition))
                   if (req.topic is None or plog.topic == req.topic)
                   and (req.partition < 0 or plog.partition == req.partition)]
        if req.topic is not None and req.partition >= 0 and not targets:
            raise UnknownPartitionError(f"topic {req.topic!r} has no partition {req.partition} on this broker")
        loop = asyncio.get_running_loop()
        reports = await loop.run_in_executor(None, lambda: [plog.verify().to_json() for plog in targets
                                                            if not plog.closed])
        return m.VerifyResponse(report_json=json.dumps(reports).encode())

    # -- lifecycle ----------------------------------------------------------------------------

    def request_started(self) -> None:
        self.in_flight += 1
        self._idle.clear()

    def request_finished(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    async def drain(self, timeout_s: float) -> None:
        """Wait until in-flight requests have been answered (bounded)."""
        self.stopping = True
        await self.groups.close()  # answers JoinGroups waiting for a rebalance
        self.waiters.notify_all()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout_s)

    def close(self) -> None:
        self.logs.close()


@dataclass(slots=True)
class RetentionOutcome:
    """What one retention run did: removed segment base offsets, and failures, by ``topic-partition``."""

    removed: dict[str, list[int]] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class _FileReply:
    response: m.FetchResponse
    file_slice: Any


def _oneway_produce(header: RequestHeader, body_head: bytes) -> bool:
    """Whether a produce request, from its leading fields (topic, partition, acks), expects no reply."""
    try:
        _topic, pos = schema.STRING.decode(body_head, 0)
        _partition, pos = schema.INT32.decode(body_head, pos)
        acks, _ = schema.INT16.decode(body_head, pos)
    except ProtocolError:
        return False
    return bool(acks == 0)


def load_broker_config(path: str | None, overrides: dict[str, str]) -> BrokerConfig:
    """server.ini (or the defaults) with command-line flags applied on top."""
    base = load_config(path) if path else parse_config("", "<defaults>")
    return base.with_overrides(overrides) if overrides else base


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The transport's limits (server.ini names in the docs); 0 disables a timeout."""

    max_connections: int = 10_000
    idle_timeout_s: float = 600.0
    handshake_timeout_s: float = 30.0
    partial_frames_bytes_max: int = 128 * 1024 * 1024

    @classmethod
    def from_config(cls, config: BrokerConfig) -> ConnectionLimits:
        return cls(config.max_connections, config.connection_idle_timeout_s,
                   config.connection_handshake_timeout_s, config.max_partial_frames_bytes)


REFUSING_CONNECTIONS_MAX = 256
"""Connections over maxConnections waiting for their first request to be refused with an answer; past it
more are closed at once, without one."""
REFUSAL_TIMEOUT_S = 5.0
"""How long a refused connection may take to send the header of its first request."""
SWEEP_INTERVAL_MAX_S = 1.0


class ConnectionRegistry:
    """What the broker's connections share: their count, the idle sweep and the partial-frame budget.

    Transport bookkeeping only (the request handlers never see it). Every operation is O(1) per
    connection event, except two: the sweep, once per SWEEP_INTERVAL_MAX_S (or a quarter of the
    shortest timeout), walks the open connections; and shedding, which happens only past the
    partial-frame budget, looks for the connection with the biggest unfinished frame.
    """

    def __init__(self, limits: ConnectionLimits, stats: BrokerStats,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self.stats = stats
        self.clock = clock
        self.open: set[BrokerProtocol] = set()
        self.refusing = 0
        self.partial_bytes = 0
        """Bytes of unfinished request frames buffered over every open connection."""

    # -- admission ----------------------------------------------------------------------------

    def admit(self, conn: BrokerProtocol) -> bool:
        """Count a new connection in, or False when maxConnections are open (the caller refuses it)."""
        if len(self.open) >= self.limits.max_connections:
            self.stats.connections_refused += 1
            return False
        self.open.add(conn)
        self.stats.connections = len(self.open)
        self.stats.connections_total += 1
        return True

    def remove(self, conn: BrokerProtocol) -> None:
        if conn in self.open:
            self.open.discard(conn)
            self.stats.connections = len(self.open)
            self.partial_changed(conn, 0)

    def refusal_message(self) -> str:
        return (f"the broker already has {len(self.open)} connections open (maxConnections="
                f"{self.limits.max_connections}); {TooManyConnectionsError.hint.split('; ', 1)[-1]}")

    # -- unfinished frames ----------------------------------------------------------------------

    def partial_changed(self, conn: BrokerProtocol, partial_bytes: int) -> None:
        """``conn`` now buffers ``partial_bytes`` of an unfinished frame; shed frames past the budget."""
        self.partial_bytes += partial_bytes - conn.partial_bytes
        conn.partial_bytes = partial_bytes
        self.stats.partial_frame_bytes = self.partial_bytes
        while self.partial_bytes > self.limits.partial_frames_bytes_max:
            victim = max(self.open, key=lambda c: c.partial_bytes)
            if victim.partial_bytes == 0:  # pragma: no cover - the sum says otherwise
                break
            self.stats.partial_frames_refused += 1
            victim.refuse_partial_frame(
                f"the broker is buffering {self.partial_bytes} bytes of unfinished request frames, over "
                f"maxPartialFramesSize={self.limits.partial_frames_bytes_max}, and this request's was the "
                "largest; retry, or send smaller batches")

    # -- timeouts -------------------------------------------------------------------------------

    @property
    def sweep_interval_s(self) -> float | None:
        timeouts = [t for t in (self.limits.idle_timeout_s, self.limits.handshake_timeout_s) if t > 0]
        return min(SWEEP_INTERVAL_MAX_S, min(timeouts) / 4) if timeouts else None

    def sweep(self) -> int:
        """Close connections past the idle or handshake timeout; returns how many."""
        now = self.clock()
        idle_s, handshake_s = self.limits.idle_timeout_s, self.limits.handshake_timeout_s
        closed = 0
        for conn in list(self.open):
            if not conn.handshaken:
                if handshake_s > 0 and now - conn.opened_at > handshake_s:
                    conn.close_quietly(f"no request within connectionHandshakeTimeoutSeconds={handshake_s:g}",
                                       logging.INFO)
                    self.stats.connections_timed_out += 1
                    closed += 1
            elif idle_s > 0 and conn.idle and now - conn.last_active > idle_s:
                conn.close_quietly(f"idle for connectionIdleTimeoutSeconds={idle_s:g}", logging.DEBUG)
                self.stats.connections_timed_out += 1
                closed += 1
        return closed

    async def run_sweeper(self) -> None:
        interval = self.sweep_interval_s
        if interval is None:
            return
        while True:
            await asyncio.sleep(interval)
            try:
                self.sweep()
            except Exception:  # the sweeper must outlive a bug in one connection's bookkeeping
                log.exception("connection sweep failed")


class BrokerProtocol(asyncio.Protocol):
    """One client connection: decode frames, dispatch, reply in order, stream fetches with sendfile.

    Transport concerns live here and in :class:`ConnectionRegistry` (connection count, idle and
    handshake timeouts, the partial-frame budget); the :class:`Broker` sees a :class:`Session`.
    When the connection closes, its requests still running (long polls above all) are cancelled, so
    they give back their waiting-fetch slots at once.
    """

    def __init__(self, broker: Broker, registry: ConnectionRegistry) -> None:
        self.broker = broker
        self.registry = registry
        self.codec = ServerConnection(broker.config.max_frame_bytes)
        self.transport: asyncio.Transport | None = None
        self.session = Session()
        self.replies: deque[_Reply] = deque()
        self.tasks: set[asyncio.Task[Any]] = set()
        self.sending = False
        self.paused = False
        self.closed = False
        self.refused = False
        """Over maxConnections: only the first request's header is read, to answer it with the refusal."""
        self.handshaken = False
        """A whole request has arrived (before that, the handshake timeout applies)."""
        self.partial_bytes = 0
        """Bytes of the unfinished frame buffered (kept in step with the registry's sum)."""
        self.loop = asyncio.get_event_loop()
        self.opened_at = self.last_active = self.registry.clock()
        self._refusal_timer: asyncio.TimerHandle | None = None
        # uvloop has no loop.sendfile (not even its copying fallback): there, file replies are pread
        # and written; asyncio's selector loop sends them with the sendfile(2) system call.
        self.native_sendfile = isinstance(self.loop, asyncio.selector_events.BaseSelectorEventLoop)

    @property
    def idle(self) -> bool:
        """Nothing in progress: no reply owed, no request running (a waiting long poll is running)."""
        return not self.replies and not self.tasks and not self.sending

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.session.peer = self._peer()
        if not self.registry.admit(self):
            self._start_refusal()
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                import socket

                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.refused:
            self.registry.refusing -= 1
            if self._refusal_timer is not None:
                self._refusal_timer.cancel()
            return
        self.registry.remove(self)
        for task in self.tasks:
            task.cancel()  # its reply can never be sent: give back what it holds (a waiting-fetch slot)
        for reply in self.replies:
            if reply.file_slice is not None:
                reply.file_slice.release()
                reply.file_slice = None
        self.replies.clear()

    def data_received(self, data: bytes) -> None:
        if self.refused:
            self._refuse(data)
            return
        self.last_active = self.registry.clock()
        self.codec.receive_data(data)
        while True:
            try:
                event = self.codec.next_event()
            except ProtocolError as exc:
                log.warning("closing connection from %s: %s", self.session.peer, exc)
                self._abort()
                return
            if event is NEED_DATA:
                break
            self.handshaken = True
            if isinstance(event, BadRequest):
                reply = _Reply(event.header)
                self.replies.append(reply)
                self._complete(reply, m.error_response(event.header.api_key, event.error_code, str(event.error)))
                continue
            assert isinstance(event, RequestEvent)
            self._handle(event)
        partial = self.codec.partial_frame_bytes
        if partial != self.partial_bytes:
            self.registry.partial_changed(self, partial)
        if len(self.replies) > MAX_PIPELINED_REQUESTS and not self.paused and self.transport:
            self.paused = True
            self.transport.pause_reading()

    # -- limits ----------------------------------------------------------------------------------

    def _start_refusal(self) -> None:
        self.refused = True
        self.registry.refusing += 1
        if self.registry.refusing > REFUSING_CONNECTIONS_MAX:
            self._abort()  # too many at once to answer each: close without a word
            return
        self._refusal_timer = self.loop.call_later(REFUSAL_TIMEOUT_S, self._abort)

    def _refuse(self, data: bytes) -> None:
        """Answer the first request of a connection over maxConnections with TOO_MANY_CONNECTIONS."""
        self.codec.receive_data(data)
        try:
            header = self.codec.peek_header()
        except ProtocolError:
            self._abort()
            return
        if header is None:  # not even 12 bytes yet
            return
        assert self.transport is not None
        self.transport.pause_reading()
        response = m.error_response(header.api_key, TooManyConnectionsError.code, self.registry.refusal_message())
        self.transport.write(self.codec.encode_response(header, response))
        self.transport.close()

    def refuse_partial_frame(self, reason: str) -> None:
        """Drop the unfinished frame being received (the partial-frame budget is spent) and answer it
        with TOO_MANY_REQUESTS once the replies before it are out; the rest of the frame is skipped."""
        dropped = self.codec.discard_partial_frame()
        self.registry.partial_changed(self, 0)
        if dropped is None:
            log.warning("closing connection from %s: %s", self.session.peer, reason)
            self._abort()
            return
        header, body_head = dropped
        log.warning("refused a request of %s from %s: %s", m.APIS[header.api_key].name
                    if header.api_key in m.APIS else header.api_key, self.session.peer, reason)
        if header.api_key == _PRODUCE and _oneway_produce(header, body_head):
            return  # a one-way produce expects no reply: the message is dropped, as on any failure
        reply = _Reply(header)
        self.replies.append(reply)
        self._complete(reply, m.error_response(header.api_key, TooManyRequestsError.code, reason))

    def close_quietly(self, reason: str, level: int) -> None:
        """Close after what is already written (a timeout: nothing is owed to the peer)."""
        log.log(level, "closing connection from %s: %s", self.session.peer, reason)
        if self.transport is not None:
            self.transport.close()

    def _handle(self, event: RequestEvent) -> None:
        oneway = event.header.api_key == _PRODUCE and event.request.acks == 0
        reply = None if oneway else _Reply(event.header)
        if reply is not None:
            self.replies.append(reply)
        result = self.broker.dispatch(event, self.session)
        if asyncio.iscoroutine(result):
            self.broker.request_started()
            task = self.loop.create_task(result)
            self.tasks.add(task)
            task.add_done_callback(functools.partial(self._task_done, reply=reply, api_key=event.header.api_key))
        elif reply is not None:
            self._complete(reply, result)

    def _task_done(self, task: asyncio.Task[Any], *, reply: _Reply | None, api_key: int) -> None:
        self.broker.request_finished()
        self.tasks.discard(task)
        if task.cancelled():
            result: Any = m.error_response(api_key, BrokerStoppingError.code, "request cancelled")
        elif task.exception() is not None:
            result = self.broker.error_reply(api_key, task.exception())  # type: ignore[arg-type]
        else:
            result = task.result()
        if reply is None:
            if isinstance(result, _FileReply):
                result.file_slice.release()
            return
        self._complete(reply, result)

    def _complete(self, reply: _Reply, result: Any) -> None:
        if self.closed:
            if isinstance(result, _FileReply):
                result.file_slice.release()
            return
        assert reply.header is not None
        try:
            if isinstance(result, _FileReply):
                reply.data = self.codec.encode_response_head(reply.header, result.response, result.file_slice.size)
                reply.file_slice = result.file_slice
            else:
                reply.data = self.codec.encode_response(reply.header, result)
        except Exception as exc:
            log.exception("cannot encode reply")
            reply.data = self.codec.encode_response(reply.header,
                                                    m.error_response(reply.header.api_key, UnknownServerError.code,
                                                                     str(exc)))
        reply.done = True
        self._pump()

    def _pump(self) -> None:
        """Write every finished reply at the head of the queue; a file reply hands over to sendfile."""
        if self.sending or self.transport is None:
            return
        out: list[bytes] = []
        while self.replies and self.replies[0].done:
            reply = self.replies.popleft()
            out.append(reply.data)
            if reply.file_slice is not None and not self.native_sendfile:
                fslice, reply.file_slice = reply.file_slice, None
                try:
                    out.append(fslice.read_bytes())
                finally:
                    fslice.release()
            elif reply.file_slice is not None:
                self.transport.write(b"".join(out))
                out = []
                self.sending = True
                self.loop.create_task(self._sendfile(reply.file_slice))
                return
        if out:
            self.transport.write(b"".join(out) if len(out) > 1 else out[0])
            self.last_active = self.registry.clock()
        if self.paused and len(self.replies) <= MAX_PIPELINED_REQUESTS // 2:
            self.paused = False
            self.transport.resume_reading()

    async def _sendfile(self, fslice: Any) -> None:
        try:
            if self.transport is not None and not self.closed:
                slice_file: Any = _SliceFile(fslice.fileno(), fslice.position)
                await self.loop.sendfile(self.transport, slice_file,
                                         fslice.position, fslice.size)
        except Exception as exc:
            log.warning("sendfile to %s failed: %r", self._peer(), exc)
            self._abort()
        finally:
            fslice.release()
            self.sending = False
        if not self.closed:
            self._pump()

    def _peer(self) -> str:
        if self.transport is None:
            return "?"
        peer = self.transport.get_extra_info("peername")
        return f"{peer[0]}:{peer[1]}" if peer else "?"

    def _abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
