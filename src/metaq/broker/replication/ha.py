"""A broker's part in its replica group with epochs: master or slave, and the switch between them.

Used when replication is more than MetaQ's async copy (``syncReplication`` or ``autoFailover``; docs/
replication.md, which holds the safety arguments this module implements). Every replica of a broker id
has a replica id (its ``slaveId``, the master's too). The group's state lives in ZooKeeper at
``brokers/replica-groups/<id>``: ``{epoch, master, isr}``, only ever written with compare-and-set.

* **Master**: at start it must be the last master or in the in-sync set; it registers
  ``ids/<id>/master`` and writes the state with the epoch one higher. It keeps the in-sync set
  (:mod:`.master`) and takes writes to async topics only within the lease its slaves' fetches grant. It
  needs no ZooKeeper to take writes: only to change the group. It watches the state node and reads it
  every second; when another replica took over (or a version-checked write fails, or a slave fetches with
  a newer epoch) it becomes a slave of the new master in the same process, and its fetcher cuts what it
  wrote alone (the epochs say where, :mod:`metaq.storage.epochs`). A master whose node went with an expired
  session registers again if the state is unchanged: an expiry never fails a healthy master over.
* **Slave**: follows the master (:class:`~metaq.broker.replication.slave.SlaveReplicator`) and watches it
  (:mod:`.detector`). With ``autoFailover=true``, when the master is dead and this slave is in the in-sync
  set, it takes over in one ZooKeeper transaction; one slave wins, the others follow the new master. That
  side is :mod:`.takeover` (:class:`~metaq.broker.replication.takeover.SlaveTakeover`, a part of
  :class:`HighAvailability`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metaq.broker.replication.detector import MasterWatch
from metaq.broker.replication.master import MasterReplication
from metaq.broker.replication.slave import SlaveReplicator
from metaq.broker.replication.slave_config import SlaveConfig
from metaq.broker.replication.takeover import SlaveTakeover
from metaq.cluster.layout import ReplicaGroupState
from metaq.cluster.registry import Address
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
    from metaq.broker.session import Session

log = logging.getLogger("metaq.broker.replication")

ELECTION_CHECK_S = 0.2
"""How often a slave looks whether its master is dead (it is also woken by its connections and by watches)."""
MASTER_CHECK_S = 1.0
"""How often a master reads the replica group's state (besides watching it) to learn it was deposed."""


def ha_enabled(broker: Broker) -> bool:
    """Whether this broker uses epochs, the in-sync set and (maybe) failover (ZooKeeper mode only)."""
    return broker.cluster.mode == "zookeeper" and broker.config.ha_mode


