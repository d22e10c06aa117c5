"""The metaq client: producers, pull consumers and admin over an asyncio core, with a sync facade.

Async::

    from metaq.client import MessageSessionFactory, Message

    async with await MessageSessionFactory.connect("127.0.0.1:8123") as session:
        producer = session.create_producer()
        result = await producer.send(Message("orders", b"payload"))

Sync (scripts)::

    from metaq.client import connect

    with connect("127.0.0.1:8123") as session:
        result = session.create_producer().send(Message("orders", b"payload"))

See docs/client.md.

The public names below are imported on first use (module ``__getattr__``), not when the package is:
``import metaq.client.blocking`` (the plain-socket client Spark executors use) then does not pay for
the asyncio client, about 100 ms per process. ``from metaq.client import X`` imports X then.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from metaq.client import selectors
    from metaq.client.admin import Admin
    from metaq.client.consumer import PullConsumer
    from metaq.client.exceptions import BufferFullError, ClientClosedError
    from metaq.client.fetcher import Fetcher, FetchResult
    from metaq.client.metadata import Partition
    from metaq.client.producer import BatchSendResult, Producer
    from metaq.client.selectors import KeyHashSelector, RandomSelector, RoundRobinSelector, StickyRoundRobinSelector
    from metaq.client.session import MessageSessionFactory
    from metaq.client.sync import SyncSessionFactory, connect
    from metaq.protocol.records import MessageBatch
    from metaq.types import Message, PartitionId, SendResult

_EXPORTS: dict[str, str] = {
    "Admin": "metaq.client.admin",
    "BatchSendResult": "metaq.client.producer",
    "BufferFullError": "metaq.client.exceptions",
    "ClientClosedError": "metaq.client.exceptions",
    "FetchResult": "metaq.client.fetcher",
    "Fetcher": "metaq.client.fetcher",
    "KeyHashSelector": "metaq.client.selectors",
    "Message": "metaq.types",
    "MessageBatch": "metaq.protocol.records",
    "MessageSessionFactory": "metaq.client.session",
    "Partition": "metaq.client.metadata",
    "PartitionId": "metaq.types",
    "Producer": "metaq.client.producer",
    "PullConsumer": "metaq.client.consumer",
    "RandomSelector": "metaq.client.selectors",
    "RoundRobinSelector": "metaq.client.selectors",
    "StickyRoundRobinSelector": "metaq.client.selectors",
    "SendResult": "metaq.types",
    "SyncSessionFactory": "metaq.client.sync",
    "connect": "metaq.client.sync",
    "selectors": "",  # the submodule itself
}
"""Public name -> the module defining it."""

__all__ = [
    "Admin",
    "BatchSendResult",
    "BufferFullError",
    "ClientClosedError",
    "FetchResult",
    "Fetcher",
    "KeyHashSelector",
    "Message",
    "MessageBatch",
    "MessageSessionFactory",
    "Partition",
    "PartitionId",
    "Producer",
    "PullConsumer",
    "RandomSelector",
    "RoundRobinSelector",
    "SendResult",
    "StickyRoundRobinSelector",
    "SyncSessionFactory",
    "connect",
    "selectors",
]
assert sorted(_EXPORTS) == sorted(__all__)


if not TYPE_CHECKING:  # type checkers see the imports above; a visible __getattr__ would hide typos from them

    def __getattr__(name: str) -> Any:
        """Import a public name's module on first use and cache the name in the package."""
        try:
            module = _EXPORTS[name]
        except KeyError:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
        value = importlib.import_module(f"{__name__}.{name}") if not module else getattr(
            importlib.import_module(module), name)
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
