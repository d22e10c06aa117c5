"""The committed offsets half of the group coordinator: OffsetCommit, checked against the generation, and
OffsetFetch.

A commit of a member is accepted only within its group's current generation, and per partition only for
what the member owns in it (:mod:`.coordinator` explains the fencing).

Offsets committed with generation -1 (``NO_GENERATION``) are accepted only while the group has no
members: that is how ``metaq group reset`` (MetaQ's 回溯), consumers that never join (broadcast members
using the broker store commit under their own per-member group name), and tools write offsets. Such a
commit may carry offset -1 to forget a partition's position.

Durability: a commit is answered after the offsets store fsynced it (:mod:`metaq.broker.offsets_store`).
"""

from __future__ import annotations

import logging

from metaq.broker.error_mapping import wire_error
from metaq.broker.groups.state import (
    Clock,
    Group,
    Member,
    _error,
    _ref_error_code,
    validate_group,
)
from metaq.broker.offsets_store import OffsetsStore
from metaq.errors import (
    BrokerError,
    IllegalGenerationError,
    InvalidArgument,
    InvalidRequestError,
    InvalidTopicError,
    RebalanceInProgressError,
    UnknownMemberError,
    UnknownPartitionError,
    UnknownTopicError,
)
from metaq.protocol import messages as m
from metaq.types import BROKER_ID_MAX, PartitionId, validate_topic

log = logging.getLogger("metaq.broker.groups")


METADATA_CHARS_MAX = 4096
REFUSALS_SHOWN_MAX = 5
"""Refused offsets an OffsetCommit's error message names one by one (the codes are per entry)."""


