"""Where a dead letter came from, proven by the broker that stored it (docs/consumers.md#dead-letters).

A consumer that gives a message up produces a copy to its group's dead-letter topic ``%DLQ%<group>`` with
``dlq-original-*`` headers naming where it came from (:mod:`metaq.client.group.dead_letter`); an operator's
redrive later produces it back there. Those headers are written by whoever writes to the dead-letter topic,
so a redrive that believed them would let any consumer of the group (bob, who may only read ``audit``) have
the operator's redrive write anything into any topic (``orders``): a confused deputy.

So every batch produced to a ``%DLQ%`` topic passes :func:`stamp_dead_letters` first, and each of its
messages must name its original topic, partition and offset; then the broker:

1. checks that the writer may ``consume`` the original topic and the group (with ACLs): a principal can only
   dead-letter messages of topics it reads, for a group it belongs to;
2. when the original partition is one of its own, reads the message at that offset and requires the dead
   letter to be its copy (same payload, key and attribute, and message id when given): **exact**; when the
   partition is on another broker, or the message is gone (retention), the copy is **unverified**;
3. replaces any :data:`PROVENANCE` header the message carries with its own, saying who wrote it, what was
   checked and whether the writer may also ``produce`` to the original topic::

       metaq-dlq-provenance: v1;writer=User:bob;topic=audit;partition=0-0;offset=17;copy=exact;may-produce=no

No client can write that header to a dead-letter topic (it is replaced on every produce there, and dead
letters reach their topic through this produce path only: transactions and delayed messages are refused
for them, replication copies what the master stored), so a redrive trusts it, and only it: a dead letter is
sent back only to the topic its provenance names, and only if it is an exact copy of a message of that topic
(it was there already: the redrive adds nothing a reader of the topic had not got) or its writer may
produce to that topic itself (nothing the writer could not have done). Anything else is refused by the
redrive and reported (``metaq group redrive``'s ``refused``), never sent.

The batch is decoded and re-encoded to carry the header (the only place the broker rewrites a produced
batch: dead letters are rare), keeping its producer block so that an idempotent retry is still recognised.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from metaq.broker import audit
from metaq.errors import (
    CorruptMessageError,
    GroupAuthorizationError,
    InvalidRequestError,
    MetaqError,
    TopicAuthorizationError,
)
from metaq.protocol.dead_letters import (
    ANONYMOUS,
    EXACT,
    H_MESSAGE_ID,
    H_OFFSET,
    H_PARTITION,
    H_TOPIC,
    PROVENANCE,
    UNVERIFIED,
    Provenance,
)
from metaq.protocol.records import (
    ATTR_DELAYED,
    BatchHeader,
    ProducerStamp,
    decode_batch,
    decode_fetched,
    encode_messages,
    read_header,
    with_producer_stamp,
)
from metaq.types import DEAD_LETTER_TOPIC_PREFIX, Message, PartitionId, parse_message_id

if TYPE_CHECKING:
    from metaq.broker.core import Broker
    from metaq.broker.session import Session


def is_dead_letter_topic(topic: str) -> bool:
    return topic.startswith(DEAD_LETTER_TOPIC_PREFIX)


def _header(msg: Message, name: str) -> str | None:
    for key, value in msg.headers or ():
        if key == name:
            return bytes(value).decode("utf-8", "replace")
    return None


def stamp_dead_letters(broker: Broker, session: Session | None, topic: str, records: bytes | memoryview,
                       header: BatchHeader, stamp: ProducerStamp | None
                       ) -> tuple[bytes, BatchHeader, ProducerStamp | None]:
    """The batch to store in dead-letter topic ``topic``: each message checked and given the broker's
    :data:`PROVENANCE` header. Raises (nothing stored) when one may not be written there."""
    if header.attributes & ATTR_DELAYED:
        raise InvalidRequestError(f"{topic} is a dead-letter topic: its messages cannot be delayed")
    group = topic[len(DEAD_LETTER_TOPIC_PREFIX):]
    writer = session.principal if session is not None and session.principal is not None else ANONYMOUS
    acls = broker.acls if broker.config.acl_enabled else None
    peer = session.peer if session is not None else None
    if acls is not None and not acls.allows(writer, "group", group, "consume"):
        broker.audit(writer, "consume", f"group:{group}", audit.DENIED, peer, f"dead letters to {topic}")
        raise GroupAuthorizationError(f"{writer} may not consume group {group!r}, so it may not write its dead "
                                      f"letters to {topic}")
    try:
        messages = decode_batch(records, topic, header=header, verify=False)
    except MetaqError as exc:
        raise CorruptMessageError(f"the dead letters sent to {topic} cannot be read: {exc}") from None
    stamped = []
    for i, msg in enumerate(messages):
        provenance = _provenance(broker, writer, topic, i, msg)
        if acls is not None and not acls.allows(writer, "topic", provenance.topic, "consume"):
            broker.audit(writer, "consume", f"topic:{provenance.topic}", audit.DENIED, peer,
                         f"a dead letter to {topic}")
            raise TopicAuthorizationError(f"{writer} may not consume topic {provenance.topic!r}, so it may not "
                                          f"dead-letter its messages (message {i} of the batch to {topic})")
        if acls is not None:
            provenance = Provenance(writer, provenance.topic, provenance.partition, provenance.offset,
                                    provenance.copy, acls.allows(writer, "topic", provenance.topic, "produce"))
        headers = [(k, v) for k, v in msg.headers or () if k != PROVENANCE]
        headers.append((PROVENANCE, provenance.header_value()))
        stamped.append(Message(topic, msg.data, msg.attribute, msg.key, headers, msg.timestamp_ms))
    out = encode_messages(stamped)
    if stamp is not None:
        out = with_producer_stamp(out, stamp)
    return out, read_header(out), stamp


def _provenance(broker: Broker, writer: str, topic: str, index: int, msg: Message) -> Provenance:
    original = _header(msg, H_TOPIC)
    partition_text = _header(msg, H_PARTITION)
    offset_text = _header(msg, H_OFFSET)
    if not original or partition_text is None or offset_text is None:
        raise InvalidRequestError(f"message {index} of the batch to dead-letter topic {topic} does not name where it "
                                  f"came from ({H_TOPIC}, {H_PARTITION}, {H_OFFSET}); a dead-letter topic takes "
                                  "only the dead letters of its group's consumers")
    try:
        partition = PartitionId.parse(partition_text)
        offset = int(offset_text)
    except (ValueError, MetaqError):
        raise InvalidRequestError(f"message {index} of the batch to {topic}: {H_PARTITION}={partition_text!r} and "
                                  f"{H_OFFSET}={offset_text!r} must be brokerId-partition and an offset") from None
    copy = _compare(broker, topic, index, msg, original, partition, offset)
    return Provenance(writer, original, str(partition), offset, copy, True)


def _compare(broker: Broker, topic: str, index: int, msg: Message, original: str, partition: PartitionId,
             offset: int) -> str:
    """EXACT when the message at ``original`` ``partition`` ``offset`` here is the one ``msg`` copies; UNVERIFIED
    when it is not here to compare with; raises when it is here and ``msg`` is not its copy."""
    if partition.broker_id != broker.config.broker_id:
        return UNVERIFIED
    plog = broker.logs.get(original, partition.partition)
    if plog is None or not plog.log_start_offset <= offset < plog.log_end_offset:
        return UNVERIFIED
    fslice = plog.read(offset, 1)
    try:
        data = fslice.read_bytes()
    finally:
        fslice.release()
    stored = next((m for m in decode_fetched(data, original, partition.partition, offset)[0] if m.offset == offset),
                  None)
    if stored is None:
        return UNVERIFIED
    claimed_id = _header(msg, H_MESSAGE_ID)
    same = (bytes(stored.data) == bytes(msg.data) and stored.key == msg.key and stored.attribute == msg.attribute
            and (not claimed_id or _same_id(claimed_id, plog.message_id(offset))))
    if not same:
        raise InvalidRequestError(f"message {index} of the batch to {topic} is not a copy of the message at "
                                  f"{original} {partition}@{offset} that it names")
    return EXACT


def _same_id(text: str, message_id: int) -> bool:
    try:
        return parse_message_id(text) == message_id
    except (ValueError, MetaqError):
        return False
