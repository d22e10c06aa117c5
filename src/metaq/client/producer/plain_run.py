"""The run of plain messages a producer defers to the end of an event-loop step (docs/producer.md, "The compiled
seam").

Under the default round robin, ``send_async`` and ``send_oneway`` of a plain message (bytes, no key, attribute,
headers or delay) of a kept topic do not place it: they hand it to the producer's :class:`PlainRun`, which checks
it and makes its future; then, for a topic whose sends are deferred, counts its bytes and keeps its payload,
timestamp and future in columns of its own. The placement takes the run (:meth:`PlainRunPy.take`) at the end of the
step, when the run is full or when any other send comes, and places it a partition's share at a time. A kept topic
whose sends are not deferred (one send per event-loop step) goes to the placement's ``place_one`` at once: the
checks and the future in one call, then the placement's short path for a plain message.

:class:`PlainRunPy` is the reference, written to be read; ``metaq._speedups.PlainRun`` is its compiled twin
(selected through :mod:`metaq._compiled`), which does the same in one C call per message. Both reach the objects
they are given only through public protocols: the Message class's attributes, ``in`` on the topic sets, the buffer's
``used`` and ``limit`` attributes, and calls (``create_future``, ``on_start``, ``on_flush``, ``place_one``).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Set
from typing import Any, Protocol

from metaq import _compiled
from metaq.types import Message


class Buffer(Protocol):
    """What the run reads and counts: ``max_buffered_bytes`` (``limit``) and the bytes held now (``used``)."""

    limit: int
    used: int


PlaceOne = Callable[[str, bytes, int, Any, int, int], object]
"""``place_one(topic, data, timestamp_ms, future or None, size, acks)``."""

Taken = tuple[str, int, list[bytes], list[int] | None, list[Any], int]
"""A run as :meth:`PlainRunPy.take` gives it: (topic, acks, payloads, timestamps or None when no message had one,
futures (empty for one-way), bytes)."""


class PlainRunPy:
    """Plain messages of one topic and acks, deferred, in send order.

    ``PlainRun(message_class, topics, direct, buffer, create_future, on_start, on_flush, place_one, acks,
    max_message_bytes, capacity, record_overhead)``:

    * ``message_class``: a message is taken only when its type is exactly this (metaq.types.Message);
    * ``topics``: the topics whose messages may be deferred (checked, kept between sends, the producer open);
    * ``direct``: the topics (``in``) whose messages are taken and placed at once: checked, kept, the producer open
      (a topic in ``topics`` is deferred whether it is here or not);
    * ``buffer``: the producer's buffer limit: a message is taken only if it fits, and its bytes are counted there
      from the moment it is taken;
    * ``create_future``: makes the future ``add_async`` returns (the event loop's);
    * ``on_start()``: called when a message starts an empty run (the placement schedules the end of the step);
    * ``on_flush()``: called to place the run -- it must call :meth:`take` -- before a message of another topic or
      acks joins, before a message of a ``direct`` topic is placed, and when the run reaches ``capacity`` messages;
    * ``place_one(topic, data, timestamp_ms, future or None, size, acks)``: places a message of a ``direct`` topic
      (the run is empty then); it counts the message's bytes in the buffer, the run does not;
    * ``acks``: the acks of ``add_async`` (0: it takes nothing, one-way sends go through ``add_oneway``);
    * ``max_message_bytes``, ``record_overhead``: a message's size is ``record_overhead + len(data)``, taken only
      within ``max_message_bytes``.
    """

    __slots__ = ("_acks", "_buffer", "_capacity", "_create_future", "_direct", "_max_message_bytes", "_message_class",
                 "_on_flush", "_on_start", "_place_one", "_record_overhead", "_topics", "acks", "nbytes", "stamps",
                 "topic", "values", "waiters")

    def __init__(self, message_class: type[Message], topics: Set[str], direct: Container[str], buffer: Buffer,
                 create_future: Callable[[], Any], on_start: Callable[[], object], on_flush: Callable[[], object],
                 place_one: PlaceOne, acks: int, max_message_bytes: int, capacity: int, record_overhead: int) -> None:
        self._message_class = message_class
        self._topics = topics
        self._direct = direct
        self._buffer = buffer
        self._create_future = create_future
        self._on_start = on_start
        self._on_flush = on_flush
        self._place_one = place_one
        self._acks = acks
        self._max_message_bytes = max_message_bytes
        self._capacity = capacity
        self._record_overhead = record_overhead
        self.topic = ""
        self.acks = 0
        self.values: list[bytes] = []
        self.stamps: list[int] | None = None
        """None while no message of the run has a timestamp of its own (the batch's creation time is theirs)."""
        self.waiters: list[Any] = []
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self.values)

    def add_async(self, message: Any) -> Any:
        """Take ``message`` with the producer's acks and return its new future; None when it is not a plain message
        of a kept topic that fits (nothing was done: the caller's general path decides)."""
        if self._acks == 0:
            return None
        size = self._size(message)
        if size < 0:
            return None
        future = self._create_future()
        self._add(message, size, self._acks, future)
        return future

    def add_oneway(self, message: Any) -> bool:
        """Take ``message`` as a one-way send (acks 0, no future); False when it is not the common case."""
        size = self._size(message)
        if size < 0:
            return False
        self._add(message, size, 0, None)
        return True

    def take(self) -> Taken:
        """The run, emptied: (topic, acks, payloads, timestamps or None, futures, bytes)."""
        taken = (self.topic, self.acks, self.values, self.stamps, self.waiters, self.nbytes)
        self.topic, self.acks, self.values, self.stamps, self.waiters, self.nbytes = "", 0, [], None, [], 0
        return taken

    def _size(self, message: Any) -> int:
        """The message's bytes in a batch, or -1 when the run does not take it."""
        if type(message) is not self._message_class:
            return -1
        plain = (type(message.topic) is str and (message.topic in self._topics or message.topic in self._direct)
                 and type(message.data) is bytes
                 and message.key is None and message.attribute is None and not message.headers
                 and message.deliver_at is None and message.delay_ms is None and type(message.timestamp_ms) is int)
        if not plain:
            return -1
        size = self._record_overhead + len(message.data)
        buffer = self._buffer
        if size > self._max_message_bytes or (buffer.used + size > buffer.limit and buffer.used):
            return -1
        return size

    def _add(self, message: Any, size: int, acks: int, waiter: Any) -> None:
        if message.topic in self._topics:
            self._append(message, size, acks, waiter)
            return
        if self.values:
            self._flush()  # the run so far goes first: sends keep their order
        self._place_one(message.topic, message.data, message.timestamp_ms, waiter, size, acks)

    def _flush(self) -> None:
        self._on_flush()
        if self.values:
            raise RuntimeError("PlainRun: on_flush did not take the run")

    def _append(self, message: Any, size: int, acks: int, waiter: Any) -> None:
        if self.values and (message.topic != self.topic or acks != self.acks):
            self._flush()  # the run so far goes first: sends keep their order
        if not self.values:
            self.topic, self.acks = message.topic, acks
            self._on_start()
        self.values.append(message.data)
        if self.stamps is not None:
            self.stamps.append(message.timestamp_ms)
        elif message.timestamp_ms >= 0:  # the first timestamp given: the messages before it had none (-1)
            self.stamps = [-1] * (len(self.values) - 1) + [message.timestamp_ms]
        if waiter is not None:
            self.waiters.append(waiter)
        self.nbytes += size
        self._buffer.used += size
        if len(self.values) >= self._capacity:
            self._on_flush()


PlainRun: type[PlainRunPy] = _compiled.speedups.PlainRun if _compiled.speedups is not None else PlainRunPy
"""The compiled run when the module is in use (metaq._compiled), else the reference."""
