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
"""

from metaq.client import selectors
from metaq.client.admin import Admin
from metaq.client.consumer import Fetcher, FetchResult, PullConsumer
from metaq.client.exceptions import BufferFullError, ClientClosedError
from metaq.client.metadata import Partition
from metaq.client.producer import BatchSendResult, Producer
from metaq.client.selectors import KeyHashSelector, RandomSelector, RoundRobinSelector
from metaq.client.session import MessageSessionFactory
from metaq.client.sync import SyncSessionFactory, connect
from metaq.types import Message, SendResult

__all__ = [
    "Admin",
    "BatchSendResult",
    "BufferFullError",
    "ClientClosedError",
    "FetchResult",
    "Fetcher",
    "KeyHashSelector",
    "Message",
    "MessageSessionFactory",
    "Partition",
    "Producer",
    "PullConsumer",
    "RandomSelector",
    "RoundRobinSelector",
    "SendResult",
    "SyncSessionFactory",
    "connect",
    "selectors",
]
