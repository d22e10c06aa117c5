# The compiled helpers of src/metaq/_speedups.c. SendResult mirrors metaq.types._PySendResult (the dataclass).
from collections.abc import Callable
from typing import Any

from metaq.types import PartitionId

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
