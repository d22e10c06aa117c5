"""Every request the broker cannot serve is answered with an error code that names what was wrong.

Raw frames and requests go to a real broker process: bad API versions on every api key, bad topic names
and partitions on every API of the table, CreateTopic's partition count and configs.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable
from typing import Any

import pytest

from metaq.client import Message, connect
from metaq.errors import (
    InvalidRequestError,
    InvalidTopicError,
    MessageNotFoundError,
    PartitionClosedError,
    UnknownPartitionError,
    UnknownTopicError,
    UnsupportedVersionError,
)
from metaq.protocol import messages as m
from metaq.protocol import schema
from metaq.protocol.records import encode_values
from metaq.testing import BrokerProcess
from metaq.testing.raw import RawClient

BAD_VERSIONS = (-1, -2, -32768, 32767)


def _raw_request(api_key: int, version: int, correlation_id: int, body: bytes = b"") -> bytes:
    client_id = b"raw"
    payload = struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id + body
    return struct.pack(">I", len(payload)) + payload


def _read_frame(sock: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError(f"broker closed the connection after {len(data)} of {n} bytes")
            data += chunk
        return data

    (size,) = struct.unpack(">I", exactly(4))
    return exactly(size)


def _nearest_version(spec: m.ApiSpec, version: int) -> int:
    return min(max(version, spec.min_version), spec.max_version)


def test_every_api_answers_a_bad_version_with_an_error_code(broker: BrokerProcess) -> None:
    """A version outside an API's range (negative ones included) gets UNSUPPORTED_VERSION, encoded in the
    response layout of the nearest version the broker has; the connection stays usable."""
    sock = socket.create_connection((broker.host, broker.port), timeout=30)
    correlation_id = 100
    for api_key, spec in sorted(m.APIS.items()):
        versions = [v for v in BAD_VERSIONS if not spec.min_version <= v <= spec.max_version]
        versions += [spec.min_version - 1, spec.max_version + 1]
        for version in versions:
            correlation_id += 1
            sock.sendall(_raw_request(api_key, version, correlation_id))
            frame = _read_frame(sock)
            assert len(frame) > 4, f"{spec.name} v{version}: a reply with only the correlation id"
            (got_cid,) = struct.unpack_from(">i", frame)
            assert got_cid == correlation_id
            response = schema.decode(spec.response, _nearest_version(spec, version), frame, 4)
            assert response.error_code == UnsupportedVersionError.code, (spec.name, version)
            assert f"v{version}" in response.error_message
    # unknown api keys, with bad versions too: the error prefix alone, still with its code
    for api_key in (-1, 999):
        for version in (-1, 0, 5):
            correlation_id += 1
            sock.sendall(_raw_request(api_key, version, correlation_id))
            frame = _read_frame(sock)
            response = schema.decode(m.ErrorResponse, 0, frame, 4)
            assert response.error_code != 0 and str(api_key) in response.error_message
    # and the connection still serves a good request
    sock.sendall(_raw_request(0, 0, 7, struct.pack(">h", 3) + b"raw"))
    reply = schema.decode(m.ApiVersionsResponse, 0, _read_frame(sock), 4)
    assert reply.error_code == 0 and reply.apis
    sock.close()


# -- topic names and partitions, on every API -------------------------------------------------------

BAD_TOPICS = ("../x", "t" * 10_000, "a/b", "", "x\x00y", "..")
BAD_GROUP = "../g"
GOOD = "good"  # 2 partitions


def _invalid_topic_cases(topic: str) -> dict[int, list[tuple[Any, Callable[[Any], int]]]]:
    """api key -> (request naming ``topic``, where its error code is) for every API of the table.

    An API whose requests name no topic maps to an empty list; the test checks that every api key of
    messages.APIS is listed, so a new API must say how it validates.
    """
    top: Callable[[Any], int] = lambda r: r.error_code  # noqa: E731
    return {
        0: [],
        1: [(m.MetadataRequest([topic]), lambda r: r.topics[0].error_code)],
        2: [(m.CreateTopicRequest(topic, 1), top)],
        3: [(m.DeleteTopicRequest(topic), top)],
        4: [(m.ProduceRequest(topic, 0, 1, 5000, encode_values([b"x"], 1)), top),
            (m.ProduceRequest(topic, m.ANY_PARTITION, 1, 5000, encode_values([b"x"], 1)), top),
            (m.ProduceRequest(topic, 0, 1, 5000, transaction_id="tx", records=encode_values([b"x"], 1)), top)],
        5: [(m.FetchRequest(topic, 0, 0, 1024, 0), top)],
        6: [(m.ListOffsetsRequest(topic, 0, m.LATEST_TIMESTAMP), top)],
        7: [(m.JoinGroupRequest("g1", "", "c", 10_000, 10_000, [topic]), top),
            (m.JoinGroupRequest("g1", "", "c", 10_000, 10_000, [GOOD, topic]), top)],
        8: [],
        9: [],
        10: [(m.OffsetCommitRequest("g2", m.NO_GENERATION, "", [m.OffsetEntry(topic, 0, 0, 5)]),
              lambda r: r.results[0].error_code)],
        11: [(m.OffsetFetchRequest("g2", [m.TopicPartitionRef(topic, 0, 0)]), lambda r: r.offsets[0].error_code)],
        12: [(m.StatsRequest(topic), top)],
        13: [],
        14: [],
        15: [(m.PartitionStateRequest(topic, -1, False), top)],
        16: [],
        17: [],
        18: [(m.VerifyRequest(topic, -1), top)],
        19: [],  # Promote names no topic
        20: [(m.FindMessagesRequest(topic, -1, b"k"), top)],
        21: [],  # Transaction names no topic (its batches come in Produce, above)
        22: [],  # CheckTransactions names a producer group, not a topic
        23: [(m.MultiFetchRequest(0, 1, 1024, "", [m.FetchPartition(topic, 0, 0, 1024)]),
              lambda r: r.partitions[0].error_code)],  # per partition, as a Fetch of it would answer
        24: [(m.MultiProduceRequest(1, 5000, "", [m.ProducePartition(topic, p, encode_values([b"x"], 1))]),
              lambda r: r.partitions[0].error_code) for p in (0, m.ANY_PARTITION)],  # per batch, as a Produce
        25: [],  # ListTransactions names a producer group, not a topic
        30: [],  # SaslHandshake and SaslAuthenticate name no topic
        31: [],
    }


def _bad_partition_cases(partition: int) -> dict[int, list[tuple[Any, Callable[[Any], int]]]]:
    """Requests naming a partition of GOOD that cannot exist (negative) or does not (2 and up).

    OffsetFetch only refuses negative partitions: asking for the position of a partition that is not
    here answers "no committed offset" (-1).
    """
    top: Callable[[Any], int] = lambda r: r.error_code  # noqa: E731
    fetch_offsets = [(m.OffsetFetchRequest("g2", [m.TopicPartitionRef(GOOD, 0, partition)]),
                      lambda r: r.offsets[0].error_code)] if partition < 0 else []
    return {
        4: [(m.ProduceRequest(GOOD, partition, 1, 5000, encode_values([b"x"], 1)), top)],
        5: [(m.FetchRequest(GOOD, partition, 0, 1024, 0), top)],
        6: [(m.ListOffsetsRequest(GOOD, partition, m.LATEST_TIMESTAMP), top)],
        10: [(m.OffsetCommitRequest("g2", m.NO_GENERATION, "", [m.OffsetEntry(GOOD, 0, partition, 5)]),
              lambda r: r.results[0].error_code)],
        11: fetch_offsets,
        15: [(m.PartitionStateRequest(GOOD, partition, False), top)],
        18: [(m.VerifyRequest(GOOD, partition), top)],
        20: [(m.FindMessagesRequest(GOOD, partition, b"k"), top)],
        23: [(m.MultiFetchRequest(0, 1, 1024, "", [m.FetchPartition(GOOD, 0, 0, 1024),
                                                   m.FetchPartition(GOOD, partition, 0, 1024)]),
              lambda r: r.partitions[1].error_code)],
        24: [(m.MultiProduceRequest(1, 5000, "", [m.ProducePartition(GOOD, partition, encode_values([b"x"], 1))]),
              lambda r: r.partitions[0].error_code)],
    }


def _bad_group_requests(group: str) -> list[Any]:
    return [
        m.JoinGroupRequest(group, "", "c", 10_000, 10_000, [GOOD]),
        m.HeartbeatRequest(group, 1, "member"),
        m.LeaveGroupRequest(group, "member"),
        m.OffsetCommitRequest(group, m.NO_GENERATION, "", [m.OffsetEntry(GOOD, 0, 0, 1)]),
        m.OffsetFetchRequest(group, None),
        m.DescribeGroupRequest(group),
        m.MultiFetchRequest(0, 1, 1024, group, [m.FetchPartition(GOOD, 0, 0, 1024)]),
    ]


def test_every_api_refuses_bad_topic_names_partitions_and_groups(small_broker: BrokerProcess) -> None:
    c = RawClient.to(small_broker)
    assert c.call(m.CreateTopicRequest(GOOD, 2)).error_code == 0
    for topic in BAD_TOPICS:
        cases = _invalid_topic_cases(topic)
        assert set(cases) == set(m.APIS), "every API must say how it validates topic names"
        for api_key, requests in cases.items():
            for request, code_of in requests:
                code = code_of(c.call(request))
                assert code == InvalidTopicError.code, (m.APIS[api_key].name, topic[:20], code)
    for partition in (-7, -2, 2, 2**31 - 1, -(2**31)):
        for api_key, requests in _bad_partition_cases(partition).items():
            for request, code_of in requests:
                code = code_of(c.call(request))
                assert code == UnknownPartitionError.code, (m.APIS[api_key].name, partition, code)
    for request in _bad_group_requests(BAD_GROUP):
        response = c.call(request)
        assert response.error_code == InvalidRequestError.code, type(request).__name__
        assert "group name" in response.error_message
    lookup = c.call(m.LookupMessageRequest(-1))
    assert lookup.error_code in (MessageNotFoundError.code, InvalidRequestError.code)
    # nothing of that was stored: no topic, no offsets, no group
    assert [t.name for t in c.call(m.MetadataRequest(None)).topics] == [GOOD]
    assert c.call(m.OffsetFetchRequest("g2", None)).offsets == []
    assert c.call(m.ListGroupsRequest()).groups == []
    assert sorted(p.name for p in small_broker.data_dir.iterdir() if p.is_dir()) == ["good-0", "good-1"]


def test_offset_commit_outside_a_generation_needs_an_existing_partition_except_to_forget(
        small_broker: BrokerProcess) -> None:
    c = RawClient.to(small_broker)
    assert c.call(m.CreateTopicRequest(GOOD, 2)).error_code == 0
    reply = c.call(m.OffsetCommitRequest("g", m.NO_GENERATION, "", [
        m.OffsetEntry(GOOD, 0, 1, 5), m.OffsetEntry("missing", 0, 0, 5), m.OffsetEntry(GOOD, 0, 0, 3)]))
    assert [r.error_code for r in reply.results] == [0, UnknownTopicError.code, 0]
    assert "missing" in reply.error_message
    offsets = c.call(m.OffsetFetchRequest("g", None)).offsets
    assert [(o.topic, o.partition, o.offset) for o in offsets] == [(GOOD, 0, 3), (GOOD, 1, 5)]
    # forgetting a position (offset -1) works for a topic that no longer exists, so stale entries can go
    assert c.call(m.DeleteTopicRequest(GOOD)).error_code == 0
    reply = c.call(m.OffsetCommitRequest("g", m.NO_GENERATION, "", [m.OffsetEntry(GOOD, 0, 0, -1)]))
    assert [r.error_code for r in reply.results] == [0]
    assert [(o.topic, o.partition) for o in c.call(m.OffsetFetchRequest("g", None)).offsets] == [(GOOD, 1)]


@pytest.mark.parametrize("broker_id", [-1, 65536, 2**31 - 1, -(2**31)])
def test_group_apis_refuse_a_broker_id_that_cannot_name_a_partition(small_broker: BrokerProcess,
                                                                     broker_id: int) -> None:
    c = RawClient.to(small_broker)
    assert c.call(m.CreateTopicRequest(GOOD, 2)).error_code == 0
    commit = c.call(m.OffsetCommitRequest("g", m.NO_GENERATION, "", [m.OffsetEntry(GOOD, broker_id, 0, 5)]))
    assert [r.error_code for r in commit.results] == [UnknownPartitionError.code]
    assert "brokerId-partition" in commit.error_message
    fetch = c.call(m.OffsetFetchRequest("g", [m.TopicPartitionRef(GOOD, broker_id, 0)]))
    assert [o.error_code for o in fetch.offsets] == [UnknownPartitionError.code]
    join = c.call(m.JoinGroupRequest("g", "", "c", 10_000, 10_000, [GOOD], "range",
                                     [m.TopicAssignment(GOOD, [m.BrokerPartition(broker_id, 0)])]))
    assert join.error_code == InvalidRequestError.code and "brokerId-partition" in join.error_message
    assert c.call(m.OffsetFetchRequest("g", None)).offsets == [] and c.call(m.ListGroupsRequest()).groups == []


def test_a_commit_outside_a_generation_stores_another_brokers_partition_as_given(
        small_broker: BrokerProcess) -> None:
    # a standalone broker (id 0) coordinating a group over several brokers cannot check their partitions
    c = RawClient.to(small_broker)
    assert c.call(m.CreateTopicRequest(GOOD, 2)).error_code == 0
    reply = c.call(m.OffsetCommitRequest("g", m.NO_GENERATION, "", [m.OffsetEntry(GOOD, 3, 9, 5),
                                                                    m.OffsetEntry(GOOD, 0, 9, 5)]))
    assert [r.error_code for r in reply.results] == [0, UnknownPartitionError.code]
    assert [(o.broker_id, o.partition, o.offset) for o in c.call(m.OffsetFetchRequest("g", None)).offsets] == [
        (3, 9, 5)]


# -- CreateTopic ------------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [-2, -(2**31), 0, 10_001, 2**31 - 1])
def test_create_topic_refuses_partition_counts_outside_1_to_10000_except_minus_one(
        small_broker: BrokerProcess, count: int) -> None:
    c = RawClient.to(small_broker)
    reply = c.call(m.CreateTopicRequest("t", count))
    assert reply.error_code == InvalidRequestError.code and str(count) in reply.error_message
    assert c.call(m.MetadataRequest(["t"])).topics[0].error_code == UnknownTopicError.code
    default = c.call(m.CreateTopicRequest("t", -1))
    assert default.error_code == 0 and default.num_partitions == 2  # the broker's numPartitions


@pytest.fixture
def small_broker(broker_factory: Callable[..., BrokerProcess]) -> BrokerProcess:
    return broker_factory({"numPartitions": 2})


def test_create_topic_configs_are_checked_with_the_server_ini_validator(small_broker: BrokerProcess) -> None:
    c = RawClient.to(small_broker)
    cases = {
        "deletePolicy=bogus": "deletePolicy: 'bogus': policy 'bogus' is unknown",
        "acceptPublish=maybe": "acceptPublish: 'maybe' is not a boolean",
        "unflushTreshold=1": "unknown key in [topic=t]; did you mean 'unflushThreshold'?",
        "serverPort=1": "serverPort: is a [system] option",
        "numPartitions=0": "numPartitions: 0 is out of range",
        "group.billing=os:system": "a consumer group filter runs code on the broker",
    }
    for entry, message in cases.items():
        key, _, value = entry.partition("=")
        reply = c.call(m.CreateTopicRequest("t", -1, [m.ConfigEntry(key, value)]))
        assert reply.error_code == InvalidRequestError.code, entry
        assert message in reply.error_message, (entry, reply.error_message)
    clash = c.call(m.CreateTopicRequest("t", 3, [m.ConfigEntry("numPartitions", "4")]))
    assert clash.error_code == InvalidRequestError.code and "disagree" in clash.error_message
    assert c.call(m.MetadataRequest(["t"])).topics[0].error_code == UnknownTopicError.code
    assert not list(small_broker.data_dir.glob("t*"))


def test_create_topic_configs_apply_and_survive_a_restart(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory(config_text="[system]\nnumPartitions=2\n")
    with connect(broker.servers) as session:
        admin = session.admin()
        assert admin.create_topic("audit", configs={"acceptPublish": "false", "deletePolicy": "delete,24h"}) == 2
        assert admin.create_topic("sized", configs={"numPartitions": "3"}) == 3
        refused = session.create_producer().send(Message("audit", b"x"))
        assert not refused.success and isinstance(refused.error, PartitionClosedError)
    assert (broker.data_dir / "audit.topic.json").exists()

    broker.restart()
    c = RawClient.to(broker)
    audit, sized = c.call(m.MetadataRequest(["audit", "sized"])).topics
    assert [p.accept_publish for p in audit.partitions] == [False, False]
    assert len(sized.partitions) == 3
    reply = c.call(m.ProduceRequest("audit", 0, 1, 5000, encode_values([b"x"], 1)))
    assert reply.error_code == PartitionClosedError.code and "acceptPublish=false" in reply.error_message

    # a [topic=...] section in server.ini wins over the created topic's options, key by key
    broker.config_path.write_text("[system]\nnumPartitions=2\n\n[topic=audit]\nacceptPublish=true\n")
    assert c.call(m.ReloadRequest()).error_code == 0
    assert c.call(m.ProduceRequest("audit", 0, 1, 5000, encode_values([b"x"], 1))).error_code == 0

    # deleting the topic deletes its options: created again, it starts from the defaults
    assert c.call(m.DeleteTopicRequest("sized")).error_code == 0
    assert not (broker.data_dir / "sized.topic.json").exists()
    broker.restart()
    c = RawClient.to(broker)
    assert c.call(m.MetadataRequest(["sized"])).topics[0].error_code == UnknownTopicError.code
    assert c.call(m.CreateTopicRequest("sized", -1)).num_partitions == 2
