"""Per-partition batching by size and by linger time, driven by a fake clock (no sleeping)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaq.client.producer.batches import Accumulator, BatchKey, ProducerBatch, record_size
from metaq.errors import InvalidArgument
from metaq.protocol.records import (
    HEADER_BYTES,
    RECORD_OVERHEAD_BYTES,
    Compression,
    decode_batch,
    encode_record,
    record_batch_bytes,
    validate_batch,
)
from metaq.testing import FakeClock
from metaq.types import Message

K0: BatchKey = ("t", 0, 0, 1)
K1: BatchKey = ("t", 1, 0, 1)


def make(batch_bytes: int = 1000, max_message_bytes: int = 10_000) -> tuple[Accumulator, FakeClock]:
    clock = FakeClock(100.0)
    return Accumulator(batch_bytes=batch_bytes, max_message_bytes=max_message_bytes, clock=clock), clock


def add(acc: Accumulator, key: BatchKey, value: bytes, linger_s: float = 0.005, waiter: object = None,
        ts: int = 1000) -> list[ProducerBatch]:
    return list(acc.append(key, ts, value, None, None, None, waiter, linger_s))


def open_count(acc: Accumulator, key: BatchKey) -> int:
    batch = acc.open_batch(key)
    return 0 if batch is None else batch.count


def test_a_batch_is_sealed_when_the_next_record_would_not_fit() -> None:
    acc, _ = make(batch_bytes=HEADER_BYTES + 3 * (RECORD_OVERHEAD_BYTES + 100))
    assert add(acc, K0, b"a" * 100) == []
    assert add(acc, K0, b"b" * 100) == []
    sealed = add(acc, K0, b"c" * 100)
    assert len(sealed) == 1  # exactly full: sealed at once, no waiting for linger
    assert sealed[0].count == 3
    assert acc.open_batch(K0) is None
    assert add(acc, K0, b"d" * 100) == []
    assert add(acc, K0, b"e" * 150) == []  # header + 124 + 174 bytes: still under header + 372
    sealed = add(acc, K0, b"f" * 100)
    assert [b.count for b in sealed] == [2]  # the third would overflow: old batch out, new one opened
    assert open_count(acc, K0) == 1


def test_a_record_larger_than_a_batch_travels_alone() -> None:
    acc, _ = make(batch_bytes=200)
    add(acc, K0, b"small")
    sealed = add(acc, K0, b"x" * 500)
    assert [b.count for b in sealed] == [1, 1]
    [big] = decode_batch(sealed[1].build(Compression.NONE))
    assert big.data == b"x" * 500
    assert len(acc) == 0


def test_partitions_batch_separately() -> None:
    acc, _ = make()
    add(acc, K0, b"a")
    add(acc, K1, b"b")
    add(acc, K0, b"c")
    assert open_count(acc, K0) == 2
    assert open_count(acc, K1) == 1


def test_linger_seals_a_batch_when_its_deadline_passes() -> None:
    acc, clock = make()
    add(acc, K0, b"a", linger_s=0.005)
    clock.advance_s(0.002)
    add(acc, K1, b"b", linger_s=0.005)
    add(acc, K0, b"c", linger_s=0.005)  # joins the open batch: its deadline stays
    assert acc.next_deadline() == pytest.approx(100.005)
    assert acc.expired() == []
    clock.now_s = 100.005
    due = acc.expired()
    assert [b.key for b in due] == [K0] and due[0].count == 2
    assert acc.next_deadline() == pytest.approx(100.007)
    clock.now_s = 100.01
    assert [b.key for b in acc.expired()] == [K1]
    assert acc.next_deadline() is None


def test_a_batch_taken_out_elsewhere_is_neither_due_nor_the_next_deadline() -> None:
    """The producer's fast paths (and its compiled placer) pop a full batch from ``batches`` themselves: the
    accumulator must neither seal it a second time nor wake the producer for it."""
    acc, clock = make()
    add(acc, K0, b"a", linger_s=0.001)
    add(acc, K1, b"b", linger_s=0.005)
    taken = acc.batches.pop(K0)
    add(acc, K0, b"c", linger_s=0.003)  # a new batch under the same key, due later than the one taken
    clock.now_s = 100.002
    assert acc.expired() == []  # the taken batch's time has come, the new one's not
    assert acc.next_deadline() == pytest.approx(100.003)
    clock.now_s = 100.01
    due = acc.expired()
    assert sorted(b.key for b in due) == [K0, K1] and all(b is not taken for b in due)
    assert [b.count for b in due] == [1, 1] and acc.next_deadline() is None and len(acc) == 0


OPS = st.lists(st.tuples(st.sampled_from(["add", "take", "tick", "expire", "seal", "peek"]),
                         st.integers(0, 2), st.integers(0, 6)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_due_batches_and_the_next_deadline_match_a_scan_of_every_open_batch(ops) -> None:
    """Whatever mix of appends, batches taken out by the producer, time passing and sealing: what is due and the
    next deadline are those a scan of every open batch gives (the accumulator keeps its batches queued by
    linger instead, so that a producer over many partitions does not scan them all each time a batch is due)."""
    acc, clock = make(batch_bytes=HEADER_BYTES + 3 * record_size(Message("t", b"x" * 10, timestamp_ms=1000)))
    for op, partition, amount in ops:
        key: BatchKey = ("t", partition, 0, 1)
        if op == "add":
            add(acc, key, b"x" * 10, linger_s=amount / 1000)
        elif op == "take":
            acc.batches.pop(key, None)
        elif op == "tick":
            clock.advance_s(amount / 2000)
        elif op == "seal":
            acc.seal(key)
        elif op == "peek":
            assert acc.next_deadline() == min((b.due_s for b in acc.batches.values()), default=None)
        else:
            scan = [b for b in acc.batches.values() if b.due_s <= clock.now_s]
            due = acc.expired()
            assert len(due) == len(scan) and {id(b) for b in due} == {id(b) for b in scan}
            assert not any(b.key in acc.batches for b in due)


def test_zero_linger_is_due_at_once() -> None:
    acc, _ = make()
    add(acc, K0, b"a", linger_s=0.0)
    assert [b.count for b in acc.expired()] == [1]


def test_seal_and_seal_all_take_open_batches_out() -> None:
    acc, _ = make()
    add(acc, K0, b"a")
    add(acc, K1, b"b")
    assert acc.seal(K0) is not None
    assert acc.seal(K0) is None
    assert [b.key for b in acc.seal_all()] == [K1]
    assert len(acc) == 0


def test_records_keep_their_waiters_in_order() -> None:
    acc, _ = make()
    for i in range(5):
        add(acc, K0, b"v%d" % i, waiter=i)
    (batch,) = acc.seal_all()
    assert batch.waiters == [0, 1, 2, 3, 4]


def test_message_over_max_message_bytes_is_refused_before_anything_changes() -> None:
    acc, _ = make(max_message_bytes=100)
    add(acc, K0, b"ok")
    with pytest.raises(InvalidArgument, match="max_message_bytes is 100"):
        add(acc, K0, b"x" * 100)
    with pytest.raises(InvalidArgument):
        add(acc, K1, b"x" * 100)
    assert open_count(acc, K0) == 1
    assert open_count(acc, K1) == 0


@pytest.mark.parametrize("message", [
    Message("t", b"payload"),
    Message("t", b"payload", attribute="tag-é", key=b"key"),
    Message("t", b"", headers=[("h1", b"v1"), ("hé", b"")]),
])
def test_record_size_is_the_encoded_size(message: Message) -> None:
    rec = encode_record(0, 1, message.data, message.key, message.attribute, message.headers)
    assert record_size(message) == record_batch_bytes(rec)


@pytest.mark.parametrize("compression", list(Compression))
def test_a_built_batch_is_valid_and_decodes_to_what_went_in(compression: Compression) -> None:
    acc, _ = make(batch_bytes=1 << 20)
    sent = [Message("t", b"v%d" % i, attribute="a" if i % 2 else None, key=b"k%d" % i if i % 3 else None,
                    headers=[("h", b"%d" % i)] if i % 5 == 0 else None, timestamp_ms=1000 + (i * 7) % 13)
            for i in range(50)]
    for m in sent:
        acc.append(K0, m.timestamp_ms, m.data, m.key, m.attribute, m.headers, None, 1.0)
    (batch,) = acc.seal_all()
    raw = batch.build(compression)
    header = validate_batch(raw, 1 << 20, 1 << 24)
    assert header.record_count == 50
    assert header.first_timestamp_ms == 1000 and header.max_timestamp_ms == 1012
    got = decode_batch(raw, "t", 0)
    assert [(m.data, m.key, m.attribute, m.headers, m.timestamp_ms) for m in got] == \
           [(m.data, m.key, m.attribute, m.headers, m.timestamp_ms) for m in sent]
    assert [m.offset for m in got] == list(range(50))


def test_an_absorbed_batch_follows_the_first_one_in_order_with_its_fields_and_waiters() -> None:
    """What the producer does with batches sealed while their connection has no room: one frame, in order."""
    acc, _ = make(batch_bytes=1 << 20)
    sent = [Message("t", b"v%d" % i, attribute="a" if i % 4 == 3 else None, key=b"k%d" % i if 5 <= i < 8 else None,
                    headers=[("h", b"%d" % i)] if i == 9 else None, timestamp_ms=1000 + i) for i in range(12)]
    batches = []
    for part in (sent[:4], sent[4:5], sent[5:12]):  # plain + attributes, plain only, keys and headers
        for m in part:
            acc.append(K0, m.timestamp_ms, m.data, m.key, m.attribute, m.headers, m.data, 1.0)
        batches.extend(acc.seal_all())
    first, second, third = batches
    sizes = sum(b.size_bytes - HEADER_BYTES for b in batches)
    first.absorb(second)
    first.absorb(third)
    assert first.count == 12 and first.size_bytes == HEADER_BYTES + sizes
    assert first.waiters == [m.data for m in sent]
    got = decode_batch(first.build(Compression.NONE), "t", 0)
    assert [(m.data, m.key, m.attribute, m.headers, m.timestamp_ms) for m in got] == \
           [(m.data, m.key, m.attribute, m.headers, m.timestamp_ms) for m in sent]


def test_a_field_one_batch_sets_is_its_own() -> None:
    """The fields most batches never change are class-level defaults (batches.py): setting one on a batch gives it
    its own value and leaves every other batch's default as it was."""
    a, b = ProducerBatch(K0, 0.0, 1.0), ProducerBatch(K0, 0.0, 1.0)
    a.error, a.tried, a.pinned, a.maybe_written = ValueError("x"), ((0, 1),), True, True
    a.attempts += 1
    a.add(5, b"v", b"k", None, None, None, 10)
    assert (b.error, b.tried, b.pinned, b.maybe_written, b.attempts, b.keys) == (None, (), False, False, 0, None)
    assert (ProducerBatch.error, ProducerBatch.attempts, ProducerBatch.keys) == (None, 0, None)
    assert a.keys == [b"k"] and not a.plain and b.plain
    assert ProducerBatch(("t", 0, 0, 1, True), 0.0, 1.0).delayed and not b.delayed
