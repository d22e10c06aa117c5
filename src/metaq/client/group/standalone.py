"""Standalone mode's memberships: a group coordinated by the brokers, and broadcast.

* :class:`BrokerMembership`: every standalone broker coordinates the group for its own partitions. The
  member joins each server it was given (a :class:`BrokerSession` per server: JoinGroup, waiting for
  the rebalance to complete; heartbeats; LeaveGroup), consumes what each broker assigns of its own
  partitions, and commits each partition's offsets to its own broker, fenced by that broker's
  generation. A rebalance on one broker gives up (committing first) only that broker's partitions. A
  broker that dies takes only its partitions with it: after a session timeout without heartbeats the
  member gives them up without committing (the broker is gone, or has given them to others), and when
  the broker is back the member joins it again and resumes them from the offsets that broker kept, at
  most one commit period behind. No broker is a single point of failure.
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
from metaq.net.servers import Address, format_address
from metaq.protocol import messages as m
from metaq.types import PartitionId, TopicPartition

log = logging.getLogger("metaq.client.group")

_JOIN_ERRORS = (RebalanceInProgressError, NotCoordinatorError, ConnectionClosedError, RequestTimeoutError)
_UNREACHABLE = (ConnectionClosedError, RequestTimeoutError, NotCoordinatorError)


class BrokerSession:
    """This member in the group as one broker coordinates it: its member id, generation and partitions there."""

    def __init__(self, membership: BrokerMembership, address: Address) -> None:
        self.membership = membership
        self.address = address
        self.broker_id = -1
        """The broker at ``address`` (known once it answered)."""
        self.member_id = ""
        self.generation = m.NO_GENERATION
        self.owned: list[TopicPartition] = []
        self.stable = False
        """Holds a current assignment of this broker's partitions."""
        self.down = False
        """Cannot reach the broker (it is not consuming anything of it): the consumer is not waiting on it."""

    async def request(self, request: Any, timeout_s: float | None = None) -> Any:
        conn = await self.membership.core.connection_at(self.address, self.membership.channel)
        self.broker_id = conn.broker_id
        return await conn.request(request, timeout_s)

    async def run(self) -> None:
        membership = self.membership
        side = membership.side
        cfg = side.config
        backoff = ERROR_RETRY.start()
        while not side.closed:
            req = m.JoinGroupRequest(cfg.group, self.member_id, side.consumer_id, cfg.session_timeout_ms,
                                     cfg.rebalance_timeout_ms, sorted(side.subscriptions), cfg.load_balance_strategy)
            try:
                resp: m.JoinGroupResponse = await self.request(
                    req, cfg.rebalance_timeout_ms / 1000 + membership.core.config.request_timeout_s)
            except UnknownMemberError:
                self.member_id = ""
                continue
            except _JOIN_ERRORS as exc:
                if not self.down:
                    log.info("group %s: cannot join at %s (%s); retrying", cfg.group, format_address(self.address),
                             exc)
                self.down = isinstance(exc, ConnectionClosedError | RequestTimeoutError)
                membership.settle()
                await asyncio.sleep(backoff.next_delay_unbounded_s())
                continue
            backoff.reset()
            self.down = False
            self.member_id, self.generation = resp.member_id, resp.generation
            owned = [TopicPartition(a.topic, PartitionId(p.broker_id, p.partition)) for a in resp.assignment
                     for p in a.partitions if p.broker_id == self.broker_id]
            log.info("group %s: member %s generation %d of broker %d owns %d partitions", cfg.group, self.member_id,
                     self.generation, self.broker_id, len(owned))
            self.owned = owned
            try:
                await side.start_partitions(owned)
            except MetaqError as exc:
                log.warning("group %s: cannot start consuming broker %d's assignment (%s); rejoining", cfg.group,
                            self.broker_id, exc)
                await self._give_up(commit=False)
                await asyncio.sleep(backoff.next_delay_unbounded_s())
                continue
            self.stable = True
            membership.settle()
            await self._heartbeat_until_rebalance()

    async def _give_up(self, commit: bool) -> None:
        """Stop consuming this broker's partitions (a listener call in progress finishes), commit if asked."""
        self.stable = False
        self.membership.side.assigned.clear()
        owned, self.owned = self.owned, []
        if owned:
            await asyncio.shield(self.membership.side.stop_partitions(owned, commit))

    async def _heartbeat_until_rebalance(self) -> None:
        side = self.membership.side
        cfg = side.config
        last_ok = time.monotonic()
        while not side.closed:
            await asyncio.sleep(cfg.heartbeat_ms / 1000)
            try:
                await self.request(m.HeartbeatRequest(cfg.group, self.generation, self.member_id))
            except (RebalanceInProgressError, IllegalGenerationError) as exc:
                log.info("group %s: broker %d rebalances (%s): committing and giving its partitions up", cfg.group,
                         self.broker_id, exc.name)
                await self._give_up(commit=True)
                return
            except UnknownMemberError:
                log.warning("group %s: member %s was dropped by broker %d (session timeout, or a restart)", cfg.group,
                            self.member_id, self.broker_id)
                await self._give_up(commit=False)
                self.member_id = ""
                return
            except _UNREACHABLE as exc:
                if time.monotonic() - last_ok > cfg.session_timeout_ms / 1000:
                    # Safe mode: the broker has dropped us by now (or is gone): its partitions are not ours.
                    log.warning("group %s: no heartbeat to broker %d for a session timeout (%s); giving its "
                                "partitions up", cfg.group, self.broker_id, exc)
                    await self._give_up(commit=False)
                    self.down = True
                    self.member_id = ""
                    self.membership.settle()
                    return
                continue
            last_ok = time.monotonic()

    async def leave(self) -> None:
        if self.member_id and not self.down:
            with contextlib.suppress(MetaqError):
                await self.request(m.LeaveGroupRequest(self.membership.side.config.group, self.member_id))
        self.member_id = ""
        conn = self.membership.core.pool.cached(self.address, self.membership.channel)
        if conn is not None:
            conn.close()


