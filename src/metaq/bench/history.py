"""A producer under load in a thread of its own, what it was told, and checking it against what is read back
(fault tests, through :mod:`metaq.testing.history`, and ``metaq bench failover``).

:class:`ProduceLoad` sends numbered messages (``send_async``, at most ``window`` unacknowledged) until
told to stop, bounded in count and time, and keeps the history: every acknowledged message with its
``brokerId-partition`` and offset, every failure with its error. :func:`read_back` reads whole
partitions; :func:`check_history` says what disagrees:

* every acknowledged message is read back, at its partition and offset, once;
* within a partition, offsets are read in order, without gaps;
* nothing is read that was never sent, and a message sent but not acknowledged may be read only if its
  failure said it may have been stored (``error.maybe_stored``: a request in flight on a lost connection, a
  timeout).

:func:`check_send_order` adds the producer's order: within a partition, one load's messages are stored in the
order they were sent (their numbers increase), a message's copies after the first aside.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from metaq.client import MessageSessionFactory
from metaq.client.selectors import PartitionSelector
from metaq.types import Message, PartitionId, SendResult


def maybe_stored(error: BaseException | None) -> bool:
    """A failed send whose request may have been appended (in flight on a lost connection, late, or written
    on a master whose slaves did not confirm it): what the error itself says (``MetaqError.maybe_stored``)."""
    return bool(getattr(error, "maybe_stored", True))


@dataclass
class Ack:
    partition: PartitionId
    offset: int
    at: float


@dataclass
class ProduceLoad:
    """Round robin (or ``selector``) sends of ``b"<prefix>%09d"`` from a thread, until :meth:`stop`,
    ``limit`` messages or ``time_limit_s``. ``session`` holds the connect() keyword arguments."""

    session: dict[str, Any]
    topic: str
    selector: Callable[[], PartitionSelector] | None = None
    key: Callable[[int], bytes | None] = lambda n: None
    limit: int = 1_000_000
    time_limit_s: float = 120.0
    window: int = 400
    prefix: bytes = b"m"
    rate: float | None = None
    """Messages a second at most (paced every 10 ms), or None: as fast as the window allows. A paced load keeps
    sending while earlier sends wait (a paused broker holds them), as an application fed by requests does."""
    producer_config: dict[str, Any] = field(default_factory=dict)
    """ProducerConfig options of the load's producer (``enable_idempotence``, ``retries`` ...)."""
    acked: dict[bytes, Ack] = field(default_factory=dict)
    failed: dict[bytes, BaseException] = field(default_factory=dict)
    failed_at: dict[bytes, float] = field(default_factory=dict)
    """time.monotonic() when each failure was reported."""
    ack_times: list[float] = field(default_factory=list)
    """time.monotonic() of every acknowledgement, in the order they came (cheap to read while the load runs)."""
    by_broker: collections.Counter[int] = field(default_factory=collections.Counter)
    first_ack: dict[int, float] = field(default_factory=dict)
    """broker id -> time.monotonic() of its first acknowledgement (read these, not ``acked``, while running)."""
    sent: int = 0
    rerouted: int = 0
    """The producer's ``rerouted_batches``, kept up to date while the load runs."""
    error: BaseException | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> ProduceLoad:
        self._thread = threading.Thread(target=self._run, name=f"load-{self.topic}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 60.0) -> ProduceLoad:
        """Stop sending, wait for every outstanding result; raises what the load itself ran into."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                raise AssertionError(f"the load on {self.topic} did not finish within {timeout_s}s of stop()")
        if self.error is not None:
            raise self.error
        return self

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def acked_since(self, n: int) -> int:
        return len(self.acked) - n

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported by stop()
            self.error = exc

    async def _main(self) -> None:
        deadline = time.monotonic() + self.time_limit_s
        async with await MessageSessionFactory.connect(**self.session) as session:
            selector = self.selector() if self.selector is not None else None
            producer = session.create_producer(selector, **self.producer_config)
            pending: set[asyncio.Future[SendResult]] = set()
            n = 0
            started = time.monotonic()
            while not self._stop.is_set() and n < self.limit and time.monotonic() < deadline:
                if self.rate is not None and n >= (time.monotonic() - started) * self.rate:
                    await asyncio.sleep(0.01)  # pacing the load, not waiting for anything
                    continue
                data = self.prefix + b"%09d" % n
                fut = producer.send_async(Message(self.topic, data, key=self.key(n)))
                n += 1
                self.sent = n
                self.rerouted = producer.rerouted_batches
                fut.add_done_callback(functools.partial(self._done, data))
                pending.add(fut)
                fut.add_done_callback(pending.discard)
                if len(pending) >= self.window:
                    await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            await producer.flush()
            if pending:
                await asyncio.wait(pending)
            self.rerouted = producer.rerouted_batches

    def _done(self, data: bytes, fut: asyncio.Future[SendResult]) -> None:
        result = fut.result()
        if result.success:
            now = time.monotonic()
            self.acked[data] = Ack(result.partition_id, result.offset, now)
            self.ack_times.append(now)
            self.by_broker[result.broker_id] += 1
            self.first_ack.setdefault(result.broker_id, time.monotonic())
        else:
            assert result.error is not None
            self.failed[data] = result.error
            self.failed_at[data] = time.monotonic()


def longest_gap(times: Iterable[float], since: float, until: float) -> float:
    """The longest stretch without an acknowledgement that overlaps [since, until] (``times`` are the acks'
    time.monotonic()): a fault's unavailability window, measured the way a client lives it."""
    return gap_at(times, since, until)[1]


def gap_at(times: Iterable[float], since: float, until: float) -> tuple[float, float]:
    """(start, length) of :func:`longest_gap`'s stretch: where it began tells which step of a fault it was."""
    ordered = sorted(times)
    start, longest = since, 0.0
    for a, b in itertools.pairwise(ordered):
        if b >= since and a <= until and b - a > longest:
            start, longest = a, b - a
    return start, longest


def read_back(session: Any, topic: str) -> dict[PartitionId, list[tuple[int, bytes]]]:
    """Every message of every partition of ``topic``, (offset, data) in the order read (sync session)."""
    consumer = session.create_pull_consumer()
    out: dict[PartitionId, list[tuple[int, bytes]]] = {}
    for p in session.partitions(topic):
        got = out.setdefault(PartitionId(p.broker_id, p.partition), [])
        for batch in consumer.iterate_batches(topic, p, "earliest", stop_at_end=True):
            got.extend((m.offset, bytes(m.data)) for m in batch)
    return out


def check_send_order(read: Mapping[PartitionId, list[tuple[int, bytes]]], prefix: bytes) -> list[str]:
    """Where one load's messages (``<prefix><number>``) were stored out of send order within a partition: a
    message stored after one sent later (empty: none). A second copy of a message is not an order problem."""
    problems: list[str] = []
    for pid, messages in read.items():
        last, last_offset = -1, -1
        seen: set[int] = set()
        for offset, data in messages:
            if not data.startswith(prefix) or not data[len(prefix):].isdigit():
                continue
            n = int(data[len(prefix):])
            if n in seen:
                continue
            seen.add(n)
            if n < last:
                problems.append(f"{pid}: {data!r} at offset {offset} stored after {prefix + b'%09d' % last!r} "
                                f"(offset {last_offset}), which was sent after it")
            else:
                last, last_offset = n, offset
    return problems


def check_history(read: Mapping[PartitionId, list[tuple[int, bytes]]], acked: Mapping[bytes, Ack],
                  failed: Mapping[bytes, BaseException], *, other: Iterable[bytes] = ()) -> list[str]:
    """What disagrees between the history and what was read (empty: everything holds). ``other``:
    payloads in the topic not sent by this history (ignored when read)."""
    problems: list[str] = []
    seen: dict[bytes, tuple[PartitionId, int]] = {}
    others = set(other)
    for pid, messages in read.items():
        offsets = [o for o, _ in messages]
        if offsets != sorted(offsets) or (offsets and offsets != list(range(offsets[0], offsets[0] + len(offsets)))):
            problems.append(f"{pid}: offsets not read in order without gaps")
        for offset, data in messages:
            if data in others:
                continue
            if data in seen:
                problems.append(f"{data!r} read twice: at {seen[data]} and {pid}@{offset}")
                continue
            seen[data] = (pid, offset)
            if data in acked:
                ack = acked[data]
                if (ack.partition, ack.offset) != (pid, offset):
                    problems.append(f"{data!r} acked at {ack.partition}@{ack.offset}, read at {pid}@{offset}")
            elif data in failed:
                if not maybe_stored(failed[data]):
                    problems.append(f"{data!r} is stored though its send failed with {failed[data]!r}")
            else:
                problems.append(f"{data!r} read at {pid}@{offset} was never sent")
    lost = [d for d in acked if d not in seen]
    if lost:
        by_partition = collections.Counter(str(acked[d].partition) for d in lost)
        unread = sorted(str(p) for p in {acked[d].partition for d in lost} if p not in read)
        problems.append(f"{len(lost)} acknowledged messages not read back, e.g. {lost[:3]}; by partition "
                        f"{dict(sorted(by_partition.items()))}" + (f"; not read at all: {unread}" if unread else ""))
    return problems
