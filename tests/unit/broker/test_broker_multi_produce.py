"""MultiProduce (24) in the broker core, without a network: each batch handled as a Produce of it would be,
with its own result in the request's order (a refused batch does not stop the others), and one reply that
waits for the last batch's ack (an fsync with unflushThreshold=1).

What a client sees over TCP (one-way requests, ACLs, quotas, a slave) is in
tests/integration/broker/test_multi_produce.py."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from metaq.broker.core import Broker
from metaq.broker.handlers import REQUEST_HANDLERS
from metaq.broker.ini import load_broker_config
from metaq.broker.session import DeferredReply, Session
from metaq.broker.transport import _oneway_produce
from metaq.errors import (
    BrokerStoppingError,
    CorruptMessageError,
    InvalidRequestError,
    MessageTooLargeError,
    PartitionClosedError,
    StorageError,
    StorageFailureError,
    UnknownPartitionError,
)
from metaq.protocol import messages as m
from metaq.protocol.codec import NEED_DATA, ClientConnection, ServerConnection
from metaq.protocol.delayed import DELIVER_AT_HEADER, mark_delayed, pack_ms
from metaq.protocol.records import ProducerStamp, decode_fetched, encode_columns, encode_values, with_producer_stamp


def _broker(tmp_path: Path, sync: Callable[[int], None] | None = None, **options: str) -> Broker:
    config = load_broker_config(None, {"dataPath": str(tmp_path / "data"), "numPartitions": "4", **options})
    broker = Broker(config, REQUEST_HANDLERS, **({"sync": sync} if sync is not None else {}))
    broker.open()
    return broker


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = _broker(tmp_path)
    yield b
    b.close()


def _stored(broker: Broker, topic: str, partition: int) -> list[bytes]:
    plog = broker.logs.get(topic, partition)
    assert plog is not None
    messages, _ = decode_fetched(plog.read_bytes(0, 1 << 24), topic, partition)
    return [bytes(x.data) for x in messages]


def _batch(*values: bytes) -> bytes:
    return encode_values(list(values), 1)


def _multi(*batches: tuple[str, int, bytes], acks: int = 1, txid: str = "") -> m.MultiProduceRequest:
    return m.MultiProduceRequest(acks, 5000, txid, [m.ProducePartition(t, p, r) for t, p, r in batches])


def _answer(broker: Broker, request: Any, session: Session | None = None) -> m.MultiProduceResponse:
    """The reply, whether immediate, deferred or a coroutine (run on a loop of its own)."""
    result = broker.handle(request, session)
    if asyncio.iscoroutine(result):
        result = asyncio.run(result)
    assert isinstance(result, m.MultiProduceResponse)
    return result


def test_each_partition_gets_its_own_offsets_in_the_request_order(broker: Broker) -> None:
    broker.handle(m.ProduceRequest("t", 2, 1, 5000, _batch(b"earlier")))
    reply = _answer(broker, _multi(("t", 0, _batch(b"a0", b"a1")), ("t", 2, _batch(b"c0")), ("u", 1, _batch(b"u")),
                                   ("t", 3, _batch(b"d0", b"d1", b"d2"))))
    assert reply.error_code == 0 and reply.throttle_time_ms == 0
    got = [(p.topic, p.partition, p.error_code, p.base_offset) for p in reply.partitions]
    assert got == [("t", 0, 0, 0), ("t", 2, 0, 1), ("u", 1, 0, 0), ("t", 3, 0, 0)]
    assert all(p.append_time_ms > 0 and p.base_message_id > 0 for p in reply.partitions)
    assert len({p.base_message_id for p in reply.partitions}) == 4
    assert _stored(broker, "t", 0) == [b"a0", b"a1"] and _stored(broker, "t", 2) == [b"earlier", b"c0"]
    assert _stored(broker, "u", 1) == [b"u"] and _stored(broker, "t", 3) == [b"d0", b"d1", b"d2"]
    counters = broker.stats.partition("t", 3)
    assert (counters.put_requests, counters.put_messages) == (1, 3)


def test_any_partition_is_answered_with_where_the_batch_went(broker: Broker) -> None:
    reply = _answer(broker, _multi(("t", m.ANY_PARTITION, _batch(b"anywhere")), ("t", 1, _batch(b"one"))))
    chosen = reply.partitions[0]
    assert chosen.error_code == 0 and 0 <= chosen.partition < 4
    assert b"anywhere" in _stored(broker, "t", chosen.partition)
    assert reply.partitions[1].partition == 1


def test_a_refused_batch_fails_alone_and_the_others_are_stored(broker: Broker) -> None:
    broker.handle(m.ProduceRequest("t", 0, 1, 5000, _batch(b"creates the topic")))
    asyncio.run(broker.set_partitions_open("t", [1], False))
    corrupt = bytearray(_batch(b"flipped"))
    corrupt[-1] ^= 0x01
    too_large = _batch(b"x" * ((1 << 20) + 1))  # over maxMessageSize (1 MiB)
    reply = _answer(broker, _multi(("t", 0, _batch(b"first")), ("t", 1, _batch(b"closed")),
                                   ("t", 2, bytes(corrupt)), ("t", 3, too_large), ("t", 9, _batch(b"nowhere")),
                                   ("t", -7, _batch(b"negative")), ("t", 3, b""), ("t", 3, _batch(b"two") * 2),
                                   ("t", 2, _batch(b"last"))))
    codes = [(p.partition, p.error_code) for p in reply.partitions]
    assert codes == [(0, 0), (1, PartitionClosedError.code), (2, CorruptMessageError.code),
                     (3, MessageTooLargeError.code), (9, UnknownPartitionError.code),
                     (-7, UnknownPartitionError.code), (3, CorruptMessageError.code), (3, CorruptMessageError.code),
                     (2, 0)]
    assert all(p.error_message for p in reply.partitions if p.error_code)
    assert all(p.base_offset == -1 for p in reply.partitions if p.error_code)
    assert _stored(broker, "t", 0) == [b"creates the topic", b"first"]
    assert _stored(broker, "t", 1) == [] and _stored(broker, "t", 3) == []
    assert _stored(broker, "t", 2) == [b"last"]
    assert reply.partitions[-1].base_offset == 0


def test_two_batches_of_one_partition_are_appended_in_the_request_order(broker: Broker) -> None:
    reply = _answer(broker, _multi(("t", 1, _batch(b"a", b"b")), ("t", 0, _batch(b"x")), ("t", 1, _batch(b"c"))))
    assert [(p.partition, p.base_offset) for p in reply.partitions] == [(1, 0), (0, 0), (1, 2)]
    assert _stored(broker, "t", 1) == [b"a", b"b", b"c"]


def test_an_idempotent_duplicate_is_answered_with_the_original_offsets(broker: Broker) -> None:
    pid = 424242
    first = with_producer_stamp(_batch(b"s0", b"s1"), ProducerStamp(pid, 0, 0))
    second = with_producer_stamp(_batch(b"s2"), ProducerStamp(pid, 0, 2))
    reply = _answer(broker, _multi(("t", 0, first), ("t", 0, first), ("t", 0, second)))
    assert [(p.error_code, p.base_offset) for p in reply.partitions] == [(0, 0), (0, 0), (0, 2)]
    assert reply.partitions[1].base_message_id == reply.partitions[0].base_message_id
    assert reply.partitions[1].append_time_ms == reply.partitions[0].append_time_ms
    retried = _answer(broker, _multi(("t", 1, _batch(b"other")), ("t", 0, first)))
    assert [(p.partition, p.base_offset) for p in retried.partitions] == [(1, 0), (0, 0)]
    assert _stored(broker, "t", 0) == [b"s0", b"s1", b"s2"]
    assert broker.stats.partition("t", 0).duplicates_dropped == 2


@pytest.mark.parametrize("count", [0, m.MULTI_PRODUCE_PARTITIONS_MAX + 1])
def test_no_batch_or_too_many_is_invalid_request_and_nothing_is_stored(broker: Broker, count: int) -> None:
    reply = _answer(broker, _multi(*[("t", i % 4, _batch(b"v")) for i in range(count)]))
    assert reply.error_code == InvalidRequestError.code and reply.partitions == []
    assert str(m.MULTI_PRODUCE_PARTITIONS_MAX) in (reply.error_message or "")
    assert "t" not in broker.topics  # not even created


def test_a_draining_broker_refuses_the_whole_request(broker: Broker) -> None:
    broker.stopping = True
    reply = _answer(broker, _multi(("t", 0, _batch(b"late"))))
    assert reply.error_code == BrokerStoppingError.code and reply.partitions == []


def test_a_transaction_takes_every_batch_and_shows_none_before_commit(broker: Broker) -> None:
    broker.handle(m.ProduceRequest("t", 0, 1, 5000, _batch(b"creates the topic")))
    assert broker.handle(m.TransactionRequest(m.TX_BEGIN, "tx-1", 10_000)).error_code == 0
    pid = 777

    def stamped(value: bytes) -> bytes:
        return with_producer_stamp(_batch(value), ProducerStamp(pid, 0, 0))

    reply = _answer(broker, _multi(("t", 0, stamped(b"in-tx-0")), ("t", 1, stamped(b"in-tx-1")),
                                   ("t", m.ANY_PARTITION, stamped(b"no partition")), txid="tx-1"))
    assert [p.error_code for p in reply.partitions] == [0, 0, UnknownPartitionError.code]
    assert _stored(broker, "t", 0) == [b"creates the topic"] and _stored(broker, "t", 1) == []
    committed = broker.handle(m.TransactionRequest(m.TX_COMMIT, "tx-1"))
    if asyncio.iscoroutine(committed):
        committed = asyncio.run(committed)
    elif isinstance(committed, DeferredReply):
        committed = committed.result
    assert committed.error_code == 0
    assert _stored(broker, "t", 0) == [b"creates the topic", b"in-tx-0"] and _stored(broker, "t", 1) == [b"in-tx-1"]


def test_a_delayed_batch_goes_to_the_delay_store_and_the_others_to_their_partitions(broker: Broker) -> None:
    due = int(time.time() * 1000) + 3_600_000
    delayed = mark_delayed(encode_columns([b"later"], [1], headers=[[(DELIVER_AT_HEADER, pack_ms(due))]]))
    reply = _answer(broker, _multi(("t", 0, _batch(b"now")), ("t", 1, delayed), ("t", 0, _batch(b"now too"))))
    now, later, too = reply.partitions
    assert (now.error_code, now.base_offset, too.base_offset) == (0, 0, 1)
    assert (later.partition, later.error_code, later.base_offset, later.base_message_id) == (1, 0, -1, -1)
    assert later.append_time_ms > 0  # answered as a delayed Produce is: its offset comes when it is delivered
    assert _stored(broker, "t", 0) == [b"now", b"now too"] and _stored(broker, "t", 1) == []
    assert broker.delay.describe()["pending"] == 1


class _HeldSync:
    """An fdatasync that, once held, waits until released (and may fail): acks that wait for it cannot be answered."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.release.set()  # the broker's own syncs while it opens go through
        self.entered = threading.Event()
        self.fail = False

    def __call__(self, fd: int) -> None:
        if not self.release.is_set():
            self.entered.set()
        self.release.wait(30)
        if self.fail:
            raise OSError(5, "Input/output error")


