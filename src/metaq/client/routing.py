"""Routing around brokers that cannot be reached: which failures may move a batch, and which partitions
producers leave out for a while. Pure logic, no I/O; time comes from the ``clock`` given.

A producer whose selector spreads messages (round robin, random) may move a batch that failed to
another partition, **only when the failure proves the batch was not stored**:

* it was never written: its broker could not be reached (connection refused or closed before the
  write, the reconnect attempts used up), or its broker is no longer in the metadata;
* the broker refused it before appending: ``PARTITION_CLOSED`` (403), ``BROKER_STOPPING`` (503, the
  broker drains), ``UNKNOWN_TOPIC_OR_PARTITION`` (the topic or partition left that broker).

A request that was in flight when its connection broke, or timed out, may have been appended: moving
it could store it twice, so that failure is the send's result (as it always was). Key-hash selectors
never move a batch: a key's order lives in one partition.

:class:`Unavailable` is the session-wide list of brokers and partitions a producer leaves out after
such a failure: each for ``avoid_s`` (then it is tried again), or until the cluster says the broker is
back (a ZooKeeper-mode session forgets a broker's entry when the broker registers again).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from metaq.client.listeners import ChangeListeners
from metaq.errors import (
    BrokerStoppingError,
    MetaqError,
    NotEnoughReplicasError,
    NotMasterError,
    PartitionClosedError,
    ProtocolError,
    UnknownPartitionError,
    UnknownServerError,
    UnknownTopicError,
)
from metaq.types import PartitionId

REFUSED_BEFORE_APPEND: tuple[type[BaseException], ...] = (
    PartitionClosedError, BrokerStoppingError, UnknownPartitionError, UnknownTopicError, NotMasterError,
    NotEnoughReplicasError)
"""Broker answers that say the batch was not appended (a refusal checked before the write)."""

BROKER_UNAVAILABLE: tuple[type[BaseException], ...] = (BrokerStoppingError, UnknownServerError)
"""Reply errors that make the whole broker avoided (the others only the partition)."""

BROKER_WIDE: tuple[type[BaseException], ...] = (BrokerStoppingError, NotEnoughReplicasError, NotMasterError)
"""Refusals that hold for every partition of the broker: a batch refused so moves only to another broker."""

P = TypeVar("P", bound=PartitionId)
_NEVER = float("inf")


def not_stored(exc: BaseException, *, written: bool) -> bool:
    """Whether a failed produce request certainly stored nothing because of where it was going (the broker or
    partition could not take it): moving it to another partition cannot duplicate it, and may succeed there.

    ``written``: the request had been handed to a connection (its failure came as a reply, or as
    the loss of the connection it was in flight on)."""
    if not written:
        return True
    return isinstance(exc, REFUSED_BEFORE_APPEND)


def maybe_stored(exc: BaseException, *, written: bool) -> bool:
    """Whether a failed produce request may have stored its batch anyway: it was written, and its failure is not a
    refusal the broker made before the append (``MetaqError.maybe_stored``). A reply that cannot be read (a
    protocol error) or an error the client does not know may hide a store."""
    if not written:
        return False
    if isinstance(exc, ProtocolError) or not isinstance(exc, MetaqError):
        return True
    return exc.maybe_stored


class Unavailable:
    """Brokers and partitions to leave out for a while (shared by a session's producers)."""

    def __init__(self, avoid_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.avoid_s = avoid_s
        self._clock = clock
        self._brokers: dict[int, float] = {}
        self._partitions: dict[tuple[str, PartitionId], float] = {}
        self.version = 0
        """Changes whenever the set changes: callers cache filtered partition lists against it."""
        self.listeners = ChangeListeners()
        """Told whenever the set changes (with :attr:`version`)."""
        self._next_expiry = _NEVER

    def avoid_broker(self, broker_id: int) -> None:
        self._add(self._brokers, broker_id)

    def avoid_partition(self, topic: str, partition: PartitionId) -> None:
        self._add(self._partitions, (topic, PartitionId(partition.broker_id, partition.partition)))

    def _add(self, table: dict[Any, float], key: object) -> None:
        until = self._clock() + self.avoid_s
        added = key not in table
        table[key] = until
        self._next_expiry = min(self._next_expiry, until)
        if added:
            self.version += 1
            self.listeners.changed()

    def forget_broker(self, broker_id: int) -> None:
        """The broker is back (it registered again, or answered): stop avoiding it and its partitions."""
        changed = self._brokers.pop(broker_id, None) is not None
        for key in [k for k in self._partitions if k[1].broker_id == broker_id]:
            del self._partitions[key]
            changed = True
        if changed:
            self.version += 1
            self._next_expiry = self._earliest_expiry()
            self.listeners.changed()

    def _expire(self) -> None:
        if self._next_expiry == _NEVER:  # nothing avoided: the producer's hot path ends here
            return
        now = self._clock()
        if now < self._next_expiry:
            return
        version = self.version
        for broker_id in [k for k, until in self._brokers.items() if until <= now]:
            del self._brokers[broker_id]
            self.version += 1
        for key in [k for k, until in self._partitions.items() if until <= now]:
            del self._partitions[key]
            self.version += 1
        self._next_expiry = self._earliest_expiry()
        if self.version != version:
            self.listeners.changed()

    def _earliest_expiry(self) -> float:
        return min([*self._brokers.values(), *self._partitions.values()], default=_NEVER)

    def avoiding(self) -> bool:
        """Whether any broker or partition is left out now (expired entries dropped first)."""
        self._expire()
        return self._next_expiry != _NEVER

    def broker_avoided(self, broker_id: int) -> bool:
        self._expire()
        return broker_id in self._brokers

    def current_version(self) -> int:
        """:attr:`version` after dropping the expired entries (cheap when nothing expired)."""
        self._expire()
        return self.version

    def usable(self, topic: str, partitions: Sequence[P]) -> Sequence[P]:
        """``partitions`` without the avoided ones (the same object when none is avoided)."""
        self._expire()
        if not self._brokers and not self._partitions:
            return partitions
        kept = [p for p in partitions
                if p.broker_id not in self._brokers
                and (topic, PartitionId(p.broker_id, p.partition)) not in self._partitions]
        return partitions if len(kept) == len(partitions) else tuple(kept)

    def __len__(self) -> int:
        self._expire()
        return len(self._brokers) + len(self._partitions)
