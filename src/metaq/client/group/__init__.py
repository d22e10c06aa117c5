"""Consumer groups: MetaQ's listener consumer, offset storages, the recover store, dead letters, filters, browser.

::

    from metaq.client import MessageSessionFactory
    from metaq.client.group import ConsumerConfig, create_consumer

    session = await MessageSessionFactory.connect("127.0.0.1:8123")
    consumer = create_consumer(session, ConsumerConfig(group="billing"))
    consumer.subscribe("orders", 1024 * 1024, handle_order)
    await consumer.complete_subscribe()

See docs/consumers.md.
"""

from metaq.client.group.browser import TopicBrowser
from metaq.client.group.config import ConsumerConfig
from metaq.client.group.consumer import ConsumerStats, GroupConsumer, PartitionContext, create_consumer
from metaq.client.group.dead_letter import DeadLetter, RedriveResult, dead_letter_topic, dead_letters, redrive
from metaq.client.group.filters import AttributeFilter
from metaq.client.group.offsets import (
    BrokerOffsetStorage,
    LocalFileOffsetStorage,
    OffsetStorage,
    PostgresOffsetStorage,
    SqliteOffsetStorage,
    SqlOffsetStorage,
    ZooKeeperOffsetStorage,
)
from metaq.client.group.recover import RecoverStore

__all__ = [
    "AttributeFilter",
    "BrokerOffsetStorage",
    "ConsumerConfig",
    "ConsumerStats",
    "DeadLetter",
    "GroupConsumer",
    "LocalFileOffsetStorage",
    "OffsetStorage",
    "PartitionContext",
    "PostgresOffsetStorage",
    "RecoverStore",
    "RedriveResult",
    "SqlOffsetStorage",
    "SqliteOffsetStorage",
    "TopicBrowser",
    "ZooKeeperOffsetStorage",
    "create_consumer",
    "dead_letter_topic",
    "dead_letters",
    "redrive",
]