@pytest.fixture
def held(tmp_path: Path) -> Iterator[tuple[Broker, _HeldSync]]:
    """A broker with unflushThreshold=1 whose fdatasync the test holds; released and closed after the test.
    No syncfs (syncfsMinPartitions=0): by default a round of two or more partitions is made durable by one syncfs,
    not by the fdatasync held here, whenever the machine has little to write back, and nothing would be held."""
    sync = _HeldSync()
    held_broker = _broker(tmp_path, sync, unflushThreshold="1", syncfsMinPartitions="0")
    try:
        yield held_broker, sync
    finally:
        sync.release.set()
        held_broker.close()


def test_acks_wait_for_the_fsync_of_every_batch(held: tuple[Broker, _HeldSync]) -> None:
    broker, held_sync = held

    async def main() -> None:
        held_sync.release.clear()
        result = broker.handle(_multi(("t", 0, _batch(b"a")), ("t", 1, _batch(b"b")), ("t", 0, _batch(b"c"))),
                               Session(), deferred=True)
        assert isinstance(result, DeferredReply)  # one reply for the request, no task
        assert await asyncio.to_thread(held_sync.entered.wait, 10)  # the flusher is in the fsync the acks need
        await asyncio.sleep(0)
        assert not result.done
        held_sync.release.set()
        reply = await asyncio.wait_for(result.wait(), 10)
        assert [(p.partition, p.error_code, p.base_offset) for p in reply.partitions] == [(0, 0, 0), (1, 0, 0),
                                                                                          (0, 0, 1)]

    asyncio.run(main())
    assert _stored(broker, "t", 0) == [b"a", b"c"]


