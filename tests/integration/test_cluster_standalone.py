"""Several standalone brokers given together in ``servers``: a topic spread over brokerId 1 and 2.

Each broker answers metadata only for its own partitions; the client merges the answers, names every
partition ``brokerId-partition``, and reaches each one at its own broker.
"""

from __future__ import annotations

import pytest

from metaq.client import Message, PartitionId, connect
from metaq.errors import InvalidArgument, UnknownPartitionError
from metaq.testing.broker import BrokerProcess

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
