"""Administration: topics, partition open/close, stats, reload, message lookup and search.

Every call raises the broker's error (a BrokerError subclass with the wire code) when it fails.
Calls that concern one broker take ``broker_id`` (None = the session's default broker); calls about a
topic's partitions go to the brokers that hold them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from metaq.client.core import ClientCore
from metaq.client.fetcher import offsets_of
from metaq.client.metadata import Partition
from metaq.errors import InvalidArgument, ProtocolError
from metaq.protocol.messages import (
    ConfigEntry,
    CreateTopicRequest,
    CreateTopicResponse,
    DeleteTopicRequest,
    FindMessagesRequest,
    FindMessagesResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
    LookupMessageRequest,
    LookupMessageResponse,
    PartitionStateRequest,
    PromoteRequest,
    PromoteResponse,
    ReloadRequest,
    ReloadResponse,
    StatsRequest,
    StatsResponse,
    VerifyRequest,
    VerifyResponse,
)
from metaq.types import MessageId, PartitionId, PartitionKey, parse_message_id, split_message_id, validate_topic


@dataclass(frozen=True, slots=True)
class PartitionDescription:
    partition: Partition
    earliest: int
    latest: int
    """The next offset to be written; ``latest - earliest`` messages are stored."""


@dataclass(frozen=True, slots=True)
class TopicDescription:
    """A topic's partitions with their offset ranges
    (:meth:`Admin.describe_topic <metaq.client.Admin.describe_topic>`)."""

    topic: str
    partitions: list[PartitionDescription]


@dataclass(frozen=True, slots=True)
class MessageLocation:
    """Where a message id points (:meth:`Admin.lookup_message <metaq.client.Admin.lookup_message>`)."""

    topic: str
    partition: int
    offset: int
    broker_id: int = -1
    """The broker that holds it (the one the message id names)."""

    @property
    def partition_id(self) -> PartitionId:
        """``brokerId-partition`` holding the message."""
        return PartitionId(self.broker_id, self.partition)


class ReloadResult(list[str]):
    """What :meth:`Admin.reload` did: the topics whose settings changed (the list itself, so code that reads it
    as a list keeps working), and ``restart_required``, the server.ini keys that changed but wait for a restart
    (their values from the broker's start stay in force)."""

    def __init__(self, changed_topics: list[str], restart_required: list[str]) -> None:
        super().__init__(changed_topics)
        self.restart_required = list(restart_required)


@dataclass(frozen=True, slots=True)
class FoundMessage:
    """One match of :meth:`Admin.find`: where it is (fetch from ``offset`` to read it) and its key."""

    broker_id: int
    partition: int
    offset: int
    message_id: int
    timestamp_ms: int
    key: bytes | None

    @property
    def partition_id(self) -> PartitionId:
        return PartitionId(self.broker_id, self.partition)


@dataclass(frozen=True, slots=True)
class FindResult:
    """The messages :meth:`Admin.find <metaq.client.Admin.find>` found, and what it could not search."""

    messages: list[FoundMessage]
    """In (broker, partition, offset) order."""
    truncated: bool
    """More matched than the limit."""
    scanned_segments: int
    """Segments searched record by record (their key index was full or damaged)."""
    problems: list[str]
    """Damaged stretches the brokers met and could not search."""


def _json_document(raw: bytes, what: str, kind: type) -> Any:
    """A broker's JSON answer, checked to be of ``kind`` (ProtocolError otherwise)."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"broker {what} is not JSON: {exc}") from None
    if not isinstance(data, kind):
        raise ProtocolError(f"broker {what} is a JSON {type(data).__name__}, not a {kind.__name__}")
    return data


class Admin:
    """Create it with ``MessageSessionFactory.admin()``."""

    def __init__(self, core: ClientCore) -> None:
        self._core = core

    async def create_topic(self, topic: str, num_partitions: int = -1, configs: dict[str, str] | None = None, *,
                           broker_id: int | None = None) -> int:
        """Create a topic (-1 partitions: the broker's numPartitions); returns its partition count.

        ``configs`` are MetaQ topic options (e.g. ``{"deletePolicy": "delete,24h"}``).
        TopicExistsError if it exists.
        """
        validate_topic(topic)
        if num_partitions == 0 or num_partitions < -1:
            raise InvalidArgument(f"num_partitions must be >= 1, or -1 for the broker's default; not {num_partitions}")
        entries = [ConfigEntry(str(k), str(v)) for k, v in (configs or {}).items()]
        resp: CreateTopicResponse = await self._core.request(CreateTopicRequest(topic, num_partitions, entries),
                                                             broker_id)
        self._core.metadata.cache.invalidate(topic)
        return resp.num_partitions

    async def delete_topic(self, topic: str, *, broker_id: int | None = None) -> None:
        """Delete a topic and its data on a broker. UnknownTopicError if there is no such topic."""
        validate_topic(topic)
        try:
            await self._core.request(DeleteTopicRequest(topic), broker_id)
        finally:
            self._core.metadata.cache.invalidate(topic)

    async def broker_ids(self) -> list[int]:
        """The ids of the brokers this session knows: every server it was given (asked once now) and
        every broker their metadata names."""
        await self._core.metadata.refresh_all()
        return sorted(set(self._core.metadata.cache.brokers) | set(self._core.server_ids.values()))

    async def list_topics(self) -> dict[str, list[Partition]]:
        """Every topic the brokers know, with its partitions in (broker id, partition) order."""
        got = await self._core.metadata.refresh_all()
        return {name: list(tm.partitions) for name, tm in sorted(got.items()) if tm.error is None}

    async def describe_topic(self, topic: str) -> TopicDescription:
        """The topic's partitions with their earliest and latest offsets (UnknownTopicError if none)."""
        validate_topic(topic)
        tm = await self._core.metadata.refresh_topic(topic)
        if tm.error is not None and not tm.partitions:
            raise type(tm.error)(tm.error.message)
        out = []
        for p in tm.partitions:
            earliest, latest = await offsets_of(self._core, topic, p)
            out.append(PartitionDescription(p, earliest, latest))
        return TopicDescription(topic, out)

    async def close_partition(self, topic: str, partition: PartitionKey = -1, *, broker_id: int | None = None) -> None:
        """Stop accepting publishes (MetaQ's ``topic close``); -1 = every partition (of ``broker_id``, or
        of every broker holding the topic). Reads still work."""
        await self._set_state(topic, partition, False, broker_id)

    async def open_partition(self, topic: str, partition: PartitionKey = -1, *, broker_id: int | None = None) -> None:
        """Accept publishes again."""
        await self._set_state(topic, partition, True, broker_id)

    async def _set_state(self, topic: str, partition: PartitionKey, open_: bool, broker_id: int | None) -> None:
        validate_topic(topic)
        try:
            if partition == -1:
                if broker_id is not None:
                    targets: list[tuple[int | None, int]] = [(broker_id, -1)]
                else:
                    tm = await self._core.metadata.refresh_topic(topic)
                    targets = [(b, -1) for b in sorted({p.broker_id for p in tm.partitions})] or [(None, -1)]
            else:
                p = await self._core.partition(topic, partition)
                targets = [(p.broker_id, p.partition)]
            for broker, number in targets:
                await self._core.request(PartitionStateRequest(topic, number, open_), broker)
        finally:
            self._core.metadata.cache.invalidate(topic)

    async def stats(self, topic: str | None = None, *, broker_id: int | None = None) -> dict[str, Any]:
        """The broker's statistics (uptime, per topic and partition counts, bytes, offsets) as a dict."""
        resp: StatsResponse = await self._core.request(StatsRequest(topic), broker_id)
        data: dict[str, Any] = _json_document(resp.stats_json, "stats", dict)
        return data

    async def verify(self, topic: str | None = None, partition: PartitionKey = -1, *, broker_id: int | None = None,
                     timeout_s: float = 3600.0) -> list[dict[str, Any]]:
        """Have a broker check every stored byte and index entry of its partitions (all, a topic's, or
        one, asked of the broker holding it); one report per partition: ``broker_id``, ``topic``,
        ``partition``, ``ok``, ``messages``, ``damaged`` ranges (offsets and the messages each makes
        unreadable), ``index_problems``, ``index_notes`` (not damage), ``file_problems`` (its epoch history and
        producer snapshots). Without a topic, one more report per store beside the segments: ``store``,
        ``path``, ``records``, ``ok``, ``damaged`` (one line per damaged record). Slow on big logs: reads
        everything once."""
        if topic is not None:
            validate_topic(topic)
        number = -1
        if partition != -1:
            if topic is None:
                raise InvalidArgument("verify of one partition needs its topic")
            p = await self._core.partition(topic, partition)
            number, broker_id = p.partition, p.broker_id
        resp: VerifyResponse = await self._core.request(VerifyRequest(topic, number), broker_id,
                                                        timeout_s=timeout_s)
        data: list[dict[str, Any]] = _json_document(resp.report_json, "verify report", list)
        answered = self._core.default_broker_id if broker_id is None else broker_id
        for report in data:
            if isinstance(report, dict):
                report.setdefault("broker_id", answered)
        return data

    async def list_transactions(self, producer_group: str = "", *, broker_id: int | None = None,
                                limit: int = 1000) -> ListTransactionsResponse:
        """One broker's transactions (docs/transactions.md): ``live`` (open, prepared, committing, oldest
        first), ``timed_out`` (the last ones it rolled back by itself: a timeout, or a half message's checks
        used up; newest first) and ``checkers`` (producer groups whose checker asked in the last minute)."""
        resp: ListTransactionsResponse = await self._core.request(ListTransactionsRequest(producer_group, limit),
                                                                  broker_id)
        return resp

    async def reload(self, *, broker_id: int | None = None) -> ReloadResult:
        """Make the broker re-read its server.ini; returns the topics whose settings changed, with
        ``.restart_required``: the changed keys only a restart applies (empty from a broker before v1)."""
        resp: ReloadResponse = await self._core.request(ReloadRequest(), broker_id)
        for topic in resp.changed_topics:
            self._core.metadata.cache.invalidate(topic)
        return ReloadResult(list(resp.changed_topics), list(resp.restart_required))

    async def promote(self, *, broker_id: int | None = None, replica_id: int = -1,
                      timeout_s: float = 30.0) -> tuple[int, int]:
        """Planned switchover (docs/replication.md): the master of ``broker_id`` stops taking writes, waits
        until slave ``replica_id`` (-1: any in-sync slave) holds every message, and hands over to it.
        Returns (new master's replica id, its epoch). Writes get NOT_MASTER for the moment it takes."""
        resp: PromoteResponse = await self._core.request(
            PromoteRequest(replica_id=replica_id, timeout_ms=int(timeout_s * 1000)), broker_id,
            timeout_s=timeout_s + 20)
        if broker_id is not None:
            await self._core.metadata.refresh_all()
        return resp.new_master, resp.epoch

    async def lookup_message(self, message_id: MessageId | str) -> MessageLocation:
        """Where a message id points: (topic, partition, offset), asked of the broker the id names."""
        mid = parse_message_id(message_id) if isinstance(message_id, str) else message_id
        broker_id = split_message_id(mid).broker_id
        if self._core.metadata.cache.address(broker_id) is None and broker_id != self._core.default_broker_id:
            await self._core.metadata.refresh_all()
        resp: LookupMessageResponse = await self._core.request(LookupMessageRequest(mid), broker_id)
        return MessageLocation(resp.topic, resp.partition, resp.offset, broker_id)

    async def find(self, topic: str, *, key: bytes | str | None = None, from_ms: int = -1, to_ms: int = -1,
                   limit: int = 100, partition: PartitionKey = -1, timeout_s: float = 600.0) -> FindResult:
        """Messages of ``topic`` with this key (any when None) and a timestamp in ``[from_ms, to_ms]``
        (-1 = open), asked of every broker holding the topic (or of the one holding ``partition``).
        At most ``limit`` (1..10000); ``truncated`` says more matched."""
        validate_topic(topic)
        if isinstance(key, str):
            key = key.encode()
        if partition != -1:
            p = await self._core.partition(topic, partition)
            targets: list[tuple[int | None, int]] = [(p.broker_id, p.partition)]
        else:
            tm = await self._core.metadata.refresh_topic(topic)
            targets = [(b, -1) for b in sorted({p.broker_id for p in tm.partitions})] or [(None, -1)]
        found: list[FoundMessage] = []
        truncated, scanned = False, 0
        problems: list[str] = []
        for broker_id, number in targets:
            resp: FindMessagesResponse = await self._core.request(
                FindMessagesRequest(topic, number, key, from_ms, to_ms, limit), broker_id, timeout_s=timeout_s)
            answered = self._core.default_broker_id if broker_id is None else broker_id
            found.extend(FoundMessage(answered, f.partition, f.offset, f.message_id, f.timestamp_ms, f.key)
                         for f in resp.messages)
            truncated = truncated or resp.truncated
            scanned += resp.scanned_segments
            problems.extend(f"broker {answered}: {p}" for p in resp.problems)
        found.sort(key=lambda f: (f.broker_id, f.partition, f.offset))
        if len(found) > limit:
            del found[limit:]
            truncated = True
        return FindResult(found, truncated, scanned, problems)

    async def list_offsets(self, topic: str, partition: PartitionKey, timestamp_ms: int = -1) -> int:
        """-2: the earliest offset; -1: the latest (next to be written); else the first offset at or after
        the timestamp."""
        validate_topic(topic)
        p = await self._core.partition(topic, partition)
        resp: ListOffsetsResponse = await self._core.request(ListOffsetsRequest(topic, p.partition, timestamp_ms),
                                                             p.broker_id)
        return resp.offset


__all__ = ["Admin", "FindResult", "FoundMessage", "MessageLocation", "PartitionDescription", "TopicDescription"]
