# metaq._speedups (src/metaq/_speedups.c): what it holds, each beside its Python reference (docs/compiled.md).
# Imported only by metaq._compiled.
from array import array
from collections.abc import Callable, Container, Iterable, Iterator, Sequence, Set
from typing import Any, TypeVar

from metaq.types import Message as _Message

_Header = TypeVar("_Header", bound=tuple[int, ...])

class SendResult:
    """metaq.types._PySendResult's fields, __init__, equality, repr and pickling; metaq.types adds its properties and
    dataclasses metadata."""
    success: bool
    message_id: int
    partition: int
    offset: int
    error: BaseException | None
    topic: str
    broker_id: int
    def __init__(self, success: bool, message_id: int = -1, partition: int = -1, offset: int = -1,
                 error: BaseException | None = None, topic: str = "", broker_id: int = -1) -> None: ...

class Message:
    """metaq.types._PyMessage's fields, __init__, equality and repr; metaq.types adds its partition_id property and
    dataclasses metadata (type checkers see metaq.types.Message as the dataclass)."""
    topic: str
    data: bytes
    attribute: str | None
    key: bytes | None
    headers: list[tuple[str, bytes]] | None
    timestamp_ms: int
    partition: int
    offset: int
    id: int
    append_time_ms: int
    broker_id: int
    deliver_at: int | None
    delay_ms: int | None
    def __init__(self, topic: str, data: bytes, attribute: str | None = None, key: bytes | None = None,
                 headers: list[tuple[str, bytes]] | None = None, timestamp_ms: int = -1, partition: int = -1,
                 offset: int = -1, id: int = -1, append_time_ms: int = -1, broker_id: int = -1,
                 deliver_at: int | None = None, delay_ms: int | None = None) -> None: ...
    __hash__: None  # type: ignore[assignment]

class MessageBuilder:
    """metaq.protocol.records.decode.build_messages, for instances of ``cls`` (Message)."""
    def __new__(cls, message_class: type[_Message], field_names: Sequence[str], /) -> MessageBuilder: ...
    def messages(self, topic: str, raw: bytes, start: int, lengths: array[int], deltas: array[int],
                 timestamps: array[int], attributes: Iterable[str | None] | None, keys: Iterable[bytes | None] | None,
                 headers: Iterable[list[tuple[str, bytes]] | None] | None, base_offset: int, base_message_id: int,
                 partition: int, append_time_ms: int, broker_id: int, /) -> Iterator[_Message]: ...

def plain_region(values: Sequence[bytes | bytearray], timestamps: Sequence[int] | int, /
                 ) -> tuple[bytes, int, int] | None: ...
def plain_columns_ok(region: bytes | bytearray | memoryview, n: int, max_message_bytes: int, /) -> bool: ...
def validate_plain(batch: bytes | bytearray | memoryview, max_message_bytes: int, max_batch_bytes: int,
                   header_type: type[_Header], /) -> _Header | None: ...
def stamp_prefix(header: tuple[int, ...], base_offset: int, base_message_id: int, append_time_ms: int, /
                 ) -> bytes | None: ...


class PlainRun:
    """metaq.client.producer.plain_run.PlainRunPy: the producer's deferred run of plain messages."""
    def __new__(cls, message_class: type[_Message], topics: Set[str], direct: Container[str], buffer: Any,
                create_future: Callable[[], Any], on_start: Callable[[], object], on_flush: Callable[[], object],
                place_one: Callable[[str, bytes, int, Any, int, int], object], acks: int, max_message_bytes: int,
                capacity: int, record_overhead: int, /) -> PlainRun: ...
    def __len__(self) -> int: ...
    def add_async(self, message: Any, /) -> Any: ...
    def add_oneway(self, message: Any, /) -> bool: ...
    def take(self) -> tuple[str, int, list[bytes], list[int] | None, list[Any], int]: ...

class PlainColumns:
    """metaq.client.producer.columns.PlainColumnsPy: an open batch's plain columns (ProducerBatch's base)."""
    values: list[bytes]
    timestamps: list[int]
    waiters: list[Any]
    created_ms: int
    count: int
    size_bytes: int
    def __init__(self, created_ms: int, size_bytes: int) -> None: ...
    def append(self, timestamp_ms: int, value: bytes, waiter: Any, size: int, /) -> None: ...
    def extend(self, values: Sequence[bytes], timestamps: Sequence[int] | None, waiters: Sequence[Any], size: int,
               /) -> None: ...
    def drop_payloads(self) -> None: ...

def resolve_successes(waiters: list[Any], base_id: int, base_offset: int, partition: int, topic: str,
                      broker_id: int, /) -> None: ...
