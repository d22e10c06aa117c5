"""Routing around a broker that cannot be reached, with standalone brokers (every broker in ``servers``):
round robin moves what was certainly not stored to the other broker; key hash keeps every key on its
partition (the broker's partitions stay in the key space while it is down), so its sends there wait for
the broker and fail at their deadline; a closed partition is left out, and a broker that comes back is
produced to again."""

from __future__ import annotations

import asyncio

import uvloop

from metaq.client import BatchSendResult, KeyHashSelector, Message, MessageSessionFactory, RandomSelector, connect
from metaq.client.selectors import key_hash
from metaq.errors import ConnectionClosedError, DeliveryTimeoutError
from metaq.testing import BrokerProcess, wait_until
from metaq.testing.history import Ack, check_history, read_back
from metaq.types import PartitionId


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


def test_an_explicit_partition_never_moves_while_its_broker_is_killed(
        two_brokers: tuple[BrokerProcess, BrokerProcess]) -> None:
    """``send_batch(partition="1-0")`` while broker 1, the first server given (the client's default broker), is
    killed -9: every batch is stored at 1-0 or fails, and nothing reaches broker 2 (a produce names only the
    partition number, so a request written to broker 2 is stored at 2-0 whatever the result says). A batch sent
    while 1-0 cannot be reached waits for it until its delivery deadline, then fails as certainly not stored."""
    b1, b2 = two_brokers
    deadline_s = 3.0
    target = PartitionId(1, 0)
    history: list[tuple[list[bytes], BatchSendResult, float, bool]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        async with await MessageSessionFactory.connect(f"{b1.servers},{b2.servers}") as session:
            admin = session.admin()
            for broker_id in (1, 2):
                await admin.create_topic("pin", 2, broker_id=broker_id)
            producer = session.create_producer(delivery_timeout_ms=deadline_s * 1000)
            killed = False

            async def send(n: int) -> None:
                payloads = [b"p%04d-%02d" % (n, i) for i in range(20)]
                after_kill, started = killed, loop.time()
                result = await producer.send_batch("pin", payloads, partition="1-0")
                history.append((payloads, result, loop.time() - started, after_kill))

            tasks = [asyncio.ensure_future(send(n)) for n in range(10)]  # stored before the kill
            await asyncio.gather(*tasks)
            for n in range(10, 60):  # in flight when broker 1 dies, then sent while it is down
                tasks.append(asyncio.ensure_future(send(n)))
                if n == 20:
                    await asyncio.to_thread(b1.kill)
                    killed = True
                await asyncio.sleep(0.01)
            await asyncio.gather(*tasks)
            await asyncio.to_thread(b1.start)
            after = await producer.send_batch("pin", [b"after"], partition="1-0")
            assert after.success and after[0].partition_id == target, after.errors

    uvloop.run(main())

    with connect(f"{b1.servers},{b2.servers}") as session:
        read = read_back(session, "pin")
    on_broker_2 = read[PartitionId(2, 0)] + read[PartitionId(2, 1)]
    assert not on_broker_2, f"{len(on_broker_2)} messages sent to 1-0 were stored on broker 2"
    acked: dict[bytes, Ack] = {}
    failed: dict[bytes, BaseException] = {}
    for payloads, result, _, _ in history:
        for data, r in zip(payloads, result, strict=True):
            assert r.partition_id == target, (data, r)  # what the caller is told
            if r.success:
                acked[data] = Ack(r.partition_id, r.offset, 0.0)
            else:
                assert r.error is not None
                failed[data] = r.error
    sent_while_down = [(result, took) for _, result, took, after_kill in history if after_kill]
    assert len(sent_while_down) >= 30 and len(acked) >= 200
    for result, took in sent_while_down:
        assert not result.success and took >= deadline_s * 0.9, (took, result.errors)
        assert all(isinstance(e, DeliveryTimeoutError) and not e.maybe_stored for e in result.errors), result.errors
    assert check_history(read, acked, failed, other=[b"after"]) == []