def test_a_reply_cancelled_before_the_fsync_is_never_answered(held: tuple[Broker, _HeldSync]) -> None:
    broker, held_sync = held

    async def main() -> None:
        held_sync.release.clear()
        result = broker.handle(_multi(("t", 0, _batch(b"a")), ("t", 1, _batch(b"b"))), Session(), deferred=True)
        assert isinstance(result, DeferredReply)
        answered: list[object] = []
        result.on_done(answered.append)
        result.cancel()  # the transport lost the connection before the sync finished
        held_sync.release.set()
        marker = broker.handle(_multi(("t", 2, _batch(b"c"))), Session(), deferred=True)
        await asyncio.wait_for(marker.wait(), 10)  # acks are answered in order: the cancelled ones came first
        assert answered == []

    asyncio.run(main())
    assert _stored(broker, "t", 0) == [b"a"]  # stored all the same: only the reply is dropped


def test_a_duplicate_waiting_for_its_original_fsync_holds_the_reply_too(held: tuple[Broker, _HeldSync]) -> None:
    broker, held_sync = held
    first = with_producer_stamp(_batch(b"s0"), ProducerStamp(99, 0, 0))

    async def main() -> None:
        held_sync.release.clear()
        result = broker.handle(_multi(("t", 0, first), ("t", 1, _batch(b"b")), ("t", 0, first)), Session(),
                               deferred=True)
        assert asyncio.iscoroutine(result)  # the duplicate's ack is a coroutine (await_ack)
        task = asyncio.ensure_future(result)
        assert await asyncio.to_thread(held_sync.entered.wait, 10)
        await asyncio.sleep(0)
        assert not task.done()
        held_sync.release.set()
        reply = await asyncio.wait_for(task, 10)
        assert [(p.partition, p.error_code, p.base_offset) for p in reply.partitions] == [(0, 0, 0), (1, 0, 0),
                                                                                          (0, 0, 0)]

    asyncio.run(main())
    assert _stored(broker, "t", 0) == [b"s0"]


