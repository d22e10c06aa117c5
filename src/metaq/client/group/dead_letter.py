"""Dead letters: the ``dead-letter`` rejection policy, and reading and redriving a group's dead-letter topic.

A message whose listener failed ``1 + max_fetch_retries`` times is produced to the group's dead-letter
topic ``%DLQ%<group>`` (RocketMQ's name) with its key, attribute, payload and headers unchanged and
the ``dlq-*`` headers below added; the group's offset moves past it only once that produce is
acknowledged. While the produce fails (the broker is down, the topic cannot be created) the
partition waits and retries with back-off: nothing is skipped. A consumer killed between the
acknowledgement and its next commit gets the message again, so the dead-letter topic is
at-least-once (a copy may appear twice).

The topic is created when missing, with ``dead_letter_partitions`` partitions, on the group's
coordinator (the lowest broker id among the session's servers; in cluster mode, among the registered
masters, which then registers it in ZooKeeper); a broker's autoCreateTopics is not needed.

:func:`redrive` reads the dead-letter topic as the group ``<group>@dlq-redrive`` and produces each
message back to its original topic (same key, the original headers, the ``dlq-*`` headers removed,
``metaq-redrive-count`` incremented), committing that group's offsets as it goes, so a second run
sends only what was dead-lettered since. :func:`dead_letters` lists what the topic holds.

A redrive trusts nothing a dead letter's writer wrote: it sends a message back only to the topic named by
the provenance the broker stamped on it when it was stored (:mod:`metaq.protocol.dead_letters`), and only if
the broker found it an exact copy of a message of that topic or its writer may produce there itself. Any
other dead letter (no provenance: written before brokers stamped them, or not by a consumer) is refused,
counted in :attr:`RedriveResult.refused` and passed over; the operator can read it with
:func:`dead_letters` and decide.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from metaq.client.config import ProducerConfig
from metaq.client.consumer import DEFAULT_FETCH_MAX_BYTES, PullConsumer, offsets_of
from metaq.client.core import ClientCore
from metaq.client.group.offsets import BrokerOffsetStorage, OffsetStorage, ZooKeeperOffsetStorage
from metaq.client.metadata import Partition
from metaq.client.producer import Producer
from metaq.client.selectors import KeyHashSelector, RoundRobinSelector
from metaq.errors import (
    BrokerError,
    ConnectionClosedError,
    InvalidArgument,
    MetaqError,
    RequestTimeoutError,
    TopicExistsError,
)
from metaq.net.retry import RetryPolicy
from metaq.protocol import dead_letters as dlp
from metaq.protocol import messages as m
from metaq.types import (
    DEAD_LETTER_TOPIC_PREFIX,
    TOPIC_NAME_MAX_CHARS,
    Message,
    PartitionId,
    SendResult,
    TopicPartition,
    format_message_id,
    validate_topic,
)

log = logging.getLogger("metaq.client.group.dead_letter")

DLQ_PREFIX = DEAD_LETTER_TOPIC_PREFIX
"""The reserved prefix of dead-letter topics: ``%DLQ%<group>``; no other topic name may hold a '%'."""
GROUP_NAME_MAX_CHARS = TOPIC_NAME_MAX_CHARS - len(DLQ_PREFIX)
"""The longest group name whose dead-letter topic name is still a valid topic name."""
REDRIVE_GROUP_SUFFIX = "@dlq-redrive"
"""``metaq group redrive GROUP`` commits its progress as the group ``GROUP@dlq-redrive``."""

HEADER_PREFIX = "dlq-"
H_TOPIC = dlp.H_TOPIC
H_PARTITION = dlp.H_PARTITION
"""``brokerId-partition``."""
H_OFFSET = dlp.H_OFFSET
H_MESSAGE_ID = dlp.H_MESSAGE_ID
"""32 hex digits."""
H_DELIVERIES = "dlq-deliveries"
H_ERROR_TYPE = "dlq-error-type"
H_ERROR_MESSAGE = "dlq-error-message"
H_TIME = "dlq-time-ms"
"""When it was dead-lettered, milliseconds since the epoch."""
H_REDRIVE_COUNT = "metaq-redrive-count"
"""Set by a redrive: how many times the message was sent back from a dead-letter topic. Kept (not a
``dlq-*`` header) so a message that dies again and is redriven again counts on."""
ERROR_MESSAGE_CHARS_MAX = 1024
"""The last error's message is cut to this many characters (an exception text can be huge)."""
ROLLBACK_ONLY_ERROR = "RollbackOnly"
"""The error type when the listener did not raise but marked the message rollback-only."""

