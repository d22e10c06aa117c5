"""MetaQ's TopicBrowser: read every message of a topic, partition by partition, without consuming.

No group, no offsets stored, nothing changes on the broker: a browser reads each partition from its
earliest stored offset to the end the broker reports when the browser reaches it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from metaq.client.consumer import PullConsumer, StartOffset
from metaq.client.core import ClientCore
from metaq.client.fetcher import DEFAULT_FETCH_MAX_BYTES
from metaq.errors import InvalidArgument
from metaq.types import Message, PartitionId, PartitionKey, validate_topic


class TopicBrowser:
    """Read every message of a topic, partition by partition, without a group (MetaQ's TopicBrowser).

    ``async for message in TopicBrowser(session, "orders")``; nothing is committed or changed on the broker."""

    def __init__(self, session: Any, topic: str, max_size: int = DEFAULT_FETCH_MAX_BYTES) -> None:
        core = session._core if hasattr(session, "_core") else session
        if not isinstance(core, ClientCore):
            raise InvalidArgument(f"TopicBrowser needs a MessageSessionFactory, not {session!r}")
        self._core = core
        self.topic = validate_topic(topic)
        self.max_size = max_size
        self._pull = PullConsumer(core)

    async def partitions(self) -> list[PartitionId]:
        """The topic's partitions on every broker, ``brokerId-partition``, in (broker id, partition) order."""
        tm = await self._core.metadata.refresh_topic(self.topic)
        return [p.id for p in tm.partitions]

    async def iterate_partition(self, partition: PartitionKey,
                                start: StartOffset = "earliest") -> AsyncIterator[Message]:
        """One partition's messages from ``start`` to the end the broker reports when it is reached."""
        async for msg in self._pull.iterate(self.topic, partition, start, max_bytes=self.max_size, stop_at_end=True,
                                            on_out_of_range="earliest"):
            yield msg

    async def __aiter__(self) -> AsyncIterator[Message]:
        """Every message: the first partition's in offset order, then the next one's, and so on."""
        for partition in await self.partitions():
            async for msg in self.iterate_partition(partition):
                yield msg

    async def close(self) -> None:
        """Stop the browser's fetches."""
        await self._pull.close()
