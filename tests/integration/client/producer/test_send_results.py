"""SendResults as the producer hands them out, and Messages as a consumer reads them back, against a real
broker: every field set and right, equality, repr, pickling, ``dataclasses`` helpers. The producer builds a
batch's successes without ``SendResult.__init__`` (it assigns every slot itself, or metaq._speedups builds
them in C) and the consumer builds Messages without ``Message.__init__``: these are the checks that they are
still ordinary objects. The last test runs the others again without the compiled SendResult."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import os
import pickle
import subprocess
import sys
from typing import Any

import uvloop

from metaq.client import Message, MessageSessionFactory, SendResult
from metaq.errors import MessageTooLargeError
from metaq.testing.broker import BrokerProcess
from metaq.types import SPEEDUPS, PartitionId, format_message_id, split_message_id

RESULT_FIELDS = [f.name for f in dataclasses.fields(SendResult)]
MESSAGE_FIELDS = [f.name for f in dataclasses.fields(Message)]


def check_ordinary(r: SendResult) -> None:
    """Every field set, and repr, asdict, replace, copy and pickling work as for one built by hand."""
    assert type(r) is SendResult
    values = {name: getattr(r, name) for name in RESULT_FIELDS}  # AttributeError for a slot left unset
    assert repr(r) == "SendResult(" + ", ".join(f"{k}={v!r}" for k, v in values.items()) + ")"
    assert r == SendResult(**values) and SendResult(**values) == r
    if r.error is None:
        assert dataclasses.asdict(r) == values
        assert pickle.loads(pickle.dumps(r)) == r
        assert copy.deepcopy(r) == r
    assert dataclasses.replace(r) == r and dataclasses.replace(r, offset=r.offset + 1) != r


def test_send_async_results_carry_where_each_message_was_stored(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            await session.admin().create_topic("results", 2)
            producer = session.create_producer(linger_ms=20)
            first = await producer.send(Message("results", b"first"))  # sync send
            check_ordinary(first)
            assert first.success and first.error is None and first.topic == "results"
            futures = [producer.send_async(Message("results", b"m%d" % i)) for i in range(200)]
            await producer.flush()
            results = [f.result() for f in futures]
            for r in [first, *results]:
                check_ordinary(r)
                assert r.success and r.error is None and r.topic == "results"
                assert r.partition_id == PartitionId(r.broker_id, r.partition) and r.broker_id >= 0
                assert split_message_id(r.message_id).offset == r.offset
                assert split_message_id(r.message_id).broker_id == r.broker_id
                assert r.message_id_hex == format_message_id(r.message_id)
            assert len({r.message_id for r in [first, *results]}) == 201
            by_partition: dict[int, list[int]] = {}
            for r in results:
                by_partition.setdefault(r.partition, []).append(r.offset)
            assert sorted(by_partition) == [0, 1]
            for offsets in by_partition.values():  # consecutive offsets in send order
                assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))

            # What a consumer reads back is what was sent, at the place each result names
            consumer = session.create_pull_consumer()
            read: dict[tuple[int, int], Message] = {}
            for p in (0, 1):
                async for m in consumer.iterate("results", p, "earliest", stop_at_end=True):
                    read[(m.partition, m.offset)] = m
            for i, r in enumerate(results):
                m = read[(r.partition, r.offset)]
                assert (m.data, m.id, m.partition_id, m.topic) == (b"m%d" % i, r.message_id, r.partition_id,
                                                                    "results")

    uvloop.run(main())


def test_messages_read_back_carry_key_attribute_headers_and_partition(broker: BrokerProcess) -> None:
    async def main() -> None:
        async with await MessageSessionFactory.connect(broker.servers) as session:
            await session.admin().create_topic("fields", 1)
            producer = session.create_producer()
            sent = [Message("fields", b"v%d" % i, attribute=f"a{i % 3}" if i % 2 else None,
                            key=b"k%d" % i if i % 3 else None, headers=[("h", b"%d" % i)] if i % 4 else None,
                            timestamp_ms=1_000 + i) for i in range(30)]
            sent.append(Message("fields", b"plain"))
            results = await asyncio.gather(*(producer.send_async(m) for m in sent))
            assert all(r.success for r in results)
            consumer = session.create_pull_consumer()
            got = [m async for m in consumer.iterate("fields", 0, "earliest", stop_at_end=True)]
            assert len(got) == len(sent)
            for m, s, r in zip(got, sent, results, strict=True):
                assert type(m) is Message
                assert dataclasses.asdict(m).keys() == set(MESSAGE_FIELDS)
                assert (m.topic, m.data, m.attribute, m.key, m.headers) == (s.topic, s.data, s.attribute, s.key,
                                                                         s.headers)
                assert m.timestamp_ms == s.timestamp_ms if s.timestamp_ms >= 0 else m.timestamp_ms > 0
                assert (m.partition_id, m.offset, m.id) == (r.partition_id, r.offset, r.message_id)
                assert m.append_time_ms > 0 and m.deliver_at is None and m.delay_ms is None
                assert pickle.loads(pickle.dumps(m)) == m
                assert repr(m).startswith(f"Message(topic='fields', data={m.data!r}, ")

    uvloop.run(main())


def test_one_way_and_failed_results(broker_factory: Any) -> None:
    proc = broker_factory({"maxMessageSize": 1024, "maxTransferSize": 4096})

    async def main() -> None:
        async with await MessageSessionFactory.connect(proc.servers) as session:
            await session.admin().create_topic("small", 1)
            producer = session.create_producer()
            oneway = producer.send_oneway(Message("small", b"fire"))
            check_ordinary(oneway)
            assert (oneway.success, oneway.message_id, oneway.offset, oneway.error) == (True, -1, -1, None)
            assert oneway.message_id_hex == "-1"
            failed = await producer.send_async(Message("small", b"x" * 2000))  # over the broker's limit
            check_ordinary(failed)
            assert not failed.success and isinstance(failed.error, MessageTooLargeError)
            assert (failed.message_id, failed.offset, failed.topic) == (-1, -1, "small")
            await producer.flush()

    uvloop.run(main())


def test_the_same_with_the_pure_python_send_result() -> None:
    """METAQ_NO_EXTENSIONS=1: the dataclass and the Python resolving pass, as where the module is not built."""
    if not SPEEDUPS:
        return  # this run is already the pure-Python one
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                           "not pure_python"], env={**os.environ, "METAQ_NO_EXTENSIONS": "1"}, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "3 passed" in done.stdout, done.stdout[-2000:]
