"""Named transactions through the blocking client (metaq.client.NamedTransactions, the exactly-once Spark sink's
two phases) against a real broker: puts invisible until the commit, a put sent twice stored once, the status each
step leaves, a prepared transaction committed by another client, a restart in between, rollbacks, pipelined
commits."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from metaq.client import BlockingClient, NamedTransactions, ProducerSequences, value_batches
from metaq.errors import InvalidTxnStateError
from metaq.protocol.records import decode_fetched
from metaq.testing.broker import BrokerProcess
from metaq.types import PartitionId


def _read(client: BlockingClient, partition: PartitionId) -> list[bytes]:
    reply = client.fetch("t", partition, 0, 1 << 20)
    messages, _ = decode_fetched(reply.records, "t", partition.partition, 0)
    return [bytes(m.data) for m in messages]


def _puts(txid: str, sequences: ProducerSequences, partition: PartitionId,
          values: list[bytes]) -> list[tuple[str, str, PartitionId, bytes]]:
    return [(txid, "t", partition, sequences.stamp("t", partition.partition, records, count))
            for records, count in value_batches(values, 1000, 1024)]


@pytest.fixture
def broker(broker_factory: Callable[..., BrokerProcess]) -> BrokerProcess:
    broker = broker_factory({"numPartitions": 2})
    with BlockingClient(broker.servers) as client:  # the topic exists: a transaction never creates one
        client.produce("t", 0, next(value_batches([b"before"], 1, 1024))[0])
    return broker


def test_a_prepared_transaction_is_invisible_durable_and_committed_by_another_client(
        broker: BrokerProcess) -> None:
    p0, p1 = PartitionId(0, 0), PartitionId(0, 1)
    sequences = ProducerSequences()
    with BlockingClient(broker.servers) as control, BlockingClient(broker.servers) as data:
        named = NamedTransactions(control)
        assert named.status(0, "job:1:0") == "unknown"
        named.begin(0, "job:1:0", timeout_ms=60_000)
        assert named.status(0, "job:1:0") == "open"
        puts = _puts("job:1:0", sequences, p0, [b"a%d" % i for i in range(60)])
        puts += _puts("job:1:0", sequences, p1, [b"b"])
        assert len(puts) > 2
        replies = list(NamedTransactions(data).iter_put(puts + puts[1:2], window=4))  # the second put twice
        assert len(replies) == len(puts) + 1
        named.prepare(0, "job:1:0")
        assert named.status(0, "job:1:0") == "prepared"
        assert _read(control, p0) == [b"before"] and _read(control, p1) == []  # nothing visible yet
    broker.restart()
    with BlockingClient(broker.servers) as other:  # a process that never saw the puts commits them
        named = NamedTransactions(other)
        assert named.status(0, "job:1:0") == "prepared"
        named.commit(0, "job:1:0")
        assert named.status(0, "job:1:0") == "committed"
        assert _read(other, p0) == [b"before"] + [b"a%d" % i for i in range(60)]  # the repeated put once
        assert _read(other, p1) == [b"b"]
        with pytest.raises(InvalidTxnStateError):
            named.begin(0, "job:1:0")  # a finished name is not begun again


def test_rollbacks_and_pipelined_commits(broker: BrokerProcess) -> None:
    p0 = PartitionId(0, 0)
    with BlockingClient(broker.servers) as client:
        named = NamedTransactions(client)
        for n in range(5):
            named.begin(0, f"job:2:{n}")
            list(named.iter_put(_puts(f"job:2:{n}", ProducerSequences(), p0, [b"m%d" % n])))
            named.prepare(0, f"job:2:{n}")
        named.roll_back(0, "job:2:4")
        assert named.status(0, "job:2:4").startswith("rolled back")
        named.commit_many([(0, f"job:2:{n}") for n in range(4)], window=2)
        assert [named.status(0, f"job:2:{n}") for n in range(4)] == ["committed"] * 4
        read = _read(client, p0)  # pipelined commits of separate transactions: no order between them
        assert read[0] == b"before" and sorted(read[1:]) == [b"m0", b"m1", b"m2", b"m3"], read
        with pytest.raises(InvalidTxnStateError):
            named.commit_many([(0, "job:2:4"), (0, "job:2:0")])  # the rolled back one is refused
        assert named.status(0, "job:2:0") == "committed"
