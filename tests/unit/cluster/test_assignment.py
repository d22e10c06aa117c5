"""The assignment functions every coordinator shares: complete, exclusive, deterministic, MetaQ's split."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaq.cluster.assignment import (
    assign,
    assign_topics,
    check_assignment,
    consistent_hash_assign,
    range_assign,
)
from metaq.types import PartitionId as P

member_ids = st.lists(st.text(alphabet="abcdefghij0123456789-", min_size=1, max_size=12), max_size=20, unique=True)
partition_sets = st.lists(st.builds(P, st.integers(0, 5), st.integers(0, 63)), max_size=80, unique=True)
strategies = st.sampled_from(["range", "consistent_hash"])


@given(strategies, member_ids, partition_sets)
def test_every_partition_has_exactly_one_owner(strategy: str, members: list[str],
                                               partitions: list[P]) -> None:
    result = assign(strategy, members, partitions)
    assert set(result) == set(members)
    check_assignment(result, members, partitions)
    owned = [p for ps in result.values() for p in ps]
    assert len(owned) == (len(set(partitions)) if members else 0)


@given(strategies, member_ids, partition_sets)
def test_deterministic_whatever_the_input_order(strategy: str, members: list[str],
                                                partitions: list[P]) -> None:
    a = assign(strategy, members, partitions)
    b = assign(strategy, list(reversed(members)), list(reversed(partitions)))
    assert a == b


@given(member_ids, partition_sets)
def test_range_split_is_metaqs(members: list[str], partitions: list[P]) -> None:
    result = range_assign(members, partitions)
    if not members:
        assert result == {}
        return
    n, m = len(partitions), len(members)
    ordered_members = sorted(members)
    ordered_parts = sorted(partitions)
    flattened = [p for member in ordered_members for p in result[member]]
    assert flattened == ordered_parts  # contiguous ranges, in member order
    for i, member in enumerate(ordered_members):
        assert len(result[member]) == n // m + (1 if i < n % m else 0)
    # spare members (beyond the partition count) idle
    assert all(result[member] == [] for member in ordered_members[n:])


def test_range_example_from_metaq() -> None:
    parts = [P(0, p) for p in range(5)] + [P(1, p) for p in range(2)]
    got = range_assign(["c2", "c1", "c3"], parts)
    assert got == {"c1": [P(0, 0), P(0, 1), P(0, 2)], "c2": [P(0, 3), P(0, 4)], "c3": [P(1, 0), P(1, 1)]}


@settings(max_examples=200)
@given(st.lists(st.text(alphabet="abcdef0123456789", min_size=1, max_size=8), min_size=1, max_size=12,
                unique=True),
       st.text(alphabet="xyz0123456789", min_size=1, max_size=8),
       st.integers(1, 120))
def test_consistent_hash_moves_only_to_the_joiner(members: list[str], joiner: str, n_partitions: int) -> None:
    partitions = [P(0, p) for p in range(n_partitions)]
    before = consistent_hash_assign(members, partitions)
    after = consistent_hash_assign([*members, joiner], partitions)
    owner_before = {p: m for m, ps in before.items() for p in ps}
    owner_after = {p: m for m, ps in after.items() for p in ps}
    moved = [p for p in partitions if owner_before[p] != owner_after[p]]
    if joiner in members:
        assert moved == []
    else:
        assert all(owner_after[p] == joiner for p in moved)


def test_consistent_hash_moves_few_partitions_on_average() -> None:
    partitions = [P(b, p) for b in range(4) for p in range(64)]  # 256 partitions
    members = [f"consumer-{i}" for i in range(7)]
    before = consistent_hash_assign(members, partitions)
    after = consistent_hash_assign([*members, "consumer-7"], partitions)
    moved = len(after["consumer-7"])
    # the ideal is 256/8 = 32; range would move far more (most ranges shift)
    assert 8 <= moved <= 64
    range_before = range_assign(members, partitions)
    range_after = range_assign([*members, "consumer-7"], partitions)
    range_owner = {p: m for m, ps in range_before.items() for p in ps}
    range_moved = sum(1 for m, ps in range_after.items() for p in ps if range_owner.get(p) != m)
    assert moved < range_moved
    assert before != {}  # sanity


def test_assign_topics_balances_each_topic_among_its_subscribers() -> None:
    parts = {"a": [P(0, p) for p in range(4)], "b": [P(0, p) for p in range(2)]}
    got = assign_topics("range", {"m1": ["a", "b"], "m2": ["a"]}, lambda t: parts[t])
    assert got == {"m1": {"a": [P(0, 0), P(0, 1)], "b": [P(0, 0), P(0, 1)]}, "m2": {"a": [P(0, 2), P(0, 3)]}}


def test_unknown_strategy_names_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="consistent_hash, range, roundrobin"):
        assign("sticky", ["a"], [P(0, 0)])


def test_roundrobin_deals_partitions_in_turn_as_kafkas_assignor_does_for_one_topic() -> None:
    parts = [P(1, 0), P(1, 1), P(2, 0), P(2, 1), P(3, 0)]
    assert assign("roundrobin", ["m2", "m1"], parts) == {"m1": [P(1, 0), P(2, 0), P(3, 0)], "m2": [P(1, 1), P(2, 1)]}
    assert assign("roundrobin", ["a", "b", "c"], parts[:2]) == {"a": [P(1, 0)], "b": [P(1, 1)], "c": []}


def test_check_assignment_catches_double_ownership_and_holes() -> None:
    with pytest.raises(AssertionError, match="owned by both"):
        check_assignment({"a": [P(0, 0)], "b": [P(0, 0)]}, ["a", "b"], [P(0, 0)])
    with pytest.raises(AssertionError, match="no owner"):
        check_assignment({"a": [P(0, 0)], "b": []}, ["a", "b"], [P(0, 0), P(0, 1)])


def test_range_over_two_brokers_partitions_in_metaq_order() -> None:
    # brokerId 1 and 2 with two partitions each, three members: MetaQ's sorted list is 1-0 1-1 2-0 2-1
    parts = [P.parse(t) for t in ("2-1", "1-0", "2-0", "1-1")]
    got = range_assign(["m3", "m1", "m2"], parts)
    assert {m: [str(p) for p in ps] for m, ps in got.items()} == {"m1": ["1-0", "1-1"], "m2": ["2-0"], "m3": ["2-1"]}
    # numeric order, not text order: broker 10 comes after broker 2
    got = range_assign(["a", "b"], [P(10, 0), P(2, 0), P(2, 1), P(10, 1)])
    assert got == {"a": [P(2, 0), P(2, 1)], "b": [P(10, 0), P(10, 1)]}


def test_consistent_hash_over_two_brokers_is_complete_and_uses_the_text_form() -> None:
    parts = [P(b, p) for b in (1, 2) for p in range(8)]
    got = consistent_hash_assign(["m1", "m2", "m3"], parts)
    check_assignment(got, ["m1", "m2", "m3"], parts)
    assert sorted(p for ps in got.values() for p in ps) == parts


def test_bare_pairs_are_refused() -> None:
    with pytest.raises(ValueError, match="PartitionId"):
        range_assign(["a"], [(0, 1)])  # type: ignore[list-item]
