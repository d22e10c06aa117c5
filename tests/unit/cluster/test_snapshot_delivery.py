"""The ZooKeeper registry's listeners get its snapshots in version order, whatever threads build them.

kazoo runs watch callbacks on more than one thread (a DataWatch spawns a thread when its node is
deleted and made again between two of its reads, which is what a master handing over does to its topic
nodes). A listener that keeps the last snapshot it was given, as the client's metadata does, must never be
handed an older snapshot after a newer one: it would keep a cluster view with the new master's topic
node missing until the next change."""

from __future__ import annotations

import threading

from metaq.cluster.zookeeper import ZooKeeperRegistry
from metaq.testing import wait_until


def _change(registry: ZooKeeperRegistry, node: str, partitions: int) -> None:
    """What a watch callback does: change the watched state under the lock, then publish a snapshot."""
    with registry._lock:
        registry._topics[True].setdefault("orders", {})[node] = partitions
    registry._publish()


def test_a_snapshot_built_while_another_is_delivered_reaches_listeners_after_it() -> None:
    registry = ZooKeeperRegistry("127.0.0.1:1", "/metaq-unit")  # never started: its callbacks are called here
    seen: list[int] = []
    newer_delivered = threading.Event()
    other = threading.Thread(target=_change, args=(registry, "2-m", 4))

    def first_listener(snapshot: object) -> None:
        version = snapshot.version  # type: ignore[attr-defined]
        if other.ident is None:  # the first delivery (this thread's): another thread changes the cluster now
            other.start()
            wait_until(lambda: registry.snapshot().version > version, 10, message="the other thread's snapshot")
            # Were it delivered now, the second listener would get it before this older one. It must wait
            # for this delivery to end; this bounded wait is for the event that must not happen.
            newer_delivered.wait(1.0)

    def second_listener(snapshot: object) -> None:
        seen.append(snapshot.version)  # type: ignore[attr-defined]
        if len(seen) == 1 and snapshot is registry.snapshot() and threading.current_thread() is other:
            newer_delivered.set()

    registry.add_listener(first_listener)
    registry.add_listener(second_listener)
    _change(registry, "1-m", 3)
    other.join(10)
    assert not other.is_alive()
    assert seen == sorted(set(seen)), f"snapshots delivered out of version order: {seen}"
    assert seen[-1] == registry.snapshot().version == 2, seen
    assert dict(registry.snapshot().topics["orders"].publish) == {1: 3, 2: 4}

