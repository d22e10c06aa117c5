"""The ZooKeeper registry's cluster view under the callback orders kazoo can produce.

kazoo runs watch callbacks on more than one thread: a DataWatch spawns a thread when its node is deleted
and made again between two of its reads, which is what a master handing over does to its broker and topic
nodes. So (1) a listener must never be handed an older snapshot after a newer one (the client's metadata
keeps the last one it got), and (2) a children list read before a node came back may be applied after
the node's own data watch saw it back: the node must stay in the view. Both were seen as a producer
finding every partition of a topic closed, or a slave not finding its new master, for tens of seconds
after `metaq admin promote`. The callbacks are called here in those orders (no ZooKeeper needed)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from metaq.cluster.registry import Address, TopicEntry
from metaq.cluster.zookeeper import ZooKeeperRegistry, view
from metaq.testing import wait_until


def _change(registry: ZooKeeperRegistry, node: str, partitions: int) -> None:
    """What a watch callback does: change the watched state under the lock, then publish a snapshot."""
    with registry.session.lock:
        registry.view._topics[True].setdefault("orders", {})[node] = partitions
    registry.view._publish()


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



class Callbacks:
    """A registry whose ZooKeeper watches are recorded instead of set: ``zk`` is what a read would see, and
    ``data[path](value)`` is what kazoo calls when the node's watch fires (the latest watch of the path)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.registry = ZooKeeperRegistry("127.0.0.1:1", "/v")
        self.zk: dict[str, bytes] = {}
        self.data: dict[str, Callable[[bytes | None], object]] = {}
        callbacks = self

        class FakeDataWatch:
            def __init__(self, _client: object, path: str, func: Callable[[bytes | None, object], object]) -> None:
                callbacks.data[path] = lambda value: func(value, None)
                func(callbacks.zk.get(path), None)  # a DataWatch reads the node when it is made

        monkeypatch.setattr(view, "DataWatch", FakeDataWatch)
        monkeypatch.setattr(view, "ChildrenWatch", lambda *_args: None)  # the test calls those itself


MASTER = "/v/brokers/ids/1/master"
PUB = "/v/brokers/topics-pub/orders/1-m"
PUB_DATA = b'{"numParts":3,"broker":"1-m"}'


def test_a_master_node_made_again_stays_in_the_view_whatever_order_the_callbacks_run_in(
        monkeypatch: pytest.MonkeyPatch) -> None:
    c = Callbacks(monkeypatch)
    c.zk[MASTER] = b"meta://127.0.0.1:9001"
    c.registry.view._on_broker_ids(["1"])
    c.registry.view._on_broker_nodes(1, ["master"])
    assert c.registry.snapshot().address(1) == Address("127.0.0.1", 9001)
    # the old master deletes its node, the new one makes it; the children watch read [] in between, but its
    # callback runs after the data watch's (spawned) read of the new node
    c.zk[MASTER] = b"meta://127.0.0.1:9002"
    c.data[MASTER](c.zk[MASTER])
    c.registry.view._on_broker_nodes(1, [])
    c.registry.view._on_broker_nodes(1, ["master"])  # the children watch's next event
    assert c.registry.snapshot().address(1) == Address("127.0.0.1", 9002)
    # and a real deletion, reported by the node's own watch, takes it out
    del c.zk[MASTER]
    c.data[MASTER](None)
    assert c.registry.snapshot().address(1) is None


def test_a_topic_that_leaves_and_comes_back_is_watched_again(monkeypatch: pytest.MonkeyPatch) -> None:
    c = Callbacks(monkeypatch)
    c.zk[PUB] = PUB_DATA
    c.registry.view._on_topics(True, ["orders"])
    c.registry.view._on_topic_nodes(True, "orders", ["1-m"])
    assert dict(c.registry.snapshot().topics["orders"].publish) == {1: 3}
    c.registry.view._on_topics(True, [])
    assert "orders" not in c.registry.snapshot().topics
    c.registry.view._on_topics(True, ["orders"])
    c.registry.view._on_topic_nodes(True, "orders", ["1-m"])
    assert dict(c.registry.snapshot().topics["orders"].publish) == {1: 3}


def test_a_node_made_again_whose_watch_stays_silent_comes_back_into_the_view(monkeypatch: pytest.MonkeyPatch) -> None:
    """Were the watch's event for the new node ever missed, the view must not lack it for good: the children
    callback reads a listed node the view lacks, and the registry looks again a moment after a deletion."""
    c = Callbacks(monkeypatch)
    c.zk[PUB] = PUB_DATA
    c.registry.view._on_topics(True, ["orders"])
    c.registry.view._on_topic_nodes(True, "orders", ["1-m"])
    del c.zk[PUB]
    c.data[PUB](None)
    assert 1 not in c.registry.snapshot().topics.get("orders", TopicEntry("orders", {}, {}, {})).publish
    c.zk[PUB] = PUB_DATA  # made again; its watch says nothing
    c.registry.view._on_topic_nodes(True, "orders", ["1-m"])  # the children watch lists it
    assert dict(c.registry.snapshot().topics["orders"].publish) == {1: 3}

    # and with no children callback either: the look a moment after the deletion finds it
    class Client:
        def exists(self, path: str) -> object:
            return object() if path in c.zk else None

        def stop(self) -> None: ...

        def close(self) -> None: ...

    monkeypatch.setattr(view, "RECHECK_AFTER_DELETE_S", (0.0,))
    monkeypatch.setattr(c.registry.session, "client", Client())
    c.registry.session._worker.start()
    try:
        c.data[PUB](None)  # a deletion read before the node was made again; the event of its creation is lost
        wait_until(lambda: 1 in c.registry.snapshot().topics.get("orders", TopicEntry("orders", {}, {}, {}))
                   .publish, 10, message="the node made again to be seen")
    finally:
        c.registry.close()
