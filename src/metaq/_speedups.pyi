# The compiled helpers of src/metaq/_speedups.c. SendResult mirrors metaq.types._PySendResult (the dataclass).
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from metaq.types import Message, PartitionId

class SendResult:
    success: bool
    message_id: int
    partition: int
    offset: int
    error: BaseException | None
    topic: str
    broker_id: int
    def __init__(self, success: bool, message_id: int = -1, partition: int = -1, offset: int = -1,
                 error: BaseException | None = None, topic: str = "", broker_id: int = -1) -> None: ...
    @property
    def partition_id(self) -> PartitionId: ...
    @property
    def message_id_hex(self) -> str: ...

def resolve_ok(waiters: list[Any], start: int, base_id: int, base_offset: int, partition: int, topic: str,
               broker_id: int, invalid_state_error: type[BaseException], /) -> None: ...
def bind(partition_id: type[PartitionId], format_message_id: Callable[[int], str], dataclass: type, /) -> None: ...

class BatchMessages:
    """The Messages of a batch, one per next() (records._build_plain's and _build's twin): payload i is lengths[i]
    bytes of raw from start on; attributes, keys and headers None when all None."""
    def __new__(cls, topic: str, raw: bytes, start: int, lengths: array[int], attributes: Iterable[str | None] | None,
                keys: Iterable[bytes | None] | None, headers: Iterable[list[tuple[str, bytes]] | None] | None,
                timestamps: Iterable[int], offsets: Iterable[int], ids: Iterable[int], partition: int,
                append_time_ms: int, broker_id: int, /) -> BatchMessages: ...
    def __iter__(self) -> Iterator[Message]: ...
    def __next__(self) -> Message: ...

def bind_message(cls: type[Message], field_names: Sequence[str], /) -> None: ...
def bind_constructor(cls: type[Message], /) -> None: ...
def plain_region(values: Sequence[bytes | bytearray], timestamps: Sequence[int] | int, /
                 ) -> tuple[bytes, int, int] | None: ...
def plain_columns_ok(region: bytes | bytearray | memoryview, n: int, max_message_bytes: int, /) -> bool: ...

class PlainPlacer:
    """Producer.send_async's (``create_future`` None: send_oneway's) common case in one call; ``place`` returns the
    message's future (True for one-way), or None having changed nothing."""
    def __new__(cls, producer: Any, create_future: Callable[[], Any] | None, hot: dict[str, Any],
                batches: dict[Any, Any], table: dict[str, Any], sticky: bool, acks: int, batch_bytes: int,
                max_message_bytes: int, max_buffered: int, record_prefix: int, batch_class: type,
                rotation_class: type, /) -> PlainPlacer: ...
    def place(self, message: Message, /) -> Any: ...
