"""MetaQ's entry point: a MessageSessionFactory per application, producers and consumers made from it.

::

    async with await MessageSessionFactory.connect("127.0.0.1:8123") as session:
        producer = session.create_producer()
        result = await producer.send(Message("orders", b"..."))

The factory owns the connections and the metadata cache that everything it creates shares, and
closing it closes them all (producers are flushed first).
"""

from __future__ import annotations

from typing import Any

from metaq.client.admin import Admin
from metaq.client.config import ClientConfig, ProducerConfig, build_config
from metaq.client.consumer import PullConsumer
from metaq.client.core import ClientCore
from metaq.client.exceptions import ClientClosedError
from metaq.client.metadata import Partition
from metaq.client.producer import Producer
from metaq.client.selectors import PartitionSelector
from metaq.errors import ConfigError
from metaq.net.servers import Address, parse_servers
from metaq.types import validate_topic


class MessageSessionFactory:
    """Connections, metadata and the producers/consumers built on them. Use :meth:`connect`."""

    def __init__(self, core: ClientCore) -> None:
        self._core = core
        self._producers: list[Producer] = []
        self._consumers: list[PullConsumer] = []
        self._closed = False

    @classmethod
    async def connect(cls, servers: str | list[str] | None = None, **config: Any) -> MessageSessionFactory:
        """Reach the first answering server of ``"host:port[,host:port]"``, or, in cluster mode
        (``zk_connect="zkhost:2181"``, ``zk_root="/meta"``, no ``servers``), the brokers registered in
        ZooKeeper.

        ``config``: :class:`~metaq.client.config.ClientConfig` options (client_id, request_timeout_s,
        max_in_flight, zk_connect, ...). Raises ConnectionClosedError when no server answers.
        """
        cfg = build_config(ClientConfig, config)
        core = ClientCore(cfg, session_servers(servers, cfg))
        try:
            await core.start()
        except BaseException:
            await core.close()
            raise
        return cls(core)

    @property
    def config(self) -> ClientConfig:
        """The session's settings (:class:`~metaq.client.config.ClientConfig`)."""
        return self._core.config

    @property
    def broker_id(self) -> int:
        """Id of the default broker (the first server that answered)."""
        return self._core.default_broker_id

    def throttle_stats(self) -> dict[str, int]:
        """How much the brokers' quotas slowed this session: ``throttle_ms_total`` (the sum of the replies'
        ``throttle_time_ms``, each waited out before sending more to that broker) and ``throttled_total``
        (replies that carried one). docs/security.md#quotas."""
        stats = self._core.pool.throttle
        return {"throttle_ms_total": stats.throttle_ms_total, "throttled_total": stats.throttled_total}

    def _check(self) -> None:
        if self._closed:
            raise ClientClosedError("the session is closed")

    def create_producer(self, selector: PartitionSelector | None = None, **producer_config: Any) -> Producer:
        """A producer; ``selector`` picks partitions (default RoundRobinSelector).

        ``producer_config``: :class:`~metaq.client.config.ProducerConfig` options (batch_bytes,
        linger_ms, compression, max_buffered_bytes, acks, retries, ...).
        """
        self._check()
        producer = Producer(self._core, build_config(ProducerConfig, producer_config), selector)
        self._producers.append(producer)
        return producer

    def create_async_producer(self, selector: PartitionSelector | None = None, **producer_config: Any) -> Producer:
        """MetaQ's AsyncMessageSessionFactory producer: every send is one-way (acks=0, results -1)."""
        return self.create_producer(selector, **{**producer_config, "acks": 0})

    def create_pull_consumer(self, *, verify_crc: bool = True) -> PullConsumer:
        """A consumer that reads partitions from offsets you choose (no group): ``get``, ``iterate``, ``fetch``.

        ``verify_crc=False`` skips the checksum of each record batch (the broker checked it when it was stored)."""
        self._check()
        consumer = PullConsumer(self._core, verify_crc=verify_crc)
        self._consumers.append(consumer)
        return consumer

    def create_consumer(self, config: Any, offset_storage: Any = None) -> Any:
        """A group (listener) consumer, MetaQ's ``createConsumer(consumerConfig[, offsetStorage])``:
        ``subscribe(topic, max_size, listener)`` then ``await complete_subscribe()`` (docs/consumers.md)."""
        from metaq.client.group import create_consumer

        self._check()
        return create_consumer(self, config, offset_storage)

    def admin(self) -> Admin:
        """Topics, partitions, statistics, message lookups, verification and switchovers."""
        self._check()
        return Admin(self._core)

    async def partitions(self, topic: str) -> list[Partition]:
        """The topic's partitions in (broker id, partition) order, freshly fetched; [] if unknown."""
        self._check()
        validate_topic(topic)
        return list((await self._core.metadata.refresh_topic(topic)).partitions)

    async def close(self) -> None:
        """Flush and close every producer, close consumers, then the connections. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            for producer in self._producers:
                await producer.close()
            for consumer in self._consumers:
                await consumer.close()
        finally:
            await self._core.close()

    async def __aenter__(self) -> MessageSessionFactory:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def connect(servers: str | list[str] | None = None, **config: Any) -> MessageSessionFactory:
    """``MessageSessionFactory.connect`` as a function."""
    return await MessageSessionFactory.connect(servers, **config)


def session_servers(servers: str | list[str] | None, config: ClientConfig) -> list[Address]:
    """The bootstrap servers: ``servers`` in standalone mode; none in cluster mode (ZooKeeper names
    them), where giving both is refused so that a session never silently ignores one."""
    if config.zk_connect is None:
        if servers is None:
            raise ConfigError("give servers ('host:port[,host:port...]') or zk_connect (cluster mode)")
        return parse_servers(servers)
    if servers is not None:
        raise ConfigError("give servers or zk_connect, not both: in cluster mode the brokers are the ones "
                          "registered in ZooKeeper")
    return []
