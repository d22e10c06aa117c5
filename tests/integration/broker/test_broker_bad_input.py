"""Bad input gets a clear error and never takes the broker down for anyone else."""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable

import pytest

from metaq.errors import (
    InvalidRequestError,
    InvalidTopicError,
    MessageTooLargeError,
    UnknownPartitionError,
    UnknownTopicError,
)
from metaq.protocol import messages as m
from metaq.protocol.records import encode_values
from metaq.testing import BrokerProcess
from metaq.testing.raw import RawClient, socket_closed_by_peer


def _produce(topic: str, partition: int = 0, n: int = 1, size: int = 10) -> m.ProduceRequest:
    return m.ProduceRequest(topic, partition, 1, 5000, encode_values([b"v" * size] * n, 1))


@pytest.fixture
def strict_broker(broker_factory: Callable[..., BrokerProcess]) -> BrokerProcess:
    return broker_factory({"numPartitions": 2, "autoCreateTopics": False, "maxMessageSize": 4096,
                           "maxFrameSize": 16 * 1024 * 1024 + 65536, "maxBatchSize": 16 * 1024 * 1024},
                          config_text="[system]\n\n[topic=known]\nnumPartitions=2\n")


def test_each_bad_request_gets_a_named_error_and_the_connection_keeps_working(strict_broker: BrokerProcess) -> None:
    c = RawClient.to(strict_broker)
    with pytest.raises(UnknownTopicError, match="nope"):
        c.raise_for(_produce("nope"))
    for bad in ("../etc", "a/b", "x\x00y", "t" * 300, "..", ""):
        with pytest.raises(InvalidTopicError):
            c.raise_for(_produce(bad))
    with pytest.raises(UnknownPartitionError, match=r"partitions 0\.\.1"):
        c.raise_for(_produce("known", partition=-5))
    with pytest.raises(UnknownPartitionError):
        c.raise_for(m.FetchRequest("known", 7, 0, 1024, 0))
    with pytest.raises(MessageTooLargeError, match="limit is 4096"):
        c.raise_for(_produce("known", size=10_000))
    with pytest.raises(InvalidRequestError, match="max_bytes"):
        c.raise_for(m.FetchRequest("known", 0, 0, 0, 0))
    corrupt = bytearray(encode_values([b"abc"] * 3, 1))
    corrupt[-1] ^= 0xFF
    response = c.call(m.ProduceRequest("known", 0, 1, 5000, bytes(corrupt)))
    assert response.error_code == 2 and "CRC" in response.error_message  # type: ignore[attr-defined]
    # after all of that, the same connection still serves good requests
    ok = c.call(_produce("known", n=3))
    assert ok.error_code == 0 and ok.base_offset == 0  # type: ignore[attr-defined]


def test_garbage_and_oversized_frames_close_only_that_connection(strict_broker: BrokerProcess) -> None:
    bystander = RawClient.to(strict_broker)
    assert bystander.call(_produce("known")).error_code == 0  # type: ignore[attr-defined]

    garbage = socket.create_connection((strict_broker.host, strict_broker.port), timeout=10)
    garbage.sendall(b"\x00\x00\x00\x03abc")  # a frame too short to hold a request header
    assert socket_closed_by_peer(garbage)

    huge = socket.create_connection((strict_broker.host, strict_broker.port), timeout=10)
    huge.sendall(struct.pack(">I", 1 << 30))  # claims a 1 GiB frame: refused from the prefix alone
    assert socket_closed_by_peer(huge)

    unknown_api = socket.create_connection((strict_broker.host, strict_broker.port), timeout=10)
    unknown_api.sendall(struct.pack(">IhhihB", 11, 999, 0, 77, 1, 0x41))  # api key 999, correlation id 77
    frame = b""
    while len(frame) < 10:
        frame += unknown_api.recv(4096)
    _size, correlation_id, code = struct.unpack_from(">Iih", frame)
    assert (correlation_id, code) == (77, InvalidRequestError.code)

    # the broker keeps serving everyone else
    assert bystander.call(_produce("known", n=2)).error_code == 0  # type: ignore[attr-defined]
    fetched = bystander.call(m.FetchRequest("known", 0, 0, 1 << 20, 0))
    assert fetched.error_code == 0 and fetched.log_end_offset == 3  # type: ignore[attr-defined]
