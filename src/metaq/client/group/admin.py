"""``metaq group list|describe|reset`` as plain functions (the CLI prints what they return).

``reset`` is MetaQ's 回溯 (rewinding a group): it writes offsets with generation -1, which the broker
accepts only while the group has no active member — stop the group's consumers first.

Every call goes to the group's coordinator: with several servers, the broker with the lowest id among
them (the one the group's consumers use). Partitions are ``brokerId-partition``.

Cluster mode (a session with ``zk_connect``): groups live in ZooKeeper (MetaQ's layout), so these read
``consumers/<group>/ids``, ``owners`` and ``offsets`` through the session's registry, ask each
partition's broker for its log range, and ``reset`` writes the ZooKeeper offsets — refused while the
group has a registered member, whose next commit would overwrite the reset.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from metaq.client.consumer import offsets_of
from metaq.client.core import ClientCore
from metaq.client.group.offsets import BrokerOffsetStorage, OffsetStorage, ZooKeeperOffsetStorage
from metaq.cluster.registry import GroupRegistry
from metaq.errors import ConnectionClosedError, IllegalGenerationError, InvalidArgument, UnknownGroupError
from metaq.protocol import messages as m
from metaq.types import PartitionId, PartitionKey, TopicPartition, validate_topic


@dataclass(frozen=True, slots=True)
class PartitionLag:
    topic: str
    partition: PartitionId
    owner: str
    """Member id that owns it in the current generation ('' = nobody: the group is empty or rebalancing)."""
    committed: int
    """-1 = nothing committed yet."""
    log_start: int
    log_end: int

    @property
    def lag(self) -> int:
        """Messages not yet consumed: from the committed offset (or the log start) to the log end."""
        return max(0, self.log_end - max(self.committed, self.log_start))


@dataclass(frozen=True, slots=True)
class MemberDescription:
    member_id: str
    client_id: str
    assignment: dict[str, list[PartitionId]]


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group: str
    state: str
    generation: int
    strategy: str
    members: list[MemberDescription]
    partitions: list[PartitionLag] = field(default_factory=list)

    @property
    def total_lag(self) -> int:
        return sum(p.lag for p in self.partitions)

    def as_dict(self) -> dict[str, Any]:
        return {"group": self.group, "state": self.state, "generation": self.generation, "strategy": self.strategy,
                "members": [{"member_id": mb.member_id, "client_id": mb.client_id,
                             "assignment": {t: [str(p) for p in ps] for t, ps in mb.assignment.items()}}
                            for mb in self.members],
                "partitions": [{"topic": p.topic, "partition": str(p.partition), "owner": p.owner,
                                "committed": p.committed, "log_start": p.log_start, "log_end": p.log_end,
                                "lag": p.lag} for p in self.partitions],
                "total_lag": self.total_lag}


def _core(session: Any) -> ClientCore:
    core = session._core if hasattr(session, "_core") else session
    if not isinstance(core, ClientCore):
        raise InvalidArgument(f"expected a MessageSessionFactory, not {session!r}")
    return core


async def _coordinated(core: ClientCore, request: Any) -> Any:
    """One request to the group coordinator (never to another broker the default connection failed over to)."""
    coordinator = await core.coordinator()
    conn = await core.connection(coordinator)
    if coordinator is not None and conn.broker_id != coordinator:
        raise ConnectionClosedError(f"broker {coordinator}, the groups' coordinator, cannot be reached")
    return await conn.request(request)


async def list_groups(session: Any) -> list[str]:
    """Groups with members or committed offsets on the coordinating broker (cluster mode: in ZooKeeper)."""
    core = _core(session)
    if core.registry is not None:
        return await asyncio.to_thread(core.registry.groups)
    resp: m.ListGroupsResponse = await _coordinated(_core(session), m.ListGroupsRequest())
    return list(resp.groups)


async def describe_group(session: Any, group: str, topics: list[str] | None = None) -> GroupDescription:
    """Members, their assignment, and per partition: owner, committed offset, log range and lag.

    ``topics``: the topics to report lag for (default: those the members subscribe to and those the
    group has offsets for). UnknownGroupError if the broker knows nothing of the group.
    """
    core = _core(session)
    if core.registry is not None:
        return await _describe_from_registry(core, core.registry, group, topics)
    desc: m.DescribeGroupResponse = await _coordinated(core, m.DescribeGroupRequest(group))
    committed: m.OffsetFetchResponse = await _coordinated(core, m.OffsetFetchRequest(group, None))
    offsets = {TopicPartition(e.topic, PartitionId(e.broker_id, e.partition)): e.offset for e in committed.offsets}
    owners = {TopicPartition(ta.topic, PartitionId(p.broker_id, p.partition)): mb.member_id
              for mb in desc.members for ta in mb.assignment for p in ta.partitions}
    wanted = set(topics or ()) or ({tp.topic for tp in owners} | {tp.topic for tp in offsets})
    rows: list[PartitionLag] = []
    for topic in sorted(wanted):
        tm = await core.metadata.refresh_topic(topic)
        for p in tm.partitions:
            start, end = await offsets_of(core, topic, p)
            tp = TopicPartition(topic, p.id)
            rows.append(PartitionLag(topic, p.id, owners.get(tp, ""), offsets.get(tp, -1), start, end))
    members = [MemberDescription(mb.member_id, mb.client_id,
                                 {ta.topic: [PartitionId(p.broker_id, p.partition) for p in ta.partitions]
                                  for ta in mb.assignment})
               for mb in desc.members]
    return GroupDescription(group, desc.state, desc.generation, desc.strategy, members, rows)


def _read_group(registry: Any, group: str, topics: list[str] | None) -> tuple[
        dict[str, list[str]], dict[TopicPartition, str], dict[TopicPartition, int], list[str]]:
    """members, owners, committed offsets and the topics to report, from ZooKeeper (blocking)."""
    members = registry.members(group)
    subscribed = {t for ts in members.values() for t in ts}
    wanted = sorted(set(topics or ()) or (subscribed | set(registry.group_topics(group))))
    owners = {TopicPartition(t, p): o for t in wanted for p, o in registry.owners(group, t).items()}
    offsets = {TopicPartition(t, p): off for t in wanted for p, off in registry.offsets(group, t).items()}
    return members, owners, offsets, wanted


async def _describe_from_registry(core: ClientCore, registry: Any, group: str,
                                  topics: list[str] | None) -> GroupDescription:
    if group not in await asyncio.to_thread(registry.groups):
        raise UnknownGroupError(f"group {group!r} has no node in ZooKeeper under {registry.paths.root}")
    members, owners, offsets, wanted = await asyncio.to_thread(_read_group, registry, group, topics)
    rows: list[PartitionLag] = []
    for topic in wanted:
        tm = await core.metadata.refresh_topic(topic)
        for p in tm.partitions:
            start, end = await offsets_of(core, topic, p)
            tp = TopicPartition(topic, p.id)
            rows.append(PartitionLag(topic, p.id, owners.get(tp, ""), offsets.get(tp, -1), start, end))
    described = []
    for member_id, member_topics in sorted(members.items()):
        owned = {t: sorted(tp.partition for tp, o in owners.items() if o == member_id and tp.topic == t)
                 for t in member_topics}
        described.append(MemberDescription(member_id, member_id, owned))
    subscribed = {t for ts in members.values() for t in ts}
    unowned = [r for r in rows if r.topic in subscribed and not r.owner]
    state = "Empty" if not members else ("Rebalancing" if unowned else "Stable")
    return GroupDescription(group, state, m.NO_GENERATION, "zookeeper", described, rows)


async def _refuse_with_members(registry: GroupRegistry, group: str) -> None:
    members = await asyncio.to_thread(registry.members, group)
    if members:
        raise IllegalGenerationError(f"group {group!r} has {len(members)} registered member(s) in ZooKeeper "
                                     f"({', '.join(sorted(members))}); stop its consumers before resetting offsets")


async def reset_offsets(session: Any, group: str, topic: str, to: str | int = "earliest", *,
                        timestamp_ms: int | None = None, partitions: list[PartitionKey] | None = None,
                        storage: OffsetStorage | None = None,
                        dry_run: bool = False) -> dict[PartitionId, tuple[int, int]]:
    """Move a group's offsets for ``topic``: to ``"earliest"``, ``"latest"``, an offset (int), or the first
    message at or after ``timestamp_ms``. ``partitions``: PartitionIds, ``"b-p"`` or unambiguous numbers
    (default: all). Returns partition -> (old committed, new). The broker refuses (ILLEGAL_GENERATION)
    while the group has active members. ``storage``: another OffsetStorage to reset (file/SQL stores are
    not checked for active members).
    """
    core = _core(session)
    validate_topic(topic)
    if timestamp_ms is not None and timestamp_ms < 0:
        raise InvalidArgument(f"timestamp_ms must be >= 0, not {timestamp_ms}")
    if timestamp_ms is None and not (to in ("earliest", "latest") or (isinstance(to, int) and to >= 0)):
        raise InvalidArgument(f"reset to 'earliest', 'latest', an offset >= 0 or timestamp_ms=...; not {to!r}")
    tm = await core.metadata.refresh_topic(topic)
    if not tm.partitions:
        raise InvalidArgument(f"topic {topic!r} has no partitions (does it exist?)")
    if partitions is None:
        chosen = list(tm.partitions)
    else:
        chosen = []
        for key in partitions:
            found = tm.find(key)
            if found is None:
                raise InvalidArgument(f"topic {topic!r} has partitions {[str(p) for p in tm.partitions]}; "
                                      f"asked for {key}")
            if found not in chosen:
                chosen.append(found)
    if storage is None and core.registry is not None:
        await _refuse_with_members(core.registry, group)
        storage = ZooKeeperOffsetStorage(core.registry)
    if storage is None:
        broker_storage = BrokerOffsetStorage()
        broker_storage.bind(lambda request: _coordinated(core, request))
        storage = broker_storage
    old = await storage.load(group, [TopicPartition(topic, p.id) for p in chosen])
    new: dict[TopicPartition, int] = {}
    for p in chosen:
        start, end = await offsets_of(core, topic, p)
        if timestamp_ms is not None:
            lo: m.ListOffsetsResponse = await core.request(m.ListOffsetsRequest(topic, p.partition, timestamp_ms),
                                                           p.broker_id)
            target = lo.offset
        elif to == "earliest":
            target = start
        elif to == "latest":
            target = end
        else:
            assert isinstance(to, int)
            target = min(max(to, start), end)  # clamp into the stored range
        new[TopicPartition(topic, p.id)] = target
    if not dry_run:
        if core.registry is not None and isinstance(storage, ZooKeeperOffsetStorage):
            await _refuse_with_members(core.registry, group)  # again: one may have joined meanwhile
        await storage.commit(group, new)
    return {tp.partition: (old.get(tp, -1), off) for tp, off in sorted(new.items())}