def test_a_failed_fsync_is_the_error_of_its_batches_only(tmp_path: Path) -> None:
    held = _HeldSync()
    broker = _broker(tmp_path, held, unflushThreshold="1")

    async def main() -> None:
        held.release.clear()
        result = broker.handle(_multi(("t", 0, _batch(b"a")), ("t", 9, _batch(b"unknown"))), Session(),
                               deferred=True)
        assert isinstance(result, DeferredReply)
        held.fail = True
        held.release.set()
        reply = await asyncio.wait_for(result.wait(), 10)
        first, second = reply.partitions
        assert (first.partition, first.error_code) == (0, StorageFailureError.code)
        assert "not made durable" in (first.error_message or "")
        assert second.error_code == UnknownPartitionError.code

    try:
        asyncio.run(main())
    finally:
        held.release.set()
        with pytest.raises(StorageError, match="offline until restart"):  # the log stays offline after EIO
            broker.close()


@pytest.mark.parametrize(("request_", "oneway"), [
    (m.ProduceRequest("t", 0, 0, 5000, _batch(b"x")), True),
    (m.ProduceRequest("t", 0, 1, 5000, _batch(b"x")), False),
    (_multi(("t", 0, _batch(b"x")), ("t", 1, _batch(b"y")), acks=0), True),
    (_multi(("t", 0, _batch(b"x")), acks=1), False),
    (m.FetchRequest("t", 0, 0, 1024, 0), False),
], ids=["produce-acks0", "produce-acks1", "multi-acks0", "multi-acks1", "fetch"])
def test_an_unfinished_frame_refused_is_answered_unless_it_is_a_one_way_produce(request_: Any, oneway: bool) -> None:
    """The transport refuses the biggest unfinished frame (maxPartialFramesSize) from its leading bytes; a
    one-way Produce or MultiProduce expects no reply, so none is written for it."""
    client = ClientConnection("partial")
    client.set_versions({key: spec.max_version for key, spec in m.APIS.items()})
    _cid, frame = client.send(request_, expect_response=not oneway)
    server = ServerConnection()
    server.receive_data(frame[:-1])
    assert server.next_event() is NEED_DATA
    dropped = server.discard_partial_frame()
    assert dropped is not None
    assert _oneway_produce(*dropped) is oneway