DEAD_LETTER_RETRY = RetryPolicy(initial_delay_s=0.2, max_delay_s=5.0)
"""A dead-letter produce that fails waits 0.2 s doubling up to 5 s, and retries until it is
acknowledged or the partition is given up (rebalance, close)."""
_STOP_POLL_S = 0.05
REDRIVE_WINDOW_BYTES_MAX = 8 * 1024 * 1024
"""A redrive waits for its window of sends once this much is unacknowledged (well under the producer's
buffer, so a send never fails for want of room)."""
TOPIC_VISIBLE_WAIT_S = 5.0
"""After creating the dead-letter topic, how long to wait for metadata to show it before sending."""


def dead_letter_topic(group: str) -> str:
    """``%DLQ%<group>``; InvalidArgument for a group name that cannot be part of a topic name."""
    if not isinstance(group, str) or not group or len(group) > GROUP_NAME_MAX_CHARS:
        raise InvalidArgument(f"a dead-letter topic needs a group name of 1..{GROUP_NAME_MAX_CHARS} characters, "
                              f"not {group!r}")
    return validate_topic(DLQ_PREFIX + group)


def redrive_group(group: str) -> str:
    """The consumer group :func:`redrive` commits its progress under."""
    return group + REDRIVE_GROUP_SUFFIX


def _text(headers: Sequence[tuple[str, bytes]] | None, name: str) -> str | None:
    for k, v in headers or ():
        if k == name:
            return bytes(v).decode("utf-8", errors="replace")
    return None


def dead_letter_headers(msg: Message, error: BaseException | None, deliveries: int,
                        now_ms: int | None = None) -> list[tuple[str, bytes]]:
    """The message's own headers (earlier ``dlq-*`` ones dropped) followed by this dead-lettering's."""
    if error is None:
        error_type, error_message = ROLLBACK_ONLY_ERROR, "the listener marked the message rollback-only"
    else:
        error_type, error_message = type(error).__qualname__, str(error)
    if len(error_message) > ERROR_MESSAGE_CHARS_MAX:
        error_message = error_message[:ERROR_MESSAGE_CHARS_MAX - 3] + "..."
    kept = [(k, v) for k, v in msg.headers or () if not k.startswith(HEADER_PREFIX)]
    added = [
        (H_TOPIC, msg.topic),
        (H_PARTITION, str(msg.partition_id)),
        (H_OFFSET, str(msg.offset)),
        (H_MESSAGE_ID, format_message_id(msg.id) if msg.id >= 0 else ""),
        (H_DELIVERIES, str(deliveries)),
        (H_ERROR_TYPE, error_type),
        (H_ERROR_MESSAGE, error_message),
        (H_TIME, str(int(time.time() * 1000) if now_ms is None else now_ms)),
    ]
    return kept + [(k, v.encode()) for k, v in added]


def _routing_selector() -> KeyHashSelector:
    """Keyed messages by key hash (so a key keeps one partition), the others round robin."""
    return KeyHashSelector(fallback=RoundRobinSelector())


async def _sleep_unless(delay_s: float, stop: Callable[[], bool]) -> None:
    deadline = time.monotonic() + delay_s
    while not stop():
        left = deadline - time.monotonic()
        if left <= 0:
            return
        await asyncio.sleep(min(left, _STOP_POLL_S))