class OffsetCommits:
    """OffsetCommit and OffsetFetch: a mixin of :class:`~metaq.broker.groups.coordinator.GroupCoordinator`,
    whose attributes below are."""

    groups: dict[str, Group]
    store: OffsetsStore
    clock: Clock
    broker_id: int

    def _partitions(self, topic: str) -> list[PartitionId]:
        raise NotImplementedError  # the coordinator's

    async def commit_offsets(self, req: m.OffsetCommitRequest) -> m.OffsetCommitResponse:
        try:
            group_name = validate_group(req.group)
        except BrokerError as exc:
            return _error(m.OffsetCommitResponse, exc)
        group = self.groups.get(group_name)
        member: Member | None = None
        if req.generation == m.NO_GENERATION:
            if group is not None and group.members:
                return _error(m.OffsetCommitResponse, IllegalGenerationError(
                    f"group {group_name!r} has {len(group.members)} active members: a commit with generation -1 "
                    "(admin reset, broadcast, standalone) is accepted only while no member is active; stop the "
                    "group's consumers first"))
        else:
            member = group.members.get(req.member_id) if group is not None else None
            if group is None or member is None:
                return _error(m.OffsetCommitResponse, UnknownMemberError(
                    f"member {req.member_id!r} is not in group {group_name!r} (session expired, left, or the broker "
                    "restarted): its partitions may belong to another member now; join again"))
            if req.generation != group.generation:
                return _error(m.OffsetCommitResponse, IllegalGenerationError(
                    f"generation {req.generation} is not group {group_name!r}'s current generation "
                    f"{group.generation}; join again"))
            if member.join is not None:
                return _error(m.OffsetCommitResponse, RebalanceInProgressError(
                    "the member already rejoined and gave its partitions up; commit before rejoining"))
            member.last_seen_ms = self.clock()
        results: list[m.OffsetEntry] = []
        accepted: list[tuple[str, PartitionId, int, str | None]] = []
        refusals: list[str] = []
        existing: dict[str, set[PartitionId]] = {}
        for e in req.offsets:
            refusal = self._check_commit_entry(e, member, req.generation, existing)
            if refusal is None:
                accepted.append((e.topic, PartitionId(e.broker_id, e.partition), e.offset, e.metadata))
                results.append(m.OffsetEntry(e.topic, e.broker_id, e.partition, e.offset, e.metadata, 0))
            else:
                refusals.append(f"{_shown(e.topic)}:{e.broker_id}-{e.partition}: {refusal.name} ({refusal.message})")
                results.append(m.OffsetEntry(e.topic, e.broker_id, e.partition, e.offset, e.metadata, refusal.code))
        try:
            await self.store.commit(group_name, accepted)
        except Exception as exc:  # a full disk or a failed fsync: the offsets are not committed
            log.error("group %s: cannot store offsets: %s", group_name, exc)
            code, message = wire_error(exc, "OffsetCommit")
            return m.OffsetCommitResponse(error_code=code, error_message=f"offsets not committed: {message}")
        msg = None
        if refusals:
            shown = "; ".join(refusals[:REFUSALS_SHOWN_MAX])
            more = f"; and {len(refusals) - REFUSALS_SHOWN_MAX} more" if len(refusals) > REFUSALS_SHOWN_MAX else ""
            msg = f"{len(refusals)} of {len(req.offsets)} offsets refused: {shown}{more}"
        return m.OffsetCommitResponse(error_message=msg, results=results)

    def _check_commit_entry(self, e: m.OffsetEntry, member: Member | None, generation: int,
                            existing: dict[str, set[PartitionId]]) -> BrokerError | None:
        """Why one committed offset is refused, or None. ``existing`` caches partitions per topic."""
        try:
            validate_topic(e.topic)
        except InvalidArgument as exc:
            return InvalidTopicError(str(exc))
        if _ref_error_code(e.topic, e.broker_id, e.partition):
            return UnknownPartitionError(f"partition must be brokerId-partition with a broker id 0..{BROKER_ID_MAX} "
                                         f"and a partition >= 0; got {e.broker_id}-{e.partition}")
        pid = PartitionId(e.broker_id, e.partition)
        if member is not None and pid not in member.assignment.get(e.topic, ()):
            return IllegalGenerationError(f"not owned by member {member.member_id} in generation {generation}")
        if e.offset < (-1 if member is None else 0):
            return InvalidRequestError(f"offset must be >= {-1 if member is None else 0}; got {e.offset}")
        if e.metadata and len(e.metadata) > METADATA_CHARS_MAX:
            return InvalidRequestError(f"metadata has {len(e.metadata)} characters; at most {METADATA_CHARS_MAX}")
        if member is None and e.offset >= 0 and e.broker_id == self.broker_id:
            # Outside a generation nothing vouches for the partition: one of this broker's must exist
            # here. Another broker's partition cannot be checked by a standalone broker; it is stored as
            # given. Forgetting (offset -1) is allowed for any partition, so entries of deleted topics
            # can be removed.
            parts = existing.get(e.topic)
            if parts is None:
                parts = existing[e.topic] = set(self._partitions(e.topic))
            if not parts:
                return UnknownTopicError(f"no topic {e.topic!r} on broker {self.broker_id}")
            if pid not in parts:
                return UnknownPartitionError(f"topic {e.topic!r} has partitions {min(parts)}..{max(parts)} "
                                             f"on broker {self.broker_id}")
        return None

    async def fetch_offsets(self, req: m.OffsetFetchRequest) -> m.OffsetFetchResponse:
        try:
            group_name = validate_group(req.group)
        except BrokerError as exc:
            return _error(m.OffsetFetchResponse, exc)
        if req.partitions is None:
            offs = self.store.group_offsets(group_name)
            return m.OffsetFetchResponse(offsets=[m.OffsetEntry(t, p.broker_id, p.partition, c.offset, c.metadata)
                                                  for (t, p), c in sorted(offs.items())])
        out = []
        for ref in req.partitions:
            code = _ref_error_code(ref.topic, ref.broker_id, ref.partition)
            c = self.store.get(group_name, ref.topic, PartitionId(ref.broker_id, ref.partition)) if code == 0 else None
            out.append(m.OffsetEntry(ref.topic, ref.broker_id, ref.partition, c.offset if c else -1,
                                     c.metadata if c else None, code))
        refused = sum(1 for o in out if o.error_code)
        msg = (f"{refused} of {len(out)} partitions refused: invalid topic name, or not brokerId-partition"
               if refused else None)
        return m.OffsetFetchResponse(error_message=msg, offsets=out)


def _shown(topic: str, limit: int = 40) -> str:
    """A topic name as an error message may quote it (a refused name may be 32 KB of anything)."""
    text = repr(topic)
    return text if len(text) <= limit else text[:limit - 4] + "...'"
