"""The shared vocabulary: messages, message ids, send results, topic-partitions, names and limits.

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

import hashlib
import re
from dataclasses import dataclass, field
from typing import NamedTuple

from metaq.errors import InvalidArgument

MessageId = int

BROKER_ID_MAX = 0xFFFF
OFFSET_BITS = 64
TAG_BITS = 48
_TAG_MASK = (1 << TAG_BITS) - 1
_OFFSET_MASK = (1 << OFFSET_BITS) - 1

TOPIC_NAME_MAX_CHARS = 249
_TOPIC_RE = re.compile(r"[A-Za-z0-9._-]+")

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

    The rules keep a topic name safe as a directory name: no path separators, no '..', no NUL.
    """
    if not isinstance(topic, str):
        raise InvalidArgument(f"topic must be a string, not {type(topic).__name__}")
    if not topic:
        raise InvalidArgument("topic name is empty")
    if len(topic) > TOPIC_NAME_MAX_CHARS:
        raise InvalidArgument(f"topic name has {len(topic)} characters; at most {TOPIC_NAME_MAX_CHARS}")
    if topic in (".", ".."):
        raise InvalidArgument(f"topic name {topic!r} is not allowed")
    if not _TOPIC_RE.fullmatch(topic):
        bad = next(ch for ch in topic if not _TOPIC_RE.fullmatch(ch))
        raise InvalidArgument(
            f"topic name {topic!r} contains {bad!r}; use letters, digits, '-', '_' and '.' only"
        )
    return topic


def validate_partition(partition: object) -> int:
    if not isinstance(partition, int) or isinstance(partition, bool) or partition < 0:
        raise InvalidArgument(f"partition must be an integer >= 0, not {partition!r}")
    return partition


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


@dataclass(slots=True)
class Message:
    """A message as the producer sends it and the consumer receives it.

    ``data`` (the payload) is never altered by metaq. ``attribute`` is MetaQ's one string consumers
    filter on. ``key`` chooses the partition under the key-hash selector and lets readers de-duplicate.
    The broker fills ``partition``, ``offset``, ``id`` and ``append_time_ms`` on the consumer side.
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
    # No __post_init__ check on purpose: consumers build millions of these per second, and it would
    # double the cost of each. The producer checks what it is given (InvalidArgument for non-bytes data).


@dataclass(slots=True)
class SendResult:
    """What a send returns. A one-way (async) send returns partition, offset and id of -1, as MetaQ."""

    success: bool
    message_id: MessageId = -1
    partition: int = -1
    offset: int = -1
    error: BaseException | None = field(default=None)
    topic: str = ""

    @property
    def message_id_hex(self) -> str:
        return format_message_id(self.message_id) if self.message_id >= 0 else "-1"
