"""Which group member owns which partition: pure, deterministic functions of (members, partitions).

Every coordinator (the broker in standalone mode, every consumer in ZooKeeper mode) must compute the
same answer from the same inputs, so nothing here depends on process state, dict order, Python's
randomised ``hash()`` or the clock.

Partitions are :class:`~metaq.types.PartitionId` values, ``brokerId-partition``: the same split over
the partitions of several brokers in every mode.

``range`` — MetaQ's DefaultLoadBalanceStrategy. Partitions are sorted by (broker id, partition) and
members by id; with ``n`` partitions and ``m`` members, member ``i`` gets the contiguous range that
starts at ``i * (n // m) + min(i, n % m)`` and has ``n // m`` partitions plus one for the first
``n % m`` members. When ``m > n`` the members after the first ``n`` get nothing: spare members idle
(and take over when an owner leaves).

``consistent_hash`` — MetaQ's ConsisHashStrategy. Members are placed on a 64-bit ring at
``virtual_nodes`` points each (BLAKE2b of ``"member#i"``); a partition belongs to the first member point
clockwise from the partition's own hash (of ``"partition:<brokerId-partition>"``). When one member
joins, only the partitions that now fall to the new member move; everything else stays where it was.
The price is a less even split.

``roundrobin`` — partitions (sorted) dealt to the members (sorted) in turn: Kafka's round-robin assignor
for one topic (the Kafka listener's groups name it).

Every function returns an entry for every member (possibly an empty list) and place every partition
with exactly one member; :func:`check_assignment` asserts this and the coordinator calls it on every
assignment it hands out.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence

from metaq.types import PartitionId

PartitionRef = PartitionId
"""A partition as the balancers see it: ``brokerId-partition``, sorted as MetaQ sorts them."""

DEFAULT_VIRTUAL_NODES = 160
"""Points per member on the consistent-hash ring; enough for a split within ~±15% of even at 4 members."""


def _sorted_unique_members(members: Iterable[str]) -> list[str]:
    ordered = sorted(set(members))
    if any(not isinstance(m, str) or not m for m in ordered):
        raise ValueError("member ids must be non-empty strings")
    return ordered


def _sorted_unique_partitions(partitions: Iterable[PartitionRef]) -> list[PartitionRef]:
    unique = set(partitions)
    if any(not isinstance(p, PartitionId) for p in unique):
        raise ValueError("partitions must be PartitionId values (brokerId-partition)")
    return sorted(p.id for p in unique)


def range_assign(members: Iterable[str], partitions: Iterable[PartitionRef],
                 first_member: int = 0) -> dict[str, list[PartitionRef]]:
    """MetaQ's sorted range split (see the module docstring); ``first_member``: the split starts at the
    member of that index (modulo the member count) in id order, and goes round."""
    ms = _sorted_unique_members(members)
    if ms:
        shift = first_member % len(ms)
        ms = ms[shift:] + ms[:shift]
    ps = _sorted_unique_partitions(partitions)
    out: dict[str, list[PartitionRef]] = {m: [] for m in ms}
    if not ms:
        return out
    per_member, extra = divmod(len(ps), len(ms))
    for i, member in enumerate(ms):
        start = i * per_member + min(i, extra)
        count = per_member + (1 if i < extra else 0)
        out[member] = ps[start:start + count]
    return out


def _point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def consistent_hash_assign(members: Iterable[str], partitions: Iterable[PartitionRef],
                           virtual_nodes: int = DEFAULT_VIRTUAL_NODES) -> dict[str, list[PartitionRef]]:
    """MetaQ's consistent-hash split (see the module docstring)."""
    if virtual_nodes < 1:
        raise ValueError(f"virtual_nodes must be >= 1; got {virtual_nodes}")
    ms = _sorted_unique_members(members)
    ps = _sorted_unique_partitions(partitions)
    out: dict[str, list[PartitionRef]] = {m: [] for m in ms}
    if not ms:
        return out
    # Ties between two members' points are broken by member id, so the ring is a pure function too.
    ring = sorted((_point(f"{m}#{i}"), m) for m in ms for i in range(virtual_nodes))
    keys = [k for k, _ in ring]
    for pid in ps:
        idx = bisect.bisect_left(keys, _point(f"partition:{pid}"))
        out[ring[idx % len(ring)][1]].append(pid)
    return out


