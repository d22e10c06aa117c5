"""Which failures may move a batch, and the list of brokers and partitions producers leave out for a while."""

from __future__ import annotations

from metaq.client.metadata import Partition
from metaq.client.routing import Unavailable, not_stored
from metaq.client.selectors import KeyHashSelector, RandomSelector, RoundRobinSelector
from metaq.errors import (
    BrokerStoppingError,
    ConnectionClosedError,
    PartitionClosedError,
    RequestTimeoutError,
    StorageFailureError,
    UnknownPartitionError,
)
from metaq.testing import FakeClock
from metaq.types import PartitionId

PARTS = tuple(Partition(b, p) for b in (1, 2, 3) for p in (0, 1))


def test_a_request_never_written_or_refused_before_the_append_was_not_stored() -> None:
    for exc in (ConnectionClosedError("cannot connect"), RequestTimeoutError("late")):
        assert not_stored(exc, written=False)
    for exc in (PartitionClosedError("closed"), BrokerStoppingError("stopping"), UnknownPartitionError("gone")):
        assert not_stored(exc, written=True)
    # In flight when the connection broke, late, or written but not made durable: maybe stored.
    for exc in (ConnectionClosedError("lost"), RequestTimeoutError("late"), StorageFailureError("fsync")):
        assert not not_stored(exc, written=True)


def test_an_avoided_broker_is_left_out_until_its_time_is_up_or_it_is_back() -> None:
    clock = FakeClock()
    unavailable = Unavailable(2.0, clock)
    assert unavailable.usable("t", PARTS) is PARTS  # nothing avoided: the same tuple, no copy
    v0 = unavailable.current_version()
    unavailable.avoid_broker(2)
    assert unavailable.current_version() != v0
    assert [str(p) for p in unavailable.usable("t", PARTS)] == ["1-0", "1-1", "3-0", "3-1"]
    clock.advance_s(1.9)
    assert unavailable.broker_avoided(2)
    clock.advance_s(0.2)
    assert not unavailable.broker_avoided(2)
    assert unavailable.usable("t", PARTS) is PARTS
    unavailable.avoid_broker(3)
    unavailable.forget_broker(3)  # it registered again
    assert unavailable.usable("t", PARTS) is PARTS and len(unavailable) == 0


def test_an_avoided_partition_is_left_out_of_its_topic_only() -> None:
    unavailable = Unavailable(2.0, FakeClock())
    unavailable.avoid_partition("t", PartitionId(1, 1))
    assert PartitionId(1, 1) not in unavailable.usable("t", PARTS)
    assert unavailable.usable("other", PARTS) is PARTS
    unavailable.forget_broker(1)
    assert unavailable.usable("t", PARTS) is PARTS


def test_spreading_selectors_may_move_batches_and_key_hash_may_not() -> None:
    assert RoundRobinSelector.reroutable and RandomSelector.reroutable
    assert not KeyHashSelector.reroutable
    assert not getattr(lambda topic, partitions, message: partitions[0], "reroutable", False)