async def _create_topic(core: ClientCore, topic: str, partitions: int) -> None:
    """Create ``topic`` on the groups' coordinator and wait (a little) until metadata shows it."""
    try:
        await core.request(m.CreateTopicRequest(topic, partitions, []), await core.coordinator())
        log.info("created the dead-letter topic %s (%d partitions)", topic, partitions)
    except TopicExistsError:
        pass  # another member of the group created it first
    deadline = time.monotonic() + TOPIC_VISIBLE_WAIT_S
    while True:
        core.metadata.cache.invalidate(topic)
        if (await core.metadata.refresh_topic(topic)).partitions or time.monotonic() > deadline:
            return
        await asyncio.sleep(0.1)  # cluster mode: the broker registers it in ZooKeeper, the watch brings it here


class DeadLetterSender:
    """The ``dead-letter`` rejection policy of one consumer: produce, acknowledged, or retry."""

    def __init__(self, core: ClientCore, group: str, partitions: int = 1) -> None:
        self._core = core
        self.topic = dead_letter_topic(group)
        self.partitions = partitions
        self._producer: Producer | None = None
        self._topic_ready = False
        self._topic_seen = False
        """Metadata showed the topic once: from then on it is never created again (see :meth:`_check_topic`)."""
        self.sent = 0
        """Messages dead-lettered (acknowledged by the broker)."""
        self.failures = 0
        """Dead-letter produces (or topic creations) that failed and were retried."""

    async def send(self, msg: Message, error: BaseException | None, deliveries: int,
                   stop: Callable[[], bool]) -> bool:
        """Produce ``msg`` to the dead-letter topic; True once the broker acknowledged it, False if
        ``stop()`` became true first (the partition is given up: its next owner gets the message again)."""
        dead = Message(self.topic, msg.data, msg.attribute, msg.key,
                       dead_letter_headers(msg, error, deliveries), msg.timestamp_ms)
        backoff = DEAD_LETTER_RETRY.start()
        while not stop():
            try:
                if not self._topic_ready:
                    await self._check_topic()
                    self._topic_ready = True
                if self._producer is None:
                    # a short delivery deadline: this loop does the waiting (and counts and logs each failure)
                    self._producer = Producer(self._core, ProducerConfig(linger_ms=0, delivery_timeout_ms=2000),
                                              _routing_selector())
                timeout_s = self._core.config.request_timeout_s
                sending = asyncio.ensure_future(self._producer.send(dead, timeout_s=timeout_s))
                while not sending.done():
                    await asyncio.wait([sending], timeout=_STOP_POLL_S)
                    if not sending.done() and stop():
                        # given up while the broker has not answered: not acknowledged, so the partition's next
                        # owner delivers it again (if it is stored after all, the DLQ gets a second copy)
                        return False
                result = sending.result()
                if result.success:
                    self.sent += 1
                    log.warning("%s:%s: offset %d failed %d times; sent to %s (%s@%d)", msg.topic, msg.partition_id,
                                msg.offset, deliveries, self.topic, result.partition_id, result.offset)
                    return True
                failure: BaseException | None = result.error
            except (MetaqError, OSError) as exc:
                failure = exc
            self.failures += 1
            self._topic_ready = False  # check again that the topic exists (deleted meanwhile? never created?)
            delay = backoff.next_delay_unbounded_s()
            log.error("%s:%s: cannot send offset %d to the dead-letter topic %s (%s); the partition waits, "
                      "retrying in %.1fs", msg.topic, msg.partition_id, msg.offset, self.topic, failure, delay)
            await _sleep_unless(delay, stop)
        return False

    async def _check_topic(self) -> None:
        """Create the topic if it was never seen; a topic seen before that metadata no longer shows is
        on brokers that are down now: wait for them (creating it elsewhere, or letting a broker
        auto-create it, would scatter the group's dead letters)."""
        tm = await self._core.metadata.refresh_topic(self.topic)
        if tm.partitions:
            self._topic_seen = True
            return
        if self._topic_seen:
            raise ConnectionClosedError(f"no broker that holds {self.topic} answers")
        await _create_topic(self._core, self.topic, self.partitions)
        self._topic_seen = True

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.close()


