"""A broker's part in its replica group with epochs: master or slave, and the switch between them.

Used when replication is more than MetaQ's async copy (``syncReplication`` or ``autoFailover``; docs/
replication.md). Every replica of a broker id has a replica id (its ``slaveId``, the master's too).
The group's state lives in ZooKeeper at ``brokers/replica-groups/<id>``: ``{epoch, master, isr}``.

* **Master**: at start it must be the last master or in the in-sync set; it registers
  ``ids/<id>/master`` and writes the state with the epoch one higher (version-checked). It takes writes
  only while it holds a **lease**: the last ZooKeeper round trip that showed its session still owning
  the master node and the state still naming it in its epoch, plus two thirds of the session timeout.
  ZooKeeper expires a session only after a whole timeout without hearing from it, and a slave is elected only
  after that, so a paused master (SIGSTOP) whose lease ran out refuses every write the moment it runs
  again (``NOT_MASTER``), before it has even learnt that it was deposed. When it learns (the state names
  another master or a newer epoch, a version-checked write fails, or a slave fetches with a newer
  epoch) it becomes a slave of the new master in the same process, and its fetcher cuts what it wrote
  alone (the epochs say where, :mod:`metaq.storage.epochs`).
* **Slave**: follows the master (:class:`~metaq.broker.replication.slave.SlaveReplicator`). With
  ``autoFailover=true``, when ``ids/<id>/master`` is gone and this slave is in the in-sync set, it
  stops fetching and, in one ZooKeeper transaction, writes the state (epoch + 1, itself as master, the
  old master out of the set; version-checked) and creates ``ids/<id>/master``. One slave wins; the
  others keep following and find the new master through their watch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metaq.broker.replication.master import MasterReplication
from metaq.broker.replication.slave import SlaveReplicator
from metaq.broker.replication.slave_config import SlaveConfig
from metaq.cluster.layout import ReplicaGroupState
from metaq.cluster.registry import Address, ReplicaGroupChanged
from metaq.errors import (
    FencedEpochError,
    InvalidRequestError,
    NotMasterError,
)
from metaq.net.retry import wait_event
from metaq.protocol import messages as m
from metaq.storage import PartitionLog
from metaq.storage.epochs import NO_EPOCH, EpochHistory

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from metaq.broker.core import Broker

log = logging.getLogger("metaq.broker.replication")

ELECTION_CHECK_S = 0.2
STOP_FETCHING_S = 10.0
LEASE_FRACTION = 2 / 3
"""A master's lease: this fraction of the session timeout from the sending of the last ZooKeeper round trip
that confirmed it (ZooKeeper expires the session a whole timeout after it last heard from it)."""
"""How often a slave with autoFailover looks whether the master is gone (it is also woken by watches)."""


def ha_enabled(broker: Broker) -> bool:
    """Whether this broker uses epochs, the in-sync set and (maybe) failover (ZooKeeper mode only)."""
    return broker.cluster.mode == "zookeeper" and broker.config.ha_mode


class HighAvailability:
    """The replica-group member of one broker process (see the module doc). Implements the core's
    :class:`metaq.broker.core.ReplicaGroupView`."""

    def __init__(self, broker: Broker, replica: SlaveConfig) -> None:
        self.broker = broker
        self.replica = replica
        self.replica_id = replica.slave_id
        self.broker_id = broker.config.broker_id
        self.registry = broker.cluster.registry
        self.session_timeout_s: float = float(getattr(self.registry, "session_timeout_s", 30.0))
        self.master: MasterReplication | None = None
        self.replicator: SlaveReplicator | None = None
        self.epoch = NO_EPOCH
        self.version = -1
        self.lease_until = 0.0
        self.promotions = 0
        self.demotions = 0
        self._histories: dict[Path, EpochHistory] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._role_changed = asyncio.Event()
        self._deposed_reason = ""
        self.handing_over = False
        self.last_takeover: dict[str, Any] = {}
        """What the last promotion of this replica found: the old master, the epoch, and how many messages
        the old master had (as of this replica's last fetch) that this replica did not."""

    # -- epochs ---------------------------------------------------------------------------------------

    def history(self, plog: PartitionLog) -> EpochHistory:
        h = self._histories.get(plog.directory)
        if h is None:
            h = self._histories[plog.directory] = EpochHistory(plog.directory)
            h.clamp(plog.log_end_offset)
        return h

    def known_epoch(self) -> int:
        return self.epoch

    def observe_epoch(self, epoch: int) -> None:
        """A slave learnt of master epoch ``epoch`` (a fetch reply): older ones are refused from now on."""
        if self.master is None and epoch > self.epoch:
            self.epoch = epoch

    # -- start (blocking, before serving writes) ------------------------------------------------------

    def check_may_be_master(self) -> None:
        """Refuse to start as master when another replica has been master since and this one is not in
        its in-sync set (it may lack acked messages). RuntimeError saying what to do."""
        state, _ = self.registry.read_replica_group(self.broker_id)
        if state is None or state.master == self.replica_id or self.replica_id in state.isr:
            return
        raise RuntimeError(
            f"replica {self.replica_id} of broker {self.broker_id} is not in the in-sync set {list(state.isr)} of "
            f"epoch {state.epoch} (master: replica {state.master}): it may lack acknowledged messages. Start it "
            "as a slave (--slave) so it catches up; see docs/replication.md")

    def start_epoch(self) -> None:
        """Right after registering ``ids/<id>/master``: the next epoch, written version-checked."""
        sent = time.monotonic()
        state, version = self.registry.read_replica_group(self.broker_id)
        isr = tuple(r for r in state.isr if r != self.replica_id) if state is not None else ()
        new = ReplicaGroupState((state.epoch + 1) if state is not None else 1, self.replica_id, isr)
        self.version = self.registry.write_replica_group(self.broker_id, new, version)
        self._become_master_state(new)
        self.lease_until = sent + self.session_timeout_s * LEASE_FRACTION
        log.info("broker %d: replica %d is master in epoch %d (in-sync slaves: %s)", self.broker_id, self.replica_id,
                 new.epoch, list(isr) or "none")

    def _become_master_state(self, state: ReplicaGroupState) -> None:
        self.epoch = state.epoch
        self.handing_over = False  # a handover of an earlier mastership (it ended when this replica stepped down)
        self.broker.slave = None
        self.master = MasterReplication(self.broker, replica_id=self.replica_id, state=state, version=self.version,
                                        write_state=self._write_state, on_deposed=self._deposed)

    def _write_state(self, state: ReplicaGroupState, version: int) -> int:
        return self.registry.write_replica_group(self.broker_id, state, version)

    # -- running --------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Play the current role until cancelled, switching when the cluster says so."""
        loop = asyncio.get_running_loop()
        self.broker.ha = self
        wake = asyncio.Event()

        def on_snapshot(_snapshot: Any) -> None:
            loop.call_soon_threadsafe(wake.set)

        self.registry.add_listener(on_snapshot)
        try:
            while True:
                if self.master is not None:
                    await self._run_master()
                else:
                    await self._run_slave(wake)
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _run_master(self) -> None:
        assert self.master is not None
        master = self.master
        self._role_changed.clear()
        task = asyncio.get_running_loop().create_task(master.run(), name="metaq-isr")
        self._tasks.append(task)
        period = self.session_timeout_s / 6
        try:
            while not self._role_changed.is_set():
                sent = time.monotonic()
                try:
                    still = await asyncio.to_thread(self._still_master)
                except Exception as exc:  # ZooKeeper unreachable: the lease runs out, writes stop
                    log.info("broker %d: cannot renew the master lease (%s)", self.broker_id, exc)
                    still = None
                if still is True:
                    self.lease_until = sent + self.session_timeout_s * LEASE_FRACTION
                elif still is False:
                    self._deposed(self._deposed_reason or "ZooKeeper names another master or a newer epoch")
                    break
                await wait_event(self._role_changed, period)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self._tasks.remove(task)
        await self._demote()

    def _still_master(self) -> bool | None:
        """True: still master (lease renewed); False: deposed; None: not sure (session lost for now)."""
        state, _ = self.registry.read_replica_group(self.broker_id)
        if state is None or state.epoch != self.epoch or state.master != self.replica_id:
            self._deposed_reason = (f"the replica group's state is now {state}" if state is not None
                                    else "the replica group's state is gone")
            return False
        if not self.registry.master_session_ok(self.broker_id):
            return None  # our session lost the master node; the registry restores it if nobody took over
        return True

    def _deposed(self, why: str) -> None:
        if self.master is None:
            return
        self.lease_until = 0.0
        self._deposed_reason = why
        self._role_changed.set()

    async def _demote(self) -> None:
        """Master -> slave of whoever is master now (in this process)."""
        master, self.master = self.master, None
        self.lease_until = 0.0
        self.handing_over = False  # done: a slave refuses writes anyway
        self.demotions += 1
        if master is not None:
            master.deposed = True
            master.fail_waiting(f"broker {self.broker_id} replica {self.replica_id} is no longer master: "
                                f"{self._deposed_reason}")
        log.warning("broker %d: replica %d is no longer master (%s); it continues as a slave and cuts what it "
                    "wrote alone", self.broker_id, self.replica_id, self._deposed_reason)
        self.broker.slave = self.replica
        address = Address(self.broker.cluster_host, self.broker.port)
        while True:
            try:
                await asyncio.to_thread(self.broker.cluster.switch_to_slave, address, self.replica_id)
                break
            except Exception as exc:
                log.warning("broker %d: cannot register as slave %d yet (%s); retrying", self.broker_id,
                            self.replica_id, exc)
                await asyncio.sleep(1.0)
        self._reannounce()

    # -- planned switchover (metaq admin promote) -------------------------------------------------------

    async def hand_over(self, replica_id: int, timeout_s: float) -> tuple[int, int]:
        """Refuse writes, wait until the slave holds everything, name it the successor in ZooKeeper and step
        down; the slave takes over. (new master, its epoch). Nothing acked is lost (the slave holds every
        batch) and nothing is written twice (writes are refused with NOT_MASTER, before any append)."""
        master = self.master
        if master is None:
            raise NotMasterError(f"broker {self.broker_id} here is slave {self.replica_id}: send the promote request "
                                 "to the master")
        isr = set(master.isr)
        joining = master.isr_joining  # already recorded in ZooKeeper, perhaps: waited for below
        if replica_id >= 0 and replica_id not in isr | joining:
            raise InvalidRequestError(f"replica {replica_id} is not in the in-sync set {sorted(isr)} of broker "
                                      f"{self.broker_id}: it may lack messages; wait until it has caught up")
        candidates = sorted(isr) if replica_id < 0 else [replica_id]
        if not candidates:
            raise InvalidRequestError(f"broker {self.broker_id} has no in-sync slave to hand over to")
        old_epoch = self.epoch
        deadline = time.monotonic() + timeout_s
        self.handing_over = True
        try:
            while True:  # the in-sync set is still kept meanwhile: a dead slave leaves, its acks complete
                ready = [c for c in candidates if c in master.isr and master.holds_everything(c)]
                if ready and not master.isr_change_pending and not master.acks_waiting:
                    master.frozen = True  # from here the state is ours to write
                    if not master.isr_change_pending:
                        break
                    master.frozen = False
                if time.monotonic() > deadline:
                    raise InvalidRequestError(f"no slave of {candidates} held every message within {timeout_s:g}s; "
                                              "nothing changed, the master takes writes again")
                await asyncio.sleep(0.01)
            target = ready[0]
            state = ReplicaGroupState(self.epoch, self.replica_id, tuple(sorted(master.isr)), successor=target)
            master.version = await asyncio.to_thread(self.registry.write_replica_group, self.broker_id, state,
                                                     master.version)
        except BaseException:
            self.handing_over = False
            master.frozen = False
            raise
        log.warning("broker %d: replica %d hands the mastership over to replica %d (it holds every message)",
                    self.broker_id, self.replica_id, target)
        self._deposed(f"handed over to replica {target} (metaq admin promote)")
        while time.monotonic() < deadline + 10:
            now, _ = await asyncio.to_thread(self.registry.read_replica_group, self.broker_id)
            if now is not None and now.epoch > old_epoch:
                return now.master, now.epoch
            await asyncio.sleep(0.05)
        raise InvalidRequestError(f"replica {target} was named successor but has not taken over yet; see its log")

    # -- slave ------------------------------------------------------------------------------------------

    async def _run_slave(self, wake: asyncio.Event) -> None:
        self.broker.slave = self.replica
        with contextlib.suppress(Exception):  # the current epoch, so a deposed master is refused at once
            state, _ = await asyncio.to_thread(self.registry.read_replica_group, self.broker_id)
            if state is not None:
                self.observe_epoch(state.epoch)
        replicator = SlaveReplicator(self.broker, self.replica, ha=self)
        self.replicator = replicator
        task = asyncio.get_running_loop().create_task(replicator.run(), name="metaq-slave")
        self._tasks.append(task)
        absent_since: float | None = None
        try:
            while True:
                wake.clear()
                if self.broker.cluster.master_address() is not None:
                    absent_since = None
                else:
                    if absent_since is None:
                        absent_since = time.monotonic()
                        log.info("broker %d: its master is not registered; replica %d checks whether to take over "
                                 "(autoFailover=%s)", self.broker_id, self.replica_id,
                                 str(self.broker.config.auto_failover).lower())
                    eligible = await self._eligible_state(time.monotonic() - absent_since)
                    if eligible is not None and await self._stop_fetching(task):
                        if await self._try_promote(*eligible):
                            return
                        task = asyncio.get_running_loop().create_task(replicator.run(), name="metaq-slave")
                        self._tasks[-1] = task
                await wait_event(wake, ELECTION_CHECK_S)
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if task in self._tasks:
                self._tasks.remove(task)
            self.replicator = None

    async def _stop_fetching(self, task: asyncio.Task[None]) -> bool:
        """Stop the replica fetchers before claiming the master's place (never take over while one may still
        store a batch of the old master's); False if they did not stop in time."""
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=STOP_FETCHING_S)
        if not done:
            log.error("broker %d: replica %d's fetchers did not stop within %.0fs; not taking over this time",
                      self.broker_id, self.replica_id, STOP_FETCHING_S)
            return False
        return True

    async def _eligible_state(self, absent_s: float) -> tuple[ReplicaGroupState, int] | None:
        """The state to take over from, when this slave should take over now: it is the successor a master
        handing over named, or (autoFailover) it is in the in-sync set or was the last master, and no other
        successor is named (or the named one has not taken over for two session timeouts)."""
        try:
            state, version = await asyncio.to_thread(self.registry.read_replica_group, self.broker_id)
        except Exception as exc:
            log.info("broker %d: cannot read the replica group's state (%s)", self.broker_id, exc)
            return None
        if state is None:
            return None
        if absent_s < ELECTION_CHECK_S:
            log.info("broker %d: replica group state %s", self.broker_id, state)
        if state.successor == self.replica_id:
            return state, version
        # the last master (restarted as a slave) holds every acked message of its epoch, as the set does
        if not self.broker.config.auto_failover or (self.replica_id not in state.isr
                                                    and state.master != self.replica_id):
            return None
        if state.successor >= 0 and absent_s < 2 * self.session_timeout_s:
            return None
        return state, version

    async def _try_promote(self, state: ReplicaGroupState, version: int) -> bool:
        new = ReplicaGroupState(state.epoch + 1, self.replica_id,
                                tuple(r for r in state.isr if r not in (self.replica_id, state.master)))
        address = Address(self.broker.cluster_host, self.broker.port)
        behind = self._behind_old_master()
        sent = time.monotonic()
        replies = [f.state.last_reply_at for f in (self.replicator.followers.values() if self.replicator else ())
                   if f.state.last_reply_at >= 0]
        silent_ms = int((time.monotonic() - max(replies)) * 1000) if replies else -1
        try:
            self.version = await asyncio.to_thread(self.registry.take_mastership, self.broker_id, address, new,
                                                   version)
        except ReplicaGroupChanged as exc:
            log.info("broker %d: replica %d did not become master (%s)", self.broker_id, self.replica_id, exc)
            return False
        except Exception as exc:
            log.warning("broker %d: replica %d could not take over (%s)", self.broker_id, self.replica_id, exc)
            return False
        self.promotions += 1
        lost = sum(behind.values())
        self.last_takeover = {"epoch": new.epoch, "old_master": state.master, "planned": state.successor >= 0,
                              "messages_behind_old_master": lost, "ms_since_last_reply": silent_ms,
                              "partitions_behind": {k: v for k, v in behind.items() if v}}
        if lost:
            log.warning("broker %d: replica %d takes over %d message(s) behind the old master (as of its last fetch, "
                        "per partition: %s); with sync replication these were never acknowledged, with async "
                        "replication acknowledged ones among them are lost", self.broker_id, self.replica_id, lost,
                        self.last_takeover["partitions_behind"])
        if not self.broker.config.sync_replication:
            log.warning("broker %d: replica %d takes over with async replication; it last heard from the old master "
                        "%d ms ago: what the old master acked since is lost unless it returns (it then cuts and counts "
                        "those messages)", self.broker_id, self.replica_id, silent_ms)
        self.broker.cluster.switched_to_master()
        self._become_master_state(new)
        self.lease_until = sent + self.session_timeout_s * LEASE_FRACTION
        self._reannounce()
        log.warning("broker %d: replica %d took over as master in epoch %d (old master: replica %d; in-sync "
                    "slaves: %s)", self.broker_id, self.replica_id, new.epoch, state.master, list(new.isr) or "none")
        return True

    def _behind_old_master(self) -> dict[str, int]:
        out: dict[str, int] = {}
        replicator = self.replicator
        if replicator is None:
            return out
        for (topic, partition), follower in replicator.followers.items():
            end = follower.state.master_end_offset
            if end >= 0:
                out[f"{topic}-{partition}"] = max(0, end - follower.plog.log_end_offset)
        return out

    def _reannounce(self) -> None:
        for topic in list(self.broker.topics):
            self.broker.announce(topic, force=True)
        self.broker.announce_config()

    # -- the core's view --------------------------------------------------------------------------------

    def check_writable(self, what: str) -> None:
        if self.master is None:
            raise NotMasterError(f"broker {self.broker_id} here is slave {self.replica_id}: it serves fetches but "
                                 f"refuses {what}; send it to the master of broker id {self.broker_id}")
        if self.handing_over:
            raise NotMasterError(f"broker {self.broker_id} replica {self.replica_id} is handing the mastership over "
                                 f"(metaq admin promote): it refuses {what}; the new master takes them in a moment")
        if time.monotonic() >= self.lease_until:
            raise NotMasterError(f"broker {self.broker_id} replica {self.replica_id} cannot confirm with ZooKeeper "
                                 f"that it is still the master (epoch {self.epoch}); it refuses {what} until it "
                                 "does (a failover may be under way)")

    def before_append(self, plog: PartitionLog) -> None:
        assert self.master is not None
        self.master.check_before_append(plog.topic)
        history = self.history(plog)
        if history.latest_epoch() != self.epoch:
            history.assign(self.epoch, plog.log_end_offset)

    def after_append(self, plog: PartitionLog, end_offset: int) -> Awaitable[None] | None:
        master = self.master
        if master is None:
            return None
        # Ends once every member of the in-sync set holds the batch, or raises NOT_ENOUGH_REPLICAS_AFTER_APPEND
        # when this master is deposed first (fail_waiting). Confirmed and then deposed is still confirmed: the
        # successor comes from that set and holds the batch. (The produce awaits this only after the batch
        # is durable here, so a planned switchover may well step down in between.)
        return master.wait_replicated(plog, end_offset)

    def visible_end(self, plog: PartitionLog) -> int:
        """Where consumers of this broker may read up to: the high watermark of a sync topic on the master."""
        master = self.master
        if master is not None:
            return master.high_watermark(plog) if master.sync_topic(plog.topic) else plog.log_end_offset
        state = self.broker.topics.get(plog.topic)
        if state is None or not state.settings.sync_replication:
            return plog.log_end_offset
        replicator = self.replicator  # a slave: the master's watermark
        follower = replicator.followers.get((plog.topic, plog.partition)) if replicator is not None else None
        if follower is None or follower.state.high_watermark < 0:
            # Neither master nor following yet (starting, the master not found yet), or no reply from the master
            # yet: nothing here is known to be committed, and a deposed master's tail may be about to be cut.
            # The master's first reply (moments after a start) shows the messages.
            return plog.log_start_offset
        return min(plog.log_end_offset, follower.state.high_watermark)

    def replica_fetch(self, req: m.FetchRequest, plog: PartitionLog) -> tuple[dict[str, int], int]:
        """Check a slave's fetch: the extra reply fields, and the offset the reply must stop before (-1: the
        log end). A reply with ``diverging_end_offset`` set carries no records."""
        master = self.master
        if master is None:
            raise NotMasterError(f"broker {self.broker_id} here is a slave: replicas fetch from the master")
        if req.replica_epoch > self.epoch:
            self._deposed(f"slave {req.replica_id} fetched with epoch {req.replica_epoch} > {self.epoch}")
            raise FencedEpochError(f"epoch {self.epoch} here is older than the slave's {req.replica_epoch}: this "
                                   "master was deposed")
        extra, stop_before = self.replica_reply(req, plog)
        if "diverging_end_offset" not in extra:
            master.on_replica_fetch(plog, req.replica_id, req.offset)
            extra["high_watermark"] = master.high_watermark(plog)  # this fetch may have moved it
        return extra, stop_before

    def replica_reply(self, req: m.FetchRequest, plog: PartitionLog) -> tuple[dict[str, int], int]:
        """The extra reply fields of a slave's fetch and where its records stop, as of now: computed when
        the fetch comes in and again when a long poll is answered (the epoch of the records and the
        watermark may have moved meanwhile). NotMasterError if this broker is no longer the master."""
        master = self.master
        if master is None:
            raise NotMasterError(f"broker {self.broker_id} here is a slave: replicas fetch from the master")
        history = self.history(plog)
        extra = {"master_epoch": self.epoch, "high_watermark": master.high_watermark(plog)}
        if req.last_fetched_epoch >= 0:
            epoch, end = history.end_offset_for(req.last_fetched_epoch, plog.log_end_offset)
            if epoch != req.last_fetched_epoch or end < req.offset:
                extra["diverging_epoch"] = epoch
                extra["diverging_end_offset"] = min(end, req.offset)
                return extra, -1
        epoch, next_start = history.epoch_at(req.offset)
        extra["records_epoch"] = epoch
        return extra, next_start

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"replica_id": self.replica_id, "role": "master" if self.master else "slave",
                               "epoch": self.epoch, "lease_ms_left": max(0, int((self.lease_until - time.monotonic())
                                                                                 * 1000)),
                               "promotions": self.promotions, "demotions": self.demotions,
                               "auto_failover": self.broker.config.auto_failover,
                               "handing_over": self.handing_over, "last_takeover": self.last_takeover}
        if self.master is not None:
            out.update(self.master.describe())
        return out


__all__ = ["HighAvailability", "ha_enabled"]
