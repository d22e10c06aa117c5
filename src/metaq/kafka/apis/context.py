"""What every Kafka API's translation shares: the connection's :class:`Context` (its way to the broker core,
the throttle to report, the addresses to advertise) and a topic's :class:`Layout` (metaq's
``brokerId-partition`` numbered as Kafka's partitions 0..N-1).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from metaq.broker.session import FileReply, Session
from metaq.kafka.errors import UNKNOWN_TOPIC_OR_PARTITION
from metaq.protocol import messages as m
from metaq.protocol.kafka.codec import RequestHeader, build, response_class
from metaq.types import PartitionId

if TYPE_CHECKING:
    from metaq.broker.core import Broker

Peers = Callable[[], dict[int, tuple[str, int, int | None]]]
"""broker id -> (host, Kafka port, Kafka TLS port or None) of the cluster's other brokers that serve Kafka."""


@dataclass
class Advertised:
    """Where Kafka clients reach brokers: this one (its listener), and the others of the cluster."""

    host: str
    port: int
    tls_port: int | None = None


class Context:
    """One Kafka connection as the translation sees it: the broker core, the connection's session, and the
    address this listener advertises."""

    def __init__(self, broker: Broker, session: Session, advertised: Advertised, peers: Peers, *,
                 on_hold: Callable[[asyncio.Future[None]], None] | None = None) -> None:
        self.broker = broker
        self.on_hold = on_hold
        """Called with the core's ``Session.hold`` (a request waits for its principal's quota debt): the
        connection reads nothing more until it is done, as the binary protocol's does."""
        self.session = session
        self.advertised = advertised
        self.peers = peers
        """broker id -> (host, Kafka port, Kafka TLS port) of the cluster's other brokers that have one."""
        self.mute_ms = 0
        """A throttle told in a reply and not yet applied by the connection (it reads nothing that long)."""

    async def core(self, request: Any) -> Any:
        """The core's response to ``request`` (errors are in it, never raised)."""
        broker = self.broker
        result = broker.handle(request, self.session)
        hold, self.session.hold = self.session.hold, None
        if hold is not None and self.on_hold is not None:
            self.on_hold(hold)
        if asyncio.iscoroutine(result):
            broker.request_started()
            try:
                result = await result
            finally:
                broker.request_finished()
        if isinstance(result, FileReply):  # not for the requests sent from here; kept safe all the same
            try:
                result.response.records = result.file_slice.read_bytes()
            finally:
                result.file_slice.release()
            result = result.response
        return result

    def throttle_ms(self) -> int:
        """The throttle the core set for the request just answered (the principal went over a byte-rate quota),
        for the reply's ``throttle_time_ms``; the connection is then muted as long (KIP-219: the reply first)."""
        ms, self.session.throttle_ms = self.session.throttle_ms, 0
        self.mute_ms = max(self.mute_ms, ms)
        return ms

    def own_address(self) -> tuple[str, int]:
        a = self.advertised
        if self.session.tls and a.tls_port is not None:
            return a.host, a.tls_port
        return a.host, a.port

    async def layouts(self, topics: list[str] | None, *, create: bool = False) -> tuple[
            m.MetadataResponse, dict[str, Layout]]:
        """The core's metadata for ``topics`` (None: all), and each known topic's partition mapping. With
        ``create``, unknown topics are created first where the broker's autoCreateTopics allows it."""
        response: m.MetadataResponse = await self.core(m.MetadataRequest(topics))
        if create and topics and self.broker.config.auto_create_topics:
            missing = [t.name for t in response.topics if t.error_code == UNKNOWN_TOPIC_OR_PARTITION]
            for name in missing:
                await self.core(m.CreateTopicRequest(name, -1))
            if missing:
                response = await self.core(m.MetadataRequest(topics))
        return response, {t.name: Layout(t) for t in response.topics if not t.error_code}

    async def layout(self, topic: str) -> Layout | None:
        _, layouts = await self.layouts([topic])
        return layouts.get(topic)


class Layout:
    """A topic's partitions as Kafka numbers them: metaq's ``brokerId-partition`` ordered by (broker id,
    partition) are Kafka partitions 0..N-1."""

    __slots__ = ("index", "infos", "partitions")

    def __init__(self, info: m.TopicInfo) -> None:
        self.infos = sorted(info.partitions, key=lambda p: (p.broker_id, p.partition))
        self.partitions = [PartitionId(p.broker_id, p.partition) for p in self.infos]
        self.index = {pid: i for i, pid in enumerate(self.partitions)}

    def get(self, index: int) -> PartitionId | None:
        return self.partitions[index] if 0 <= index < len(self.partitions) else None


def _ms(value: Any) -> int:
    return int(value.total_seconds() * 1000) if hasattr(value, "total_seconds") else int(value)


def _response(header: RequestHeader, values: dict[str, Any]) -> Any:
    return build(response_class(header.api_key, header.api_version), values)

