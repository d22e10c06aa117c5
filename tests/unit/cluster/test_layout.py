"""MetaQ's ZooKeeper layout: the paths MetaQ-aware tools read, and the parsing of what is stored there
(round trips, MetaQ's older encodings, and garbage refused with LayoutError rather than a crash)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metaq.cluster import layout as L

PATHS = L.Paths("meta/")


def test_paths_are_metaqs() -> None:
    assert PATHS.root == "/meta"
    assert PATHS.broker_node(3) == "/meta/brokers/ids/3/master"
    assert PATHS.broker_node(3, 1) == "/meta/brokers/ids/3/slave1"
    assert PATHS.topic_broker("orders", 3, publish=True) == "/meta/brokers/topics-pub/orders/3-m"
    assert PATHS.topic_broker("orders", 3, 2, publish=False) == "/meta/brokers/topics-sub/orders/3-s2"
    assert PATHS.group_member("g", "g_host-1") == "/meta/consumers/g/ids/g_host-1"
    assert PATHS.group_owner("g", "orders", "3-0") == "/meta/consumers/g/owners/orders/3-0"
    assert PATHS.group_offset("g", "orders", "3-0") == "/meta/consumers/g/offsets/orders/3-0"
    assert L.Paths("/a/b").broker_ids == "/a/b/brokers/ids"
    with pytest.raises(L.LayoutError):
        L.Paths("/a//b")


@given(st.sampled_from(["127.0.0.1", "broker-1.example", "::1", "fe80::1"]), st.integers(1, 65535))
def test_broker_url_round_trip(host: str, port: int) -> None:
    assert L.parse_broker_url(L.broker_url(host, port).encode()) == (host, port)


def test_broker_url_as_metaq_writes_it_and_garbage() -> None:
    assert L.parse_broker_url(b"meta://10.0.0.5:8123?slaveId=1") == ("10.0.0.5", 8123)
    for bad in (b"", b"http://a:1", b"meta://a", b"meta://a:0", b"meta://a:70000", b"\xff\xfe", b"meta://a:1 x"):
        with pytest.raises(L.LayoutError):
            L.parse_broker_url(bad)


def test_topic_registration_data() -> None:
    assert L.topic_broker_data(4, 3) == b'{"numParts":4,"broker":"3-m"}'
    assert L.parse_topic_broker_data(L.topic_broker_data(4, 3)) == 4
    assert L.parse_topic_broker_data(b"7") == 7  # MetaQ before 1.4.3 stored the bare count
    assert L.parse_topic_broker_name("12-m") == (12, -1)
    assert L.parse_topic_broker_name("12-s3") == (12, 3)
    for bad in (b"", b"{}", b'{"numParts":"4"}', b'{"numParts":0}', b"true", b"[1]", b"\xff", b'{"numParts":true}'):
        with pytest.raises(L.LayoutError):
            L.parse_topic_broker_data(bad)
    for name in ("x-m", "3", "3-x", "-1-m", "3-s"):
        with pytest.raises(L.LayoutError):
            L.parse_topic_broker_name(name)


@given(st.integers(0, 2**62), st.integers(-1, 2**127))
def test_offset_data_round_trip(offset: int, message_id: int) -> None:
    assert L.parse_offset_data(L.offset_data(offset, message_id)) == (offset, message_id)


def test_offset_data_of_old_clients_and_garbage() -> None:
    assert L.parse_offset_data(b"42") == (42, -1)
    assert L.parse_offset_data(b"-1-42") == (42, -1)
    for bad in (b"", b"x", b"1-x", b"-5", b"\xff", b"1--2"):
        with pytest.raises(L.LayoutError):
            L.parse_offset_data(bad)


def test_member_data() -> None:
    assert L.parse_member_data(L.member_data(["a", "b"])) == ["a", "b"]
    assert L.parse_member_data(b"a, ,b,") == ["a", "b"]
    assert L.parse_slave_node("slave2") == 2 and L.parse_slave_node("master") is None


def test_a_broker_url_carries_its_other_listeners_ports_which_old_readers_ignore() -> None:
    from metaq.cluster import layout as lay

    url = lay.broker_url("10.0.0.1", 8123, 8124, {"kafkaPort": 9092, "kafkaSslPort": 9093})
    assert url == "meta://10.0.0.1:8123?sslPort=8124&kafkaPort=9092&kafkaSslPort=9093"
    assert lay.parse_broker_url(url) == ("10.0.0.1", 8123)
    assert lay.parse_broker_tls_port(url) == 8124
    assert lay.parse_broker_ports(url) == {"kafkaPort": 9092, "kafkaSslPort": 9093}
    assert lay.parse_broker_ports(lay.broker_url("h", 1, None, {"kafkaPort": 9092})) == {"kafkaPort": 9092}
    assert lay.parse_broker_ports("meta://h:1?kafkaPort=99999&x=1") == {}
    assert lay.broker_url("h", 1) == "meta://h:1"
