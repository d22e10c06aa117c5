"""Partition selectors: MetaQ's ordering and the stability ordered messages rely on."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import zlib
from collections.abc import Collection

import pytest

from metaq.client.metadata import Partition
from metaq.client.selectors import (
    KeyHashSelector,
    RandomSelector,
    RoundRobinSelector,
    StickyRoundRobinSelector,
    key_hash,
)
from metaq.errors import InvalidArgument, PartitionClosedError
from metaq.types import Message


def parts(*pairs: tuple[int, int], closed: Collection[tuple[int, int]] = ()) -> list[Partition]:
    return sorted(Partition(b, p, accept_publish=(b, p) not in closed) for b, p in pairs)


def msg(key: bytes | None = None) -> Message:
    return Message("t", b"v", key=key)


def test_partitions_order_by_broker_id_then_partition() -> None:
    ps = [Partition(2, 0), Partition(1, 1), Partition(1, 0), Partition(0, 3)]
    assert [str(p) for p in sorted(ps)] == ["0-3", "1-0", "1-1", "2-0"]


def test_flags_take_no_part_in_equality_or_order() -> None:
    assert Partition(1, 2, accept_publish=False) == Partition(1, 2)
    assert hash(Partition(1, 2, accept_publish=False)) == hash(Partition(1, 2))


def test_round_robin_walks_partitions_in_broker_then_partition_order() -> None:
    ps = parts((1, 0), (0, 1), (0, 0), (1, 1))
    sel = RoundRobinSelector()
    chosen = [str(sel("t", ps, msg())) for _ in range(6)]
    assert chosen == ["0-0", "0-1", "1-0", "1-1", "0-0", "0-1"]


def test_round_robin_skips_closed_partitions() -> None:
    ps = parts((0, 0), (0, 1), (0, 2), closed={(0, 1)})
    sel = RoundRobinSelector()
    assert [sel("t", ps, msg()).partition for _ in range(4)] == [0, 2, 0, 2]


def test_round_robin_keeps_a_counter_per_topic() -> None:
    ps = parts((0, 0), (0, 1))
    sel = RoundRobinSelector()
    assert sel("a", ps, msg()).partition == 0
    assert sel("b", ps, msg()).partition == 0
    assert sel("a", ps, msg()).partition == 1


def test_round_robin_reserve_chooses_what_as_many_calls_would() -> None:
    """reserve(n) (send_async_many's plain lists) gives the partitions n calls would have given, skips closed
    ones, and the next call continues after them."""
    ps = parts((0, 0), (0, 1), (1, 0), (1, 1), closed={(0, 1)})
    one_by_one, reserving = RoundRobinSelector(), RoundRobinSelector()
    expected = [one_by_one("t", ps, msg()) for _ in range(3 + 7)]
    assert reserving("t", ps, msg()) == expected[0]
    candidates, first = reserving.reserve("t", ps, 7)
    assert [candidates[(first + j) % len(candidates)] for j in range(7)] == expected[1:8]
    assert [reserving("t", ps, msg()) for _ in range(2)] == expected[8:10]
    assert reserving.reserve("other", ps, 2)[1] == 0  # a counter per topic, as calls keep


def test_every_partition_closed_is_partition_closed_error() -> None:
    ps = parts((0, 0), (0, 1), closed={(0, 0), (0, 1)})
    with pytest.raises(PartitionClosedError, match="closed"):
        RoundRobinSelector()("t", ps, msg())
    with pytest.raises(PartitionClosedError):
        RandomSelector()("t", ps, msg())


def test_random_picks_only_open_partitions() -> None:
    ps = parts((0, 0), (0, 1), (0, 2), closed={(0, 1)})
    sel = RandomSelector(random.Random(7))
    seen = {sel("t", ps, msg()).partition for _ in range(200)}
    assert seen == {0, 2}


def test_key_hash_is_crc32_of_the_key_over_all_partitions() -> None:
    ps = parts((0, 0), (0, 1), (0, 2), (1, 0), (1, 1))
    sel = KeyHashSelector()
    for key in (b"", b"order-1", b"order-2", "用户".encode()):
        assert sel("t", ps, msg(key)) == ps[zlib.crc32(key) % len(ps)]
        assert key_hash(key) == zlib.crc32(key)


def test_key_hash_sends_one_key_to_one_partition_even_if_it_is_closed() -> None:
    # Skipping a closed partition would move the key elsewhere and break its order; the broker
    # refuses the send instead.
    ps = parts((0, 0), (0, 1), (0, 2))
    key = next(k for k in (b"k%d" % i for i in range(100)) if zlib.crc32(k) % 3 == 1)
    closed = parts((0, 0), (0, 1), (0, 2), closed={(0, 1)})
    assert KeyHashSelector()("t", closed, msg(key)) == ps[1]


def test_key_hash_without_a_key_is_refused_unless_a_fallback_is_given() -> None:
    ps = parts((0, 0), (0, 1))
    with pytest.raises(InvalidArgument, match=r"needs message\.key"):
        KeyHashSelector()("t", ps, msg())
    sel = KeyHashSelector(fallback=RoundRobinSelector())
    assert [sel("t", ps, msg()).partition for _ in range(3)] == [0, 1, 0]


def test_key_hash_is_stable_across_processes() -> None:
    keys = [b"alpha", b"beta", b"order-42", bytes(range(256))]
    ps = parts(*[(b, p) for b in range(3) for p in range(5)])
    here = [str(KeyHashSelector()("t", ps, msg(k))) for k in keys]
    code = (
        "from metaq.client.metadata import Partition\n"
        "from metaq.client.selectors import KeyHashSelector\n"
        "from metaq.types import Message\n"
        f"keys = {keys!r}\n"
        "ps = sorted(Partition(b, p) for b in range(3) for p in range(5))\n"
        "sel = KeyHashSelector()\n"
        "print([str(sel('t', ps, Message('t', b'v', key=k))) for k in keys])\n"
    )
    for seed in ("1", "12345"):  # Python's own hash() would differ between these
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == str(here)


def test_any_callable_is_a_selector() -> None:
    def last(topic: str, partitions: list[Partition], message: Message) -> Partition:
        return partitions[-1]

    from metaq.client.selectors import PartitionSelector

    sel: PartitionSelector = last
    assert sel("t", parts((0, 0), (0, 1)), msg()) == Partition(0, 1)


def test_sticky_round_robin_stays_on_one_partition_until_its_batch_is_done() -> None:
    ps = parts((0, 0), (0, 1), (1, 0))
    sel = StickyRoundRobinSelector()
    assert {str(sel("t", ps, msg())) for _ in range(50)} == {"0-0"}
    sel.batch_done("t", 0, 1)  # another partition's batch: no move
    assert str(sel("t", ps, msg())) == "0-0"
    sel.batch_done("t", 0, 0)
    assert str(sel("t", ps, msg())) == "0-1"


def test_sticky_round_robin_visits_every_open_partition_in_order_over_time() -> None:
    ps = parts((0, 0), (0, 1), (1, 0), (1, 1), closed=[(1, 0)])
    sel = StickyRoundRobinSelector()
    seen = []
    for _ in range(9):
        p = sel("t", ps, msg())
        seen.append(str(p))
        sel.batch_done("t", p.broker_id, p.partition)
    assert seen == ["0-0", "0-1", "1-1"] * 3


def test_sticky_round_robin_moves_on_when_the_partition_list_changes() -> None:
    sel = StickyRoundRobinSelector()
    first = parts((0, 0), (0, 1))
    assert str(sel("t", first, msg())) == "0-0"
    # A refresh (or a broker left out) hands a new list: the stuck partition is not kept blindly.
    refreshed = parts((0, 1))
    assert str(sel("t", refreshed, msg())) == "0-1"
    assert str(sel("other", first, msg())) == "0-0"  # a counter and a partition per topic


def test_sticky_round_robin_refuses_when_every_partition_is_closed() -> None:
    with pytest.raises(PartitionClosedError):
        StickyRoundRobinSelector()("t", parts((0, 0), closed=[(0, 0)]), msg())


def test_key_hash_with_a_sticky_fallback_keeps_keys_and_passes_batch_done_on() -> None:
    ps = parts((0, 0), (0, 1), (0, 2))
    fallback = StickyRoundRobinSelector()
    sel = KeyHashSelector(fallback=fallback)
    keyed = {str(sel("t", ps, msg(b"user-7"))) for _ in range(10)}
    assert keyed == {str(ps[key_hash(b"user-7") % 3])}
    first = sel("t", ps, msg())
    sel.batch_done("t", first.broker_id, first.partition)
    assert sel("t", ps, msg()) != first
    assert {str(sel("t", ps, msg(b"user-7"))) for _ in range(10)} == keyed
