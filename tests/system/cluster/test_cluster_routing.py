"""Producers and pull consumers on a ZooKeeper-mode cluster (real ZooKeeper, real broker processes), the
client in cluster mode (``zk_connect``), under load and under faults:

* 3 brokers, 100k messages round robin land evenly and all read back exactly; key hash keeps each key in
  one partition, in order;
* a broker joining under load is produced to within seconds;
* a broker killed (-9) under load: round robin goes on with the others, the only failures are the
  requests in flight on its connections; after its restart every acknowledged message is there;
* ZooKeeper stopped and started under load: producing and consuming go on with the metadata the client
  has, nothing is lost;
* a pull consumer follows its partition's broker through a restart on another port.

Every history is checked the same way (metaq.testing.history): every acknowledged message read back at
its partition and offset, once, in order; nothing read that was not sent, or whose failure said it was
not stored.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from metaq.client import KeyHashSelector, Message, connect
from metaq.testing import BrokerProcess, wait_until
from metaq.testing.history import ProduceLoad, check_history, maybe_stored, read_back
from metaq.testing.zookeeper import ZooKeeperServer, cluster_config, unique_root
from metaq.types import PartitionId

pytestmark = pytest.mark.slow

TOPIC = "[topic=t]\nnumPartitions=2\n"


def zk_session(zookeeper: Any, zk_root: str, **options: Any) -> dict[str, Any]:
    return {"zk_connect": zookeeper.connect_string, "zk_root": zk_root, **options}


def test_round_robin_spreads_100k_evenly_over_three_brokers_and_all_read_back(
        cluster_factory: Callable[..., BrokerProcess], zookeeper: Any, zk_root: str) -> None:
    for b in (1, 2, 3):
        cluster_factory(b, topics=TOPIC)
    load = ProduceLoad(zk_session(zookeeper, zk_root), "t", limit=100_000, window=2000).start()
    wait_until(lambda: not load.running, 120, message="100k round-robin sends")
    load.stop()
    assert not load.failed
    per_partition = collections.Counter(a.partition for a in load.acked.values())
    assert sorted(per_partition) == [PartitionId(b, p) for b in (1, 2, 3) for p in (0, 1)]
    # Round robin over the 6 partitions, one message after the other: every partition within one message.
    assert max(per_partition.values()) - min(per_partition.values()) <= 1, per_partition
    with connect(**zk_session(zookeeper, zk_root)) as session:
        read = read_back(session, "t")
    assert sum(map(len, read.values())) == 100_000
    assert check_history(read, load.acked, load.failed) == []


def test_key_hash_keeps_each_key_in_one_partition_in_order(
        cluster_factory: Callable[..., BrokerProcess], zookeeper: Any, zk_root: str) -> None:
    for b in (1, 2, 3):
        cluster_factory(b, topics=TOPIC)
    keys = [b"customer-%d" % k for k in range(40)]
    with connect(**zk_session(zookeeper, zk_root)) as session:
        producer = session.create_producer(KeyHashSelector())
        futures = [producer.send_async(Message("t", b"%s:%05d" % (keys[n % 40], n // 40), key=keys[n % 40]))
                   for n in range(8000)]
        assert all(f.result(60).success for f in futures)
        read = read_back(session, "t")
    where: dict[bytes, set[PartitionId]] = collections.defaultdict(set)
    sequence: dict[bytes, list[int]] = collections.defaultdict(list)
    for pid, messages in read.items():
        for _, data in messages:
            key, seq = data.rsplit(b":", 1)
            where[key].add(pid)
            sequence[key].append(int(seq))
    assert set(where) == set(keys)
    assert all(len(parts) == 1 for parts in where.values()), where
    assert all(seqs == list(range(200)) for seqs in sequence.values())
    assert len({next(iter(p)) for p in where.values()}) > 3  # the keys are spread over the brokers


def test_a_broker_joining_under_load_is_produced_to_within_seconds(
        cluster_factory: Callable[..., BrokerProcess], zookeeper: Any, zk_root: str) -> None:
    cluster_factory(1, topics=TOPIC)
    cluster_factory(2, topics=TOPIC)
    load = ProduceLoad(zk_session(zookeeper, zk_root), "t", time_limit_s=90).start()
    try:
        wait_until(lambda: len(load.acked) > 2000, 30, message="load on two brokers")
        assert load.by_broker[3] == 0
        cluster_factory(3, topics=TOPIC)  # returns once it serves; it registers right after
        joined = time.monotonic()
        wait_until(lambda: load.by_broker[3] > 0, 10, message="the joining broker's partitions to be produced to")
        assert load.first_ack[3] - joined < 5
        before = load.by_broker[3]
        wait_until(lambda: load.by_broker[3] - before > 1000, 30, message="more load on broker 3")
    finally:
        load.stop()
    assert not load.failed
    with connect(**zk_session(zookeeper, zk_root)) as session:
        assert check_history(read_back(session, "t"), load.acked, load.failed) == []


def test_a_broker_killed_under_load_costs_only_its_requests_in_flight_and_loses_nothing_acknowledged(
        cluster_factory: Callable[..., BrokerProcess], zookeeper: Any, zk_root: str) -> None:
    brokers = {b: cluster_factory(b, topics=TOPIC, zk_session_timeout_ms=3000) for b in (1, 2, 3)}
    window = 400
    load = ProduceLoad(zk_session(zookeeper, zk_root, unreachable_avoid_s=1.0), "t", window=window,
                       time_limit_s=120).start()
    try:
        wait_until(lambda: len(load.acked) > 5000, 30, message="load on three brokers")
        brokers[2].kill()
        killed_at = len(load.acked)
        # Round robin leaves broker 2 out (tried again each unreachable_avoid_s until its session
        # expires and ZooKeeper drops it), so the others take the whole load meanwhile; a batch sent to it
        # again finds the connection refused before anything is written and is moved to another partition.
        # Both are waited for before the restart: with the load fast enough, 20,000 acks come before the
        # first retry of broker 2 (unreachable_avoid_s), and a restarted broker accepts connections again.
        wait_until(lambda: len(load.acked) > killed_at + 20_000 and load.rerouted > 0, 60,
                   message="round robin to go on without broker 2, moving the batches it refused")
        brokers[2].start()  # same port: it waits for its previous session to expire, then registers
        back = load.by_broker[2]
        wait_until(lambda: load.by_broker[2] > back + 1000, 30, message="broker 2 produced to again after its restart")
    finally:
        load.stop()
    # What surfaced: only requests that were in flight on broker 2's connections when it died (a
    # connection refused before anything was written is moved to another partition, not reported).
    assert len(load.failed) <= window, f"{len(load.failed)} failures"
    assert all(maybe_stored(e) for e in load.failed.values()), collections.Counter(map(repr, load.failed.values()))
    assert load.rerouted > 0
    with connect(**zk_session(zookeeper, zk_root)) as session:
        assert check_history(read_back(session, "t"), load.acked, load.failed) == []
    print(f"killed broker 2 under load: {len(load.failed)} sends failed (in flight), {load.rerouted} batches "
          f"moved, {len(load.acked)} acknowledged")


def test_zookeeper_stopped_and_restarted_under_load_producing_and_consuming_go_on(
        tmp_path: Path, broker_factory: Callable[..., BrokerProcess]) -> None:
    with ZooKeeperServer(tmp_path / "zk") as zk:
        root = unique_root()
        for b in (1, 2):
            broker_factory(config_text=cluster_config(b, zk.connect_string, root, 10_000, {}, TOPIC), name=f"b{b}")
        session_options = {"zk_connect": zk.connect_string, "zk_root": root, "zk_session_timeout_ms": 10_000}
        load = ProduceLoad(session_options, "t", time_limit_s=120).start()
        consumed = [0]  # messages read from 1-0 (one writer: the reader thread)
        stop_consuming = threading.Event()

        def consume() -> None:  # one pull consumer per partition would do the same; one is enough here
            with connect(**session_options) as session:
                consumer = session.create_pull_consumer()
                for batch in consumer.iterate_batches("t", "1-0", "earliest", max_wait_ms=200):
                    consumed[0] += len(batch)
                    if stop_consuming.is_set():
                        return

        reader = threading.Thread(target=consume, daemon=True)
        reader.start()
        try:
            wait_until(lambda: len(load.acked) > 2000 and consumed[0] > 200, 30, message="load before the stop")
            zk.stop()
            acked, read = len(load.acked), consumed[0]
            wait_until(lambda: len(load.acked) > acked + 5000 and consumed[0] > read + 500, 30,
                       message="producing and consuming to go on while ZooKeeper is down")
            zk.start()
            acked, read = len(load.acked), consumed[0]
            wait_until(lambda: len(load.acked) > acked + 5000 and consumed[0] > read + 500, 60,
                       message="producing and consuming after ZooKeeper is back")
        finally:
            stop_consuming.set()
            load.stop()
            with connect(**session_options) as session:  # wakes the reader's long poll: it sees the stop
                # (broker 1 may still be registering again after a session expiry: see the read back below)
                wait_until(lambda: any((p.broker_id, p.partition) == (1, 0) for p in session.partitions("t")), 30,
                           message="partition 1-0 in the cluster's metadata again")
                session.create_producer(lambda topic, partitions, message: next(
                    p for p in partitions if (p.broker_id, p.partition) == (1, 0))).send(Message("t", b"wake"))
            reader.join(30)
        assert not reader.is_alive()
        assert not load.failed, collections.Counter(map(repr, load.failed.values()))
        assert {a.partition.broker_id for a in load.acked.values()} == {1, 2}
        with connect(**session_options) as session:
            # A broker whose ZooKeeper session expired while the server was down (it could not reconnect
            # in time: the restarted server was slow to answer) registers again with a new session; until
            # then its partitions are not in the cluster's metadata, so read back once both are there.
            wait_until(lambda: len(session.partitions("t")) == 4, 30, message="both brokers registered again")
            assert check_history(read_back(session, "t"), load.acked, load.failed, other=[b"wake"]) == []


def test_a_pull_consumer_follows_its_broker_through_a_restart_on_another_port(
        cluster_factory: Callable[..., BrokerProcess], zookeeper: Any, zk_root: str) -> None:
    cluster_factory(1, topics=TOPIC)
    b2 = cluster_factory(2, topics=TOPIC)
    got: list[bytes] = []
    errors: list[BaseException] = []
    with connect(**zk_session(zookeeper, zk_root)) as session:
        producer = session.create_producer()
        assert producer.send_batch("t", [b"before-%d" % i for i in range(10)], partition="2-0").success

        def consume() -> None:
            try:
                for m in session.create_pull_consumer().iterate("t", "2-0", "earliest", max_wait_ms=500,
                                                                max_messages=20):
                    got.append(bytes(m.data))
            except BaseException as exc:
                errors.append(exc)

        reader = threading.Thread(target=consume, daemon=True)
        reader.start()
        wait_until(lambda: len(got) == 10, 20, message="the messages before the restart")
        old_port = b2.port
        b2.restart(keep_port=False)  # SIGTERM: it deregisters; then it registers at its new port
        assert b2.port != old_port
        wait_until(lambda: session.partitions("t") and any(
            p.broker_id == 2 for p in session.partitions("t")), 20, message="broker 2 registered again")
        result = producer.send_batch("t", [b"after-%d" % i for i in range(10)], partition="2-0")
        assert result.success, result.errors
        reader.join(60)
        assert not errors
        assert got == [b"before-%d" % i for i in range(10)] + [b"after-%d" % i for i in range(10)]


def test_after_its_zookeeper_session_expires_the_client_still_follows_the_cluster(
        cluster_factory: Callable[..., BrokerProcess], zookeeper: Any, zk_root: str) -> None:
    from metaq.testing.zookeeper import expire_session

    cluster_factory(1, topics=TOPIC)
    with connect(**zk_session(zookeeper, zk_root)) as session:
        producer = session.create_producer()
        assert producer.send(Message("t", b"before")).success
        registry = session.session._core.registry
        assert registry is not None
        expire_session(registry.raw_client(), zookeeper)
        assert producer.send(Message("t", b"expired")).success  # the metadata it has
        cluster_factory(2, topics=TOPIC)
        wait_until(lambda: {producer.send(Message("t", b"x")).broker_id for _ in range(4)} == {1, 2}, 20,
                   message="the broker registered after the expiry to be produced to")
