"""The replica fetcher: one partition of the master, copied into the slave's log byte for byte.

It is a consumer of the master like any other -- the normal Fetch request with long polling, over a
``metaq.net`` connection -- except for what it does with the reply: it always fetches at its own log
end, keeps only whole batches, and stores them with :meth:`PartitionLog.append_replicated`, which
checks every header and body CRC, the stamped ids and offset continuity before writing. So the slave's
log is the master's bytes: same offsets, same message ids, same CRCs.

One connection per partition: a held long poll never delays another partition's reply (replies are in
order on one connection). The lag is measured from each reply: ``lag_messages`` is the master's log end
(in the reply) minus the slave's log end after storing; ``lag_ms`` is how long the slave has not been
caught up (0 when it is), as Kafka measures a follower's lag.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from metaq.cluster.registry import Address
from metaq.errors import (
    BrokerError,
    ConnectionClosedError,
    CorruptRecordError,
    FencedEpochError,
    MetaqError,
    OffsetOutOfRangeError,
    RequestTimeoutError,
    StorageError,
)
from metaq.net.codec import ConnectionSettings
from metaq.net.connection import BrokerConnection
from metaq.net.retry import RetryPolicy, wait_event
from metaq.protocol import messages as m
from metaq.protocol.records import peek_length
from metaq.storage import PartitionLog
from metaq.storage.epochs import EpochHistory
from metaq.storage.replica import ReplicaGap

log = logging.getLogger("metaq.broker.replication")

RECONNECT = RetryPolicy(initial_delay_s=0.05, max_delay_s=2.0, multiplier=2.0, jitter=0.5)
"""Reconnecting to the master, and waiting after an error the master may fix (unbounded: a slave
follows until it stops)."""
STALLED_RETRY_S = 5.0
"""How often a partition that cannot continue (its log diverged from the master's) looks again."""
REQUEST_SLACK_S = 10.0
"""The reply to a long poll may take max_wait plus this before the connection is given up."""


def whole_batches(records: bytes | memoryview) -> memoryview:
    """The prefix of a fetch reply that holds whole batches (the reply's last batch may be cut off)."""
    view = memoryview(records)
    position = 0
    while True:
        peeked = peek_length(view, position)
        if peeked is None or position + peeked[1] > view.nbytes:
            return view[:position]
        position += peeked[1]


@dataclass
class FollowerState:
    """What ``metaq stats`` shows of one followed partition."""

    master_end_offset: int = -1
    lag_messages: int = -1
    caught_up_at: float = -1.0
    """time.monotonic() when the slave last held everything the master had (or when following began)."""
    replicated_messages: int = 0
    replicated_bytes: int = 0
    fetches: int = 0
    errors: int = 0
    last_error: str = ""
    stalled: str = ""
    """Why the partition cannot continue without an operator (a diverged log), '' when it can."""
    connected_to: str = ""
    high_watermark: int = -1
    last_reply_at: float = -1.0
    """time.monotonic() of the last reply from the master (-1: none yet)."""
    """The master's high watermark in its last reply (sync replication; -1: not tracked)."""
    truncated_messages: int = 0
    """Messages cut because a deposed master had written them alone (HA mode)."""

    def lag_ms(self, now: float) -> int:
        if self.lag_messages == 0:
            return 0
        if self.lag_messages < 0:  # no reply from the master yet
            return -1
        return int((now - self.caught_up_at) * 1000)


class FollowerEpochs(Protocol):
    """What a follower needs of its replica group when epochs are in use (HA mode; see .ha)."""

    replica_id: int

    def history(self, plog: PartitionLog) -> EpochHistory: ...

    def known_epoch(self) -> int: ...

    def observe_epoch(self, epoch: int) -> None: ...


class PartitionFollower:
    """Follows ``topic``-``partition`` of the master that ``master_address`` names, into ``plog``."""

    def __init__(self, plog: PartitionLog, broker_id: int, master_address: Callable[[], Address | None],
                 settings: ConnectionSettings, *, max_bytes: int, max_wait_ms: int,
                 on_append: Callable[[str, int], None], epochs: FollowerEpochs | None = None) -> None:
        self.plog = plog
        self.topic = plog.topic
        self.partition = plog.partition
        self.broker_id = broker_id
        self._master_address = master_address
        self._settings = settings
        self.max_bytes = max_bytes
        self.max_wait_ms = max_wait_ms
        self._on_append = on_append
        self._epochs = epochs
        self._wake = asyncio.Event()
        """Set by :meth:`wake` when the cluster view changes (the master registered again, maybe elsewhere)."""
        self.state = FollowerState(caught_up_at=time.monotonic())
        self._conn: BrokerConnection | None = None
        self._conn_to: Address | None = None

    def __repr__(self) -> str:
        return f"PartitionFollower({self.topic}-{self.partition})"

    async def run(self) -> None:
        """Fetch and store until cancelled."""
        backoff = RECONNECT.start()
        try:
            while True:
                try:
                    await self._step()
                    backoff.reset()
                except (ConnectionClosedError, RequestTimeoutError, BrokerError, OSError) as exc:
                    self._note_error(exc)
                    self._drop_connection()
                    await self._pause(backoff.next_delay_unbounded_s())
                except (ReplicaGap, CorruptRecordError, StorageError) as exc:
                    self._note_error(exc)
                    self._drop_connection()
                    await self._pause(max(STALLED_RETRY_S, backoff.next_delay_unbounded_s()))
        finally:
            self._drop_connection()

    async def _step(self) -> None:
        address = self._master_address()
        if address is None:
            self.state.connected_to = ""
            self._drop_connection()
            await self._pause(RECONNECT.max_delay_s)  # woken at once when the master registers
            return
        conn = await self._connection(address)
        offset = self.plog.log_end_offset
        request = m.FetchRequest(topic=self.topic, partition=self.partition, offset=offset,
                                 max_bytes=self.max_bytes, max_wait_ms=self.max_wait_ms)
        # a replica's fetch (not counted against a quota), as the handshake said (docs/security.md)
        request.replica_id = self._settings.replica_id
        epochs = self._epochs
        history = epochs.history(self.plog) if epochs is not None else None
        if epochs is not None and history is not None:
            request.replica_id = epochs.replica_id
            request.replica_epoch = epochs.known_epoch()
            request.last_fetched_epoch = history.latest_epoch()
        try:
            reply: m.FetchResponse = await conn.request(request, self.max_wait_ms / 1000 + REQUEST_SLACK_S)
        except OffsetOutOfRangeError as exc:
            if self._start_at_master_start(exc.response, offset):
                return
            self._diverged(exc.response, offset)
            raise
        self.state.fetches += 1
        self.state.last_reply_at = time.monotonic()
        if epochs is not None and history is not None and reply.master_epoch >= 0:
            if reply.master_epoch < epochs.known_epoch():
                raise FencedEpochError(f"{conn.address} answers in epoch {reply.master_epoch}, older than epoch "
                                       f"{epochs.known_epoch()}: a deposed master")
            epochs.observe_epoch(reply.master_epoch)
            if reply.diverging_end_offset >= 0:
                self._truncate(history, reply.diverging_epoch, reply.diverging_end_offset)
                return
        if reply.reset_offset >= 0:  # a master with updateConsumerOffsets served another offset
            if self._start_at_master_start(reply, offset):
                return
            self._diverged(reply, offset)
            raise ReplicaGap(f"{self.topic}-{self.partition}", offset, reply.reset_offset)
        data = whole_batches(reply.records)
        # The watermark first: consumers of this slave woken by the append below read up to it.
        watermark_rose = reply.high_watermark > self.state.high_watermark
        self.state.high_watermark = reply.high_watermark
        appended = False
        if data.nbytes:
            if history is not None and reply.records_epoch > history.latest_epoch():
                history.assign(reply.records_epoch, self.plog.log_end_offset)  # before its first batch
            result = self.plog.append_replicated(data)
            if result is not None:
                self.state.replicated_messages += result.record_count
                self.state.replicated_bytes += data.nbytes
                appended = True
        if appended or watermark_rose:  # a rise alone makes messages visible too (sync topics)
            self._on_append(self.topic, self.partition)
        self.state.stalled = ""
        self.state.master_end_offset = reply.log_end_offset
        self.state.lag_messages = max(0, reply.log_end_offset - self.plog.log_end_offset)
        if self.state.lag_messages == 0:
            self.state.caught_up_at = time.monotonic()

    def _truncate(self, history: EpochHistory, epoch: int, master_end: int) -> None:
        """The master says our log is not a prefix of its own past ``master_end`` (the end of ``epoch``,
        the last epoch we share): cut what we hold beyond the common prefix, as Kafka's follower does."""
        _, own_end = history.end_offset_for(epoch, self.plog.log_end_offset)
        cut = min(master_end, own_end, self.plog.log_end_offset)
        if cut < self.plog.log_start_offset:
            raise ReplicaGap(f"{self.topic}-{self.partition}", self.plog.log_start_offset, cut)
        dropped = self.plog.log_end_offset - cut
        if dropped > 0:
            log.warning("replica %s-%d: cutting %d message(s) at offsets %d..%d that the master (epoch %d) never "
                        "had: they were written by a master that was deposed before they were replicated", self.topic,
                        self.partition, dropped, cut, self.plog.log_end_offset - 1, epoch)
            self.plog.truncate_to(cut)
            self.state.truncated_messages += dropped
        history.truncate_from(cut)

    def _start_at_master_start(self, reply: Any, offset: int) -> bool:
        """A slave with nothing stored yet follows a master whose retention removed the offsets below its
        log start: start there (nothing is lost that the master still has). A slave holding data is not
        moved: that is a divergence for the operator (see :meth:`_diverged`)."""
        start = getattr(reply, "log_start_offset", -1)
        if start <= offset or self.plog.size_bytes:
            return False
        self.plog.start_empty_at(start)
        log.info("replica %s-%d starts at offset %d, the master's log start (it has nothing below)", self.topic,
                 self.partition, start)
        return True

    def _diverged(self, reply: Any, offset: int) -> None:
        """The master does not have our log end: it lost data we have, or retention removed what we lack."""
        start = getattr(reply, "log_start_offset", -1)
        end = getattr(reply, "log_end_offset", -1)
        if end >= 0 and offset > end:
            why = (f"the slave holds offsets up to {offset} but the master's log ends at {end} (the master lost "
                   "data it had replicated, or it is another master); nothing is truncated automatically yet: "
                   "see docs/replication.md")
        else:
            why = (f"the master's log now starts at {start}, past the slave's end {offset} (retention removed what "
                   "the slave lacks); see docs/replication.md")
        if not self.state.stalled:  # once per stall (its text follows the master's offsets in stats)
            log.error("replica %s-%d cannot continue: %s", self.topic, self.partition, why)
        self.state.stalled = why

    async def _connection(self, address: Address) -> BrokerConnection:
        conn = self._conn
        if conn is not None and not conn.closed and self._conn_to == address:
            return conn
        self._drop_connection()
        conn = await BrokerConnection.open((address.host, address.port), self._settings)
        if conn.broker_id != self.broker_id:
            conn.close()
            raise ConnectionClosedError(f"{address} answers as broker {conn.broker_id}, not as the master of broker "
                                        f"id {self.broker_id} (a stale registration?)")
        self._conn, self._conn_to = conn, address
        self.state.connected_to = str(address)
        log.info("replica %s-%d follows the master at %s from offset %d", self.topic, self.partition, address,
                 self.plog.log_end_offset)
        return conn

    def wake(self) -> None:
        """End a pause early: the master's registration changed."""
        self._wake.set()

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = self._conn_to = None

    def _note_error(self, exc: BaseException) -> None:
        self.state.errors += 1
        text = str(exc) if isinstance(exc, MetaqError) else f"{type(exc).__name__}: {exc}"
        if text != self.state.last_error:
            log.warning("replica %s-%d: %s", self.topic, self.partition, text)
        self.state.last_error = text

    async def _pause(self, delay_s: float) -> None:
        """Wait ``delay_s``, or less when the cluster view changes (the master came back elsewhere)."""
        self._wake.clear()
        await wait_event(self._wake, delay_s)

    def describe(self, now: float) -> dict[str, Any]:
        s = self.state
        return {"log_end_offset": self.plog.log_end_offset, "master_end_offset": s.master_end_offset,
                "lag_messages": s.lag_messages, "lag_ms": s.lag_ms(now), "replicated_messages": s.replicated_messages,
                "replicated_bytes": s.replicated_bytes, "fetches": s.fetches, "errors": s.errors,
                "last_error": s.last_error, "stalled": s.stalled, "master": s.connected_to,
                "truncated_messages": s.truncated_messages}
