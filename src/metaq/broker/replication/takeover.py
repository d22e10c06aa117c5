"""The slave's part in a replica group with epochs: follow the master, watch it, take its place.

A slave follows its master (:class:`~metaq.broker.replication.slave.SlaveReplicator`, which asks
:meth:`SlaveTakeover.master_address` whom to follow and reports every reply and refusal) and watches it
(:mod:`.detector`). It takes over when the master names it successor (``metaq admin promote``: the
master's :meth:`~metaq.broker.replication.ha.HighAvailability.hand_over`), or, with ``autoFailover=true``,
when the master is dead (its address refuses, or it has been silent for ``masterLeaseMs`` and the other
in-sync slaves agree) and this slave may take over (it is in the in-sync set, or was the last master).
Then it stops fetching and, in one ZooKeeper transaction, writes the state (epoch + 1, itself as master,
the old master out of the set; version-checked), deletes the old master's node and creates its own. One
slave wins; the others keep following and find the new master through their watch. The safety argument is
docs/replication.md's.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import TYPE_CHECKING, Any

from metaq.broker.replication.detector import REFUSED, SILENT, MasterWatch, ask_other_slaves
from metaq.broker.replication.master import MasterReplication
from metaq.broker.replication.slave import SlaveReplicator
from metaq.broker.replication.slave_config import SlaveConfig
from metaq.cluster.layout import ReplicaGroupState
from metaq.cluster.registry import Address, ClusterRegistry, ReplicaGroupChanged

if TYPE_CHECKING:
    from metaq.broker.core import Broker

log = logging.getLogger("metaq.broker.replication")

STOP_FETCHING_S = 10.0


class SlaveTakeover:
    """Following, watching and taking over: a mixin of :class:`~metaq.broker.replication.ha.HighAvailability`,
    whose attributes below are."""

    broker: Broker
    replica: SlaveConfig
    replica_id: int
    broker_id: int
    registry: ClusterRegistry
    session_timeout_s: float
    lease_s: float
    epoch: int
    version: int
    master: MasterReplication | None
    replicator: SlaveReplicator | None
    watch: MasterWatch
    _last_master: tuple[Address, int] | None
    _wake: asyncio.Event
    _absent_since: float | None
    last_suspicion: str
    promotions: int
    last_takeover: dict[str, Any]

    def observe_epoch(self, epoch: int) -> None:
        raise NotImplementedError  # HighAvailability's

    def _become_master_state(self, state: ReplicaGroupState) -> None:
        raise NotImplementedError  # HighAvailability's

    def _reannounce(self) -> None:
        raise NotImplementedError  # HighAvailability's

    # -- what the followers see of the master ----------------------------------------------------------

    def master_address(self, registered: Address | None) -> Address | None:
        """The master to follow: the registered one, or while its node is gone (a live master's session
        expired, say) the current epoch's master at its last registered address."""
        if registered is not None:
            self._last_master = (registered, self.epoch)
            address: Address | None = registered
        elif self._last_master is not None and self._last_master[1] == self.epoch:
            address = self._last_master[0]
        else:
            address = None
        if self.master is None and self.watch.follow(address, self.epoch, time.monotonic()):
            self._wake.set()
        return address

    def on_reply(self, address: Address) -> None:
        self.watch.reply(address, time.monotonic())

    def on_refused(self, address: Address, why: str) -> None:
        self.watch.refused(address, why, time.monotonic())
        self._wake.set()

    # -- the takeover ---------------------------------------------------------------------------------

    def _evidence(self, replicator: SlaveReplicator, registered: Address | None) -> str | None:
        """REFUSED or SILENT when this slave has seen its master die (:mod:`.detector`), else None. The
        registration of this very replica's address as master is its previous run's: gone (REFUSED)."""
        if registered is not None and registered == Address(self.broker.cluster_host, self.broker.port):
            return REFUSED
        if not replicator.followers:
            return None  # nothing is fetched (no topic yet): silence says nothing
        return self.watch.evidence(time.monotonic())

    async def _maybe_take_over(self, replicator: SlaveReplicator, task: asyncio.Task[None]) -> bool:
        """Take over when this slave should (the master is dead or names it successor); True when it did."""
        registered = self.broker.cluster.master_address()
        now = time.monotonic()
        if registered is not None:
            self._absent_since = None
        elif self._absent_since is None:
            self._absent_since = now
            log.info("broker %d: its master is not registered; replica %d follows it at its last address while it "
                     "answers (autoFailover=%s)", self.broker_id, self.replica_id,
                     str(self.broker.config.auto_failover).lower())
        evidence = self._evidence(replicator, registered)
        watched = (self.watch.address, self.watch.epoch)  # what the evidence is about
        absent = registered is None
        if evidence is None and not absent:
            self.last_suspicion = ""
            return False
        try:
            state, version = await asyncio.to_thread(self.registry.read_replica_group, self.broker_id)
        except Exception as exc:
            self._suspect(f"cannot read the replica group's state ({exc})")
            return False
        if state is None:
            return False
        self.observe_epoch(state.epoch)
        planned = state.successor == self.replica_id
        if not planned:
            if evidence is None and not (absent and not replicator.followers):
                return False  # the node is gone but the master answers: an expired session, not a death
            moved = (self.watch.address, self.watch.epoch) != watched
            if evidence is not None and (state.epoch != watched[1] or moved):
                return False  # evidence about the master of another epoch, or a new master appeared meanwhile
            why = self._not_eligible(state, now - (self._absent_since or now))
            if why:
                seen = evidence or "not registered"
                if evidence == REFUSED and self.watch.refused_why:
                    seen += f": {self.watch.refused_why}"
                self._suspect(f"the master looks dead ({seen}) but this replica may not take over: {why}")
                return False
            if evidence == SILENT:
                vote = await self._vote(state, replicator)
                if not vote.confirmed:
                    self._suspect(f"the master has been silent for {self.watch.silent_s(time.monotonic()):.2f}s, but "
                                  f"{vote.veto or '; '.join(vote.unknown)}")
                    return False
        if not await self._stop_fetching(task):
            return False
        return await self._try_promote(state, version, "planned" if planned else (evidence or "not registered"),
                                       None if planned else watched[0])

    def _suspect(self, why: str) -> None:
        if why != self.last_suspicion:
            log.info("broker %d: replica %d: %s", self.broker_id, self.replica_id, why)
        self.last_suspicion = why

    def _not_eligible(self, state: ReplicaGroupState, absent_s: float) -> str:
        """Why this slave may not take over from ``state`` ('' when it may): with autoFailover, it is in the
        in-sync set or was the last master, and no other successor is named (or the named one has not taken
        over for two session timeouts)."""
        if not self.broker.config.auto_failover:
            return "autoFailover=false"
        # the last master (restarted as a slave) holds every acked message of its epoch, as the set does
        if self.replica_id not in state.isr and state.master != self.replica_id:
            return f"it is not in the in-sync set {list(state.isr)} (it may lack acknowledged messages)"
        if state.successor >= 0 and absent_s < 2 * self.session_timeout_s:
            return f"replica {state.successor} is named to take over (metaq admin promote)"
        return ""

    async def _vote(self, state: ReplicaGroupState, replicator: SlaveReplicator) -> Any:
        """The other registered in-sync slaves' vote on the master's silence (:func:`.detector.ask_other_slaves`)."""
        snapshot = self.broker.cluster.snapshot()
        if self.broker.config.ssl_replication:
            snapshot = snapshot.over_tls()
        entry = snapshot.brokers.get(self.broker_id)
        registered = entry.slaves if entry is not None else {}
        others = [(r, registered[r]) for r in sorted(state.isr)
                  if r not in (self.replica_id, state.master) and r in registered]
        return await ask_other_slaves(others, self.watch.epoch, self.lease_s, replicator.settings)

    async def _stop_fetching(self, task: asyncio.Task[None]) -> bool:
        """Stop the replica fetchers before claiming the master's place: from here this replica confirms
        nothing more to the old master (the proof in docs/replication.md rests on it), and never stores a batch
        of the old master's after taking over. False if they did not stop in time."""
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=STOP_FETCHING_S)
        if not done:
            log.error("broker %d: replica %d's fetchers did not stop within %.0fs; not taking over this time",
                      self.broker_id, self.replica_id, STOP_FETCHING_S)
            return False
        return True

    async def _try_promote(self, state: ReplicaGroupState, version: int, evidence: str,
                           replacing: Address | None) -> bool:
        new = ReplicaGroupState(state.epoch + 1, self.replica_id,
                                tuple(r for r in state.isr if r not in (self.replica_id, state.master)))
        address = Address(self.broker.cluster_host, self.broker.port)
        behind = self._behind_old_master()
        silent_ms = int(self.watch.silent_s(time.monotonic()) * 1000)
        try:
            self.version = await asyncio.to_thread(functools.partial(
                self.registry.take_mastership, self.broker_id, address, new, version, replacing=replacing))
        except ReplicaGroupChanged as exc:
            log.info("broker %d: replica %d did not become master (%s)", self.broker_id, self.replica_id, exc)
            return False
        except Exception as exc:
            log.warning("broker %d: replica %d could not take over (%s)", self.broker_id, self.replica_id, exc)
            return False
        self.promotions += 1
        lost = sum(behind.values())
        self.last_takeover = {"epoch": new.epoch, "old_master": state.master, "planned": state.successor >= 0,
                              "evidence": evidence, "messages_behind_old_master": lost,
                              "ms_since_last_reply": silent_ms,
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
        self.last_suspicion = ""
        self._reannounce()
        log.warning("broker %d: replica %d took over as master in epoch %d (old master: replica %d, %s; in-sync "
                    "slaves: %s)", self.broker_id, self.replica_id, new.epoch, state.master, evidence,
                    list(new.isr) or "none")
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