# -- reading and redriving --------------------------------------------------------------------------


def _core_of(session: Any) -> ClientCore:
    core = session._core if hasattr(session, "_core") else session
    if not isinstance(core, ClientCore):
        raise InvalidArgument(f"expected a MessageSessionFactory, not {session!r}")
    return core


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One message of a dead-letter topic, with what its headers say of where it came from."""

    message: Message
    """As stored in ``%DLQ%<group>`` (its partition and offset there)."""

    def header(self, name: str) -> str | None:
        """A ``dlq-*`` header's value as text (None when absent), e.g. ``header("dlq-error-type")``."""
        return _text(self.message.headers, name)

    @property
    def original_topic(self) -> str | None:
        """The topic the message was dead-lettered from."""
        return self.header(H_TOPIC)

    @property
    def original_headers(self) -> list[tuple[str, bytes]]:
        """The message's own headers (those it had when it was produced, and a redrive count)."""
        return [(k, v) for k, v in self.message.headers or ()
                if not k.startswith(HEADER_PREFIX) and k != dlp.PROVENANCE]

    @property
    def provenance(self) -> dlp.Provenance | None:
        """Where the broker that stored it says it came from (None: no provenance it wrote)."""
        for k, v in self.message.headers or ():
            if k == dlp.PROVENANCE:
                return dlp.Provenance.parse(bytes(v))
        return None

    def as_dict(self) -> dict[str, Any]:
        """The message as JSON-ready values (what ``metaq group dlq --json`` prints)."""
        msg = self.message
        return {"partition": str(msg.partition_id), "offset": msg.offset,
                "id": format_message_id(msg.id) if msg.id >= 0 else None,
                "key": msg.key.decode(errors="replace") if msg.key is not None else None,
                "attribute": msg.attribute,
                "headers": {k: bytes(v).decode("utf-8", errors="replace") for k, v in msg.headers or ()},
                "data": bytes(msg.data).decode("utf-8", errors="replace"),
                "writer": self.provenance.writer if self.provenance is not None else None,
                "redrivable": self.provenance is not None and self.provenance.redrivable}


async def _partitions(core: ClientCore, topic: str) -> list[Partition]:
    tm = await core.metadata.refresh_topic(topic)
    return list(tm.partitions)


async def dead_letters(session: Any, group: str, *, topic: str | None = None,
                       limit: int | None = None) -> AsyncIterator[DeadLetter]:
    """The messages in ``%DLQ%<group>``, partition by partition in offset order (``topic``: only those
    dead-lettered from it). Reads only; commits nothing. Nothing if the topic does not exist."""
    core = _core_of(session)
    dlq = dead_letter_topic(group)
    pull = PullConsumer(core)
    shown = 0
    try:
        for p in await _partitions(core, dlq):
            async for msg in pull.iterate(dlq, p.id, "earliest", max_bytes=DEFAULT_FETCH_MAX_BYTES,
                                          stop_at_end=True, on_out_of_range="earliest"):
                letter = DeadLetter(msg)
                if topic is not None and letter.original_topic != topic:
                    continue
                if limit is not None and shown >= limit:
                    return
                shown += 1
                yield letter
    finally:
        await pull.close()


