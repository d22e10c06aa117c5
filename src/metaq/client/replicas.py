"""Which copy of a partition a consumer reads: its master, or one of the master's slaves.

MetaQ lets consumers read from a master or its slaves (docs/replication.md). A session's
``read_from`` (:class:`~metaq.client.config.ClientConfig`) chooses, for every fetch of the pull
consumer and of group consumers:

* ``"master"`` (the default): the partition's master, which holds every acknowledged message first; while
  its replica group has no master (it died and no slave took over, or its session expired), a live slave;
* ``"slave"``: a live slave of the partition's broker id, never the master: with none live, fetches
  wait (retried with backoff, woken by ZooKeeper changes) until one registers;
* ``"prefer-slave"``: a live slave when there is one, the master otherwise.

A slave is *live* for a topic while ZooKeeper holds both ``brokers/ids/<id>/slave<n>`` and
``brokers/topics-sub/<topic>/<id>-s<n>`` (cluster mode only: slaves are found there). Among several,
each partition picks one at random and keeps it while it stays live, so a group's partitions spread
over the slaves. A slave that could not be reached (a refused connection, a timeout, a broker error)
is passed over for ``unreachable_avoid_s``: ``prefer-slave`` reads from the master meanwhile and goes
back to a slave afterwards; ``slave`` tries another slave, or the same again when it is the only one.

Every switch happens between two fetches at the consumer's own next offset, and a slave's log is a
byte-for-byte prefix of its master's (same offsets, same ids), so a switch neither skips nor repeats a
message. A slave may be behind its master (its lag, ``metaq cluster``): an offset past the slave's log
end is waited for, never jumped over or reset (:class:`metaq.client.fetcher.Fetcher`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from metaq.net.servers import Address
from metaq.types import PartitionId

if TYPE_CHECKING:
    from metaq.cluster.registry import ClusterSnapshot

__all__ = ["READ_FROM_CHOICES", "ReadFrom", "ReadReplica", "ReplicaChooser", "live_slaves"]

ReadFrom = Literal["master", "slave", "prefer-slave"]
READ_FROM_CHOICES: tuple[ReadFrom, ...] = ("master", "slave", "prefer-slave")

MASTER = -1
"""The ``slave_id`` of a master."""


@dataclass(frozen=True, slots=True)
class ReadReplica:
    """One copy of a replica group to read from: the master (``slave_id`` -1) or slave ``slave_id``."""

    broker_id: int
    slave_id: int
    address: Address

    @property
    def is_slave(self) -> bool:
        return self.slave_id != MASTER

    def __str__(self) -> str:
        role = f"slave{self.slave_id}" if self.is_slave else "master"
        return f"{role} of broker {self.broker_id} at {self.address[0]}:{self.address[1]}"


def live_slaves(snapshot: ClusterSnapshot, topic: str, broker_id: int) -> dict[int, Address]:
    """Slave id -> address of each slave of ``broker_id`` registered and serving ``topic`` to consumers."""
    broker = snapshot.brokers.get(broker_id)
    entry = snapshot.topics.get(topic)
    if broker is None or entry is None:
        return {}
    return {s: (a.host, a.port) for s, a in sorted(broker.slaves.items()) if (broker_id, s) in entry.subscribe_slaves}


class ReplicaChooser:
    """The choice of ``read_from``, remembered per partition (sticky) with recently failed slaves avoided.

    Pure bookkeeping: no I/O, no asyncio; the clock and the randomness are injected."""

    def __init__(self, read_from: ReadFrom, avoid_s: float, *, clock: Callable[[], float] = time.monotonic,
                 rand: random.Random | None = None) -> None:
        self.read_from = read_from
        self.avoid_s = avoid_s
        self._clock = clock
        self._rand = rand or random.Random()
        self._chosen: dict[tuple[str, PartitionId], int] = {}
        self._avoid_until: dict[Address, float] = {}

    def choose(self, snapshot: ClusterSnapshot, topic: str, partition: PartitionId,
               master: Address | None) -> ReadReplica | None:
        """The copy to read ``topic``:``partition`` from now; None when ``read_from`` allows none. Whatever
        ``read_from`` says, a replica group with no master is read from a live slave: its copy is the
        master's prefix, and it is the only one left (docs/replication.md)."""
        broker_id = partition.broker_id
        if self.read_from == "master" and master is not None:
            return ReadReplica(broker_id, MASTER, master)
        slaves = live_slaves(snapshot, topic, broker_id)
        now = self._clock()
        usable = {s: a for s, a in slaves.items() if self._avoid_until.get(a, 0.0) <= now}
        if not usable and (self.read_from == "slave" or master is None):
            usable = slaves  # every slave failed lately: try them again rather than read nothing
        if usable:
            key = (topic, partition)
            slave_id = self._chosen.get(key)
            if slave_id not in usable:
                slave_id = self._rand.choice(sorted(usable))
                self._chosen[key] = slave_id
            return ReadReplica(broker_id, slave_id, usable[slave_id])
        if self.read_from == "prefer-slave" and master is not None:
            return ReadReplica(broker_id, MASTER, master)
        return None

    def failed(self, replica: ReadReplica) -> None:
        """``replica`` could not serve a fetch: pass it over for ``avoid_s`` (masters are never avoided)."""
        if replica.is_slave:
            self._avoid_until[replica.address] = self._clock() + self.avoid_s
