"""MessageBatch, the column view of a stored batch: the same records, checks and errors as the Messages."""

from __future__ import annotations

import gc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from protocol_strategies import examples, messages

from metaq.errors import CorruptRecordError
from metaq.protocol.records import (
    Compression,
    MessageBatch,
    decode_batch,
    decode_fetched,
    decode_fetched_batches,
    encode_messages,
    message_batch,
    read_header,
    rebuild_batch,
    stamp,
)
from metaq.types import Message

RECORDS = settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def stamped(batch: bytes, base_offset: int, base_id: int = 0, append_time: int = 7) -> bytes:
    buf = bytearray(batch)
    stamp(buf, base_offset, base_id, append_time)
    return bytes(buf)


def fields(m: Message) -> tuple[object, ...]:
    return (m.topic, bytes(m.data), m.attribute, m.key, m.headers, m.timestamp_ms, m.partition, m.offset, m.id,
            m.append_time_ms, m.broker_id)


def columns(batch: MessageBatch) -> list[tuple[object, ...]]:
    """A view's records read through its columns (not its Messages), as Message fields."""
    n = len(batch)
    cols = [list(batch.offsets), list(batch.ids), list(batch.timestamps), [bytes(p) for p in batch.payloads],
            batch.keys, batch.attributes, batch.headers]
    assert all(len(c) == n for c in cols)
    return [(batch.topic, data, attr, key, headers, ts, batch.partition, offset, id_, batch.append_time_ms,
             batch.broker_id)
            for offset, id_, ts, data, key, attr, headers in zip(*cols, strict=True)]


@st.composite
def fetched_logs(draw: st.DrawFn) -> bytes:
    """Consecutive stamped batches as a partition stores them (offsets contiguous from 10): every kind of
    record (keys, attributes, headers), every compression, and batches a server-side filter thinned out
    (gaps in the offset deltas, or no record left at all)."""
    out, offset = [], 10
    for _ in range(draw(st.integers(1, 4))):
        sent = draw(st.lists(messages("t"), min_size=1, max_size=5))
        compression = draw(st.sampled_from(list(Compression)))
        batch = stamped(encode_messages(sent, compression), offset, offset << 8, 99)
        if draw(st.booleans()):  # a server-side filter kept only some records
            whole = decode_batch(batch, "t", 3)
            kept = [m for m, keep in zip(whole, draw(st.lists(st.booleans(), min_size=len(whole),
                                                              max_size=len(whole))), strict=True) if keep]
            batch = rebuild_batch(batch, read_header(batch), kept)
        out.append(batch)
        offset += len(sent)
    return b"".join(out)


@RECORDS
@given(body=fetched_logs(), data=st.data())
def test_views_hold_exactly_the_records_decode_fetched_returns(body: bytes, data: st.DataObject) -> None:
    from_offset = data.draw(st.integers(0, 40), label="from_offset")
    cut = data.draw(st.integers(0, len(body)), label="cut")
    reply = body[:cut]
    want, want_next = decode_fetched(reply, "t", 3, from_offset, broker_id=2)
    views, next_offset = decode_fetched_batches(reply, "t", 3, from_offset, broker_id=2)
    assert next_offset == want_next
    assert all(len(v) > 0 for v in views)
    assert [fields(m) for v in views for m in v] == [fields(m) for m in want]  # iterating: lazy Messages
    assert [fields(m) for v in views for m in v.messages()] == [fields(m) for m in want]
    assert [r for v in views for r in columns(v)] == [fields(m) for m in want]
    offsets = [m.offset for m in want]
    assert offsets == sorted(set(offsets)) and all(o >= from_offset for o in offsets)
    for v in views:
        assert v.first_offset == next(iter(v)).offset
        assert v.partition_id.broker_id == 2 and v.partition_id.partition == 3


@RECORDS
@given(sent=st.lists(messages("t"), min_size=1, max_size=6), compression=st.sampled_from(list(Compression)),
       count=st.integers(0, 7))
