"""metaq: a distributed, persistent, pull-based message queue after Taobao's MetaQ."""

from metaq.allocator import tune_allocator
from metaq.errors import MetaqError
from metaq.types import Message, MessageId, SendResult

__all__ = ["Message", "MessageId", "MetaqError", "SendResult", "__version__", "tune_allocator"]
__version__ = "0.1.0"
