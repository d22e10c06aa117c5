"""The broker's group coordinator, driven directly with a fake clock (no sockets, no sleeps)."""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from metaq.broker.groups import EMPTY, PREPARING_REBALANCE, STABLE, GroupCoordinator
from metaq.errors import (
    IllegalGenerationError,
    InvalidRequestError,
    InvalidTopicError,
    NotCoordinatorError,
    RebalanceInProgressError,
    UnknownGroupError,
    UnknownMemberError,
    UnknownPartitionError,
)
from metaq.protocol import messages as m
from metaq.testing import FakeClock, until
from metaq.types import PartitionId

SESSION_MS = 1000
REBALANCE_MS = 3000


class Topics:
    def __init__(self, **counts: int) -> None:
        self.counts = dict(counts)

    def __call__(self, topic: str) -> list[tuple[int, int]]:
        return [(0, p) for p in range(self.counts.get(topic, 0))]


def run(coro_fn: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
    @functools.wraps(coro_fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return asyncio.run(coro_fn(*args, **kwargs))  # type: ignore[arg-type]
    return wrapper


async def settle(coord: GroupCoordinator, joins: Iterable[asyncio.Future[Any] | None]) -> None:
    """Until each of ``joins`` has its answer or waits in the coordinator for its group's rebalance (a member
    with an unanswered join). The clock is fake: nothing else can happen meanwhile."""
    tasks = [j for j in joins if j is not None]

    def settled() -> bool:
        waiting = sum(1 for group in coord.groups.values() for member in group.members.values()
                      if member.join is not None and not member.join.done())
        return sum(not t.done() for t in tasks) == waiting

    await until(settled, 10, message="the joins to be answered or to wait for the rebalance", interval_s=0)


def make(tmp_path: Path, **topics: int) -> tuple[GroupCoordinator, FakeClock, Topics]:
    clock = FakeClock(now_s=0.0)
    parts = Topics(**(topics or {"t": 12}))
    coord = GroupCoordinator(parts, tmp_path / "offsets", clock=clock.ms, timer=False)
    coord.open()
    return coord, clock, parts


def join_req(member_id: str = "", topics: list[str] | None = None, strategy: str = "range",
             group: str = "g") -> m.JoinGroupRequest:
    return m.JoinGroupRequest(group=group, member_id=member_id, client_id="c", session_timeout_ms=SESSION_MS,
                              rebalance_timeout_ms=REBALANCE_MS, topics=topics or ["t"], strategy=strategy)


def owned(resp: m.JoinGroupResponse) -> set[tuple[str, int]]:
    """(topic, partition number) owned; the coordinator of these tests is broker 0 and holds them all."""
    assert all(p.broker_id == 0 for a in resp.assignment for p in a.partitions)
    return {(a.topic, p.partition) for a in resp.assignment for p in a.partitions}


class SimMember:
    """A well-behaved consumer: heartbeats, and on REBALANCE_IN_PROGRESS commits, gives up, rejoins."""

    def __init__(self, coord: GroupCoordinator, strategy: str = "range", topics: list[str] | None = None) -> None:
        self.coord = coord
        self.topics = topics
        self.strategy = strategy
        self.member_id = ""
        self.generation = -1
        self.holding: set[tuple[str, int]] = set()
        self.join_task: asyncio.Future[m.JoinGroupResponse] | None = None
        self.alive = True

    def start_join(self) -> None:
        self.holding = set()  # eager: give everything up before rejoining
        self.join_task = asyncio.ensure_future(self.coord.join(join_req(self.member_id, self.topics, self.strategy)))

    def collect(self) -> None:
        if self.join_task is not None and self.join_task.done():
            resp = self.join_task.result()
            self.join_task = None
            if resp.error_code == UnknownMemberError.code:
                self.member_id = ""
                self.start_join()
                return
            assert resp.error_code == 0, resp
            self.member_id, self.generation = resp.member_id, resp.generation
            self.holding = owned(resp)

    async def beat(self) -> None:
        if not self.alive or self.join_task is not None:
            return
        hb = await self.coord.heartbeat(m.HeartbeatRequest("g", self.generation, self.member_id))
        if hb.error_code in (RebalanceInProgressError.code, IllegalGenerationError.code):
            await self.coord.commit_offsets(m.OffsetCommitRequest(
                "g", self.generation, self.member_id, [m.OffsetEntry(t, 0, p, 1) for t, p in sorted(self.holding)]))
            self.start_join()
        elif hb.error_code == UnknownMemberError.code:
            self.member_id = ""
            self.start_join()


async def drive(coord: GroupCoordinator, clock: FakeClock, sims: list[SimMember], steps: int = 400) -> None:
    """Heartbeat, commit and rejoin like real consumers until the group is stable with the live sims."""
    for _step in range(steps):
        await settle(coord, [s.join_task for s in sims])
        for s in sims:
            if s.alive:
                s.collect()
        # safety at every step: no partition held by two live members at once
        held = [p for s in sims if s.alive for p in s.holding]
        assert len(held) == len(set(held)), "a partition has two owners"
        live = [s for s in sims if s.alive]
        group = coord.groups.get("g")
        if (group is not None and group.state == STABLE and all(s.join_task is None for s in live)
                and {s.member_id for s in live} == set(group.members)
                and all(s.generation == group.generation for s in live)):
            return
        clock.advance_ms(SESSION_MS / 4)
        coord.poll()
        for s in live:
            await s.beat()
    raise AssertionError("the group never became stable")


async def form_group(coord: GroupCoordinator, clock: FakeClock, n: int, topics: list[list[str]] | None = None,
                     strategy: str = "range") -> list[SimMember]:
    sims = [SimMember(coord, strategy, topics[i] if topics else None) for i in range(n)]
    for s in sims:
        s.start_join()
    await drive(coord, clock, sims)
    return sims



@run
async def test_first_member_owns_everything(tmp_path: Path) -> None:
    coord, _clock, _ = make(tmp_path)
    resp = await coord.join(join_req())
    assert resp.error_code == 0 and resp.generation == 1
    assert owned(resp) == {("t", p) for p in range(12)}
    assert (await coord.heartbeat(m.HeartbeatRequest("g", 1, resp.member_id))).error_code == 0
    coord.check_invariants()


@run
async def test_three_members_split_twelve_partitions_disjointly(tmp_path: Path) -> None:
    coord, clock, _ = make(tmp_path)
    sims = await form_group(coord, clock, 3)
    assert len({s.generation for s in sims}) == 1
    sets = [s.holding for s in sims]
    assert all(len(s) == 4 for s in sets)
    assert set().union(*sets) == {("t", p) for p in range(12)}
    coord.check_invariants()


@run
async def test_join_of_a_new_member_makes_old_members_commit_and_rejoin(tmp_path: Path) -> None:
    coord, _clock, _ = make(tmp_path)
    a = await coord.join(join_req())
    b_task = asyncio.ensure_future(coord.join(join_req()))
    await settle(coord, [b_task])
    assert not b_task.done()
    assert coord.groups["g"].state == PREPARING_REBALANCE
    hb = await coord.heartbeat(m.HeartbeatRequest("g", a.generation, a.member_id))
    assert hb.error_code == RebalanceInProgressError.code
    # the old member commits what it consumed before giving its partitions up: accepted
    commit = await coord.commit_offsets(m.OffsetCommitRequest("g", a.generation, a.member_id,
                                                              [m.OffsetEntry("t", 0, 5, 42)]))
    assert commit.error_code == 0 and commit.results[0].error_code == 0
    a2 = await coord.join(join_req(a.member_id))
    b = await b_task
    assert a2.generation == b.generation == 2
    assert owned(a2) | owned(b) == {("t", p) for p in range(12)} and not owned(a2) & owned(b)
    fetched = await coord.fetch_offsets(m.OffsetFetchRequest("g", [m.TopicPartitionRef("t", 0, 5)]))
    assert fetched.offsets[0].offset == 42
    # the old generation is fenced now
    stale = await coord.commit_offsets(m.OffsetCommitRequest("g", 1, a.member_id, [m.OffsetEntry("t", 0, 0, 1)]))
    assert stale.error_code == IllegalGenerationError.code


@run
async def test_expired_member_is_dropped_and_fenced(tmp_path: Path) -> None:
    coord, clock, _ = make(tmp_path)
    a, b = await form_group(coord, clock, 2)
    for _ in range(5):  # a heartbeats, b is silent (crashed)
        clock.advance_ms(SESSION_MS / 3)
        coord.poll()
        hb = await coord.heartbeat(m.HeartbeatRequest("g", a.generation, a.member_id))
        if hb.error_code:
            break
    assert hb.error_code == RebalanceInProgressError.code
    assert b.member_id not in coord.groups["g"].members
    a2 = await coord.join(join_req(a.member_id))
    assert a2.generation == a.generation + 1 and owned(a2) == {("t", p) for p in range(12)}
    fenced = await coord.commit_offsets(m.OffsetCommitRequest("g", b.generation, b.member_id,
                                                              [m.OffsetEntry("t", 0, 0, 7)]))
    assert fenced.error_code == UnknownMemberError.code
    assert (await coord.heartbeat(m.HeartbeatRequest("g", b.generation, b.member_id))).error_code \
        == UnknownMemberError.code
    rejoin_old_id = await coord.join(join_req(b.member_id))
    assert rejoin_old_id.error_code == UnknownMemberError.code


@run
async def test_member_that_never_rejoins_is_dropped_at_the_rebalance_deadline(tmp_path: Path) -> None:
    coord, clock, _ = make(tmp_path)
    a = await coord.join(join_req())
    b_task = asyncio.ensure_future(coord.join(join_req()))
    await settle(coord, [b_task])
    # a keeps heartbeating (alive) but never rejoins: a stuck consumer
    for _ in range(int(REBALANCE_MS / (SESSION_MS / 4)) + 2):
        clock.advance_ms(SESSION_MS / 4)
        await coord.heartbeat(m.HeartbeatRequest("g", a.generation, a.member_id))
        coord.poll()
        await settle(coord, [b_task])
        if b_task.done():
            break
    b = b_task.result()
    assert b.generation == 2 and owned(b) == {("t", p) for p in range(12)}
    assert clock.ms() >= REBALANCE_MS
    late = await coord.commit_offsets(m.OffsetCommitRequest("g", 1, a.member_id, [m.OffsetEntry("t", 0, 0, 3)]))
    assert late.error_code == UnknownMemberError.code


@run
async def test_leave_hands_partitions_to_the_rest(tmp_path: Path) -> None:
    coord, clock, _ = make(tmp_path)
    a, b = await form_group(coord, clock, 2)
    assert (await coord.leave(m.LeaveGroupRequest("g", b.member_id))).error_code == 0
    hb = await coord.heartbeat(m.HeartbeatRequest("g", a.generation, a.member_id))
    assert hb.error_code == RebalanceInProgressError.code
    a2 = await coord.join(join_req(a.member_id))
    assert owned(a2) == {("t", p) for p in range(12)}
    assert (await coord.leave(m.LeaveGroupRequest("g", a.member_id))).error_code == 0
    assert coord.groups["g"].state == EMPTY
    assert (await coord.leave(m.LeaveGroupRequest("g", a.member_id))).error_code == UnknownMemberError.code


@run
async def test_commits_are_checked_against_ownership_and_generation(tmp_path: Path) -> None:
    coord, clock, _ = make(tmp_path)
    a, b = await form_group(coord, clock, 2)
    mine = sorted(p for _t, p in a.holding)
    theirs = sorted(p for _t, p in b.holding)
    resp = await coord.commit_offsets(m.OffsetCommitRequest("g", a.generation, a.member_id, [
        m.OffsetEntry("t", 0, mine[0], 10), m.OffsetEntry("t", 0, theirs[0], 10), m.OffsetEntry("t", 0, mine[1], -5)]))
    assert [r.error_code for r in resp.results] == [0, IllegalGenerationError.code, InvalidRequestError.code]
    assert resp.error_message
    wrong_gen = await coord.commit_offsets(m.OffsetCommitRequest("g", 99, a.member_id,
                                                                 [m.OffsetEntry("t", 0, mine[0], 1)]))
    assert wrong_gen.error_code == IllegalGenerationError.code
    hb = await coord.heartbeat(m.HeartbeatRequest("g", 99, a.member_id))
    assert hb.error_code == IllegalGenerationError.code


@run
async def test_no_generation_commits_only_when_the_group_is_empty(tmp_path: Path) -> None:
    coord, _clock, _ = make(tmp_path)
    ok = await coord.commit_offsets(m.OffsetCommitRequest("g", m.NO_GENERATION, "", [m.OffsetEntry("t", 0, 0, 9)]))
    assert ok.error_code == 0
    a = await coord.join(join_req())
    refused = await coord.commit_offsets(m.OffsetCommitRequest("g", m.NO_GENERATION, "",
                                                               [m.OffsetEntry("t", 0, 0, 1)]))
    assert refused.error_code == IllegalGenerationError.code and "active" in (refused.error_message or "")
    await coord.leave(m.LeaveGroupRequest("g", a.member_id))
    forget = await coord.commit_offsets(m.OffsetCommitRequest("g", m.NO_GENERATION, "", [m.OffsetEntry("t", 0, 0, -1)]))
    assert forget.error_code == 0
    fetched = await coord.fetch_offsets(m.OffsetFetchRequest("g", None))
    assert fetched.offsets == []


@run
async def test_offsets_survive_a_restart_and_a_torn_tail(tmp_path: Path) -> None:
    coord, _clock, _ = make(tmp_path, t=12, u=1)
    for i in range(50):
        await coord.commit_offsets(m.OffsetCommitRequest("g", m.NO_GENERATION, "",
                                                         [m.OffsetEntry("t", 0, i % 4, i, f"meta{i}")]))
    await coord.commit_offsets(m.OffsetCommitRequest("h", m.NO_GENERATION, "", [m.OffsetEntry("u", 0, 0, 5)]))
    # no close(): what kill -9 leaves behind, plus half a record written when it died
    with open(tmp_path / "offsets" / "consumer_offsets.log", "ab") as f:
        f.write(b"\x00\x00\x01\x00garbage")
    coord2, _, _ = make(tmp_path)
    assert coord2.store.corrupt_tail_bytes == 11
    got = {(e.topic, e.partition): (e.offset, e.metadata)
           for e in (await coord2.fetch_offsets(m.OffsetFetchRequest("g", None))).offsets}
    assert got == {("t", 0): (48, "meta48"), ("t", 1): (49, "meta49"), ("t", 2): (46, "meta46"),
                   ("t", 3): (47, "meta47")}
    assert (await coord2.list_groups(m.ListGroupsRequest())).groups == ["g", "h"]
    await coord.close()
    await coord2.close()


@run
async def test_runtime_compaction_keeps_every_offset(tmp_path: Path) -> None:
    from metaq.broker.offsets_store import OffsetsStore

    store = OffsetsStore(tmp_path / "o", compact_bytes=2000)
    coord = GroupCoordinator(Topics(t=4), store, clock=FakeClock().ms, timer=False)
    coord.open()
    for i in range(300):
        await coord.commit_offsets(m.OffsetCommitRequest("g", m.NO_GENERATION, "", [m.OffsetEntry("t", 0, i % 4, i)]))
    assert (tmp_path / "o" / "consumer_offsets.log").stat().st_size < 4 * 2000 + 200
    await coord.close()
    reopened = OffsetsStore(tmp_path / "o")
    reopened.open()
    assert {(t, str(p)): v.offset for (t, p), v in reopened.group_offsets("g").items()} == {
        ("t", "0-0"): 296, ("t", "0-1"): 297, ("t", "0-2"): 298, ("t", "0-3"): 299}
    reopened.close()


@run
async def test_new_partitions_trigger_a_rebalance(tmp_path: Path) -> None:
    coord, clock, parts = make(tmp_path, t=2)
    a = await coord.join(join_req(topics=["t", "later"]))
    assert owned(a) == {("t", 0), ("t", 1)}
    parts.counts["later"] = 3  # the topic is created after the member subscribed
    clock.advance_ms(10)
    coord.poll()
    hb = await coord.heartbeat(m.HeartbeatRequest("g", a.generation, a.member_id))
    assert hb.error_code == RebalanceInProgressError.code
    a2 = await coord.join(join_req(a.member_id, topics=["t", "later"]))
    assert owned(a2) == {("t", 0), ("t", 1), ("later", 0), ("later", 1), ("later", 2)}


@run
async def test_members_with_different_topics_share_only_what_they_read(tmp_path: Path) -> None:
    coord, clock, _ = make(tmp_path, x=4, y=2)
    a, b = await form_group(coord, clock, 2, [["x", "y"], ["x"]])
    assert {t for t, _ in b.holding} == {"x"}
    assert {p for t, p in a.holding | b.holding if t == "x"} == {0, 1, 2, 3}
    assert {p for t, p in a.holding if t == "y"} == {0, 1}
    coord.check_invariants()


@run
async def test_describe_list_and_errors(tmp_path: Path) -> None:
    coord, clock, _ = make(tmp_path)
    assert (await coord.describe_group(m.DescribeGroupRequest("nope"))).error_code == UnknownGroupError.code
    a, b = await form_group(coord, clock, 2)
    d = await coord.describe_group(m.DescribeGroupRequest("g"))
    assert d.state == STABLE and d.generation == a.generation and d.strategy == "range"
    assert {mb.member_id for mb in d.members} == {a.member_id, b.member_id}
    assert sum(len(ta.partitions) for mb in d.members for ta in mb.assignment) == 12
    assert (await coord.list_groups(m.ListGroupsRequest())).groups == ["g"]
    bad = await coord.join(join_req(strategy="consistent_hash"))
    assert bad.error_code == InvalidRequestError.code and "strategy" in (bad.error_message or "")
    for req in (join_req(group="../x"), join_req(strategy="nope"),
                m.JoinGroupRequest("g", "", "c", 1, 1, ["t"], "range")):
        assert (await coord.join(req)).error_code == InvalidRequestError.code
    assert (await coord.join(join_req(topics=["a/b"]))).error_code == InvalidTopicError.code


@run
async def test_close_answers_waiting_joins(tmp_path: Path) -> None:
    coord, _clock, _ = make(tmp_path)
    await coord.join(join_req())
    waiting = asyncio.ensure_future(coord.join(join_req()))
    await settle(coord, [waiting])
    await coord.close()
    assert (await waiting).error_code == NotCoordinatorError.code


@run
async def test_consistent_hash_groups(tmp_path: Path) -> None:
    coord, clock, _ = make(tmp_path, t=64)
    sims = await form_group(coord, clock, 4, strategy="consistent_hash")
    sets = [s.holding for s in sims]
    assert set().union(*sets) == {("t", p) for p in range(64)} and sum(map(len, sets)) == 64
    coord.check_invariants()


@pytest.mark.parametrize("strategy", ["range", "consistent_hash"])
@run
async def test_a_hundred_rebalances_leave_no_partition_unowned(tmp_path: Path, strategy: str) -> None:
    coord, clock, _ = make(tmp_path, t=12)
    rng = random.Random(4)
    sims: list[SimMember] = []
    rebalances = 0
    while rebalances < 100:
        live = [s for s in sims if s.alive]
        event = rng.choice(["join", "join", "leave", "crash"] if live else ["join"])
        if event == "join" or len(live) <= 1:
            s = SimMember(coord, strategy)
            sims.append(s)
            s.start_join()
        elif event == "leave":
            s = rng.choice(live)
            s.alive = False
            s.holding = set()
            await settle(coord, [t.join_task for t in sims])
            s.collect()
            if s.member_id:
                await coord.leave(m.LeaveGroupRequest("g", s.member_id))
        else:  # crash: stop heartbeating, keep "holding" nothing (a dead process consumes nothing)
            s = rng.choice(live)
            s.alive = False
            s.holding = set()
        await drive(coord, clock, sims)
        live = [s for s in sims if s.alive]
        coord.check_invariants()
        held = sorted(p for s in live for p in s.holding)
        assert held == [("t", p) for p in range(12)], "every partition owned exactly once"
        rebalances = coord.groups["g"].rebalances
    assert rebalances >= 100


# -- several brokers: broker 1 coordinates the group for its own partitions; members may report others' --------

def bp(text: str) -> m.BrokerPartition:
    pid = PartitionId.parse(text)
    return m.BrokerPartition(pid.broker_id, pid.partition)


def seen(*texts: str, topic: str = "t") -> list[m.TopicAssignment]:
    return [m.TopicAssignment(topic, [bp(t) for t in texts])]


def owned_ids(resp: m.JoinGroupResponse) -> list[str]:
    return [f"{a.topic}:{p.broker_id}-{p.partition}" for a in resp.assignment for p in a.partitions]


def two_broker_coordinator(tmp_path: Path, partitions: int = 2) -> GroupCoordinator:
    coord = GroupCoordinator(lambda topic: [PartitionId(1, p) for p in range(partitions)] if topic == "t" else [],
                             tmp_path / "offsets", broker_id=1, clock=FakeClock().ms, timer=False)
    coord.open()
    return coord


def report_req(member_id: str, partitions: list[m.TopicAssignment], client_id: str = "c") -> m.JoinGroupRequest:
    req = join_req(member_id)
    req.partitions = partitions
    req.client_id = client_id
    return req


@run
async def test_a_broker_assigns_only_its_own_partitions_whatever_the_members_report(tmp_path: Path) -> None:
    coord = two_broker_coordinator(tmp_path)
    view = seen("1-0", "1-1", "1-7", "2-0", "2-1")
    first = await coord.join(report_req("", view))
    assert owned_ids(first) == ["t:1-0", "t:1-1"]  # broker 2 coordinates 2-0 and 2-1 itself
    coord.check_invariants()
    assert sorted(str(tp) for tp in coord.owners("g")) == ["t:1-0", "t:1-1"]


@run
async def test_members_are_balanced_by_consumer_id_from_a_member_that_depends_on_the_broker_id(
        tmp_path: Path) -> None:
    """Every broker orders the members by their (unique) consumer ids, and the range split of broker b starts
    at member b: with as many one-partition brokers as members, each member gets one partition."""
    async def split(broker_id: int) -> dict[str, list[str]]:
        coord = GroupCoordinator(lambda t: [PartitionId(broker_id, 0)] if t == "t" else [],
                                 tmp_path / f"offsets-{broker_id}", broker_id=broker_id, clock=FakeClock().ms,
                                 timer=False)
        coord.open()
        first = await coord.join(report_req("", [], "consumer-a"))
        joins = [asyncio.ensure_future(coord.join(report_req("", [], c))) for c in ("consumer-c", "consumer-b")]
        await settle(coord, joins)
        again = await coord.join(report_req(first.member_id, [], "consumer-a"))
        resps = [again, *[await j for j in joins]]
        by_client = {mb.client_id: mb.member_id for mb in coord.groups["g"].members.values()}
        owned = {r.member_id: owned_ids(r) for r in resps}
        await coord.close()
        return {c: owned[mid] for c, mid in sorted(by_client.items())}

    assert await split(0) == {"consumer-a": ["t:0-0"], "consumer-b": [], "consumer-c": []}
    assert await split(1) == {"consumer-a": [], "consumer-b": ["t:1-0"], "consumer-c": []}
    assert await split(2) == {"consumer-a": [], "consumer-b": [], "consumer-c": ["t:2-0"]}


@run
async def test_commits_and_fetches_are_keyed_per_broker_partition(tmp_path: Path) -> None:
    coord = two_broker_coordinator(tmp_path)
    a = await coord.join(report_req("", seen("2-0", "2-1")))
    commit = await coord.commit_offsets(m.OffsetCommitRequest("g", a.generation, a.member_id, [
        m.OffsetEntry("t", 1, 0, 10), m.OffsetEntry("t", 2, 0, 20), m.OffsetEntry("t", 1, 5, 1)]))
    assert [r.error_code for r in commit.results] == [0, IllegalGenerationError.code, IllegalGenerationError.code]
    assert "'t':2-0" in (commit.error_message or "")  # broker 2's partition is not this member's here
    fetched = await coord.fetch_offsets(m.OffsetFetchRequest("g", [m.TopicPartitionRef("t", 1, 0),
                                                                   m.TopicPartitionRef("t", 2, 0)]))
    assert [(e.broker_id, e.partition, e.offset) for e in fetched.offsets] == [(1, 0, 10), (2, 0, -1)]
    await coord.leave(m.LeaveGroupRequest("g", a.member_id))
    # outside a generation: another broker's partition is stored as given, an own one must exist
    reset = await coord.commit_offsets(m.OffsetCommitRequest("g", m.NO_GENERATION, "", [
        m.OffsetEntry("t", 2, 7, 3), m.OffsetEntry("t", 1, 7, 3), m.OffsetEntry("t", 70000, 0, 3),
        m.OffsetEntry("t", 2, -1, 3)]))
    assert [r.error_code for r in reset.results] == [0, UnknownPartitionError.code, UnknownPartitionError.code,
                                                    UnknownPartitionError.code]
    await coord.close()
    reopened = two_broker_coordinator(tmp_path)
    got = await reopened.fetch_offsets(m.OffsetFetchRequest("g", None))
    assert [(e.broker_id, e.partition, e.offset) for e in got.offsets] == [(1, 0, 10), (2, 7, 3)]
    await reopened.close()


@run
async def test_a_member_rejoining_with_another_view_of_other_brokers_changes_nothing_here(tmp_path: Path) -> None:
    coord = two_broker_coordinator(tmp_path)
    a = await coord.join(report_req("", seen("2-0")))
    assert owned_ids(a) == ["t:1-0", "t:1-1"]
    grown = await coord.join(report_req(a.member_id, seen("2-0", "2-1", "2-2")))
    assert (grown.generation, owned_ids(grown)) == (a.generation, ["t:1-0", "t:1-1"])


@run
async def test_a_whole_cluster_group_balances_the_other_brokers_reported_partitions_too(tmp_path: Path) -> None:
    """A Kafka group (joined through the Kafka listener) has one coordinator: it balances every broker's
    partitions its members report, never trusting a report of its own broker id."""
    coord = two_broker_coordinator(tmp_path)
    view = seen("1-0", "1-1", "1-7", "2-0", "2-1")
    first = await coord.join(report_req("", view), whole_cluster=True)
    assert owned_ids(first) == ["t:1-0", "t:1-1", "t:2-0", "t:2-1"]  # 1-7 is not broker 1's: ignored
    second = asyncio.ensure_future(coord.join(report_req("", view, "c2"), whole_cluster=True))
    await settle(coord, [second])
    again = await coord.join(report_req(first.member_id, view), whole_cluster=True)
    second_answer = await second
    split = [owned_ids(again), owned_ids(second_answer)]
    assert sorted(p for s in split for p in s) == ["t:1-0", "t:1-1", "t:2-0", "t:2-1"] and all(split)
    coord.check_invariants()
    wider = seen("1-0", "2-0", "2-1", "2-2")
    grown = asyncio.ensure_future(coord.join(report_req(first.member_id, wider), whole_cluster=True))
    await settle(coord, [grown])
    assert coord.groups["g"].state == PREPARING_REBALANCE  # a new view of the cluster rebalances
    other = await coord.join(report_req(second_answer.member_id, wider, "c2"), whole_cluster=True)
    assert sorted(owned_ids(await grown) + owned_ids(other)) == ["t:1-0", "t:1-1", "t:2-0", "t:2-1", "t:2-2"]
    await coord.close()


@run
async def test_a_report_that_is_not_broker_partition_is_refused(tmp_path: Path) -> None:
    coord = two_broker_coordinator(tmp_path)
    bad = await coord.join(report_req("", [m.TopicAssignment("t", [m.BrokerPartition(70000, 0)])]))
    assert bad.error_code == InvalidRequestError.code and "brokerId-partition" in (bad.error_message or "")
    other_topic = await coord.join(report_req("", seen("2-0", topic="not-subscribed")))
    assert other_topic.error_code == 0 and owned_ids(other_topic) == ["t:1-0", "t:1-1"]


def test_an_offsets_log_of_the_earlier_format_is_read_as_this_brokers_partitions(tmp_path: Path) -> None:
    import json
    import struct

    import crc32c

    from metaq.broker.offsets_store import OffsetsStore

    body = json.dumps({"g": "g", "o": [["t", 3, 42, None], ["t", "2-1", 7, "m"]]}).encode()
    (tmp_path / "consumer_offsets.log").write_bytes(struct.pack(">II", len(body), crc32c.crc32c(body)) + body)
    store = OffsetsStore(tmp_path, broker_id=5)
    store.open()
    assert {(t, str(p)): c.offset for (t, p), c in store.group_offsets("g").items()} == {("t", "5-3"): 42,
                                                                                        ("t", "2-1"): 7}
    store.close()
    assert b'"5-3"' in (tmp_path / "consumer_offsets.log").read_bytes()  # rewritten by the compaction