def roundrobin_assign(members: Iterable[str], partitions: Iterable[PartitionRef]) -> dict[str, list[PartitionRef]]:
    """Partitions dealt in turn: the i-th partition (sorted) to the (i mod m)-th member (sorted); Kafka's
    RoundRobinAssignor's split of one topic, which the Kafka listener's groups use (docs/kafka.md)."""
    ms = _sorted_unique_members(members)
    ps = _sorted_unique_partitions(partitions)
    out: dict[str, list[PartitionRef]] = {m: [] for m in ms}
    for i, p in enumerate(ps):
        if ms:
            out[ms[i % len(ms)]].append(p)
    return out


Strategy = Callable[[Iterable[str], Iterable[PartitionRef]], dict[str, list[PartitionRef]]]

STRATEGIES: Mapping[str, Strategy] = {
    "range": range_assign,
    "consistent_hash": consistent_hash_assign,
    "roundrobin": roundrobin_assign,
}


def assign(strategy: str, members: Iterable[str], partitions: Iterable[PartitionRef],
           first_member: int = 0) -> dict[str, list[PartitionRef]]:
    """Dispatch on a strategy name ('range' or 'consistent_hash'); ValueError names the valid ones.
    ``first_member`` rotates the range split (a standalone broker passes its id); the ring needs none."""
    fn = STRATEGIES.get(strategy)
    if fn is None:
        raise ValueError(f"unknown assignment strategy {strategy!r}; use one of {', '.join(sorted(STRATEGIES))}")
    if fn is range_assign:
        return range_assign(members, partitions, first_member)
    return fn(members, partitions)


def assign_topics(strategy: str, subscriptions: Mapping[str, Iterable[str]],
                  partitions_of: Callable[[str], Sequence[PartitionRef]],
                  first_member: int = 0) -> dict[str, dict[str, list[PartitionRef]]]:
    """member -> topic -> partitions, balancing each topic among the members subscribed to it.

    MetaQ balances every topic on its own, so a member subscribed to two topics takes a share of each,
    and a topic's split does not depend on which other topics anybody reads.
    """
    subscribers: dict[str, list[str]] = {}
    for member, topics in subscriptions.items():
        for topic in topics:
            subscribers.setdefault(topic, []).append(member)
    out: dict[str, dict[str, list[PartitionRef]]] = {m: {} for m in subscriptions}
    for topic in sorted(subscribers):
        split = assign(strategy, subscribers[topic], partitions_of(topic), first_member)
        for member, owned in split.items():
            out[member][topic] = owned
    return out


def check_assignment(assignment: Mapping[str, Sequence[PartitionRef]], members: Iterable[str],
                     partitions: Iterable[PartitionRef]) -> None:
    """AssertionError unless every partition has exactly one owner and every owner is a member."""
    member_set = set(members)
    wanted = set(partitions)
    seen: dict[PartitionRef, str] = {}
    for member, owned in assignment.items():
        if member not in member_set:
            raise AssertionError(f"assignment names {member!r}, which is not a member")
        for ref in owned:
            if ref in seen:
                raise AssertionError(f"partition {ref} is owned by both {seen[ref]!r} and {member!r}")
            if ref not in wanted:
                raise AssertionError(f"{member!r} owns {ref}, which is not a partition of the topic")
            seen[ref] = member
    missing = wanted - set(seen)
    if missing and member_set:
        raise AssertionError(f"partitions {sorted(missing)} have no owner")