def test_head_keeps_the_first_records_and_says_where_to_go_on(sent: list[Message], compression: Compression,
                                                               count: int) -> None:
    batch = message_batch(stamped(encode_messages(sent, compression), 5, 50), "t", 0)
    whole = batch.messages()
    head = batch.head(count)
    assert [fields(m) for m in head] == [fields(m) for m in whole[:count]]
    assert head.next_offset == (whole[count].offset if count < len(whole) else batch.header.next_offset)
    assert columns(head) == [fields(m) for m in whole[:count]]


def test_payloads_are_slices_of_the_fetched_bytes_not_copies() -> None:
    body = stamped(encode_messages([Message("t", b"one"), Message("t", b"two", key=b"k")]), 0)
    (view,), _ = decode_fetched_batches(body, "t", 0)
    assert [m.data for m in view] == [b"one", b"two"]  # Messages built first: the view still slices the reply
    payloads = view.payloads
    assert [bytes(p) for p in payloads] == [b"one", b"two"]
    assert all(p.obj is body and p.readonly for p in payloads)


def test_a_compressed_batch_gives_its_inflated_payloads() -> None:
    sent = [Message("t", b"x" * 100, key=b"%d" % i) for i in range(50)]
    view = message_batch(stamped(encode_messages(sent, Compression.ZSTD), 0), "t", 0)
    assert [bytes(p) for p in view.payloads] == [b"x" * 100] * 50
    assert view.keys == [b"%d" % i for i in range(50)]


def test_building_the_messages_leaves_the_garbage_collector_as_it_was() -> None:
    body = stamped(encode_messages([Message("t", b"a"), Message("t", b"b")]), 0)
    assert gc.isenabled()
    assert len(decode_fetched(body + stamped(encode_messages([Message("t", b"c")]), 2), "t", 0)[0]) == 3
    assert gc.isenabled()
    gc.disable()
    try:
        decode_fetched(body, "t", 0)
        message_batch(body).messages()
        assert not gc.isenabled()
    finally:
        gc.enable()


# -- damage: a view is refused exactly where the Messages are -------------------------------------------

def flip(batch: bytes, bit: int) -> bytes:
    buf = bytearray(batch)
    buf[bit // 8] ^= 1 << (bit % 8)
    return bytes(buf)


@pytest.mark.parametrize("compression", list(Compression), ids=[c.name for c in Compression])
def test_every_single_bit_flip_is_refused_with_the_same_error_as_decode_batch(compression: Compression) -> None:
    batch = stamped(encode_messages([Message("t", b"payload", "attr", b"key", [("h", b"v")], 5),
                                     Message("t", b"", timestamp_ms=6)], compression), 40, 1 << 100)
    assert len(message_batch(batch)) == 2
    for bit in range(len(batch) * 8):
        bad = flip(batch, bit)
        with pytest.raises(CorruptRecordError) as by_messages:
            decode_batch(bad)
        with pytest.raises(CorruptRecordError) as by_view:
            message_batch(bad)
        assert str(by_view.value) == str(by_messages.value)
        with pytest.raises(CorruptRecordError) as fetched:
            decode_fetched_batches(bad, "t", 0, 40)
        with pytest.raises(CorruptRecordError) as fetched_messages:
            decode_fetched(bad, "t", 0, 40)
        assert str(fetched.value) == str(fetched_messages.value)
        assert fetched.value.offset == fetched_messages.value.offset


def test_a_damaged_batch_after_intact_ones_ends_the_views_there() -> None:
    a = stamped(encode_messages([Message("t", b"a"), Message("t", b"b")]), 0)
    b = stamped(encode_messages([Message("t", b"c")]), 2)
    c = stamped(encode_messages([Message("t", b"d")]), 3)
    damaged = b[:-1] + bytes([b[-1] ^ 1])  # the body: the header (and so the offsets) intact
    views, next_offset = decode_fetched_batches(a + damaged + c, "t", 0, 1)
    assert [[bytes(p) for p in v.payloads] for v in views] == [[b"b"]]
    assert next_offset == 2  # the next fetch starts at the damage
    with pytest.raises(CorruptRecordError) as info:
        decode_fetched_batches(damaged + c, "t", 0, 2)
    assert (info.value.offset, info.value.resume_offset) == (2, 3)
