"""metaq.storage: the persistent, segmented partition log (files, not sockets).

Layout and formats are in docs/storage.md. The broker uses LogManager to hold its partitions and
PartitionLog to append, read (zero-copy FileSlice) and expire them.
"""

from metaq.storage.config import LogConfig, RetentionPolicy
from metaq.storage.errors import LogClosedError, MessageNotFound, OffsetOutOfRange
from metaq.storage.fileslice import FileSlice
from metaq.storage.flush import Flusher
from metaq.storage.log import AppendResult, PartitionLog
from metaq.storage.manager import LogManager
from metaq.storage.retention import RetentionOutcome

__all__ = [
    "AppendResult",
    "FileSlice",
    "Flusher",
    "LogClosedError",
    "LogConfig",
    "LogManager",
    "MessageNotFound",
    "OffsetOutOfRange",
    "PartitionLog",
    "RetentionOutcome",
    "RetentionPolicy",
]
