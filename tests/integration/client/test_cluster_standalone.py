"""Several standalone brokers given together in ``servers``: a topic spread over brokerId 1 and 2.

Each broker answers metadata only for its own partitions; the client merges the answers, names every
partition ``brokerId-partition``, and reaches each one at its own broker.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import uvloop
from cli_process import metaq

from metaq.client import Message, MessageSessionFactory, PartitionId, connect
from metaq.client.blocking import BlockingClient
from metaq.client.group import ConsumerConfig, create_consumer
from metaq.client.group.admin import describe_group, list_groups
from metaq.errors import DuplicateBrokerIdError, InvalidArgument, UnknownPartitionError
from metaq.protocol.messages import OffsetFetchRequest
from metaq.testing import BrokerProcess, until
from metaq.types import TopicPartition

ORDER = [PartitionId(1, 0), PartitionId(1, 1), PartitionId(2, 0), PartitionId(2, 1)]


def servers_of(brokers: tuple[BrokerProcess, BrokerProcess], reverse: bool = False) -> str:
    listed = list(reversed(brokers)) if reverse else list(brokers)
    return ",".join(b.servers for b in listed)


def create_everywhere(session: object, topic: str) -> None:
    admin = session.admin()  # type: ignore[attr-defined]
    for broker_id in (1, 2):
        assert admin.create_topic(topic, 2, broker_id=broker_id) == 2


@pytest.mark.parametrize("reverse", [False, True], ids=["listed-1-2", "listed-2-1"])
def test_round_robin_walks_the_partitions_of_both_brokers_in_metaq_order(
        two_brokers: tuple[BrokerProcess, BrokerProcess], reverse: bool) -> None:
    with connect(servers_of(two_brokers, reverse)) as session:
        create_everywhere(session, "orders")
        assert session.partitions("orders") == ORDER
        producer = session.create_producer()
        results = [producer.send(Message("orders", b"m%d" % i)) for i in range(10)]
        assert all(r.success for r in results)
        assert [r.partition_id for r in results] == [ORDER[i % 4] for i in range(10)]
        # the message id names the broker that stored it (bits 127..112)
        assert [r.message_id >> 112 for r in results] == [r.broker_id for r in results]


def test_a_pull_consumer_reads_every_partition_of_both_brokers(
        two_brokers: tuple[BrokerProcess, BrokerProcess]) -> None:
    with connect(servers_of(two_brokers)) as session:
        create_everywhere(session, "events")
        producer = session.create_producer()
        sent = {i: producer.send(Message("events", b"e%d" % i)) for i in range(40)}
        consumer = session.create_pull_consumer()
        got = {}
        for pid in session.partitions("events"):
            for m in consumer.iterate("events", pid, "earliest", stop_at_end=True):
                assert m.partition_id == pid and m.broker_id == pid.broker_id
                got[bytes(m.data)] = (m.partition_id, m.offset, m.id)
        assert got == {b"e%d" % i: (r.partition_id, r.offset, r.message_id) for i, r in sent.items()}
        assert consumer.offsets("events", "2-1") == (0, 10)
        assert consumer.get("events", PartitionId(2, 0), 9)[0].data == b"e38"


def test_a_bare_partition_number_must_be_unambiguous(two_brokers: tuple[BrokerProcess, BrokerProcess]) -> None:
    with connect(servers_of(two_brokers)) as session:
        create_everywhere(session, "t")
        session.admin().create_topic("only-on-2", 3, broker_id=2)
        consumer = session.create_pull_consumer()
        with pytest.raises(InvalidArgument, match=r"partition 1 of topic 't' is ambiguous: brokers 1, 2 each "
                                                  r"have one \('1-1', '2-1'\); name it as brokerId-partition"):
            consumer.get("t", 1, 0)
        assert consumer.offsets("only-on-2", 2) == (0, 0)  # only broker 2 has a partition 2
        with pytest.raises(UnknownPartitionError, match="'2-0', '2-1', '2-2'"):
            consumer.get("only-on-2", "1-0", 0)


# -- a consumer group over both brokers ---------------------------------------------------------------------

FAST = {"session_timeout_ms": 1500, "rebalance_timeout_ms": 6000, "commit_offset_period_ms": 200,
        "max_delay_fetch_ms": 500, "fetch_runner_count": 4}


def test_a_group_over_both_brokers_is_disjoint_complete_and_resumes_per_broker_partition(
        two_brokers: tuple[BrokerProcess, BrokerProcess], tmp_path: Path) -> None:
    b1, b2 = two_brokers
    everything = [TopicPartition("work", PartitionId(b, p)) for b in (1, 2) for p in range(3)]

    async def main() -> None:
        admin_session = await MessageSessionFactory.connect(servers_of(two_brokers))
        for broker_id in (1, 2):
            await admin_session.admin().create_topic("work", 3, broker_id=broker_id)
        producer = admin_session.create_producer()
        for i in range(60):
            assert (await producer.send(Message("work", b"old-%d" % i))).success
        # members list the brokers in different orders: each joins both, each broker balances its own partitions
        sessions = [await MessageSessionFactory.connect(servers_of(two_brokers, reverse=i % 2 == 1))
                    for i in range(3)]
        got: Counter[bytes] = Counter()
        where: dict[bytes, PartitionId] = {}

        def listener(msg: Message) -> None:
            got.update([bytes(msg.data)])
            where[bytes(msg.data)] = msg.partition_id

        config = ConsumerConfig(group="workers", recover_dir=tmp_path / "recover", **FAST)
        consumers = [create_consumer(s, config).subscribe("work", 64 * 1024, listener) for s in sessions]
        for c in consumers:
            await c.complete_subscribe()

        def stable() -> bool:
            owned = [tp for c in consumers for tp in c.assignment()]
            return (all(c.assigned.is_set() for c in consumers)
                    and len({tuple(sorted(c.generations.items())) for c in consumers}) == 1
                    and sorted(owned) == everything)

        await until(lambda: stable() and sum(got.values()) >= 60, message="a stable group that consumed everything")
        owned = [set(c.assignment()) for c in consumers]
        assert all(owned) and sum(map(len, owned)) == 6 and set().union(*owned) == set(everything)
        # each broker splits its three partitions among the three (range, starting at member "broker id"):
        # one partition of each broker each
        assert sorted(sorted(tp.partition.broker_id for tp in o) for o in owned) == [[1, 2], [1, 2], [1, 2]]
        assert got == Counter({b"old-%d" % i: 1 for i in range(60)})
        owner_of = {tp.partition: c for c in consumers for tp in c.assignment()}
        assert all(owner_of[pid] in consumers for pid in where.values())
        for c in consumers:
            await c.close()

        # each broker keeps the offsets of its own partitions
        for broker, broker_id in ((b1, 1), (b2, 2)):
            async with await MessageSessionFactory.connect(broker.servers) as only_one:
                offsets = await describe_group(only_one, "workers")
                assert {(str(p.partition), p.committed) for p in offsets.partitions} == {
                    (f"{broker_id}-{p}", 10) for p in range(3)}
                fetched = await only_one._core.request(OffsetFetchRequest("workers", None))
                assert sorted((e.broker_id, e.partition, e.offset) for e in fetched.offsets) == [
                    (broker_id, p, 10) for p in range(3)]
                assert await list_groups(only_one) == ["workers"]
        described = await describe_group(admin_session, "workers")
        assert sorted((str(p.partition), p.committed) for p in described.partitions) == [
            (str(tp.partition), 10) for tp in everything]
        assert described.members == [] and described.state == "Empty" and described.unreachable == []

        # a new member resumes from the committed offsets of every broker partition
        for i in range(12):
            assert (await producer.send(Message("work", b"new-%d" % i))).success
        later: Counter[bytes] = Counter()
        resumed = create_consumer(sessions[0], config).subscribe("work", 64 * 1024,
                                                                 lambda msg: later.update([bytes(msg.data)]))
        await resumed.complete_subscribe()
        await until(lambda: sum(later.values()) >= 12, message="the new messages")
        assert sorted(later) == sorted(b"new-%d" % i for i in range(12)) and set(later.values()) == {1}
        assert sorted(resumed.assignment()) == everything
        await resumed.close()
        for s in (*sessions, admin_session):
            await s.close()

    uvloop.run(main())


def test_a_group_takes_up_partitions_that_appear_on_another_broker(
        two_brokers: tuple[BrokerProcess, BrokerProcess], tmp_path: Path) -> None:
    # broker 2 coordinates its own partitions: it notices the new ones itself and rebalances them alone
    async def main() -> None:
        session = await MessageSessionFactory.connect(servers_of(two_brokers))
        await session.admin().create_topic("grow", 2, broker_id=1)
        got: list[PartitionId] = []
        consumer = create_consumer(session, ConsumerConfig(group="g", recover_dir=tmp_path, **FAST)).subscribe(
            "grow", 4096, lambda msg: got.append(msg.partition_id))
        await consumer.complete_subscribe()
        await until(lambda: consumer.assigned.is_set(), message="the first assignment")
        assert [str(tp.partition) for tp in consumer.assignment()] == ["1-0", "1-1"]
        generations = consumer.generations
        await session.admin().create_topic("grow", 2, broker_id=2)
        await until(lambda: consumer.assigned.is_set() and len(consumer.assignment()) == 4,
                    message="broker 2's partitions")
        assert consumer.generations[1] == generations[1] and consumer.generations[2] > generations[2]
        producer = session.create_producer()
        for i in range(4):
            assert (await producer.send(Message("grow", b"%d" % i))).success
        await until(lambda: len(got) == 4, message="a message from each partition")
        assert sorted(got) == [PartitionId(b, p) for b in (1, 2) for p in (0, 1)]
        await consumer.close()
        await session.close()

    uvloop.run(main())


# -- the command line ---------------------------------------------------------------------------------------

def test_the_cli_names_partitions_broker_dash_partition(two_brokers: tuple[BrokerProcess, BrokerProcess]) -> None:
    from cli_process import metaq

    s = ["-s", servers_of(two_brokers, reverse=True)]
    created = metaq("topic", "create", "t", "-p", "2", "-b", "1", *s)
    assert created.stdout == "created topic t with 2 partitions on broker 1\n"
    assert metaq("topic", "create", "t", "-p", "2", "-b", "2", *s).returncode == 0
    described = json.loads(metaq("topic", "describe", "t", "--json", *s).stdout)
    assert [p["partition"] for p in described["partitions"]] == ["1-0", "1-1", "2-0", "2-1"]
    assert metaq("topic", "list", *s).stdout == "t\t4 partitions\n"

    sent = metaq("produce", "t", "-p", "2-1", "--print-ids", *s, input="a\nb\n")
    assert sent.returncode == 0, sent.stderr
    [(pid, offset, message_id), _] = [line.split("\t") for line in sent.stdout.splitlines()]
    assert (pid, offset) == ("2-1", "0") and int(message_id, 16) >> 112 == 2
    ambiguous = metaq("produce", "t", "-p", "1", *s, input="x\n")
    assert ambiguous.returncode == 2 and "partition 1 of topic 't' is ambiguous" in ambiguous.stderr
    assert metaq("produce", "t", *s, input="".join(f"r{i}\n" for i in range(8))).returncode == 0  # round robin

    one = [json.loads(line) for line in metaq("consume", "t", "-p", "2-1", "--format", "json", *s).stdout.splitlines()]
    assert [(r["partition"], r["value"]) for r in one[:2]] == [("2-1", "a"), ("2-1", "b")]
    everything = [json.loads(line) for line in metaq("consume", "t", "--format", "json", *s).stdout.splitlines()]
    assert sorted({r["partition"] for r in everything}) == ["1-0", "1-1", "2-0", "2-1"] and len(everything) == 10
    bad = metaq("consume", "t", "-p", "3-0", *s)
    assert bad.returncode == 2 and "t has partitions 1-0, 1-1, 2-0, 2-1; no 3-0" in bad.stderr

    assert metaq("admin", "lookup", message_id, *s).stdout == "t\t2-1\t0\n"
    stats = metaq("stats", "-t", "t", *s).stdout.splitlines()
    assert [line.split("\t")[1] for line in stats if line.startswith("t\t")] == ["1-0", "1-1", "2-0", "2-1"]
    closed = metaq("topic", "close", "t", "-p", "2-0", *s)
    assert closed.stdout == "closed partition 2-0 of t for publishing\n", closed.stderr
    described = json.loads(metaq("topic", "describe", "t", "--json", *s).stdout)
    assert [p["publish"] for p in described["partitions"]] == ["open", "open", "closed", "open"]
    verified = metaq("admin", "verify", *s)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert [line.split(":")[1] for line in verified.stdout.splitlines() if line.startswith("t:")] == [
        "1-0", "1-1", "2-0", "2-1"]
    assert metaq("topic", "delete", "t", "--yes", *s).stdout == "deleted topic t\n"
    assert metaq("topic", "list", *s).stdout == ""


def test_a_topic_browser_reads_both_brokers(two_brokers: tuple[BrokerProcess, BrokerProcess]) -> None:
    from metaq.client.group import TopicBrowser

    async def main() -> None:
        async with await MessageSessionFactory.connect(servers_of(two_brokers)) as session:
            for broker_id in (1, 2):
                await session.admin().create_topic("browse", 2, broker_id=broker_id)
            producer = session.create_producer()
            for i in range(8):
                assert (await producer.send(Message("browse", b"%d" % i))).success
            browser = TopicBrowser(session, "browse")
            assert await browser.partitions() == ORDER
            seen = [(str(m.partition_id), bytes(m.data)) async for m in browser]
            assert seen == [(str(ORDER[i % 4]), b"%d" % i) for i in sorted(range(8), key=lambda i: (i % 4, i))]
            assert [bytes(m.data) async for m in browser.iterate_partition("2-0")] == [b"2", b"6"]
            await browser.close()

    uvloop.run(main())


def test_a_group_consumes_one_broker_while_the_other_is_down(
        two_brokers: tuple[BrokerProcess, BrokerProcess], tmp_path: Path) -> None:
    # no broker coordinates for another: with broker 1 down from the start, broker 2's partitions are
    # consumed, its part of the group is formed alone, and `describe` names what did not answer
    b1, b2 = two_brokers

    async def main() -> None:
        async with await MessageSessionFactory.connect(b2.servers) as only_2:
            await only_2.admin().create_topic("t", 2, broker_id=2)
            producer = only_2.create_producer()
            for i in range(4):
                assert (await producer.send(Message("t", b"%d" % i))).success
        await asyncio.to_thread(b1.stop)
        async with await MessageSessionFactory.connect(servers_of(two_brokers)) as session:
            got: list[bytes] = []
            consumer = create_consumer(session, ConsumerConfig(group="g", recover_dir=tmp_path, **FAST)).subscribe(
                "t", 4096, lambda msg: got.append(bytes(msg.data)))
            await consumer.complete_subscribe()
            await until(lambda: sorted(got) == [b"0", b"1", b"2", b"3"], message="broker 2's messages")
            await until(lambda: consumer.assigned.is_set(), message="the assignment settled with broker 1 down")
            assert list(consumer.generations) == [2]
            described = await describe_group(session, "g")
            assert described.state == "Stable" and len(described.members) == 1
            assert len(described.unreachable) == 1 and str(b1.port) in described.unreachable[0]
            await consumer.close()

    uvloop.run(main())


@pytest.mark.parametrize("reverse", [False, True], ids=["listed-a-b", "listed-b-a"])
def test_two_brokers_with_one_broker_id_are_refused_naming_both_addresses(
        broker_factory: Callable[..., BrokerProcess], reverse: bool) -> None:
    # both left at the default brokerId=0: a client cannot tell their partitions apart, so whichever order
    # the servers are listed in, it must stop and say so rather than read one broker and miss the other
    a = broker_factory({"numPartitions": 1}, name="a")
    b = broker_factory({"numPartitions": 1}, name="b")
    listed = [b, a] if reverse else [a, b]
    servers = ",".join(p.servers for p in listed)
    for proc in (a, b):
        with connect(proc.servers) as alone:
            assert alone.create_producer().send(Message("t", b"x")).success
    both = rf"servers {listed[0].servers} and {listed[1].servers} both answer as broker id 0"

    done = metaq("consume", "t", "-s", servers)
    assert done.returncode == 1 and done.stdout == ""
    assert re.search(both + r".*brokerId", done.stderr), done.stderr

    with connect(servers) as session, pytest.raises(DuplicateBrokerIdError, match=both):
        session.partitions("t")
    with BlockingClient(servers) as blocking, pytest.raises(DuplicateBrokerIdError, match=both):
        blocking.partitions_for("t")
