"""How the ZooKeeper servers are handed to kazoo: each listed often enough that a session request left
unanswered is asked again within seconds, never after a whole session timeout."""

from __future__ import annotations

from kazoo.hosts import collect_hosts

from metaq.cluster.zookeeper.session import CONNECT_ANSWER_S, MAX_HOST_COPIES, kazoo_hosts


def kazoo_connect_wait_s(hosts: str, session_timeout_s: float) -> float:
    """What kazoo waits for the answer to its Connect request: the session timeout over the servers listed."""
    servers, _ = collect_hosts(hosts)
    return session_timeout_s / len(servers)


def test_one_server_is_listed_so_that_an_unanswered_session_request_is_asked_again_within_seconds() -> None:
    hosts = kazoo_hosts("127.0.0.1:2181", 30.0)
    assert set(collect_hosts(hosts)[0]) == {("127.0.0.1", 2181)}
    assert kazoo_connect_wait_s(hosts, 30.0) == CONNECT_ANSWER_S


def test_an_ensemble_keeps_every_server_and_its_chroot() -> None:
    hosts = kazoo_hosts("zk1:2181, zk2:2182,zk3:2183/metaq/prod", 30.0)
    servers, chroot = collect_hosts(hosts)
    assert chroot == "/metaq/prod"
    assert set(servers) == {("zk1", 2181), ("zk2", 2182), ("zk3", 2183)}
    assert servers.count(("zk1", 2181)) == servers.count(("zk3", 2183))  # each as often: none favoured
    assert kazoo_connect_wait_s(hosts, 30.0) <= CONNECT_ANSWER_S * 1.5


def test_a_short_session_lists_each_server_once_and_a_long_one_a_bounded_number_of_times() -> None:
    assert kazoo_hosts("127.0.0.1:2181", 4.0) == "127.0.0.1:2181,127.0.0.1:2181"
    assert kazoo_hosts("127.0.0.1:2181", 1.0) == "127.0.0.1:2181"
    assert kazoo_hosts("a:1,b:2,c:3", 4.0) == "a:1,b:2,c:3"
    servers, _ = collect_hosts(kazoo_hosts("127.0.0.1:2181", 3600.0))
    assert len(servers) == MAX_HOST_COPIES
