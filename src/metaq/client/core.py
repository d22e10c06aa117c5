"""What a session's producers, consumers and admin share: config, connections, metadata, routing."""

from __future__ import annotations

import asyncio
from typing import Any

from metaq.client.config import ClientConfig
from metaq.client.connection import BrokerConnection, raise_for_error
from metaq.client.metadata import Address, Metadata, Partition, TopicMetadata
from metaq.client.pool import ConnectionPool
from metaq.errors import ConnectionClosedError, UnknownPartitionError, UnknownServerError
from metaq.protocol.messages import MetadataRequest, MetadataResponse


class ClientCore:
    def __init__(self, config: ClientConfig, servers: list[Address]) -> None:
        self.config = config
        self.servers = servers
        self.pool = ConnectionPool(config)
        self.metadata = Metadata(self._fetch_metadata, max_age_s=config.metadata_max_age_s,
                                 min_interval_s=config.metadata_min_interval_s)
        self.default_broker_id = -1
        """The broker first reached: it answers metadata and gets produce requests for topics with no
        known partitions (partition -1, the broker picks)."""
        self._default_address: Address | None = None

    async def start(self) -> None:
        """Reach the first bootstrap server that answers; ConnectionClosedError if none does."""
        errors: list[str] = []
        for address in self.servers:
            try:
                conn = await self.pool.get(address)
            except ConnectionClosedError as exc:
                errors.append(str(exc))
                continue
            self._adopt(address, conn)
            return
        raise ConnectionClosedError("no bootstrap server could be reached: " + "; ".join(errors))

    def _adopt(self, address: Address, conn: BrokerConnection) -> None:
        self.default_broker_id = conn.broker_id
        self._default_address = address
        if conn.broker_id >= 0:
            self.metadata.cache.known_addresses[conn.broker_id] = address

    def address(self, broker_id: int) -> Address:
        addr = self.metadata.cache.address(broker_id)
        if addr is None:
            if broker_id == self.default_broker_id and self._default_address is not None:
                return self._default_address
            raise UnknownServerError(f"broker {broker_id} is not in the metadata this client has")
        return addr

    def cached_connection(self, broker_id: int, channel: str = "default") -> BrokerConnection | None:
        """The open shared connection to a broker if there is one (no I/O, no reconnect)."""
        if broker_id == self.default_broker_id:
            address = self._default_address
        else:
            address = self.metadata.cache.address(broker_id)
        return self.pool.cached(address, channel) if address is not None else None

    async def connection(self, broker_id: int | None = None, channel: str = "default") -> BrokerConnection:
        """The shared connection to a broker (None: the default broker), reconnecting if needed."""
        if broker_id is None or broker_id == self.default_broker_id:
            return await self._default_connection(channel)
        return await self.pool.get(self.address(broker_id), channel)

    async def _default_connection(self, channel: str) -> BrokerConnection:
        assert self._default_address is not None, "ClientCore.start() was not called"
        try:
            conn = await self.pool.get(self._default_address, channel)
        except ConnectionClosedError as exc:
            # The default broker is gone: another bootstrap server may answer.
            last = exc
            for address in self.servers:
                if address == self._default_address:
                    continue
                try:
                    conn = await self.pool.get(address, channel)
                except ConnectionClosedError as other:
                    last = other
                    continue
                self._adopt(address, conn)
                return conn
            raise last from None
        if conn.broker_id != self.default_broker_id and conn.broker_id >= 0:
            self._adopt(self._default_address, conn)  # restarted with another broker id
        return conn

    async def request(self, request: Any, broker_id: int | None = None, *, channel: str = "default",
                      timeout_s: float | None = None) -> Any:
        """One request to a broker; raises the broker's error (with ``exc.response``)."""
        conn = await self.connection(broker_id, channel)
        return await conn.request(request, timeout_s)

    async def _fetch_metadata(self, request: MetadataRequest) -> MetadataResponse:
        conn = await self.connection(None)
        return raise_for_error(await conn.request(request))

    async def topic(self, topic: str) -> TopicMetadata:
        return await self.metadata.topic(topic)

    async def partition(self, topic: str, partition: int | Partition) -> Partition:
        """The Partition (with its broker) for a partition number; UnknownPartitionError if none."""
        if isinstance(partition, Partition):
            return partition
        tm = await self.metadata.topic(topic)
        found = tm.find(partition)
        if found is None:
            tm = await self.metadata.refresh_topic(topic)
            found = tm.find(partition)
        if found is None:
            if tm.error is not None:
                raise type(tm.error)(tm.error.message)
            raise UnknownPartitionError(
                f"topic {topic!r} has no partition {partition} (it has {[p.partition for p in tm.partitions]})")
        return found

    async def close(self) -> None:
        self.metadata.close()
        self.pool.close()
        await asyncio.sleep(0)  # let transports run their connection_lost callbacks

