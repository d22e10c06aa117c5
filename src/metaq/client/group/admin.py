"""``metaq group list|describe|reset`` as plain functions (the CLI prints what they return).

``reset`` is MetaQ's 回溯 (rewinding a group): it writes offsets with generation -1, which the broker
accepts only while the group has no active member — stop the group's consumers first.

Standalone mode: each broker coordinates the group for its own partitions and keeps their offsets, so
``list`` and ``describe`` ask every server and merge the answers (a member is one consumer id, with a
member id on each broker), and ``reset`` writes each partition's offset to its own broker. A broker that
does not answer is named in :attr:`GroupDescription.unreachable`. Partitions are ``brokerId-partition``.

Cluster mode (a session with ``zk_connect``): groups live in ZooKeeper (MetaQ's layout), so these read
``consumers/<group>/ids``, ``owners`` and ``offsets`` through the session's registry, ask each
partition's broker for its log range, and ``reset`` writes the ZooKeeper offsets — refused while the
group has a registered member, whose next commit would overwrite the reset.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from metaq.client.core import ClientCore
from metaq.client.fetcher import offsets_of
from metaq.client.group.offsets import BrokerOffsetStorage, OffsetStorage, ZooKeeperOffsetStorage
from metaq.cluster.registry import GroupRegistry
from metaq.errors import (
    ConnectionClosedError,
    IllegalGenerationError,
    InvalidArgument,
    RequestTimeoutError,
    UnknownGroupError,
)
from metaq.net.servers import format_address
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
    """Its member id at the lowest broker id (standalone mode: each broker gives its own: ``member_ids``)."""
    client_id: str
    assignment: dict[str, list[PartitionId]]
    member_ids: dict[int, str] = field(default_factory=dict)
    """Standalone mode: broker id -> the member id that broker gave it."""


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group: str
    state: str
    """Standalone mode over several brokers: Stable when every broker's part is; else the first that is not."""
    generation: int
    """Standalone mode: the generation at the lowest broker id (``generations`` has each broker's)."""
    strategy: str
    members: list[MemberDescription]
    partitions: list[PartitionLag] = field(default_factory=list)
    generations: dict[int, int] = field(default_factory=dict)
    unreachable: list[str] = field(default_factory=list)
    """Servers that did not answer (their members, partitions' owners and offsets are missing here)."""

    @property
    def total_lag(self) -> int:
        return sum(p.lag for p in self.partitions)

    def as_dict(self) -> dict[str, Any]:
        return {"group": self.group, "state": self.state, "generation": self.generation, "strategy": self.strategy,
                "generations": {str(b): g for b, g in sorted(self.generations.items())},
                "unreachable": self.unreachable,
                "members": [{"member_id": mb.member_id, "client_id": mb.client_id,
                             "member_ids": {str(b): mid for b, mid in sorted(mb.member_ids.items())},
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


async def _every_server(core: ClientCore, request: Any) -> tuple[list[tuple[int, Any]], list[str]]:
    """``request`` to every server, each at its own address: (broker id, response) of those that answered
    (UnknownGroupError in place of the response of a broker that knows nothing of the group; any other
    error of a broker is raised), and the servers that could not be reached."""
    async def ask(address: Any) -> tuple[int, Any]:
        conn = await core.connection_at(address)
        try:
            return conn.broker_id, await conn.request(request)
        except UnknownGroupError as exc:
            return conn.broker_id, exc

    answers = await asyncio.gather(*(ask(a) for a in core.servers), return_exceptions=True)
    got: list[tuple[int, Any]] = []
    unreachable: list[str] = []
    for address, answer in zip(core.servers, answers, strict=True):
        if isinstance(answer, ConnectionClosedError | RequestTimeoutError):
            unreachable.append(f"{format_address(address)} ({answer})")
        elif isinstance(answer, BaseException):
            raise answer
        else:
            got.append(answer)
    if not got:
        raise ConnectionClosedError(f"no server answered: {'; '.join(unreachable)}")
    return sorted(got, key=lambda answer: answer[0]), unreachable


async def list_groups(session: Any) -> list[str]:
    """Groups with members or committed offsets on any broker (cluster mode: in ZooKeeper)."""
    core = _core(session)
    if core.registry is not None:
        return await asyncio.to_thread(core.registry.groups)
    answers, _unreachable = await _every_server(core, m.ListGroupsRequest())
    return sorted({g for _b, resp in answers for g in resp.groups})


async def describe_group(session: Any, group: str, topics: list[str] | None = None) -> GroupDescription:
    """Members, their assignment, and per partition: owner, committed offset, log range and lag.

    ``topics``: the topics to report lag for (default: those the members subscribe to and those the
    group has offsets for). UnknownGroupError if the broker knows nothing of the group.
    """
    core = _core(session)
    if core.registry is not None:
        return await _describe_from_registry(core, core.registry, group, topics)
    described: list[tuple[int, m.DescribeGroupResponse]] = []
    unknown: UnknownGroupError | None = None
    for broker_id, resp in (await _every_server(core, m.DescribeGroupRequest(group)))[0]:
        if isinstance(resp, UnknownGroupError):
            unknown = resp
        else:
            described.append((broker_id, resp))
    if not described:
        assert unknown is not None
        raise unknown
    committed, unreachable = await _every_server(core, m.OffsetFetchRequest(group, None))
    offsets = {TopicPartition(e.topic, PartitionId(e.broker_id, e.partition)): e.offset
               for _b, resp in committed for e in resp.offsets}
    owners = {TopicPartition(ta.topic, PartitionId(p.broker_id, p.partition)): mb.member_id
              for _b, desc in described for mb in desc.members for ta in mb.assignment for p in ta.partitions}
    wanted = set(topics or ()) or ({tp.topic for tp in owners} | {tp.topic for tp in offsets})
    rows: list[PartitionLag] = []
    for topic in sorted(wanted):
        tm = await core.metadata.refresh_topic(topic)
        for p in tm.partitions:
            start, end = await offsets_of(core, topic, p)
            tp = TopicPartition(topic, p.id)
            rows.append(PartitionLag(topic, p.id, owners.get(tp, ""), offsets.get(tp, -1), start, end))
    by_client: dict[str, tuple[dict[int, str], dict[str, list[PartitionId]]]] = {}
    for broker_id, desc in described:
        for mb in desc.members:
            ids, assignment = by_client.setdefault(mb.client_id or mb.member_id, ({}, {}))
            ids[broker_id] = mb.member_id
            for ta in mb.assignment:
                assignment.setdefault(ta.topic, []).extend(PartitionId(p.broker_id, p.partition)
                                                           for p in ta.partitions)
    members = [MemberDescription(ids[min(ids)], client, {t: sorted(ps) for t, ps in assignment.items()}, ids)
               for client, (ids, assignment) in sorted(by_client.items())]
    states = [desc.state for _b, desc in described if desc.members]
    state = next((st for st in states if st != "Stable"), "Stable") if states else described[0][1].state
    generations = {b: desc.generation for b, desc in described}
    strategy = next((desc.strategy for _b, desc in described if desc.strategy), "")
    return GroupDescription(group, state, described[0][1].generation, strategy, members, rows, generations,
                            unreachable)


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
        storage = BrokerOffsetStorage.for_session(core)
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
