"""The master's side of replication: what each slave holds, the in-sync set, the high watermark.

A slave's replica fetch at offset N says "I hold everything below N" (its fetcher always asks at its
own log end, after storing the previous reply). From those offsets the master keeps, per partition and
slave, how far it is and when it was last caught up (Kafka's rule: a fetch at the log end, or at the
log end of the previous fetch, counts as caught up then).

**The in-sync set (ISR)** is kept in ZooKeeper (``brokers/replica-groups/<id>``, version-checked: a
write from a deposed master fails). A slave leaves it when one of its partitions has not been caught up
for ``inSyncMaxLagMs``, and joins when it holds, on every partition, at least the high watermark and
fetched recently. While a change is being written, acks wait for the larger of the old and new sets,
so at every moment every acknowledged batch is held by every slave in the set ZooKeeper records: an
in-sync slave elected after a failover has every acked message.

**The high watermark** of a partition is the smallest fetch offset of the in-sync slaves (the log end
with none). A produce to a sync-replicated topic is acked when the high watermark passes its batch;
consumers of the master read only below it, so nothing a consumer saw can vanish in a failover.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from metaq.cluster.layout import ReplicaGroupState
from metaq.cluster.registry import ReplicaGroupChanged
from metaq.errors import NotEnoughReplicasAfterAppendError, NotEnoughReplicasError
from metaq.storage import PartitionLog

if TYPE_CHECKING:
    from metaq.broker.core import Broker

log = logging.getLogger("metaq.broker.replication")

MAINTAIN_MIN_S = 0.05
MAINTAIN_MAX_S = 0.5


@dataclass(slots=True)
class FollowerProgress:
    fetch_offset: int
    caught_up_at: float
    last_fetch_at: float
    end_at_last_fetch: int


class MasterReplication:
    """Per broker while it is master: slaves' progress, the ISR, the high watermarks, waiting acks.

    ``write_state(state, version) -> new version`` writes the replica group's state in ZooKeeper (a
    blocking call, run on a worker thread); ReplicaGroupChanged from it means this master is deposed
    and ``on_deposed`` is called.
    """

    def __init__(self, broker: Broker, *, replica_id: int, state: ReplicaGroupState, version: int,
                 write_state: Callable[[ReplicaGroupState, int], int], on_deposed: Callable[[str], None]) -> None:
        self.broker = broker
        self.replica_id = replica_id
        self.epoch = state.epoch
        self.isr: frozenset[int] = frozenset(state.isr)
        self.version = version
        self._pending: frozenset[int] | None = None
        self._write_state = write_state
        self._on_deposed = on_deposed
        self.started_at = time.monotonic()
        self.progress: dict[tuple[str, int], dict[int, FollowerProgress]] = {}
        self.last_seen: dict[int, float] = {}
        self._waiting: dict[tuple[str, int], list[tuple[int, asyncio.Future[None]]]] = {}
        self._hw: dict[tuple[str, int], int] = {}
        self.degraded_acks = 0
        self.isr_changes = 0
        self.deposed = False
        self.frozen = False
        """Set during a hand-over: the in-sync set is not changed any more (the state is being written)."""
        self._known_since: dict[tuple[str, int], float] = {}

    # -- configuration ------------------------------------------------------------------------------

    @property
    def max_lag_s(self) -> float:
        return self.broker.config.in_sync_max_lag_ms / 1000

    def sync_topic(self, topic: str) -> bool:
        state = self.broker.topics.get(topic)
        return bool(state is not None and state.settings.sync_replication)

    def _ack_members(self) -> frozenset[int]:
        """Whose fetch offsets an ack waits for: the recorded ISR, and while a change is being written
        the union of the old and new sets."""
        return self.isr | self._pending if self._pending is not None else self.isr

    # -- fetches from slaves ------------------------------------------------------------------------

    def on_replica_fetch(self, plog: PartitionLog, replica_id: int, offset: int) -> None:
        """Slave ``replica_id`` asked for ``offset`` of ``plog``: it holds everything below."""
        now = time.monotonic()
        end = plog.log_end_offset
        key = (plog.topic, plog.partition)
        per = self.progress.setdefault(key, {})
        p = per.get(replica_id)
        if p is None:
            p = per[replica_id] = FollowerProgress(offset, self.started_at, now, end)
        if offset >= end:
            p.caught_up_at = now
        elif offset >= p.end_at_last_fetch:
            p.caught_up_at = max(p.caught_up_at, p.last_fetch_at)
        p.fetch_offset = offset
        p.last_fetch_at = now
        p.end_at_last_fetch = end
        self.last_seen[replica_id] = now
        self._advance(plog)

    # -- the high watermark and waiting acks ----------------------------------------------------------

    def high_watermark(self, plog: PartitionLog) -> int:
        end = plog.log_end_offset
        members = self._ack_members()
        if not members:
            return end
        per = self.progress.get((plog.topic, plog.partition), {})
        hw = end
        for r in members:
            p = per.get(r)
            hw = min(hw, p.fetch_offset if p is not None else plog.log_start_offset)
        return max(hw, plog.log_start_offset) if hw < end else end

    def check_before_append(self, topic: str) -> None:
        """NOT_ENOUGH_REPLICAS before anything is written, for a sync topic with too few in-sync slaves."""
        if not self.sync_topic(topic):
            return
        members = self._ack_members()  # a slave joining (being written) counts: acks wait for it too
        if len(members) < self.broker.config.min_in_sync_slaves and not self.broker.config.degrade_to_async:
            raise NotEnoughReplicasError(
                f"broker {self.broker.config.broker_id}: {len(members)} in-sync slave(s) "
                f"({', '.join(map(str, sorted(members))) or 'none'}), minInSyncSlaves="
                f"{self.broker.config.min_in_sync_slaves}; nothing was stored")

    def wait_replicated(self, plog: PartitionLog, end_offset: int) -> Awaitable[None] | None:
        """None when the batch ending at ``end_offset`` may be acked now; else an awaitable that ends
        when it may (or raises NOT_ENOUGH_REPLICAS_AFTER_APPEND)."""
        topic = plog.topic
        if not self.sync_topic(topic):
            return None
        if self._too_few():
            self.degraded_acks += 1
            if self.degraded_acks == 1 or self.degraded_acks % 10_000 == 0:
                log.warning("sync replication degraded to async (degradeToAsync=true): %d in-sync slave(s) < "
                            "minInSyncSlaves=%d; %d batch(es) acked without a slave copy so far", len(self.isr),
                            self.broker.config.min_in_sync_slaves, self.degraded_acks)
            return None
        if self.high_watermark(plog) >= end_offset:
            return None
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault((topic, plog.partition), []).append((end_offset, fut))
        return self._await(fut, plog, end_offset)

    def _too_few(self) -> bool:
        config = self.broker.config
        return len(self.isr) < config.min_in_sync_slaves and config.degrade_to_async

    async def _await(self, fut: asyncio.Future[None], plog: PartitionLog, end_offset: int) -> None:
        limit = 2 * self.max_lag_s + 1.0
        try:
            await asyncio.wait_for(fut, limit)
        except TimeoutError:
            raise NotEnoughReplicasAfterAppendError(
                f"{plog.topic}-{plog.partition}: the in-sync slaves did not confirm offsets below {end_offset} "
                f"within {limit:.1f}s") from None

    def _below_min(self) -> bool:
        """Too few in-sync slaves to confirm anything (and no degrading to async)."""
        config = self.broker.config
        return len(self.isr) < config.min_in_sync_slaves and not config.degrade_to_async

    def _advance(self, plog: PartitionLog) -> None:
        key = (plog.topic, plog.partition)
        hw = self.high_watermark(plog)
        if self._hw.get(key) != hw:
            self._hw[key] = hw
            self.broker.waiters.notify(plog.topic, plog.partition)  # consumers capped at the watermark
        waiting = self._waiting.get(key)
        if not waiting or self._below_min():
            return
        kept = []
        for end_offset, fut in waiting:
            if fut.done():
                continue
            if end_offset <= hw:
                fut.set_result(None)
            else:
                kept.append((end_offset, fut))
        if kept:
            self._waiting[key] = kept
        else:
            del self._waiting[key]

    def _advance_all(self) -> None:
        if not self._below_min():
            for topic, partition in list(self._waiting):
                plog = self.broker.logs.get(topic, partition)
                if plog is not None:
                    self._advance(plog)
            return
        for waiting in self._waiting.values():  # too few left to ever confirm: tell the producers now
            for _end, fut in waiting:
                if not fut.done():
                    fut.set_exception(NotEnoughReplicasAfterAppendError(
                        f"the in-sync set shrank to {len(self.isr)} slave(s) (minInSyncSlaves="
                        f"{self.broker.config.min_in_sync_slaves}) before the batch was confirmed"))
        self._waiting.clear()

    def fail_waiting(self, why: str) -> None:
        for waiting in self._waiting.values():
            for _end, fut in waiting:
                if not fut.done():
                    fut.set_exception(NotEnoughReplicasAfterAppendError(why))
        self._waiting.clear()

    # -- keeping the in-sync set --------------------------------------------------------------------

    def _partitions(self) -> list[PartitionLog]:
        out = []
        now = time.monotonic()
        for topic, state in self.broker.topics.items():
            for p in range(state.num_partitions):
                plog = self.broker.logs.get(topic, p)
                if plog is not None:
                    out.append(plog)
                    self._known_since.setdefault((topic, p), now)
        return out

    def holds_everything(self, replica_id: int) -> bool:
        """Whether slave ``replica_id`` has fetched up to the log end of every partition."""
        for plog in self._partitions():
            p = self.progress.get((plog.topic, plog.partition), {}).get(replica_id)
            if p is None or p.fetch_offset < plog.log_end_offset:
                return False
        return True

    @property
    def acks_waiting(self) -> bool:
        """Whether a produce still waits for its batch to be confirmed."""
        return any(not fut.done() for waiting in self._waiting.values() for _end, fut in waiting)

    @property
    def isr_change_pending(self) -> bool:
        return self._pending is not None

    @property
    def isr_joining(self) -> frozenset[int]:
        """Slaves whose entry into the in-sync set is being written to ZooKeeper (empty when none is)."""
        return self._pending - self.isr if self._pending is not None else frozenset()

    def _lagging(self, replica_id: int, now: float, plogs: list[PartitionLog]) -> str:
        """Why ``replica_id`` is out of sync now ('' when it is not)."""
        if not plogs and replica_id not in self._registered_slaves():
            return "it is not registered in ZooKeeper"
        bound = now - self.max_lag_s
        for plog in plogs:
            p = self.progress.get((plog.topic, plog.partition), {}).get(replica_id)
            since = max(self.started_at, self._known_since.get((plog.topic, plog.partition), self.started_at))
            caught_up_at = p.caught_up_at if p is not None else since
            if caught_up_at < bound:
                at = p.fetch_offset if p is not None else -1
                return (f"{plog.topic}-{plog.partition} not caught up for {now - caught_up_at:.1f}s (at offset "
                        f"{at}, log end {plog.log_end_offset})")
        return ""

    def _registered_slaves(self) -> set[int]:
        entry = self.broker.cluster.snapshot().brokers.get(self.broker.config.broker_id)
        return set(entry.slaves) if entry is not None else set()

    def _caught_up(self, replica_id: int, now: float, plogs: list[PartitionLog]) -> bool:
        if not plogs:  # nothing to copy yet: a registered slave holds everything there is
            return replica_id in self._registered_slaves()
        if now - self.last_seen.get(replica_id, -1e18) > self.max_lag_s:
            return False
        for plog in plogs:
            p = self.progress.get((plog.topic, plog.partition), {}).get(replica_id)
            if p is None or p.fetch_offset < self.high_watermark(plog) or now - p.caught_up_at > self.max_lag_s:
                return False
        return True

    async def run(self) -> None:
        """Keep the in-sync set until cancelled (or deposed)."""
        loop = asyncio.get_running_loop()
        period = min(MAINTAIN_MAX_S, max(MAINTAIN_MIN_S, self.max_lag_s / 10))
        while not self.deposed:
            await asyncio.sleep(period)
            if self.frozen:
                continue
            now = time.monotonic()
            plogs = self._partitions()
            keep = {r for r in self.isr if not self._lagging(r, now, plogs)}
            for r in sorted(self.isr - keep):
                log.warning("slave %d of broker %d leaves the in-sync set: %s", r, self.broker.config.broker_id,
                            self._lagging(r, now, plogs))
            joining = {r for r in set(self.last_seen) | self._registered_slaves()
                       if r not in self.isr and r != self.replica_id and self._caught_up(r, now, plogs)}
            new = frozenset(keep | joining)
            if new == self.isr:
                continue
            self._pending = new
            state = ReplicaGroupState(self.epoch, self.replica_id, tuple(sorted(new)))
            try:
                self.version = await loop.run_in_executor(None, self._write_state, state, self.version)
            except ReplicaGroupChanged as exc:
                self._pending = None
                self.deposed = True
                self._on_deposed(f"the in-sync set could not be written: {exc}")
                return
            except Exception as exc:  # ZooKeeper unreachable: acks keep waiting for the larger set
                log.warning("cannot record the in-sync set %s in ZooKeeper (%s); trying again", sorted(new), exc)
                self._pending = None
                continue
            old, self.isr, self._pending = self.isr, new, None
            self.isr_changes += 1
            for r in sorted(new - old):
                log.info("slave %d of broker %d joins the in-sync set", r, self.broker.config.broker_id)
            log.info("in-sync set of broker %d (epoch %d): %s", self.broker.config.broker_id, self.epoch,
                     sorted(new) or "empty")
            self._advance_all()

    def describe(self) -> dict[str, Any]:
        now = time.monotonic()
        slaves: dict[str, Any] = {}
        for r, seen in sorted(self.last_seen.items()):
            behind = 0
            for (topic, partition), per in self.progress.items():
                p = per.get(r)
                plog = self.broker.logs.get(topic, partition)
                if p is not None and plog is not None:
                    behind += max(0, plog.log_end_offset - p.fetch_offset)
            slaves[str(r)] = {"in_sync": r in self.isr, "last_fetch_ms_ago": int((now - seen) * 1000),
                              "messages_behind": behind}
        config = self.broker.config
        return {"epoch": self.epoch, "isr": sorted(self.isr), "min_in_sync_slaves": config.min_in_sync_slaves,
                "isr_changes": self.isr_changes, "degraded_acks": self.degraded_acks, "slaves": slaves}
