"""The blocking client (Spark executors' client) produces as the asyncio producer does (docs/producer.md): a batch
its broker cannot take now waits for it, in order, within delivery_timeout_ms; past it the failure says the batch
was certainly not stored; a key hash keeps mapping over the partitions of a broker that does not answer."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from metaq.client.blocking import BlockingClient
from metaq.client.selectors import key_hash
from metaq.errors import ConnectionClosedError, DeliveryTimeoutError
from metaq.protocol.records import encode_values
from metaq.testing import BrokerProcess, wait_until
from metaq.types import PartitionId


def test_batches_to_a_broker_that_is_down_wait_for_it_and_go_in_order(broker: BrokerProcess) -> None:
    with BlockingClient(broker.servers) as client:
        client.request(_create("waits", 1))
        assert client.produce("waits", 0, encode_values([b"before"], 1000)).base_offset == 0  # type: ignore[union-attr]
        broker.stop()
        out: list[Any] = []
        items = [("waits", 0, encode_values([b"m%d" % i], 1000)) for i in range(20)]
        sender = threading.Thread(target=lambda: out.append(_catch(lambda: client.produce_many(items, window=4))))
        sender.start()
        time.sleep(0.3)  # the writes meet a closed port meanwhile (no event to wait for: the point is the wait)
        assert sender.is_alive(), f"gave up at once: {out}"
        broker.start()
        sender.join(60)
        assert not sender.is_alive()
        replies = out[0]
        assert not isinstance(replies, BaseException), replies
        assert [r.base_offset for r in replies] == list(range(1, 21))  # every one, once, in item order


def test_a_broker_down_past_the_delivery_deadline_fails_as_certainly_not_stored(broker: BrokerProcess) -> None:
    with BlockingClient(broker.servers, delivery_timeout_ms=1000) as client:
        client.request(_create("late", 1))
        broker.stop()
        started = time.monotonic()
        with pytest.raises(DeliveryTimeoutError) as failed:
            client.produce_many([("late", 0, encode_values([b"x"], 1000))])
        assert time.monotonic() - started >= 0.9
        assert failed.value.maybe_stored is False and isinstance(failed.value.cause, ConnectionClosedError)


def test_the_key_space_keeps_a_broker_that_does_not_answer(two_brokers: tuple[BrokerProcess, BrokerProcess]) -> None:
    b1, b2 = two_brokers
    with BlockingClient(f"{b1.servers},{b2.servers}") as client:
        for broker_id in (1, 2):
            client.request(_create("keys", 2), broker_id=broker_id)
        every = client.partitions_for("keys")
        assert [str(p) for p in every] == ["1-0", "1-1", "2-0", "2-1"]
        b2.stop()
        wait_until(lambda: _answers(client) == {1}, 10, 0.05, "broker 2 to stop answering")
        assert client.partitions_for("keys") == every  # what the Spark sink's key hash maps over
        assert every[key_hash(b"k") % len(every)] == PartitionId(*[(1, 0), (1, 1), (2, 0), (2, 1)][key_hash(b"k") % 4])


def test_a_partition_of_the_bootstrap_broker_is_never_written_to_another_one(
        two_brokers: tuple[BrokerProcess, BrokerProcess]) -> None:
    """Broker 1, the first server (the bootstrap broker), killed -9: a batch for 1-0 waits for it and fails at its
    deadline, certainly not stored; it is not written to broker 2, which would store it at its own 2-0."""
    b1, b2 = two_brokers
    with BlockingClient(f"{b1.servers},{b2.servers}", delivery_timeout_ms=1500) as client:
        for broker_id in (1, 2):
            client.request(_create("boot", 1), broker_id=broker_id)
        assert client.produce("boot", "1-0", encode_values([b"before"], 1000)).base_offset == 0  # type: ignore[union-attr]
        b1.kill()
        started = time.monotonic()
        with pytest.raises(DeliveryTimeoutError) as failed:
            client.produce_many([("boot", "1-0", encode_values([b"while-down"], 1000))])
        assert time.monotonic() - started >= 1.4 and failed.value.maybe_stored is False
        assert client.list_offsets("boot", "2-0", -1).offset == 0, "a batch for 1-0 was stored at 2-0"
        b1.start()
        assert client.produce("boot", "1-0", encode_values([b"after"], 1000)).base_offset == 1  # type: ignore[union-attr]


def _answers(client: BlockingClient) -> set[int]:
    return {b.broker_id for b in client.metadata(["keys"]).brokers}


def _create(topic: str, partitions: int) -> Any:
    from metaq.protocol import messages as m

    return m.CreateTopicRequest(topic, partitions)


def _catch(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except BaseException as exc:
        return exc
