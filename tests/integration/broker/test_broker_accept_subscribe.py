"""acceptSubscribe=false: consumers are refused with PARTITION_CLOSED (403), producers are still served.

MetaQ's acceptSubscribe takes a broker's topics (or one topic's, in its [topic=...] section) out of
subscription while they keep accepting messages, e.g. to fill a topic before consumers may start.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from metaq.client import Message, connect
from metaq.errors import PartitionClosedError
from metaq.protocol import messages as m
from metaq.testing.inprocess import InProcessBroker
from metaq.testing.raw import RawClient


def test_accept_subscribe_false_refuses_every_fetch_and_still_takes_produces(tmp_path: Path) -> None:
    with InProcessBroker(tmp_path / "data", {"acceptSubscribe": False, "numPartitions": 2}) as broker, \
            connect(broker.servers) as session:
        session.admin().create_topic("feed", 2)
        producer = session.create_producer()
        stored = [producer.send(Message("feed", b"m%d" % i)) for i in range(4)]
        assert all(r.success for r in stored), [r.error for r in stored]
        assert {r.partition for r in stored} == {0, 1}

        parts = session.admin().list_topics()["feed"]
        assert [(p.accept_publish, p.accept_subscribe) for p in parts] == [(True, False)] * 2

        consumer = session.create_pull_consumer()
        for partition in (0, 1):
            with pytest.raises(PartitionClosedError, match="acceptSubscribe"):
                consumer.get("feed", partition, 0)
        # A long poll is refused at once too, and so is a topic created on the fly by a producer.
        raw = RawClient.to(broker)
        try:
            reply = raw.call(m.FetchRequest("feed", 0, 0, max_wait_ms=60_000))
            assert reply.error_code == PartitionClosedError.code and not reply.records
            assert producer.send(Message("dynamic", b"x")).success
            reply = raw.call(m.FetchRequest("dynamic", 0, 0))
            assert reply.error_code == PartitionClosedError.code
        finally:
            raw.close()
        # Offsets can still be listed: the data is there, only subscribing is closed.
        assert consumer.offsets("feed", 0)[1] == sum(r.partition == 0 for r in stored)


def test_a_topic_section_closes_subscribing_for_that_topic_only_and_a_reload_reopens_it(tmp_path: Path) -> None:
    def config(accept: str) -> str:
        return f"[system]\nnumPartitions=1\n\n[topic=staging]\nacceptSubscribe={accept}\n\n[topic=live]\n"

    with InProcessBroker(tmp_path / "data", config_text=config("false")) as broker, \
            connect(broker.servers) as session:
        producer = session.create_producer()
        for topic in ("staging", "live"):
            assert producer.send(Message(topic, b"first " + topic.encode())).success
        consumer = session.create_pull_consumer()
        with pytest.raises(PartitionClosedError, match="staging"):
            consumer.get("staging", 0, 0)
        assert [x.data for x in consumer.get("live", 0, 0)] == [b"first live"]

        broker.config_path.write_text(config("true"))
        assert session.admin().reload() == ["staging"]
        assert producer.send(Message("staging", b"second")).success
        assert [x.data for x in consumer.get("staging", 0, 0)] == [b"first staging", b"second"]
