"""The shared vocabulary: messages, message ids, send results, partition ids, names and limits.

Partition identity
------------------
A partition is ``brokerId-partition`` within a topic, as MetaQ names it (its ``Partition`` class and
ZooKeeper paths such as ``offsets/<topic>/<brokerId-partition>``): :class:`PartitionId`, written
``"1-3"`` (broker 1, partition 3) and ordered by broker id, then partition number. A broker id names a
*replica group* (a master and its slaves share it), so the id stays valid across a failover. The same
value keys the wire's group assignments and offset entries, client metadata, every offset store, the
Spark source's offsets JSON and the CLI. :class:`TopicPartition` is ``(topic, PartitionId)``, written
``"orders:1-3"`` (``:`` cannot occur in a topic name, so the text parses back).

Message ids
-----------
A message id is a 128-bit unsigned integer assigned by the broker when it appends a batch::

    bits 127..112  broker id            (16 bits; MetaQ brokerIds are 0..1024)
    bits 111..64   partition tag        (48 bits of BLAKE2b over "topic\\x00partition")
    bits  63..0    offset               (the message's offset in its partition)

It is unique across brokers (the broker id), never reused (offsets only grow), and resolves to
(topic, partition, offset) without a scan: the broker keeps a dict from partition tag to partition.
The tag is a hash, so two partitions of one broker could collide; a broker refuses to create a
partition whose tag is taken (about one chance in 10^7 with 10,000 partitions). A batch stores its
base id; message ``i`` of the batch has id ``base_id + offset_delta``. Printed as 32 hex digits.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from metaq import _compiled
from metaq.errors import InvalidArgument

MessageId = int

BROKER_ID_MAX = 0xFFFF
OFFSET_BITS = 64
TAG_BITS = 48
_TAG_MASK = (1 << TAG_BITS) - 1
_OFFSET_MASK = (1 << OFFSET_BITS) - 1

TOPIC_NAME_MAX_CHARS = 249
_TOPIC_RE = re.compile(r"[A-Za-z0-9._-]+")
DEAD_LETTER_TOPIC_PREFIX = "%DLQ%"
"""The one reserved use of '%' in a topic name: ``%DLQ%<group>``, a consumer group's dead-letter topic
(docs/consumers.md), ``<group>`` following the group-name rules (letters, digits, '.', '_', '-', '@')."""
_GROUP_NAME_RE = re.compile(r"[A-Za-z0-9._@-]+")

DEFAULT_PORT = 8123
DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024
DEFAULT_MAX_BATCH_BYTES = 16 * 1024 * 1024


def partition_tag(topic: str, partition: int) -> int:
    """The 48-bit tag of a partition inside message ids."""
    digest = hashlib.blake2b(f"{topic}\x00{partition}".encode(), digest_size=6).digest()
    return int.from_bytes(digest, "big")


def make_message_id(broker_id: int, tag: int, offset: int) -> MessageId:
    if not 0 <= broker_id <= BROKER_ID_MAX:
        raise InvalidArgument(f"broker id {broker_id} is outside 0..{BROKER_ID_MAX}")
    return (broker_id << (TAG_BITS + OFFSET_BITS)) | ((tag & _TAG_MASK) << OFFSET_BITS) | (offset & _OFFSET_MASK)


class MessageIdParts(NamedTuple):
    broker_id: int
    tag: int
    offset: int


def split_message_id(message_id: MessageId) -> MessageIdParts:
    if not 0 <= message_id < (1 << 128):
        raise InvalidArgument(f"message id {message_id} is not a 128-bit unsigned integer")
    return MessageIdParts(
        message_id >> (TAG_BITS + OFFSET_BITS),
        (message_id >> OFFSET_BITS) & _TAG_MASK,
        message_id & _OFFSET_MASK,
    )


def format_message_id(message_id: MessageId) -> str:
    return f"{message_id:032x}"


def parse_message_id(text: str) -> MessageId:
    try:
        value = int(text, 16)
    except ValueError:
        raise InvalidArgument(f"message id {text!r} is not hexadecimal") from None
    split_message_id(value)
    return value


def validate_topic(topic: object) -> str:
    """Return the topic name or raise InvalidArgument saying what is wrong with it.

    The rules keep a topic name safe as a directory name: no path separators, no '..', no NUL. The
    one name with '%' is a dead-letter topic, ``%DLQ%<group>``.
    """
    if not isinstance(topic, str):
        raise InvalidArgument(f"topic must be a string, not {type(topic).__name__}")
    if not topic:
        raise InvalidArgument("topic name is empty")
    if len(topic) > TOPIC_NAME_MAX_CHARS:
        raise InvalidArgument(f"topic name has {len(topic)} characters; at most {TOPIC_NAME_MAX_CHARS}")
    if topic in (".", ".."):
        raise InvalidArgument(f"topic name {topic!r} is not allowed")
    if topic.startswith(DEAD_LETTER_TOPIC_PREFIX):
        group = topic[len(DEAD_LETTER_TOPIC_PREFIX):]
        if not group or group in (".", "..") or not _GROUP_NAME_RE.fullmatch(group):
            raise InvalidArgument(f"dead-letter topic name {topic!r}: after {DEAD_LETTER_TOPIC_PREFIX!r} comes a "
                                  "consumer group name: letters, digits, '-', '_', '.' and '@' (not '.' or '..')")
        return topic
    if not _TOPIC_RE.fullmatch(topic):
        bad = next(ch for ch in topic if not _TOPIC_RE.fullmatch(ch))
        raise InvalidArgument(
            f"topic name {topic!r} contains {bad!r}; use letters, digits, '-', '_' and '.' only"
            + (f" ('%' only in a dead-letter topic, {DEAD_LETTER_TOPIC_PREFIX}<group>)" if bad == "%" else "")
        )
    return topic


def validate_partition(partition: object) -> int:
    if not isinstance(partition, int) or isinstance(partition, bool) or partition < 0:
        raise InvalidArgument(f"partition must be an integer >= 0, not {partition!r}")
    return partition


_PARTITION_ID_RE = re.compile(r"([0-9]{1,5})-([0-9]{1,10})")


@functools.total_ordering
@dataclass(frozen=True, slots=True, eq=False)
class PartitionId:
    """A partition's identity within a topic: ``brokerId-partition`` (see the module docstring).

    Frozen and hashable; equal to any PartitionId (subclasses included, such as the client's
    ``metaq.client.metadata.Partition``) with the same broker id and number; ordered by broker id,
    then partition, as MetaQ sorts partitions. ``str()`` is ``"1-3"``; :meth:`parse` reads it back.
    """

    broker_id: int
    partition: int

    def __post_init__(self) -> None:
        b, p = self.broker_id, self.partition
        if not isinstance(b, int) or isinstance(b, bool) or not 0 <= b <= BROKER_ID_MAX:
            raise InvalidArgument(f"broker id must be an integer 0..{BROKER_ID_MAX}, not {b!r}")
        if not isinstance(p, int) or isinstance(p, bool) or p < 0:
            raise InvalidArgument(f"partition must be an integer >= 0, not {p!r}")

    @classmethod
    def parse(cls, text: str) -> PartitionId:
        """``"1-3"`` -> PartitionId(1, 3); InvalidArgument saying the expected form otherwise."""
        match = _PARTITION_ID_RE.fullmatch(text.strip()) if isinstance(text, str) else None
        if match is None:
            raise InvalidArgument(f"partition id {text!r} is not brokerId-partition (e.g. '0-3': partition 3 "
                                  "of broker 0)")
        try:
            return cls(int(match.group(1)), int(match.group(2)))
        except InvalidArgument as exc:
            raise InvalidArgument(f"partition id {text!r}: {exc}") from None

    def __str__(self) -> str:
        return f"{self.broker_id}-{self.partition}"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PartitionId):
            return self.broker_id == other.broker_id and self.partition == other.partition
        return NotImplemented

    def __lt__(self, other: object) -> bool:
        if isinstance(other, PartitionId):
            return (self.broker_id, self.partition) < (other.broker_id, other.partition)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.broker_id, self.partition))

    @property
    def id(self) -> PartitionId:
        """The bare identity (a subclass such as the client's Partition drops its extra fields)."""
        return self if type(self) is PartitionId else PartitionId(self.broker_id, self.partition)


PartitionKey = PartitionId | int | str
"""How callers may name a partition: a PartitionId, its text ``"1-3"``, or a bare number (accepted
only where exactly one broker holds a partition with that number)."""


def partition_key(value: object) -> PartitionId | int:
    """A PartitionId for a PartitionId or ``"b-p"`` text, the number for an int or a digits-only text.

    The bare number still has to be resolved against the topic's partitions (see
    ``metaq.client.metadata.resolve_partition``); this only checks the form.
    """
    if isinstance(value, PartitionId):
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.isascii() and text.isdigit():
            return int(text)
        return PartitionId.parse(text)
    return validate_partition(value)


class TopicPartition(NamedTuple):
    """A partition of a topic: ``(topic, PartitionId)``, written ``"orders:1-3"``."""

    topic: str
    partition: PartitionId

    def __str__(self) -> str:
        return f"{self.topic}:{self.partition}"

    @classmethod
    def parse(cls, text: str) -> TopicPartition:
        topic, sep, pid = text.rpartition(":") if isinstance(text, str) else ("", "", "")
        if not sep:
            raise InvalidArgument(f"{text!r} is not topic:brokerId-partition (e.g. 'orders:0-3')")
        return cls(validate_topic(topic), PartitionId.parse(pid))


@dataclass(slots=True)
class Message:
    """A message as the producer sends it and the consumer receives it.

    ``data`` (the payload) is never altered by metaq. ``attribute`` is MetaQ's one string consumers
    filter on. ``key`` chooses the partition under the key-hash selector and lets readers de-duplicate.
    The broker fills ``partition``, ``offset``, ``id`` and ``append_time_ms`` on the consumer side, and
    the client ``broker_id``: the broker whose partition it was read from, so ``partition_id`` (that
    broker id and ``partition``) names the partition unambiguously when a topic spans several brokers.
    """

    topic: str
    data: bytes
    attribute: str | None = None
    key: bytes | None = None
    headers: list[tuple[str, bytes]] | None = None
    timestamp_ms: int = -1
    partition: int = -1
    offset: int = -1
    id: MessageId = -1
    append_time_ms: int = -1
    broker_id: int = -1
    deliver_at: int | None = None
    """Delayed delivery (docs/delayed.md): ms since the epoch when consumers may see it (producer side)."""
    delay_ms: int | None = None
    """Delayed delivery: ms from the send until consumers may see it; not with ``deliver_at``."""
    # No __post_init__ check on purpose: consumers build millions of these per second, and it would
    # double the cost of each. The producer checks what it is given (InvalidArgument for non-bytes data).
    # The consumer's decoder (metaq.protocol.records.decode.build_messages, and the compiled MessageBuilder)
    # skips __init__ too: it sets every field of an empty instance itself. A new field must be set there as
    # well, and in the compiled Message (src/metaq/_speedups.c): the compiled builder refuses the class at import
    # until it is, and tests/unit/test_message_type.py fails.

    @property
    def partition_id(self) -> PartitionId:
        """``brokerId-partition`` of a consumed message (InvalidArgument for one not read from a broker)."""
        return PartitionId(self.broker_id, self.partition)


@dataclass(slots=True)
class SendResult:
    """What a send returns. A one-way (async) send returns partition, offset and id of -1, as MetaQ.

    ``broker_id`` and ``partition`` say where the message was stored (``partition_id`` together).
    """

    # A new field must be added to the compiled SendResult too (src/metaq/_speedups.c:
    # tests/unit/test_send_result_impl.py fails until it is).

    success: bool
    message_id: MessageId = -1
    partition: int = -1
    offset: int = -1
    error: BaseException | None = field(default=None)
    topic: str = ""
    broker_id: int = -1

    @property
    def partition_id(self) -> PartitionId:
        """``brokerId-partition`` the message was stored in (InvalidArgument if it was not stored)."""
        return PartitionId(self.broker_id, self.partition)

    @property
    def message_id_hex(self) -> str:
        """The message id as 32 hex digits (what the CLI prints); ``"-1"`` when nothing was stored."""
        return format_message_id(self.message_id) if self.message_id >= 0 else "-1"


_PyMessage = Message
"""The dataclass: ``Message`` without the compiled module (not built, or ``METAQ_NO_EXTENSIONS=1``), and the reference
of the compiled one (metaq._speedups.Message), which behaves as it does: same fields, defaults, constructor errors,
equality, repr, property, pickling, copying, subclassing and dataclasses helpers (tests/unit/test_message_type.py
runs both)."""

_PySendResult = SendResult
"""The dataclass: ``SendResult`` without the compiled module (not built, or ``METAQ_NO_EXTENSIONS=1``), and the
reference of the compiled one (metaq._speedups.SendResult), which behaves as it does: same attributes, defaults,
equality, repr, properties, pickling and dataclasses helpers (tests/unit/test_send_result_impl.py runs both)."""

SPEEDUPS = _compiled.ENABLED
"""Whether ``Message`` and ``SendResult`` are the compiled ones."""


def _adopt(compiled: type, reference: type, names: tuple[str, ...]) -> type:
    """``compiled``, given what the dataclass ``reference`` adds on top of its fields: its properties, the dataclasses
    metadata (``fields``, ``asdict``, ``replace`` and ``match`` read it) and ``names``; the reference is renamed
    ``_Py<Name>`` so that its own instances pickle by a name that is theirs."""
    for name in ("__dataclass_fields__", "__dataclass_params__", "__match_args__", *names):
        setattr(compiled, name, reference.__dict__[name])
    reference.__qualname__ = reference.__name__ = "_Py" + reference.__name__
    return compiled


if not TYPE_CHECKING and _compiled.speedups is not None:
    # The compiled Message owns its thirteen fields: Message(...) is one C call instead of the dataclass's __init__
    # (docs/compiled.md). __slots__ names them, so copy and pickle take the dataclass's path (object's reduce, state
    # (None, {field: value})); __annotations__ and __doc__ are what typing.get_type_hints and help() read.
    Message = _adopt(_compiled.speedups.Message, _PyMessage,
                     ("partition_id", "__slots__", "__annotations__", "__doc__"))
    # The compiled SendResult holds the seven fields in a form the cyclic GC does not track for a success: a window of
    # tens of thousands of live results no longer makes full collections (docs/compiled.md).
    SendResult = _adopt(_compiled.speedups.SendResult, _PySendResult, ("partition_id", "message_id_hex"))
