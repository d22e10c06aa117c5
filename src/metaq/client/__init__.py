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

Without an event loop (Spark executors, tools)::

    from metaq.client import BlockingClient

    with BlockingClient("127.0.0.1:8123") as client:
        reply = client.fetch("orders", "0-0", 0, max_bytes=1 << 20)

The public names below are imported on first use (module ``__getattr__``), not when the package is:
``from metaq.client import BlockingClient`` (the plain-socket client Spark executors use) then does not pay
for the asyncio client, about 100 ms per process. ``from metaq.client import X`` imports X's module then.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from metaq.client import selectors
    from metaq.client.admin import Admin
    from metaq.client.batches import ColumnSpan, FetchedColumns, fetched_columns, next_fetch_offset, value_batches
    from metaq.client.blocking import BlockingClient, PendingFetch, ProduceItem
    from metaq.client.consumer import PullConsumer
    from metaq.client.exceptions import BufferFullError, ClientClosedError
    from metaq.client.fetcher import Fetcher, FetchResult
    from metaq.client.metadata import Partition
    from metaq.client.named_transactions import NamedTransactions, ProducerSequences
    from metaq.client.producer import BatchSendResult, Producer
    from metaq.client.selectors import (
        KeyHashSelector,
        RandomSelector,
        RoundRobinSelector,
        StickyRoundRobinSelector,
        key_partition,
    )
    from metaq.client.session import MessageSessionFactory
    from metaq.client.sync import SyncSessionFactory, connect
    from metaq.client.zk_brokers import BrokerStatus, ZooKeeperBrokers
    from metaq.net.retry import RetryPolicy
    from metaq.net.servers import DEFAULT_SERVERS, parse_servers
    from metaq.net.tls import ClientTls
    from metaq.protocol.messages import ANY_PARTITION
    from metaq.protocol.records import BatchBuilder, Compression, MessageBatch
    from metaq.types import Message, PartitionId, SendResult

_EXPORTS: dict[str, str] = {
    "ANY_PARTITION": "metaq.protocol.messages",
    "Admin": "metaq.client.admin",
    "BatchBuilder": "metaq.protocol.records",
    "BatchSendResult": "metaq.client.producer",
    "BlockingClient": "metaq.client.blocking",
    "BrokerStatus": "metaq.client.zk_brokers",
    "BufferFullError": "metaq.client.exceptions",
    "ClientClosedError": "metaq.client.exceptions",
    "ClientTls": "metaq.net.tls",
    "ColumnSpan": "metaq.client.batches",
    "Compression": "metaq.protocol.records",
    "DEFAULT_SERVERS": "metaq.net.servers",
    "FetchResult": "metaq.client.fetcher",
    "FetchedColumns": "metaq.client.batches",
    "Fetcher": "metaq.client.fetcher",
    "KeyHashSelector": "metaq.client.selectors",
    "Message": "metaq.types",
    "MessageBatch": "metaq.protocol.records",
    "MessageSessionFactory": "metaq.client.session",
    "NamedTransactions": "metaq.client.named_transactions",
    "Partition": "metaq.client.metadata",
    "PartitionId": "metaq.types",
    "PendingFetch": "metaq.client.blocking",
    "ProduceItem": "metaq.client.blocking",
    "Producer": "metaq.client.producer",
    "ProducerSequences": "metaq.client.named_transactions",
    "PullConsumer": "metaq.client.consumer",
    "RandomSelector": "metaq.client.selectors",
    "RetryPolicy": "metaq.net.retry",
    "RoundRobinSelector": "metaq.client.selectors",
    "SendResult": "metaq.types",
    "StickyRoundRobinSelector": "metaq.client.selectors",
    "SyncSessionFactory": "metaq.client.sync",
    "ZooKeeperBrokers": "metaq.client.zk_brokers",
    "connect": "metaq.client.sync",
    "fetched_columns": "metaq.client.batches",
    "key_partition": "metaq.client.selectors",
    "next_fetch_offset": "metaq.client.batches",
    "parse_servers": "metaq.net.servers",
    "selectors": "",  # the submodule itself
    "value_batches": "metaq.client.batches",
}
"""Public name -> the module defining it."""

__all__ = [
    "ANY_PARTITION",
    "DEFAULT_SERVERS",
    "Admin",
    "BatchBuilder",
    "BatchSendResult",
    "BlockingClient",
    "BrokerStatus",
    "BufferFullError",
    "ClientClosedError",
    "ClientTls",
    "ColumnSpan",
    "Compression",
    "FetchResult",
    "FetchedColumns",
    "Fetcher",
    "KeyHashSelector",
    "Message",
    "MessageBatch",
    "MessageSessionFactory",
    "NamedTransactions",
    "Partition",
    "PartitionId",
    "PendingFetch",
    "ProduceItem",
    "Producer",
    "ProducerSequences",
    "PullConsumer",
    "RandomSelector",
    "RetryPolicy",
    "RoundRobinSelector",
    "SendResult",
    "StickyRoundRobinSelector",
    "SyncSessionFactory",
    "ZooKeeperBrokers",
    "connect",
    "fetched_columns",
    "key_partition",
    "next_fetch_offset",
    "parse_servers",
    "selectors",
    "value_batches",
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
