"""The blocking client's own logic, no broker needed (tests/integration/spark has it against a broker)."""

from __future__ import annotations

import pytest

from metaq.client.blocking import BlockingClient
from metaq.errors import ConnectionClosedError, InvalidArgument
from metaq.testing.ports import unused_port


def test_connection_refused_names_servers() -> None:
    port = unused_port()
    servers = f"127.0.0.1:{port}"
    with pytest.raises(ConnectionClosedError, match=f"servers='{servers}'"):
        BlockingClient(servers, timeout_s=2)


def test_two_standalone_brokers_are_merged_and_each_partition_reached_at_its_own() -> None:
    from spark_fake_broker import FakeBroker

    from metaq.protocol.records import encode_values
    from metaq.types import PartitionId

    one, two = FakeBroker({"t": 2, "only-1": 1}, broker_id=1), FakeBroker({"t": 3}, broker_id=2)
    try:
        with BlockingClient(f"{two.servers},{one.servers}") as client:
            assert client.broker_id == 2  # the first server that answered: it gets partition -1
            assert client.partitions_for("t") == [PartitionId(1, 0), PartitionId(1, 1), PartitionId(2, 0),
                                                  PartitionId(2, 1), PartitionId(2, 2)]
            assert client.partitions_for("only-1") == [PartitionId(1, 0)]
            client.produce("t", PartitionId(1, 1), encode_values([b"a", b"b"], 1))
            client.produce("t", "2-1", encode_values([b"c"], 1))
            client.produce("t", 2, encode_values([b"d"], 1))  # only broker 2 has a partition 2
            assert [len(p.batches) for p in one.topics["t"]] == [0, 1]
            assert [len(p.batches) for p in two.topics["t"]] == [0, 1, 1]
            ends = client.list_offsets_many("t", client.partitions_for("t"), -1)
            assert [r.log_end_offset for r in ends.values()] == [0, 2, 0, 1, 1]
            assert client.fetch("t", "1-1", 0, 1 << 20).log_end_offset == 2
            with pytest.raises(InvalidArgument, match=r"partition 1 of topic 't' is ambiguous: brokers 1, 2"):
                client.fetch("t", 1, 0, 1 << 20)
    finally:
        one.stop()
        two.stop()


def test_a_broker_id_is_looked_for_among_the_servers() -> None:
    from spark_fake_broker import FakeBroker

    from metaq.errors import UnknownServerError
    from metaq.protocol.messages import MetadataRequest

    one, two = FakeBroker({"t": 1}, broker_id=1), FakeBroker({"t": 1}, broker_id=2)
    try:
        with BlockingClient(f"{one.servers},{two.servers}") as client:
            # no metadata asked yet: broker 2 is found by trying the servers not reached so far
            assert client.request(MetadataRequest(["t"]), broker_id=2).brokers[0].broker_id == 2
            with pytest.raises(UnknownServerError, match="broker 7 is not among the servers"):
                client.request(MetadataRequest(["t"]), broker_id=7)
    finally:
        one.stop()
        two.stop()