class BrokerMembership(Membership):
    """Standalone mode: one :class:`BrokerSession` per server (see the module docstring).

    ``channel`` names the connections the group's requests share (one per broker; the consumer's
    MultiFetches to that broker use it too).
    """

    def __init__(self, side: GroupSide, core: ClientCore, channel: str) -> None:
        self.side = side
        self.core = core
        self.channel = channel
        self.sessions = [BrokerSession(self, address) for address in core.servers]

    def session_of(self, broker_id: int) -> BrokerSession | None:
        return next((s for s in self.sessions if s.broker_id == broker_id), None)

    @property
    def generations(self) -> dict[int, int]:
        """broker id -> the group's generation there, for the brokers where this member holds an assignment."""
        return {s.broker_id: s.generation for s in self.sessions if s.stable}

    @property
    def generation(self) -> int:
        """The generation at the lowest broker id where this member holds an assignment (-1: none)."""
        stable = sorted((s.broker_id, s.generation) for s in self.sessions if s.stable)
        return stable[0][1] if stable else m.NO_GENERATION

    @property
    def member_id(self) -> str:
        """The member id the lowest broker with an assignment gave this member ('' if none)."""
        stable = sorted((s.broker_id, s.member_id) for s in self.sessions if s.stable)
        return stable[0][1] if stable else ""

    def settle(self) -> None:
        """``side.assigned`` is set once every broker's session holds an assignment or cannot reach its broker."""
        if all(s.stable or s.down for s in self.sessions):
            self.side.assigned.set()

    def fence(self, broker_id: int) -> tuple[int, str]:
        """(generation, member id) a commit of ``broker_id``'s partitions carries (the broker refuses a stale one)."""
        session = self.session_of(broker_id)
        if session is None:
            return m.NO_GENERATION, ""
        return session.generation, session.member_id

    async def request_to(self, broker_id: int, request: Any) -> Any:
        """A request to ``broker_id`` over the group's connection to it (offsets of its partitions)."""
        session = self.session_of(broker_id)
        if session is not None:
            return await session.request(request)
        return await (await self.core.connection(broker_id, self.channel)).request(request)

    async def run(self) -> None:
        tasks = [asyncio.ensure_future(s.run()) for s in self.sessions]
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t

    async def leave(self) -> None:
        """LeaveGroup to every broker, then their connections close."""
        await asyncio.gather(*(s.leave() for s in self.sessions), return_exceptions=True)


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