class HighAvailability(SlaveTakeover):
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
        self.lease_s = broker.config.master_lease_ms / 1000
        self.watch = MasterWatch(self.lease_s)
        """What this replica, as a slave, has seen of its master (the evidence of its death)."""
        self._last_master: tuple[Address, int] | None = None
        """(address, epoch) of the master last registered: followed while its node is gone in that epoch."""
        self._wake = asyncio.Event()
        self._absent_since: float | None = None
        """time.monotonic() since when the master's node is missing from the view (None: it is there)."""
        self._zk_unreachable = False
        self.last_suspicion = ""
        """Why the master was last suspected dead without a takeover ('' when it was not)."""
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
        state, version = self.registry.read_replica_group(self.broker_id)
        isr = tuple(r for r in state.isr if r != self.replica_id) if state is not None else ()
        new = ReplicaGroupState((state.epoch + 1) if state is not None else 1, self.replica_id, isr)
        self.version = self.registry.write_replica_group(self.broker_id, new, version)
        self._become_master_state(new)
        log.info("broker %d: replica %d is master in epoch %d (in-sync slaves: %s)", self.broker_id, self.replica_id,
                 new.epoch, list(isr) or "none")

    def _become_master_state(self, state: ReplicaGroupState) -> None:
        self.epoch = state.epoch
        self.handing_over = False  # a handover of an earlier mastership (it ended when this replica stepped down)
        self.broker.slave = None
        self.master = MasterReplication(self.broker, replica_id=self.replica_id, state=state, version=self.version,
                                        write_state=self._write_state, on_deposed=self._deposed,
                                        read_state=lambda: self.registry.read_replica_group(self.broker_id))

    def _write_state(self, state: ReplicaGroupState, version: int) -> int:
        return self.registry.write_replica_group(self.broker_id, state, version)

    # -- running --------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Play the current role until cancelled, switching when the cluster says so."""
        loop = asyncio.get_running_loop()
        self.broker.ha = self

        def on_snapshot(_snapshot: Any) -> None:
            loop.call_soon_threadsafe(self._wake.set)

        def on_state(state: ReplicaGroupState | None) -> None:
            loop.call_soon_threadsafe(self._on_state, state)

        self.registry.add_listener(on_snapshot)
        with contextlib.suppress(Exception):  # without the watch, the periodic reads still tell
            await asyncio.to_thread(self.registry.watch_replica_group, self.broker_id, on_state)
        try:
            while True:
                if self.master is not None:
                    await self._run_master()
                else:
                    await self._run_slave()
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _on_state(self, state: ReplicaGroupState | None) -> None:
        """The replica group's state changed in ZooKeeper (its watch)."""
        if state is None:
            return
        if self.master is not None:
            if state.epoch > self.epoch or (state.epoch == self.epoch and state.master != self.replica_id):
                self._deposed(f"the replica group's state is now {state}")
            return
        self.observe_epoch(state.epoch)
        self._wake.set()  # a named successor, or a new master about to register

    async def _run_master(self) -> None:
        assert self.master is not None
        master = self.master
        self._role_changed.clear()
        task = asyncio.get_running_loop().create_task(master.run(), name="metaq-isr")
        self._tasks.append(task)
        try:
            while not self._role_changed.is_set():
                try:
                    still = await asyncio.to_thread(self._still_master)
                    if still is None:  # its node went with an expired session: back if nobody took over
                        still = await asyncio.to_thread(self.registry.reclaim_mastership, self.broker_id)
                    self._zookeeper_reachable(True)
                except Exception as exc:  # writes go on: changing the group is what needs ZooKeeper
                    self._zookeeper_reachable(False, exc)
                    still = True
                if still is False:
                    self._deposed(self._deposed_reason or "ZooKeeper names another master or a newer epoch")
                    break
                await wait_event(self._role_changed, MASTER_CHECK_S)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self._tasks.remove(task)
        await self._demote()

    def _zookeeper_reachable(self, reachable: bool, exc: BaseException | None = None) -> None:
        """Log each change between reaching ZooKeeper and not (once, not every second)."""
        if reachable == (not self._zk_unreachable):
            return
        self._zk_unreachable = not reachable
        if reachable:
            log.info("broker %d: replica %d reaches ZooKeeper again; it is still the master (epoch %d)",
                     self.broker_id, self.replica_id, self.epoch)
        else:
            log.warning("broker %d: replica %d cannot reach ZooKeeper (%s); it goes on taking writes that its "
                        "in-sync slaves confirm (or within its lease), and cannot change the in-sync set meanwhile",
                        self.broker_id, self.replica_id, exc)

    def _still_master(self) -> bool | None:
        """True: still master; False: deposed; None: the state names it but its node is gone (an expired
        session), to be registered again."""
        state, _ = self.registry.read_replica_group(self.broker_id)
        if state is None or state.epoch != self.epoch or state.master != self.replica_id:
            self._deposed_reason = (f"the replica group's state is now {state}" if state is not None
                                    else "the replica group's state is gone")
            return False
        if not self.registry.master_session_ok(self.broker_id):
            return None
        return True

    def _deposed(self, why: str) -> None:
        if self.master is None:
            return
        self._deposed_reason = why
        self._role_changed.set()

    async def _demote(self) -> None:
        """Master -> slave of whoever is master now (in this process)."""
        master, self.master = self.master, None
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

    def _reannounce(self) -> None:
        for topic in list(self.broker.topics):
            self.broker.announce(topic, force=True)
        self.broker.announce_config()

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

    async def _run_slave(self) -> None:
        self.broker.slave = self.replica
        with contextlib.suppress(Exception):  # the current epoch, so a deposed master is refused at once
            state, _ = await asyncio.to_thread(self.registry.read_replica_group, self.broker_id)
            if state is not None:
                self.observe_epoch(state.epoch)
        replicator = SlaveReplicator(self.broker, self.replica, ha=self)
        self.replicator = replicator
        task = asyncio.get_running_loop().create_task(replicator.run(), name="metaq-slave")
        self._tasks.append(task)
        self._absent_since = None
        try:
            while True:
                self._wake.clear()
                outcome = await self._maybe_take_over(replicator, task)
                if outcome is True:
                    return
                if task.done():  # stopped for a takeover that did not happen: follow again
                    task = asyncio.get_running_loop().create_task(replicator.run(), name="metaq-slave")
                    self._tasks[-1] = task
                await wait_event(self._wake, ELECTION_CHECK_S)
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if task in self._tasks:
                self._tasks.remove(task)
            self.replicator = None

    # -- the core's view --------------------------------------------------------------------------------

    def check_writable(self, what: str) -> None:
        if self.master is None:
            raise NotMasterError(f"broker {self.broker_id} here is slave {self.replica_id}: it serves fetches but "
                                 f"refuses {what}; send it to the master of broker id {self.broker_id}")
        if self.handing_over:
            raise NotMasterError(f"broker {self.broker_id} replica {self.replica_id} is handing the mastership over "
                                 f"(metaq admin promote): it refuses {what}; the new master takes them in a moment")

    def before_append(self, plog: PartitionLog) -> None:
        master = self.master
        assert master is not None
        master.check_before_append(plog.topic)
        if not master.lease_ok(time.monotonic()):
            master.lease_refusals += 1
            raise NotMasterError(f"broker {self.broker_id} replica {self.replica_id}: its in-sync slaves have not "
                                 f"renewed its lease (epoch {self.epoch}; masterLeaseMs="
                                 f"{self.broker.config.master_lease_ms}): a failover may be under way; nothing was "
                                 "stored")
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

    def replica_fetch(self, req: m.FetchRequest, plog: PartitionLog,
                      session: Session | None = None) -> tuple[dict[str, int], int]:
        """Check a slave's fetch: the extra reply fields, and the offset the reply must stop before (-1: the
        log end). A reply with ``diverging_end_offset`` set carries no records."""
        master = self.master
        if master is None:
            raise NotMasterError(f"broker {self.broker_id} here is a slave: replicas fetch from the master")
        if req.replica_epoch <= self.epoch:
            master.on_replica_connection(session, req.replica_id, time.monotonic())
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

    def connection_closed(self, session: Session) -> None:
        if self.master is not None:
            self.master.connection_closed(session)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"replica_id": self.replica_id, "role": "master" if self.master else "slave",
                               "epoch": self.epoch, "master_lease_ms": self.broker.config.master_lease_ms,
                               "promotions": self.promotions, "demotions": self.demotions,
                               "auto_failover": self.broker.config.auto_failover,
                               "handing_over": self.handing_over, "last_takeover": self.last_takeover}
        if self.master is not None:
            out.update(self.master.describe())
        else:
            out.update(self.watch.describe(time.monotonic()))
            out["last_suspicion"] = self.last_suspicion
        return out


__all__ = ["HighAvailability", "ha_enabled"]