class _ThreadsSync(_HeldSync):
    """A held fdatasync that also records which thread made each call."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []

    def __call__(self, fd: int) -> None:
        self.threads.append(threading.current_thread().name)
        super().__call__(fd)


@pytest.mark.parametrize(("inline", "pool"), [(None, True), ("4", False)])
def test_sync_inline_max_partitions_decides_who_syncs_a_round_of_four(tmp_path: Path, inline: str | None,
                                                                       pool: bool) -> None:
    """unflushThreshold=1: while one sync is held, a MultiProduce of four partitions piles up into one round of four;
    by default (syncInlineMaxPartitions=2) that round is synced on the flusher's pool, with 4 in the flusher's own
    thread. Every ack still comes, after its sync."""
    sync = _ThreadsSync()
    # No syncfs (syncfsMinPartitions=0): with the default syncfsQuietMinPartitions (2) the round of four is one syncfs,
    # no fdatasync at all, while the machine has little to write back; this test is about the fdatasyncs' threads.
    options = {"unflushThreshold": "1", "syncfsMinPartitions": "0",
               **({"syncInlineMaxPartitions": inline} if inline else {})}
    broker = _broker(tmp_path, sync, **options)
    try:
        assert broker.logs.flusher._inline_max_logs == int(inline or 2)

        async def main() -> None:
            warm = broker.handle(_multi(*(("t", p, _batch(b"warm")) for p in range(4))), Session(), deferred=True)
            assert isinstance(warm, DeferredReply)
            await asyncio.wait_for(warm.wait(), 10)  # every partition's files exist and were synced once
            sync.release.clear()
            first = broker.handle(_multi(("t", 0, _batch(b"first"))), Session(), deferred=True)
            assert await asyncio.to_thread(sync.entered.wait, 10)  # the flusher is held in partition 0's sync
            calls = len(sync.threads)
            burst = broker.handle(_multi(*(("t", p, _batch(b"%d" % p)) for p in range(4))), Session(), deferred=True)
            sync.release.set()
            for result in (first, burst):
                assert isinstance(result, DeferredReply)
                reply = await asyncio.wait_for(result.wait(), 10)
                assert all(p.error_code == 0 for p in reply.partitions)
            round_threads = set(sync.threads[calls:])
            assert len(sync.threads) - calls >= 4  # the four partitions' syncs (and whatever else their round had)
            if pool:
                assert any(name.startswith("metaq-flusher-sync") for name in round_threads), round_threads
            else:
                assert round_threads == {"metaq-flusher"}

        asyncio.run(main())
    finally:
        sync.release.set()
        broker.close()