@dataclass
class RedriveResult:
    """What :func:`redrive` did (or, dry run, would do)."""

    group: str
    dry_run: bool
    redriven: dict[str, int] = field(default_factory=dict)
    """Original topic -> messages sent back to it."""
    skipped: int = 0
    """Dead letters of other topics than the one asked for (passed over, and committed past)."""
    errors: list[str] = field(default_factory=list)
    """Messages that could not be sent back (the run stops at the first, so nothing after it is lost)."""
    refused: int = 0
    """Dead letters not sent back because their provenance does not allow it (passed over, and committed
    past: :class:`UnprovenDeadLetter`)."""
    refusals: list[str] = field(default_factory=list)
    """Why, for the first :data:`REFUSALS_LISTED` of them."""
    remaining: int = 0
    """Dead letters not handled in this run (left for the next: ``limit`` reached, or an error)."""

    @property
    def total(self) -> int:
        """Messages sent back, over every topic."""
        return sum(self.redriven.values())

    def as_dict(self) -> dict[str, Any]:
        """The result as JSON-ready values (what ``metaq group redrive --json`` prints)."""
        return {"group": self.group, "dry_run": self.dry_run, "redriven": dict(sorted(self.redriven.items())),
                "total": self.total, "skipped": self.skipped, "remaining": self.remaining, "errors": self.errors,
                "refused": self.refused, "refusals": self.refusals}


REFUSALS_LISTED = 20
REFUSED = ""
"""In a redrive's window: a dead letter refused (by identity: no topic is named "")."""


class UnprovenDeadLetter(InvalidArgument):
    """A dead letter whose provenance does not allow sending it back (see the module docstring)."""


def redrive_message(letter: DeadLetter) -> Message:
    """The message to send back: to the topic its provenance names, payload, key and attribute, original
    headers, the redrive count one higher. UnprovenDeadLetter when its provenance does not allow it."""
    where = f"the dead letter at {letter.message.partition_id}@{letter.message.offset}"
    provenance = letter.provenance
    if provenance is None:
        raise UnprovenDeadLetter(f"{where} carries no provenance written by the broker (written before brokers "
                                 "stamped dead letters, or not by a consumer of the group): not sent back")
    if not provenance.redrivable:
        raise UnprovenDeadLetter(f"{where} was written by {provenance.writer}, who may not produce to "
                                 f"{provenance.topic}, and the broker could not check it is a copy of a message of "
                                 f"{provenance.topic} (its partition {provenance.partition} is on another broker, or "
                                 "the message was gone): not sent back")
    original = provenance.topic
    if letter.original_topic not in (None, original):
        raise UnprovenDeadLetter(f"{where} names {letter.original_topic} but its provenance {original}: not sent "
                                 "back")
    count = 0
    headers: list[tuple[str, bytes]] = []
    for k, v in letter.original_headers:
        if k == H_REDRIVE_COUNT:
            try:
                count = int(bytes(v).decode())
            except ValueError:
                count = 0
            continue
        headers.append((k, v))
    headers.append((H_REDRIVE_COUNT, str(count + 1).encode()))
    msg = letter.message
    return Message(original, msg.data, msg.attribute, msg.key, headers)


def _offset_storage(core: ClientCore) -> OffsetStorage:
    if core.registry is not None:
        return ZooKeeperOffsetStorage(core.registry)
    return BrokerOffsetStorage.for_session(core)


Progress = Callable[[int, int], Awaitable[None] | None]
"""``progress(done, total)``: called as a redrive goes (total: dead letters pending when it started)."""


