"""The ZooKeeper registry against a real ZooKeeper: MetaQ's znodes written exactly, a watched snapshot
that follows brokers and topics coming and going, registrations made again after a session expiry,
garbage znodes ignored, and the group operations (members, owners, offsets)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.exceptions import KazooException

from metaq.cluster.registry import Address, BrokerIdTaken, RegistryError
from metaq.cluster.zookeeper import ZooKeeperRegistry
from metaq.testing import wait_until
from metaq.testing.zookeeper import ZooKeeperServer, expire_session, unique_root
from metaq.types import PartitionId as P


@pytest.fixture(scope="module")
def zk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    with ZooKeeperServer(tmp_path_factory.mktemp("zk")) as server:
        yield server


@pytest.fixture
def registries(zk: ZooKeeperServer) -> Iterator[tuple[str, list[ZooKeeperRegistry]]]:
    made: list[ZooKeeperRegistry] = []
    yield unique_root(), made
    for registry in made:
        registry.close()


def open_registry(zk: ZooKeeperServer, root: str, made: list[ZooKeeperRegistry], **kw: object) -> ZooKeeperRegistry:
    registry = ZooKeeperRegistry(zk.connect_string, root, session_timeout_ms=4000, **kw)  # type: ignore[arg-type]
    made.append(registry)
    return registry.start()


def test_brokers_and_topics_are_written_in_metaqs_layout_and_watched(zk, registries) -> None:
    root, made = registries
    watcher = open_registry(zk, root, made)
    b1 = open_registry(zk, root, made, watch_cluster=False)
    b2 = open_registry(zk, root, made, watch_cluster=False)
    b1.register_broker(1, Address("127.0.0.1", 9001))
    b2.register_broker(2, Address("127.0.0.1", 9002))
    b1.publish_topic("orders", 3, accept_publish=True, accept_subscribe=True)
    b2.publish_topic("orders", 2, accept_publish=False, accept_subscribe=True)

    raw = watcher.raw_client()
    assert raw.get(f"{root}/brokers/ids/1/master")[0] == b"meta://127.0.0.1:9001"
    assert raw.get(f"{root}/brokers/topics-pub/orders/1-m")[0] == b'{"numParts":3,"broker":"1-m"}'
    assert raw.exists(f"{root}/brokers/topics-pub/orders/2-m") is None  # acceptPublish=false
    assert raw.get(f"{root}/brokers/topics-sub/orders/2-m")[0] == b'{"numParts":2,"broker":"2-m"}'
    for path in (f"{root}/brokers/ids/1/master", f"{root}/brokers/topics-sub/orders/1-m"):
        assert raw.get(path)[1].ephemeralOwner == b1.session_id

    def view() -> tuple[list[str], list[str], dict[int, Address | None]]:
        s = watcher.snapshot()
        return ([str(p) for p in s.partitions("orders", publish=True)],
                [str(p) for p in s.partitions("orders", publish=False)],
                {b: e.master for b, e in s.brokers.items()})

    wait_until(lambda: view() == (["1-0", "1-1", "1-2"], ["1-0", "1-1", "1-2", "2-0", "2-1"],
                                  {1: Address("127.0.0.1", 9001), 2: Address("127.0.0.1", 9002)}),
               10, message="the watcher to see both brokers and the topic")
    b2.publish_topic("orders", 4, accept_publish=True, accept_subscribe=True)  # a reload grew it
    wait_until(lambda: view()[0] == ["1-0", "1-1", "1-2", "2-0", "2-1", "2-2", "2-3"], 10,
               message="the grown topic")
    b1.close()  # a broker gone: its ephemeral nodes with it
    wait_until(lambda: view() == (["2-0", "2-1", "2-2", "2-3"], ["2-0", "2-1", "2-2", "2-3"],
                                  {2: Address("127.0.0.1", 9002)}), 10, message="broker 1 to vanish")
    b2.withdraw_topic("orders")
    wait_until(lambda: "orders" not in watcher.snapshot().topics, 10, message="the withdrawn topic")
    b2.deregister()
    wait_until(lambda: not watcher.snapshot().brokers.get(2) or watcher.snapshot().brokers[2].master is None, 10,
               message="the deregistered broker")


def test_a_second_live_broker_with_the_same_id_is_refused(zk, registries) -> None:
    root, made = registries
    first = open_registry(zk, root, made, watch_cluster=False)
    first.register_broker(5, Address("127.0.0.1", 9005))
    second = open_registry(zk, root, made, watch_cluster=False)
    with pytest.raises(BrokerIdTaken, match="broker id 5 is already registered"):
        second.register_broker(5, Address("127.0.0.1", 9999))


def test_a_restarted_broker_waits_for_its_previous_session_then_registers(zk, registries) -> None:
    root, made = registries
    old = open_registry(zk, root, made, watch_cluster=False)
    old.register_broker(6, Address("127.0.0.1", 9006))
    new = open_registry(zk, root, made, watch_cluster=False)
    # the old process is "killed": its session lives on until ZooKeeper expires it
    expire_session(old.raw_client(), zk)  # stands in for the timeout running out
    old.close()
    new.register_broker(6, Address("127.0.0.1", 9006))
    assert new.raw_client().get(f"{root}/brokers/ids/6/master")[1].ephemeralOwner == new.session_id


def test_registrations_come_back_after_a_session_expiry(zk, registries) -> None:
    root, made = registries
    watcher = open_registry(zk, root, made)
    broker = open_registry(zk, root, made, watch_cluster=False)
    broker.register_broker(7, Address("127.0.0.1", 9007))
    broker.publish_topic("t", 2, accept_publish=True, accept_subscribe=True)
    wait_until(lambda: watcher.snapshot().partitions("t", publish=True) == [P(7, 0), P(7, 1)], 10,
               message="the registration")
    old_session = broker.session_id
    expire_session(broker.raw_client(), zk)

    def made_again() -> bool:
        try:
            _, stat = watcher.raw_client().get(f"{root}/brokers/topics-pub/t/7-m")
        except KazooException:
            return False
        return bool(stat.ephemeralOwner == broker.session_id != old_session)

    wait_until(made_again, 30, message="the nodes to be made again on the new session")
    wait_until(lambda: watcher.snapshot().partitions("t", publish=True) == [P(7, 0), P(7, 1)], 10,
               message="the watcher to see them again")


def test_garbage_in_a_znode_is_logged_and_ignored(zk, registries, caplog) -> None:
    root, made = registries
    watcher = open_registry(zk, root, made)
    raw = watcher.raw_client()
    broker = open_registry(zk, root, made, watch_cluster=False)
    broker.register_broker(8, Address("127.0.0.1", 9008))
    broker.publish_topic("good", 1, accept_publish=True, accept_subscribe=True)
    with caplog.at_level(logging.ERROR, logger="metaq.cluster.zookeeper"):
        raw.create(f"{root}/brokers/ids/x9/master", b"meta://h:1", makepath=True)
        raw.create(f"{root}/brokers/ids/9/master", b"\xff\xfegarbage", makepath=True)
        raw.create(f"{root}/brokers/topics-pub/good/9-m", b"{not json", makepath=True)
        raw.create(f"{root}/brokers/topics-pub/good/oops", b"{}", makepath=True)
        wait_until(lambda: len([r for r in caplog.records if "not in MetaQ's layout" in r.message]) >= 4, 10,
                   message="each bad znode to be reported")
    snapshot = watcher.snapshot()
    assert snapshot.partitions("good", publish=True) == [P(8, 0)]
    assert snapshot.address(9) is None and 8 in snapshot.brokers


def test_group_members_owners_and_offsets(zk, registries) -> None:
    root, made = registries
    a = open_registry(zk, root, made, watch_cluster=False)
    b = open_registry(zk, root, made, watch_cluster=False)
    changes: list[int] = []
    a.watch_members("g", lambda: changes.append(1))
    a.register_member("g", "g_a", ["t", "u"])
    b.register_member("g", "g_b", ["t"])
    wait_until(lambda: a.members("g") == {"g_a": ["t", "u"], "g_b": ["t"]}, 10, message="both members")
    assert a.claim("g", "t", P(1, 0), "g_a")
    assert not b.claim("g", "t", P(1, 0), "g_b"), "an owned partition cannot be claimed"
    b.release("g", "t", P(1, 0), "g_b")  # not the owner: nothing happens
    assert a.owners("g", "t") == {P(1, 0): "g_a"}
    a.release("g", "t", P(1, 0), "g_a")
    assert b.claim("g", "t", P(1, 0), "g_b")
    b.commit_offsets("g", {("t", P(1, 0)): 42, ("t", P(2, 3)): 7})
    b.commit_offsets("g", {("t", P(1, 0)): 43})
    assert (a.load_offset("g", "t", P(1, 0)), a.load_offset("g", "t", P(2, 3)), a.load_offset("g", "t", P(9, 9))) \
        == (43, 7, None)
    assert a.raw_client().get(f"{root}/consumers/g/offsets/t/1-0")[0] == b"-1-43"
    b.close()  # a dead member: its registration and its ownerships vanish
    wait_until(lambda: a.members("g") == {"g_a": ["t", "u"]} and a.owners("g", "t") == {}, 10,
               message="the dead member's nodes to vanish")
    assert changes, "member changes were watched"


def test_an_unreachable_zookeeper_is_a_clear_error(tmp_path: Path) -> None:
    from metaq.testing import unused_port

    registry = ZooKeeperRegistry(f"127.0.0.1:{unused_port()}", connection_timeout_ms=1500)
    with pytest.raises(RegistryError, match=r"cannot reach ZooKeeper at 127\.0\.0\.1:"):
        registry.start()
