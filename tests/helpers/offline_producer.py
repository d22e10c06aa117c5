"""A producer of a session that never connects, for tests of where messages go (placement, selectors, kept topics):
the metadata is given, and each batch the producer would send is handed to the test instead of the network."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from metaq.client.config import ClientConfig, ProducerConfig
from metaq.client.core import ClientCore
from metaq.client.producer import Producer
from metaq.protocol.messages import MetadataResponse


def run_offline(metadata: MetadataResponse, topics: list[str], config: ProducerConfig, selector: Any,
                on_batch: Callable[[Any], object], test: Callable[[ClientCore, Producer], Coroutine[Any, Any, None]],
                prepare: Callable[[ClientCore, Producer], object] | None = None) -> None:
    """Run ``test(core, producer)`` on a new event loop; ``on_batch(batch)`` gets every sealed batch (in place of the
    sender's dispatch), ``prepare(core, producer)`` runs first when given."""

    async def main() -> None:
        core = ClientCore(ClientConfig(), [("127.0.0.1", 9)])
        core.metadata.cache.update(metadata, topics)
        producer = Producer(core, config, selector)
        producer._sender.dispatch = on_batch  # type: ignore[method-assign]
        if prepare is not None:
            prepare(core, producer)
        try:
            await test(core, producer)
        finally:
            producer._placement.acc.batches.clear()
            producer._placement.end_hot()
            await core.close()

    asyncio.run(main())


async def next_iteration() -> None:
    """Return once the callbacks scheduled so far have run (the producer's end of the loop step among them):
    the event loop runs them in the order they were scheduled, before the one scheduled here."""
    loop = asyncio.get_running_loop()
    passed = loop.create_future()
    loop.call_soon(passed.set_result, None)
    await passed