async def redrive(session: Any, group: str, *, topic: str | None = None, limit: int | None = None,
                  dry_run: bool = False, progress: Progress | None = None,
                  commit_every: int = 100) -> RedriveResult:
    """Send the dead letters of ``group`` back to their original topics (see the module docstring).

    ``topic``: only those dead-lettered from it (the others are passed over and not sent by later
    runs either: the redrive group's offsets pass them). ``limit``: at most this many sent.
    ``dry_run``: count what would be sent; nothing is produced or committed. Sends go out in windows
    of ``commit_every`` messages (pipelined, not one round trip each); once a window is acknowledged
    the progress is committed: a run cut short (killed) sends again at most one window. A failed send
    stops the run there (in :attr:`RedriveResult.errors`); sends after it in its window may have been
    stored and are sent again by the next run.
    """
    if limit is not None and limit < 1:
        raise InvalidArgument(f"limit must be >= 1, not {limit}")
    if topic is not None:
        validate_topic(topic)
    core = _core_of(session)
    dlq = dead_letter_topic(group)
    result = RedriveResult(group, dry_run)
    parts = await _partitions(core, dlq)
    if not parts:
        return result
    storage = _offset_storage(core)
    progress_group = redrive_group(group)
    pull = PullConsumer(core)
    producer: Producer | None = None
    try:
        tps = [TopicPartition(dlq, p.id) for p in parts]
        committed = await storage.load(progress_group, tps)
        ranges: dict[PartitionId, tuple[int, int]] = {}
        for p in parts:
            start, end = await offsets_of(core, dlq, p)
            ranges[p.id] = (max(start, committed.get(TopicPartition(dlq, p.id), start)), end)
        total = sum(max(0, end - start) for start, end in ranges.values())
        done = queued = 0
        stopped = False
        if not dry_run:
            producer = Producer(core, ProducerConfig(), _routing_selector())

        async def report() -> None:
            if progress is not None:
                out = progress(done, total)
                if out is not None:
                    await out

        Window = list[tuple[int, str | None, asyncio.Future[SendResult] | None]]
        """(offset, original topic or None if passed over, the send's result) not yet settled, in order."""

        async def settle(window: Window, tp: TopicPartition, position: int) -> tuple[bool, int]:
            """Wait for the window's sends; move the position past them in order up to the first failure and
            commit it. False if one failed (sends after it may be stored: the next run sends them again)."""
            ok = True
            for offset, original, fut in window:
                sent = await fut if fut is not None else None
                if not ok:
                    continue
                if sent is not None and not sent.success:
                    result.errors.append(f"{tp}@{offset} -> {original}: {sent.error}")
                    ok = False
                    continue
                if original is None:
                    result.skipped += 1
                elif original == REFUSED:
                    pass  # counted in result.refused when it was read
                else:
                    result.redriven[original] = result.redriven.get(original, 0) + 1
                position = offset + 1
            window.clear()
            if not dry_run:
                await storage.commit(progress_group, {tp: position})
            return ok, position

        for p in parts:
            start, end = ranges[p.id]
            tp = TopicPartition(dlq, p.id)
            position = start
            window: Window = []

            if start < end and not stopped:
                async for msg in pull.iterate(dlq, p.id, start, max_bytes=DEFAULT_FETCH_MAX_BYTES,
                                              stop_at_end=True, on_out_of_range="earliest"):
                    if msg.offset >= end:
                        break
                    if limit is not None and queued >= limit:
                        stopped = True
                        break
                    letter = DeadLetter(msg)
                    if topic is not None and letter.original_topic != topic:
                        window.append((msg.offset, None, None))
                    else:
                        try:
                            back = redrive_message(letter)
                        except UnprovenDeadLetter as exc:  # passed over, reported: never sent
                            result.refused += 1
                            if len(result.refusals) < REFUSALS_LISTED:
                                result.refusals.append(str(exc))
                            log.warning("%s", exc)
                            window.append((msg.offset, REFUSED, None))
                        else:
                            fut = producer.send_async(back) if producer is not None else None
                            window.append((msg.offset, back.topic, fut))
                            queued += 1
                    done += 1
                    if len(window) >= commit_every or (
                            producer is not None and producer.buffered_bytes >= REDRIVE_WINDOW_BYTES_MAX):
                        ok, position = await settle(window, tp, position)
                        if not ok:
                            stopped = True
                            break
                        await report()
                if window:
                    ok, position = await settle(window, tp, position)
                    stopped = stopped or not ok
                await report()
            result.remaining += max(0, end - position)
        await report()
    except (ConnectionClosedError, RequestTimeoutError, BrokerError) as exc:
        result.errors.append(str(exc))
    finally:
        if producer is not None:
            await producer.close()
        await pull.close()
        await storage.close()
    return result


__all__ = [
    "DLQ_PREFIX",
    "DeadLetter",
    "DeadLetterSender",
    "RedriveResult",
    "UnprovenDeadLetter",
    "dead_letter_headers",
    "dead_letter_topic",
    "dead_letters",
    "redrive",
    "redrive_group",
    "redrive_message",
]
