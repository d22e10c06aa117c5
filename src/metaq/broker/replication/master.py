"""The master's side of replication: what each slave holds, the in-sync set, the high watermark.

A slave's replica fetch at offset N says "I hold everything below N" (its fetcher always asks at its
own log end, after storing the previous reply). From those offsets the master keeps, per partition and
slave, how far it is and when it was last caught up (Kafka's rule: a fetch at the log end, or at the
log end of the previous fetch, counts as caught up then).

**The in-sync set (ISR)** is kept in ZooKeeper (``brokers/replica-groups/<id>``, version-checked: a
write from a deposed master fails). A slave leaves it when it is gone (its replica connections closed),
silent (no fetch for two thirds of ``masterLeaseMs``) or lagging (a partition not caught up for
``inSyncMaxLagMs``), and joins when it holds, on every partition, at least the high watermark and fetched
recently. While a change is being written, or its outcome is unknown, acks wait for the union of the old
and new sets, so at every moment every acknowledged batch is held by every slave in the set ZooKeeper
records: an in-sync slave elected after a failover has every acked message.

**The lease** (docs/replication.md#the-masters-lease): a slave never takes over within ``masterLeaseMs``
of the last reply it got, and a replica fetch is sent only after the reply to the previous one on its
connection arrived; so a fetch arriving on a connection renews the master's lease from that slave until
the previous fetch's arrival plus the lease. Writes are taken only within the lease of every in-sync
slave: acks that wait for no slave (async topics, degraded sync acks) need it to be safe; a sync write
would never be confirmed without it anyway, and is better refused (``NOT_MASTER``, nothing stored) than
appended and then failed.

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
from metaq.net.retry import wait_event
from metaq.storage import PartitionLog

if TYPE_CHECKING:
    from metaq.broker.core import Broker
    from metaq.broker.session import Session

log = logging.getLogger("metaq.broker.replication")

MAINTAIN_S = 0.1
"""How often the in-sync set is looked at (and at once when a slave's last connection closes)."""
GONE_GRACE_S = 0.25
"""A slave whose replica connections all closed leaves the in-sync set when none came back within this."""
SILENT_FRACTION = 2 / 3
"""A slave with no fetch for this fraction of masterLeaseMs leaves the in-sync set (a live one fetches at least
every third: its long polls are held at most that long)."""
DRIFT_MARGIN = 0.9
"""The master counts a lease as this fraction of its length: monotonic clocks of two machines may run at
(slightly) different rates."""
SETTLE_RETRY_S = 0.5
"""How often a state write whose outcome is unknown is read back while ZooKeeper cannot be reached."""


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
    and ``on_deposed`` is called. ``read_state() -> (state, version)`` reads it back (blocking), to settle a
    write whose reply was lost.
    """

    def __init__(self, broker: Broker, *, replica_id: int, state: ReplicaGroupState, version: int,
                 write_state: Callable[[ReplicaGroupState, int], int], on_deposed: Callable[[str], None],
                 read_state: Callable[[], tuple[ReplicaGroupState | None, int]] | None = None) -> None:
        self.broker = broker
        self.replica_id = replica_id
        self.epoch = state.epoch
        self.isr: frozenset[int] = frozenset(state.isr)
        self.version = version
        self._pending: frozenset[int] | None = None
        self._write_state = write_state
        self._read_state = read_state
        self._on_deposed = on_deposed
        self.started_at = time.monotonic()
        self.lease_s = broker.config.master_lease_ms / 1000
        self.grants: dict[int, float] = {r: self.started_at + self.lease_s * DRIFT_MARGIN for r in self.isr}
        """Slave -> until when (time.monotonic()) it has promised not to take over. A new master starts with a
        lease from each slave: their silence clocks start when they learn of it, after its takeover."""
        self.connections: dict[int, int] = {}
        """Slave -> its replica connections open now (counted from its first replica fetch on each)."""
        self.gone_since: dict[int, float] = {}
        """Slave -> when its last replica connection closed (while none is open)."""
        self.lease_refusals = 0
        self._wake = asyncio.Event()
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

    def on_replica_connection(self, session: Session | None, replica_id: int, now: float) -> None:
        """A replica fetch of ``replica_id`` came in on ``session``: the slave is alive, and the connection's
        previous fetch renews the lease (see the module doc). Counted before any check of the fetch."""
        self.last_seen[replica_id] = now
        if session is None:
            return
        if session.replica_master is not self:  # its first replica fetch in this mastership
            session.replica_master = self
            session.replica_id = replica_id
            session.replica_fetch_at = -1.0
            self.connections[replica_id] = self.connections.get(replica_id, 0) + 1
            self.gone_since.pop(replica_id, None)
        previous = session.replica_fetch_at
        if previous >= 0:
            until = previous + self.lease_s * DRIFT_MARGIN
            if until > self.grants.get(replica_id, -1.0):
                self.grants[replica_id] = until
        session.replica_fetch_at = now

    def connection_closed(self, session: Session) -> None:
        """A slave's replica connection closed: when it was its last one, the slave may be dead (killed
        -9: its kernel resets them all at once); the in-sync set is looked at now."""
        if session.replica_master is not self:
            return
        session.replica_master = None
        r = session.replica_id
        left = self.connections.get(r, 0) - 1
        self.connections[r] = max(0, left)
        if left <= 0:
            self.gone_since[r] = time.monotonic()
            self._wake.set()

    def lease_ok(self, now: float) -> bool:
        """Whether every slave that ZooKeeper may list as in sync has promised not to take over until after
        ``now`` (always, with none: nobody else may take over)."""
        return all(self.grants.get(r, -1.0) > now for r in self._ack_members())

    def lease_left_s(self, now: float) -> float:
        members = self._ack_members()
        if not members:
            return float("inf")
        return max(0.0, min(self.grants.get(r, -1.0) for r in members) - now)

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
        if not plogs:
            return "" if replica_id in self._registered_slaves() else "it is not registered in ZooKeeper"
        gone = self.gone_since.get(replica_id)
        if gone is not None and not self.connections.get(replica_id) and now - gone >= GONE_GRACE_S:
            return f"its replica connections closed {now - gone:.2f}s ago (killed, or its machine is gone)"
        seen = max(self.last_seen.get(replica_id, self.started_at), self.started_at)
        if now - seen > self.lease_s * SILENT_FRACTION:
            return f"no fetch from it for {now - seen:.2f}s (paused, cut off, or gone)"
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
        if now - self.last_seen.get(replica_id, -1e18) > min(self.max_lag_s, self.lease_s * SILENT_FRACTION / 2):
            return False  # it must not be about to leave again for silence
        if self.grants.get(replica_id, -1.0) <= now:
            return False  # its fetches have not granted a lease yet: writes would be refused
        for plog in plogs:
            p = self.progress.get((plog.topic, plog.partition), {}).get(replica_id)
            if p is None or p.fetch_offset < self.high_watermark(plog) or now - p.caught_up_at > self.max_lag_s:
                return False
        return True

    async def run(self) -> None:
        """Keep the in-sync set until cancelled (or deposed)."""
        loop = asyncio.get_running_loop()
        while not self.deposed:
            self._wake.clear()
            await wait_event(self._wake, MAINTAIN_S)
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
            except Exception as exc:  # the outcome is unknown: acks wait for the union until it is read back
                log.warning("cannot record the in-sync set %s in ZooKeeper (%s); acks wait for %s until it is "
                            "settled", sorted(new), exc, sorted(self.isr | new))
                if not await self._settle(new):
                    return
                if self._pending is not None:
                    continue
            self._changed(new)

    async def _settle(self, new: frozenset[int]) -> bool:
        """After a state write that failed without a verdict (ZooKeeper unreachable; the write may or may not
        have happened), read the state back until it says which: written (the version moved to a state with
        ``new``), not written (the version is ours: ``_pending`` cleared, the next round tries again), or
        replaced (deposed: False). Acks wait for the union of both sets meanwhile."""
        loop = asyncio.get_running_loop()
        while not self.deposed:
            try:
                state, version = await loop.run_in_executor(None, self._read_state) if self._read_state else (None, -1)
            except Exception:
                await asyncio.sleep(SETTLE_RETRY_S)
                continue
            if state is None or state.epoch != self.epoch or state.master != self.replica_id:
                self._pending = None
                self.deposed = True
                self._on_deposed(f"the replica group's state is now {state}")
                return False
            if version == self.version:
                self._pending = None  # not written
            elif frozenset(state.isr) == new:
                self.version = version  # written: the reply was lost
            else:  # a write of ours we do not know of cannot happen: treat it as written by someone else
                self._pending = None
                self.deposed = True
                self._on_deposed(f"the replica group's state moved unexpectedly to {state} (version {version})")
                return False
            return True
        return False

    def _changed(self, new: frozenset[int]) -> None:
        old, self.isr, self._pending = self.isr, new, None
        self.isr_changes += 1
        for r in sorted(new - old):  # its lease is renewed by its fetches, in the set or not
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
                              "messages_behind": behind, "connections": self.connections.get(r, 0)}
        config = self.broker.config
        lease = self.lease_left_s(now)
        return {"epoch": self.epoch, "isr": sorted(self.isr), "min_in_sync_slaves": config.min_in_sync_slaves,
                "isr_changes": self.isr_changes, "degraded_acks": self.degraded_acks, "slaves": slaves,
                "lease_ms_left": None if lease == float("inf") else int(lease * 1000),
                "lease_refusals": self.lease_refusals}
