"""Standalone mode's memberships: a group coordinated by a broker, and broadcast.

* :class:`BrokerMembership`: the group is coordinated by the broker with the lowest id among the
  session's servers (:meth:`~metaq.client.core.ClientCore.coordinator`). The member joins it
  (JoinGroup, waiting for the rebalance to complete), consumes what the answer assigns, heartbeats, and
  gives everything up (committing first) when a heartbeat says a rebalance started. In every JoinGroup
  it tells the coordinator which partitions it sees on the other brokers (a standalone broker knows only
  its own), and rejoins when that view changes.
* :class:`BroadcastMembership`: MetaQ's broadcast consumer: every member owns every partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from metaq.client.core import ClientCore
from metaq.client.group.membership import ERROR_RETRY, GroupSide, Membership
from metaq.errors import (
    BrokerError,
    ConnectionClosedError,
    IllegalGenerationError,
    MetaqError,
    NotCoordinatorError,
    RebalanceInProgressError,
    RequestTimeoutError,
    UnknownMemberError,
)
from metaq.protocol import messages as m
from metaq.types import PartitionId

log = logging.getLogger("metaq.client.group")


class BrokerMembership(Membership):
    """Standalone mode: JoinGroup / Heartbeat / LeaveGroup to the coordinating broker (see the module docstring).

    ``channel`` names the connection the group's requests share (the consumer's MultiFetches use it too).
    """

    def __init__(self, side: GroupSide, core: ClientCore, channel: str) -> None:
        self.side = side
        self.core = core
        self.channel = channel
        self.generation = m.NO_GENERATION
        self.member_id = ""
        self._coordinator: int | None = None
        self._coordinator_known = False
        self._reported: dict[str, tuple[PartitionId, ...]] = {}
        """The partitions the last JoinGroup reported, per topic."""

    async def request(self, request: Any, timeout_s: float | None = None) -> Any:
        """A request to the group's coordinator (the lowest broker id among the servers)."""
        if not self._coordinator_known:
            self._coordinator = await self.core.coordinator()
            self._coordinator_known = True
        conn = await self.core.connection(self._coordinator, self.channel)
        if self._coordinator is not None and conn.broker_id != self._coordinator:
            # the default broker's connection failed over to another server: that broker does not
            # coordinate this group, and answering it would split the group in two
            raise ConnectionClosedError(f"broker {self._coordinator}, the group's coordinator, cannot be reached")
        return await conn.request(request, timeout_s)

    def _coordinator_id(self) -> int:
        return self.core.default_broker_id if self._coordinator is None else self._coordinator

    async def _view(self, fresh: bool) -> dict[str, tuple[PartitionId, ...]]:
        """The subscribed topics' partitions as this member's metadata has them (``fresh``: asked now,
        else the cache, refreshed in the background when old)."""
        out: dict[str, tuple[PartitionId, ...]] = {}
        for topic in sorted(self.side.subscriptions):
            tm = None
            if fresh:
                with contextlib.suppress(ConnectionClosedError, RequestTimeoutError, BrokerError):
                    tm = await self.core.metadata.topic(topic)
            else:
                tm = self.core.metadata.cached(topic)
                if tm is None:  # forgotten (a topic created or deleted through this session): ask again
                    self.core.metadata.refresh_soon(topic)
            out[topic] = tuple(p.id for p in tm.partitions) if tm is not None else self._reported.get(topic, ())
        return out

    def _others(self, view: dict[str, tuple[PartitionId, ...]]) -> dict[str, tuple[PartitionId, ...]]:
        """The part of a view the coordinator learns only from its members: other brokers' partitions."""
        coordinator = self._coordinator_id()
        return {t: tuple(p for p in ps if p.broker_id != coordinator) for t, ps in view.items()}

    async def run(self) -> None:
        side = self.side
        cfg = side.config
        backoff = ERROR_RETRY.start()
        while not side.closed:
            self._reported = await self._view(fresh=True)
            seen = [m.TopicAssignment(t, [m.BrokerPartition(p.broker_id, p.partition) for p in ps])
                    for t, ps in self._reported.items()]
            req = m.JoinGroupRequest(cfg.group, self.member_id, side.consumer_id, cfg.session_timeout_ms,
                                     cfg.rebalance_timeout_ms, sorted(side.subscriptions), cfg.load_balance_strategy,
                                     seen)
            try:
                resp: m.JoinGroupResponse = await self.request(
                    req, cfg.rebalance_timeout_ms / 1000 + self.core.config.request_timeout_s)
            except UnknownMemberError:
                self.member_id = ""
                continue
            except (RebalanceInProgressError, NotCoordinatorError, ConnectionClosedError, RequestTimeoutError) as exc:
                log.info("group %s: join failed (%s); retrying", cfg.group, exc)
                await asyncio.sleep(backoff.next_delay_unbounded_s())
                continue
            backoff.reset()
            self.member_id, self.generation = resp.member_id, resp.generation
            owned = [(a.topic, PartitionId(p.broker_id, p.partition)) for a in resp.assignment for p in a.partitions]
            log.info("group %s: member %s generation %d owns %d partitions", cfg.group, self.member_id,
                     self.generation, len(owned))
            try:
                await side.assign(owned)
            except MetaqError as exc:
                log.warning("group %s: cannot start consuming the assignment (%s); rejoining", cfg.group, exc)
                await asyncio.shield(side.revoke(commit=False))
                await asyncio.sleep(backoff.next_delay_unbounded_s())
                continue
            await self._heartbeat_until_rebalance()

    async def _heartbeat_until_rebalance(self) -> None:
        side = self.side
        cfg = side.config
        last_ok = time.monotonic()
        while not side.closed:
            await asyncio.sleep(cfg.heartbeat_ms / 1000)
            try:
                await self.request(m.HeartbeatRequest(cfg.group, self.generation, self.member_id))
                if self._others(await self._view(fresh=False)) != self._others(self._reported):
                    # Another broker's partitions changed (it came, went, or grew): only the members can
                    # tell a standalone coordinator, by rejoining with what they see now.
                    log.info("group %s: the partitions on other brokers changed; committing and rejoining",
                             cfg.group)
                    await asyncio.shield(side.revoke(commit=True))
                    return
            except (RebalanceInProgressError, IllegalGenerationError) as exc:
                log.info("group %s: rebalance (%s): committing and giving partitions up", cfg.group, exc.name)
                await asyncio.shield(side.revoke(commit=True))
                return
            except UnknownMemberError:
                log.warning("group %s: member %s was dropped from the group (session timeout?)", cfg.group,
                            self.member_id)
                await asyncio.shield(side.revoke(commit=False))
                self.member_id = ""
                return
            except (ConnectionClosedError, RequestTimeoutError, NotCoordinatorError) as exc:
                if time.monotonic() - last_ok > cfg.session_timeout_ms / 1000:
                    # Safe mode: the coordinator has surely given our partitions to others by now.
                    log.warning("group %s: no heartbeat for a session timeout (%s); giving partitions up",
                                cfg.group, exc)
                    await asyncio.shield(side.revoke(commit=False))
                    return
                continue
            last_ok = time.monotonic()

    async def leave(self) -> None:
        """LeaveGroup to the coordinator, then its connection closes."""
        if self.member_id:
            with contextlib.suppress(MetaqError):
                await self.request(m.LeaveGroupRequest(self.side.config.group, self.member_id))
        conn = self.core.cached_connection(self._coordinator_id(), self.channel) if self._coordinator_known else None
        if conn is not None:
            conn.close()


class BroadcastMembership(Membership):
    """MetaQ's broadcast consumer: every partition of every subscribed topic; new partitions are picked
    up as they appear (the metadata is asked again every heartbeat interval, at least every second)."""

    def __init__(self, side: GroupSide, core: ClientCore) -> None:
        self.side = side
        self.core = core

    async def run(self) -> None:
        side = self.side
        while not side.closed:
            try:
                owned: list[tuple[str, PartitionId]] = []
                for topic in sorted(side.subscriptions):
                    tm = await self.core.metadata.refresh_topic(topic)
                    owned += [(topic, p.id) for p in tm.partitions]
                if set(owned) != {(tp.topic, tp.partition) for tp in side.workers} or not side.assigned.is_set():
                    await side.assign(owned, keep=True)
            except (ConnectionClosedError, RequestTimeoutError, BrokerError) as exc:
                log.info("broadcast consumer %s: metadata refresh failed (%s)", side.consumer_id, exc)
            await asyncio.sleep(max(side.config.heartbeat_ms, 1000) / 1000)

    async def leave(self) -> None:
        """Nothing to leave: a broadcast member belongs to no group."""
