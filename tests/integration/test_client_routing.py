"""Routing around a broker that cannot be reached, with standalone brokers (every broker in ``servers``):
round robin moves what was certainly not stored to the other broker; key hash keeps every key on its
partition (the broker's partitions stay in the key space while it is down), so its sends there wait for
the broker and fail at their deadline; a closed partition is left out, and a broker that comes back is
produced to again."""

from __future__ import annotations

from metaq.client import KeyHashSelector, Message, RandomSelector, connect
from metaq.client.selectors import key_hash
from metaq.errors import ConnectionClosedError, DeliveryTimeoutError
from metaq.testing import BrokerProcess, wait_until


def make_topic(session: object, topic: str) -> None:
    admin = session.admin()  # type: ignore[attr-defined]
    for broker_id in (1, 2):
        admin.create_topic(topic, 2, broker_id=broker_id)


def test_round_robin_goes_around_a_stopped_broker_and_key_hash_reports_it(
        two_brokers: tuple[BrokerProcess, BrokerProcess]) -> None:
    b1, b2 = two_brokers
    with connect(f"{b1.servers},{b2.servers}", unreachable_avoid_s=0.5) as session:
        make_topic(session, "r")
        producer = session.create_producer()
        assert {producer.send(Message("r", b"x")).broker_id for _ in range(4)} == {1, 2}
        b2.stop()
        results = [f.result(30) for f in [producer.send_async(Message("r", b"m%d" % i)) for i in range(200)]]
        assert all(r.success for r in results), [r.error for r in results if not r.success][:3]
        assert {r.broker_id for r in results} == {1}
        # Moved once, then left out: the stopped broker is not tried again for every batch.
        assert 1 <= producer.rerouted_batches <= 3, producer.rerouted_batches

        keys = [b"key-%d" % i for i in range(20)]
        home = {k: [1, 1, 2, 2][key_hash(k) % 4] for k in keys}  # 1-0, 1-1, 2-0, 2-1 (the key space)
        keyed = session.create_producer(KeyHashSelector(), delivery_timeout_ms=1500)
        outcome = [f.result(30) for f in [keyed.send_async(Message("r", b"k", key=k)) for k in keys]]
        failed = [r for r in outcome if not r.success]
        assert failed and all(isinstance(r.error, DeliveryTimeoutError) and not r.error.maybe_stored
                              and isinstance(r.error.cause, ConnectionClosedError) and r.broker_id == 2
                              for r in failed), [r.error for r in failed][:3]
        assert [r.broker_id for r in outcome] == [home[k] for k in keys]  # no key moved

        patient = session.create_producer(KeyHashSelector())  # the default deadline: it waits for the broker
        waiting = [patient.send_async(Message("r", b"w", key=k)) for k in keys if home[k] == 2]
        b2.start()
        assert all(f.result(60).success and f.result().broker_id == 2 for f in waiting)
        wait_until(lambda: producer.send(Message("r", b"y")).broker_id == 2, 10,
                   message="round robin to take the restarted broker back")


def test_round_robin_leaves_a_closed_partition_out(two_brokers: tuple[BrokerProcess, BrokerProcess]) -> None:
    b1, b2 = two_brokers
    with connect(f"{b1.servers},{b2.servers}") as session:
        make_topic(session, "c")
        producer = session.create_producer()
        producer.send(Message("c", b"warm"))
        session.admin().close_partition("c", "1-0")
        results = [f.result(30) for f in [producer.send_async(Message("c", b"m%d" % i)) for i in range(100)]]
        assert all(r.success for r in results), [r.error for r in results if not r.success][:3]
        assert "1-0" not in {str(r.partition_id) for r in results}


def test_random_goes_around_a_stopped_broker_too(two_brokers: tuple[BrokerProcess, BrokerProcess]) -> None:
    b1, b2 = two_brokers
    with connect(f"{b1.servers},{b2.servers}") as session:
        make_topic(session, "rnd")
        producer = session.create_producer(RandomSelector())
        b2.stop()
        results = [f.result(30) for f in [producer.send_async(Message("rnd", b"m%d" % i)) for i in range(100)]]
        assert all(r.success for r in results), [r.error for r in results if not r.success][:3]
        assert {r.broker_id for r in results} == {1}
