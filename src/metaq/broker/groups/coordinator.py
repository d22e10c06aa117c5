"""The group coordinator of standalone mode: each broker balances a consumer group's partitions on it.

Partitions are ``brokerId-partition`` (:class:`metaq.types.PartitionId`) in assignments and offsets.
A standalone broker knows only its own partitions, and coordinates every group for those only: a
member joins every broker it was given (docs/consumers.md, "Standalone groups"), each broker assigns
its own partitions among the members that joined it and keeps their committed offsets. So a group
spread over several brokers has no single point of failure: losing a broker stops only its
partitions, and their offsets come back with it. (JoinGroup's ``partitions``, what the member sees on
other brokers, is checked and kept for ``metaq group describe``, not used to balance.) A Kafka group is
the exception (:attr:`Group.whole_cluster`): Kafka clients find one coordinator for a group, and the Kafka
listener reports the broker's own cluster view, so that coordinator balances every broker's partitions.

Balancing: members are keyed by their consumer id (JoinGroup ``client_id``) when it is unique in the
group, else by member id, so that every broker orders the same members the same way. With ``range``
each broker starts its split at member ``broker id mod members``: brokers with one partition each
(or fewer partitions than members) then hand them to different members instead of all to the first.

Protocol (Kafka's classic eager rebalance, with the assignment computed here rather than by a leader)
------------------------------------------------------------------------------------------------------
A group is *Empty* (no members), *PreparingRebalance* or *Stable* at generation ``G``.

* A JoinGroup from a new member, a LeaveGroup, a member whose session timed out, a member that rejoins
  with another subscription, or a change in a subscribed topic's partitions starts a rebalance: the group
  goes to PreparingRebalance and stays at generation ``G``.
* Members of generation ``G`` learn it from their next heartbeat (REBALANCE_IN_PROGRESS). Each one then
  commits its offsets (commits with generation ``G`` are still accepted while preparing), stops
  consuming — gives up every partition — and sends JoinGroup again. That JoinGroup waits.
* The rebalance completes when every current member is waiting in JoinGroup, or at the rebalance
  deadline (the largest ``rebalance_timeout_ms`` of the members, counted from the start), when members
  that have not rejoined are dropped. Members that stop heartbeating before rejoining are dropped when
  their session times out. Only then is the generation bumped to ``G + 1`` and the assignment computed,
  by :func:`metaq.cluster.assignment.assign_topics`, over exactly the members that rejoined; every
  waiting JoinGroup is answered with the new generation and that member's share.

Invariant (asserted on every completion, checkable with :meth:`GroupCoordinator.check_invariants`):
within a generation every partition of every subscribed topic is owned by exactly one member of that
generation, and every member of it rejoined after giving up what it owned before — so no partition ever
has two owners that both believe they are current. A member that was dropped (session or rebalance
timeout) is fenced: its commits answer UNKNOWN_MEMBER_ID, and a commit with a generation other than the
group's answers ILLEGAL_GENERATION; commits for a partition the member does not own in the generation
are refused per partition.

Group membership is in memory only: after a broker restart members find themselves unknown and rejoin.
Committed offsets: :mod:`.offsets` (this class's OffsetCommit and OffsetFetch), over the offsets store
(:mod:`metaq.broker.offsets_store`).

Wiring (the broker)::

    self.groups = GroupCoordinator(self.partition_refs, config.data_path,   # Broker.__init__
                                   broker_id=config.broker_id)
    # requests JoinGroup ... DescribeGroup reach the methods below through metaq.broker.handlers.groups
    self.groups.open()                                    # Broker.open: loads committed offsets
    await self.groups.close()                             # Broker.drain, first: answers waiting joins

The session timer starts with the first JoinGroup (or :meth:`GroupCoordinator.start`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import Counter
from pathlib import Path

from metaq.broker.groups.offsets import OffsetCommits
from metaq.broker.groups.state import (
    DEFAULT_TICK_MS,
    EMPTY,
    GROUPS_MAX,
    MEMBERS_PER_GROUP_MAX,
    PREPARING_REBALANCE,
    REBALANCE_TIMEOUT_MAX_MS,
    REPORTED_PARTITIONS_MAX,
    SESSION_TIMEOUT_MAX_MS,
    SESSION_TIMEOUT_MIN_MS,
    STABLE,
    TOPICS_PER_MEMBER_MAX,
    Clock,
    Group,
    Member,
    PartitionsOf,
    _error,
    _monotonic_ms,
    _ref_error_code,
    validate_group,
)
from metaq.broker.offsets_store import OffsetsStore
from metaq.cluster.assignment import STRATEGIES, PartitionRef, assign_topics, check_assignment
from metaq.errors import (
    BrokerError,
    IllegalGenerationError,
    InvalidArgument,
    InvalidRequestError,
    InvalidTopicError,
    NotCoordinatorError,
    RebalanceInProgressError,
    UnknownGroupError,
    UnknownMemberError,
)
from metaq.protocol import messages as m
from metaq.types import BROKER_ID_MAX, PartitionId, TopicPartition, validate_topic
from metaq.wording import plural

log = logging.getLogger("metaq.broker.groups")


class GroupCoordinator(OffsetCommits):
    """Consumer groups of one broker. Every request method is a coroutine taking and returning the
    protocol dataclasses (errors are answered in the response, never raised).

    ``partitions_of(topic)`` returns the topic's partitions on this broker as PartitionIds (or (broker id,
    partition) pairs), [] for an unknown topic; it is called on every rebalance and every tick (it must
    be cheap). ``broker_id`` is this broker's id. ``offsets_dir`` is the directory of the committed
    offsets log (the broker's dataPath), or an OffsetsStore.
    ``clock`` returns monotonic milliseconds: tests inject a fake one, pass ``timer=False`` and drive
    time with :meth:`poll`.
    """

    def __init__(self, partitions_of: PartitionsOf, offsets_dir: str | Path | OffsetsStore, *, broker_id: int = 0,
                 clock: Clock = _monotonic_ms, tick_ms: int = DEFAULT_TICK_MS,
                 session_timeout_min_ms: int = SESSION_TIMEOUT_MIN_MS, timer: bool = True) -> None:
        self.partitions_of = partitions_of
        self.broker_id = broker_id
        self.store = offsets_dir if isinstance(offsets_dir, OffsetsStore) else OffsetsStore(offsets_dir,
                                                                                            broker_id=broker_id)
        self.clock = clock
        self.tick_ms = tick_ms
        self.session_timeout_min_ms = session_timeout_min_ms
        self.timer_enabled = timer
        """False in tests that drive time themselves with :meth:`poll`."""
        self.groups: dict[str, Group] = {}
        self._opened = False
        self._closed = False
        self._timer: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def open(self) -> None:
        """Load committed offsets (blocking). :meth:`start` calls it in a thread if not done yet."""
        if not self._opened:
            self.store.open()
            self._opened = True

    async def start(self) -> None:
        if not self._opened:
            await asyncio.get_running_loop().run_in_executor(None, self.open)
        self._ensure_timer()

    def _ensure_timer(self) -> None:
        if self._timer is None and not self._closed:
            self._timer = asyncio.get_running_loop().create_task(self._run_timer())

    async def close(self) -> None:
        """Answer waiting JoinGroups with NOT_COORDINATOR, stop the timer, close the store. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer
            self._timer = None
        for group in self.groups.values():
            for member in group.members.values():
                self._answer_join(member, _error(m.JoinGroupResponse, NotCoordinatorError(
                    "the broker is shutting down; rejoin when it is back")))
        if self._opened:
            await asyncio.get_running_loop().run_in_executor(None, self.store.close)

    async def _run_timer(self) -> None:
        while True:
            await asyncio.sleep(self.tick_ms / 1000)
            try:
                self.poll()
            except Exception:  # the timer must outlive a bug in one group's bookkeeping
                log.exception("group coordinator tick failed")

    # -- timers ------------------------------------------------------------------------------------

    def poll(self) -> None:
        """Expire sessions, end rebalances past their deadline, notice partition changes. Idempotent."""
        now = self.clock()
        for group in list(self.groups.values()):
            self._poll_group(group, now)

    def _poll_group(self, group: Group, now: float) -> None:
        expired = [mb for mb in group.members.values()
                   if mb.join is None and now - mb.last_seen_ms > mb.session_timeout_ms]
        for mb in expired:
            log.info("group %s: member %s session expired (%d ms)", group.name, mb.member_id,
                     mb.session_timeout_ms)
            self._remove_member(group, mb, f"member {mb.member_id} session expired")
        if group.state == PREPARING_REBALANCE and now >= group.rebalance_deadline_ms:
            late = [mb for mb in group.members.values() if mb.join is None]
            for mb in late:
                log.info("group %s: member %s did not rejoin within the rebalance timeout", group.name,
                         mb.member_id)
                del group.members[mb.member_id]
            self._maybe_complete(group)
        elif group.state == STABLE and self._partition_snapshot(group) != group.partitions:
            self._begin_rebalance(group, "the partitions of a subscribed topic changed")
        if group.state == EMPTY and not group.members and not self.store.group_offsets(group.name):
            del self.groups[group.name]

    # -- membership --------------------------------------------------------------------------------

    async def join(self, req: m.JoinGroupRequest, *, whole_cluster: bool = False) -> m.JoinGroupResponse:
        """``whole_cluster``: the group is balanced over the other brokers' partitions the members report too
        (:attr:`Group.whole_cluster`); a group takes it from its first member."""
        try:
            group_name = validate_group(req.group)
            topics = self._validate_join(req)
            reported = _reported_partitions(req, topics)
        except BrokerError as exc:
            return _error(m.JoinGroupResponse, exc)
        if self._closed:
            return _error(m.JoinGroupResponse, NotCoordinatorError("the broker is shutting down"))
        if self.timer_enabled:
            self._ensure_timer()
        group = self.groups.get(group_name)
        if req.member_id and (group is None or req.member_id not in group.members):
            return _error(m.JoinGroupResponse, UnknownMemberError(
                f"member {req.member_id!r} is not in group {group_name!r} (its session expired or the broker "
                "restarted); join again with an empty member id"))
        if group is None:
            if len(self.groups) >= GROUPS_MAX:
                return _error(m.JoinGroupResponse, InvalidRequestError(f"this broker already has {GROUPS_MAX} groups"))
            group = self.groups[group_name] = Group(group_name, whole_cluster=whole_cluster)
        if not group.members:
            group.whole_cluster = whole_cluster
        if group.members and req.strategy != group.strategy and set(group.members) != {req.member_id}:
            return _error(m.JoinGroupResponse, InvalidRequestError(
                f"group {group_name!r} balances with strategy {group.strategy!r}; this member asked for "
                f"{req.strategy!r}: every member of a group must use the same strategy"))
        now = self.clock()
        member = group.members.get(req.member_id) if req.member_id else None
        if member is None:
            if len(group.members) >= MEMBERS_PER_GROUP_MAX:
                return _error(m.JoinGroupResponse, InvalidRequestError(
                    f"group {group_name!r} already has {MEMBERS_PER_GROUP_MAX} members"))
            member_id = f"{req.client_id or 'consumer'}-{uuid.uuid4().hex[:16]}"
            member = Member(member_id, req.client_id, topics, req.session_timeout_ms, req.rebalance_timeout_ms, now,
                            reported=reported)
            group.members[member_id] = member
            group.strategy = req.strategy
            reason = f"member {member_id} joined"
        else:
            changed = (member.topics != topics or group.strategy != req.strategy
                       or (group.whole_cluster and member.reported != reported))
            member.client_id = req.client_id
            member.topics = topics
            member.reported = reported
            member.session_timeout_ms = req.session_timeout_ms
            member.rebalance_timeout_ms = req.rebalance_timeout_ms
            member.last_seen_ms = now
            group.strategy = req.strategy
            if group.state == STABLE and not changed:
                # It already belongs to the current generation: hand back what it owns.
                return self._join_response(group, member)
            reason = f"member {member.member_id} rejoined with a new subscription or view" if changed else ""
        if group.state != PREPARING_REBALANCE:
            self._begin_rebalance(group, reason or f"member {member.member_id} rejoined")
        member.assignment = {}  # it gave its partitions up before rejoining
        self._answer_join(member, _error(m.JoinGroupResponse, RebalanceInProgressError(
            "superseded by a newer JoinGroup from the same member")))
        fut: asyncio.Future[m.JoinGroupResponse] = asyncio.get_running_loop().create_future()
        member.join = fut
        self._maybe_complete(group)
        return await fut

    def _validate_join(self, req: m.JoinGroupRequest) -> tuple[str, ...]:
        if req.strategy not in STRATEGIES:
            raise InvalidRequestError(f"unknown assignment strategy {req.strategy!r}; use one of "
                                      f"{', '.join(sorted(STRATEGIES))}")
        if not self.session_timeout_min_ms <= req.session_timeout_ms <= SESSION_TIMEOUT_MAX_MS:
            raise InvalidRequestError(f"session_timeout_ms must be {self.session_timeout_min_ms}.."
                                      f"{SESSION_TIMEOUT_MAX_MS}; got {req.session_timeout_ms}")
        if not req.session_timeout_ms <= req.rebalance_timeout_ms <= REBALANCE_TIMEOUT_MAX_MS:
            raise InvalidRequestError(f"rebalance_timeout_ms must be session_timeout_ms..{REBALANCE_TIMEOUT_MAX_MS}; "
                                      f"got {req.rebalance_timeout_ms}")
        if not req.topics or len(req.topics) > TOPICS_PER_MEMBER_MAX:
            raise InvalidRequestError(
                f"a member subscribes to 1..{TOPICS_PER_MEMBER_MAX} topics; got {len(req.topics)}")
        try:
            return tuple(sorted({validate_topic(t) for t in req.topics}))
        except InvalidArgument as exc:
            raise InvalidTopicError(f"subscription: {exc}") from None

    async def heartbeat(self, req: m.HeartbeatRequest) -> m.HeartbeatResponse:
        try:
            validate_group(req.group)
        except BrokerError as exc:
            return _error(m.HeartbeatResponse, exc)
        group = self.groups.get(req.group)
        member = group.members.get(req.member_id) if group is not None else None
        if group is None or member is None:
            return _error(m.HeartbeatResponse, UnknownMemberError(
                f"member {req.member_id!r} is not in group {req.group!r}; join again"))
        member.last_seen_ms = self.clock()
        if group.state == PREPARING_REBALANCE or member.join is not None:
            return _error(m.HeartbeatResponse, RebalanceInProgressError(
                f"group {group.name!r} is rebalancing ({group.rebalance_reason}); commit, give up your "
                "partitions and join again"))
        if req.generation != group.generation:
            return _error(m.HeartbeatResponse, IllegalGenerationError(
                f"generation {req.generation} is not the group's current generation {group.generation}"))
        return m.HeartbeatResponse()

    async def leave(self, req: m.LeaveGroupRequest) -> m.LeaveGroupResponse:
        try:
            validate_group(req.group)
        except BrokerError as exc:
            return _error(m.LeaveGroupResponse, exc)
        group = self.groups.get(req.group)
        member = group.members.get(req.member_id) if group is not None else None
        if group is None or member is None:
            return _error(m.LeaveGroupResponse, UnknownMemberError(
                f"member {req.member_id!r} is not in group {req.group!r}"))
        self._answer_join(member, _error(m.JoinGroupResponse, UnknownMemberError("the member left the group")))
        self._remove_member(group, member, f"member {member.member_id} left")
        return m.LeaveGroupResponse()

    # -- the state machine -------------------------------------------------------------------------

    def _remove_member(self, group: Group, member: Member, reason: str) -> None:
        del group.members[member.member_id]
        if group.state == PREPARING_REBALANCE:
            self._maybe_complete(group)
        else:
            self._begin_rebalance(group, reason)
            self._maybe_complete(group)

    def _begin_rebalance(self, group: Group, reason: str) -> None:
        log.info("group %s: rebalance from generation %d: %s", group.name, group.generation, reason)
        group.state = PREPARING_REBALANCE
        group.rebalance_reason = reason
        timeout = max((mb.rebalance_timeout_ms for mb in group.members.values()), default=0)
        group.rebalance_deadline_ms = self.clock() + timeout

    def _maybe_complete(self, group: Group) -> None:
        if group.state != PREPARING_REBALANCE:
            return
        if any(mb.join is None for mb in group.members.values()):
            return
        self._complete(group)

    def _complete(self, group: Group) -> None:
        group.generation += 1
        group.rebalances += 1
        group.partitions = self._partition_snapshot(group)
        keys = _balance_keys(group.members)
        subs = {keys[mid]: mb.topics for mid, mb in group.members.items()}
        split_by_key = assign_topics(group.strategy or "range", subs, lambda t: group.partitions.get(t, ()),
                                     first_member=self.broker_id)
        split = {mid: split_by_key[keys[mid]] for mid in group.members}
        now = self.clock()
        for mid, mb in group.members.items():
            mb.assignment = {t: sorted(refs) for t, refs in split[mid].items()}
            mb.last_seen_ms = now
        group.state = STABLE if group.members else EMPTY
        self._assert_invariant(group, split)
        log.info("group %s: generation %d with %s", group.name, group.generation, plural(len(group.members), "member"))
        for mb in group.members.values():
            self._answer_join(mb, self._join_response(group, mb))

    def _partition_snapshot(self, group: Group) -> dict[str, tuple[PartitionRef, ...]]:
        """Every subscribed topic's partitions the group is balanced over: this broker's own, and for a
        whole-cluster group the other brokers' partitions its members report (reports of this broker's own
        id are not trusted: it knows its own)."""
        topics = sorted({t for mb in group.members.values() for t in mb.topics})
        out = {}
        for topic in topics:
            own = set(self._partitions(topic))
            if group.whole_cluster:
                own_brokers = {self.broker_id} | {p.broker_id for p in own}
                own |= {p for mb in group.members.values() for p in mb.reported.get(topic, ())
                        if p.broker_id not in own_brokers}
            out[topic] = tuple(sorted(own))
        return out

    def _assert_invariant(self, group: Group, split: dict[str, dict[str, list[PartitionRef]]]) -> None:
        for topic, refs in group.partitions.items():
            subscribers = [mid for mid, mb in group.members.items() if topic in mb.topics]
            check_assignment({mid: split[mid].get(topic, []) for mid in subscribers}, subscribers, refs)

    def _join_response(self, group: Group, member: Member) -> m.JoinGroupResponse:
        return m.JoinGroupResponse(
            generation=group.generation, member_id=member.member_id, members=sorted(group.members),
            assignment=_assignment(member))

    @staticmethod
    def _answer_join(member: Member, response: m.JoinGroupResponse) -> None:
        fut, member.join = member.join, None
        if fut is not None and not fut.done():
            fut.set_result(response)

    def check_invariants(self) -> None:
        """AssertionError unless every Stable group's generation gives each partition exactly one owner."""
        for group in self.groups.values():
            if group.state != STABLE:
                continue
            assert group.members, f"group {group.name} is Stable with no members"
            for topic, refs in group.partitions.items():
                subscribers = [mid for mid, mb in group.members.items() if topic in mb.topics]
                owned = {mid: group.members[mid].assignment.get(topic, []) for mid in subscribers}
                check_assignment(owned, subscribers, refs)

    def owners(self, group_name: str) -> dict[TopicPartition, str]:
        """topic-partition -> member id in the group's current generation."""
        group = self.groups.get(group_name)
        if group is None:
            return {}
        return {TopicPartition(t, p): mid for mid, mb in group.members.items() for t, ps in mb.assignment.items()
                for p in ps}

    # -- this broker's partitions ------------------------------------------------------------------

    def _partitions(self, topic: str) -> list[PartitionId]:
        """This broker's partitions of ``topic`` ([] for an unknown or deleted topic)."""
        try:
            refs = self.partitions_of(topic)
        except Exception:  # an unknown or deleted topic has no partitions
            return []
        return [r if isinstance(r, PartitionId) else PartitionId(*r) for r in refs]

    # -- admin -------------------------------------------------------------------------------------

    async def list_groups(self, req: m.ListGroupsRequest) -> m.ListGroupsResponse:
        names = {g.name for g in self.groups.values() if g.members} | set(self.store.groups())
        return m.ListGroupsResponse(groups=sorted(names))

    async def describe_group(self, req: m.DescribeGroupRequest) -> m.DescribeGroupResponse:
        try:
            validate_group(req.group)
        except BrokerError as exc:
            return _error(m.DescribeGroupResponse, exc)
        group = self.groups.get(req.group)
        if group is None:
            if req.group in self.store.groups():
                return m.DescribeGroupResponse(state=EMPTY)
            return _error(m.DescribeGroupResponse, UnknownGroupError(
                f"no group {req.group!r} on this broker (no members, no committed offsets)"))
        members = [m.GroupMember(mb.member_id, mb.client_id, "", _assignment(mb))
                   for mb in sorted(group.members.values(), key=lambda x: x.member_id)]
        return m.DescribeGroupResponse(state=group.state, generation=group.generation, strategy=group.strategy,
                                       members=members)


def _balance_keys(members: dict[str, Member]) -> dict[str, str]:
    """member id -> the name it is balanced under: its consumer id when no other member of the group has
    it (every broker then orders the members alike), else its member id."""
    seen = Counter(mb.client_id for mb in members.values())
    return {mid: mb.client_id if mb.client_id and seen[mb.client_id] == 1 and mb.client_id not in members else mid
            for mid, mb in members.items()}


def _assignment(member: Member) -> list[m.TopicAssignment]:
    return [m.TopicAssignment(t, [m.BrokerPartition(p.broker_id, p.partition) for p in ps])
            for t, ps in sorted(member.assignment.items())]


def _reported_partitions(req: m.JoinGroupRequest, topics: tuple[str, ...]) -> dict[str, tuple[PartitionId, ...]]:
    """JoinGroup's ``partitions``: topic -> the member's view; topics it does not subscribe are ignored."""
    if sum(len(ta.partitions) for ta in req.partitions) > REPORTED_PARTITIONS_MAX:
        raise InvalidRequestError(f"a JoinGroup reports at most {REPORTED_PARTITIONS_MAX} partitions")
    out: dict[str, set[PartitionId]] = {}
    for ta in req.partitions:
        if ta.topic not in topics:
            continue
        for bp in ta.partitions:
            if _ref_error_code(ta.topic, bp.broker_id, bp.partition):
                raise InvalidRequestError(f"JoinGroup reports partition {bp.broker_id}-{bp.partition} of topic "
                                          f"{ta.topic!r}: not brokerId-partition (broker id 0..{BROKER_ID_MAX})")
            out.setdefault(ta.topic, set()).add(PartitionId(bp.broker_id, bp.partition))
    return {t: tuple(sorted(ps)) for t, ps in sorted(out.items())}


