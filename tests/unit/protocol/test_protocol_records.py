"""Record batches: what a producer builds, the broker validates and stamps, and a consumer decodes."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from protocol_strategies import INT64_MAX, examples, messages

from metaq.errors import CorruptRecordError, InvalidArgument
from metaq.protocol import records as rec
from metaq.protocol.records import (
    HEADER_BYTES,
    RECORD_OVERHEAD_BYTES,
    STAMPED_BYTES,
    BatchBuilder,
    Compression,
    decode_batch,
    decode_fetched,
    encode_messages,
    encode_values,
    iter_batches,
    peek_length,
    read_header,
    stamp,
    stamp_prefix,
    validate_batch,
)
from metaq.types import Message

BIG = 1 << 40
RECORDS = settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
compressions = st.sampled_from(list(Compression))
message_lists = st.lists(messages("t"), min_size=1, max_size=8)
base_offsets = st.integers(0, (1 << 62))
base_ids = st.integers(0, (1 << 127))
append_times = st.integers(-1, INT64_MAX)


def expected(sent: list[Message], base_offset: int, base_id: int, append_time: int,
             partition: int = 3) -> list[tuple[object, ...]]:
    """What a consumer must see for ``sent``: the producer's fields, plus what the broker stamped."""
    return [(m.data, m.key, m.attribute, m.headers or None, m.timestamp_ms,
             "t", partition, base_offset + i, base_id + i, append_time) for i, m in enumerate(sent)]


def seen(got: list[Message]) -> list[tuple[object, ...]]:
    return [(bytes(m.data), m.key, m.attribute, m.headers, m.timestamp_ms,
             m.topic, m.partition, m.offset, m.id, m.append_time_ms) for m in got]


def stamped(batch: bytes, base_offset: int, base_id: int = 0, append_time: int = 7) -> bytes:
    buf = bytearray(batch)
    stamp(buf, base_offset, base_id, append_time)
    return bytes(buf)


@RECORDS
@given(sent=message_lists, compression=compressions, base_offset=base_offsets, base_id=base_ids,
       append_time=append_times)
def test_messages_round_trip(sent: list[Message], compression: Compression, base_offset: int, base_id: int,
                             append_time: int) -> None:
    batch = encode_messages(sent, compression)
    header = validate_batch(batch, BIG, BIG)
    assert header.record_count == len(sent) and header.last_offset_delta == len(sent) - 1
    assert header.compression == compression and header.total_bytes == len(batch)
    assert header.first_timestamp_ms == min(m.timestamp_ms for m in sent)
    assert header.max_timestamp_ms == max(m.timestamp_ms for m in sent)
    # The producer leaves the broker's fields zero / -1.
    assert (header.base_offset, header.base_message_id, header.append_time_ms) == (0, 0, -1)

    buf = bytearray(batch)
    stamp(buf, base_offset, base_id, append_time)
    # Stamping rewrites only bytes [0, 45): the body CRC still holds and the prefix is what stamp_prefix gives.
    assert buf[STAMPED_BYTES:] == batch[STAMPED_BYTES:]
    assert stamp_prefix(header, base_offset, base_id, append_time) + batch[STAMPED_BYTES:] == buf
    again = validate_batch(buf, BIG, BIG)
    assert (again.base_offset, again.base_message_id, again.append_time_ms) == (base_offset, base_id, append_time)
    assert again.crc == header.crc
    assert again.next_offset == base_offset + len(sent)

    assert seen(decode_batch(bytes(buf), "t", 3)) == expected(sent, base_offset, base_id, append_time)
    assert seen(decode_batch(memoryview(buf), "t", 3, verify=False)) == expected(sent, base_offset, base_id,
                                                                                 append_time)


@RECORDS
@given(values=st.lists(st.binary(max_size=64), min_size=1, max_size=10), compression=compressions,
       ts=st.integers(0, INT64_MAX))
def test_encode_values(values: list[bytes], compression: Compression, ts: int) -> None:
    batch = stamped(encode_values(values, ts, compression), 100)
    header = validate_batch(batch, BIG, BIG)
    assert (header.first_timestamp_ms, header.max_timestamp_ms, header.record_count) == (ts, ts, len(values))
    sent = [Message("t", v, timestamp_ms=ts) for v in values]
    assert seen(decode_batch(batch, "t", 3)) == expected(sent, 100, 0, 7)
    # The fast path writes exactly what the general path writes.
    assert encode_values(values, ts, compression) == encode_messages(sent, compression)


@RECORDS
@given(sent=message_lists, compression=compressions, max_bytes=st.integers(HEADER_BYTES, 400))
def test_batch_builder_splits_without_losing_or_reordering(sent: list[Message], compression: Compression,
                                                          max_bytes: int) -> None:
    batches: list[bytes] = []
    builder = BatchBuilder(max_bytes=max_bytes, compression=compression)
    for m in sent:
        if not builder.try_append(m.timestamp_ms, m.data, m.key, m.attribute, m.headers):
            batches.append(builder.build())
            builder = BatchBuilder(max_bytes=max_bytes, compression=compression)
            assert builder.try_append(m.timestamp_ms, m.data, m.key, m.attribute, m.headers), "first always fits"
        if compression == Compression.NONE and len(builder) > 1:
            assert builder.size_bytes <= max_bytes
    batches.append(builder.build())
    got: list[Message] = []
    for batch in batches:
        if compression == Compression.NONE:
            assert len(batch) == read_header(batch).total_bytes
        validate_batch(batch, BIG, BIG)
        got.extend(decode_batch(stamped(batch, len(got), len(got)), "t", 3))
    assert seen(got) == expected(sent, 0, 0, 7)


def test_empty_batch_is_refused() -> None:
    with pytest.raises(InvalidArgument):
        BatchBuilder(max_bytes=1000).build()
    with pytest.raises(InvalidArgument):
        encode_values([], 0)


def test_empty_and_absent_fields_stay_distinct() -> None:
    sent = [Message("t", b"", key=b"", attribute=""), Message("t", b"v", key=None, attribute=None),
            Message("t", b"", headers=[("", b"")]), Message("t", b"x", headers=[])]
    for m in sent:
        m.timestamp_ms = 5
    got = decode_batch(stamped(encode_messages(sent), 0), "t", 3)
    assert [(m.key, m.attribute, m.headers, m.data) for m in got] == [
        (b"", "", None, b""), (None, None, None, b"v"), (None, None, [("", b"")], b""), (None, None, None, b"x")]


def test_missing_timestamp_becomes_now() -> None:
    batch = encode_messages([Message("t", b"a"), Message("t", b"b", timestamp_ms=3)], now_ms=1000)
    assert [m.timestamp_ms for m in decode_batch(batch)] == [1000, 3]
    assert read_header(batch).first_timestamp_ms == 3


def test_attribute_length_limit() -> None:
    encode_messages([Message("t", b"", attribute="a" * 0x7FFF)])
    with pytest.raises(InvalidArgument):
        encode_messages([Message("t", b"", attribute="a" * 0x8000)])


def test_size_limits_are_invalid_argument() -> None:
    batch = encode_messages([Message("t", b"x" * 100, timestamp_ms=1), Message("t", b"y", timestamp_ms=1)])
    largest = RECORD_OVERHEAD_BYTES + 100  # the 100-byte message with its column entries
    validate_batch(batch, max_message_bytes=largest, max_batch_bytes=len(batch))
    with pytest.raises(InvalidArgument):
        validate_batch(batch, max_message_bytes=largest, max_batch_bytes=len(batch) - 1)
    with pytest.raises(InvalidArgument):
        validate_batch(batch, max_message_bytes=largest - 1, max_batch_bytes=len(batch))


def test_compression_parse() -> None:
    assert Compression.parse(None) is Compression.NONE
    assert Compression.parse(" Zstd ") is Compression.ZSTD
    assert Compression.parse(1) is Compression.LZ4
    assert Compression.parse(Compression.LZ4) is Compression.LZ4
    for bad in ("gzip", 9):
        with pytest.raises(InvalidArgument):
            Compression.parse(bad)


@st.composite
def fetched_logs(draw: st.DrawFn) -> tuple[list[bytes], list[list[Message]]]:
    """Consecutive stamped batches as a partition stores them (offsets contiguous from 10)."""
    batches, contents, offset = [], [], 10
    for _ in range(draw(st.integers(1, 4))):
        sent = draw(st.lists(messages("t"), min_size=1, max_size=4))
        batches.append(stamped(encode_messages(sent, draw(compressions)), offset, offset << 8, 99))
        contents.append(sent)
        offset += len(sent)
    return batches, contents


@RECORDS
@given(log=fetched_logs(), data=st.data())
def test_decode_fetched_skips_below_offset_and_drops_cut_tail(
        log: tuple[list[bytes], list[list[Message]]], data: st.DataObject) -> None:
    batches, contents = log
    body = b"".join(batches)
    end = 10 + sum(len(c) for c in contents)
    from_offset = data.draw(st.integers(10, end), label="from_offset")
    cut = data.draw(st.integers(0, len(body)), label="cut")
    view = body[:cut]

    # The model: whole batches only, messages at or after from_offset.
    want, next_offset, pos, offset, positions = [], from_offset, 0, 10, []
    for batch, sent in zip(batches, contents, strict=True):
        if pos + len(batch) > cut:
            break
        positions.append(pos)
        for i, m in enumerate(sent):
            if offset + i >= from_offset:
                want.append((m.data, m.key, m.attribute, m.headers or None, m.timestamp_ms, "t", 3,
                             offset + i, (offset << 8) + i, 99))
        if offset + len(sent) > from_offset:
            next_offset = offset + len(sent)
        pos += len(batch)
        offset += len(sent)

    assert [p for p, _ in iter_batches(view)] == positions
    got, got_next = decode_fetched(view, "t", 3, from_offset)
    assert seen(got) == want
    assert got_next == next_offset


def test_iter_batches_from_a_position_and_peek_length() -> None:
    a = stamped(encode_values([b"a"], 1), 0)
    b = stamped(encode_values([b"bb", b"cc"], 1), 1)
    body = a + b
    assert [(p, h.base_offset) for p, h in iter_batches(body)] == [(0, 0), (len(a), 1)]
    assert [p for p, _ in iter_batches(body, len(a))] == [len(a)]
    assert peek_length(body, len(a)) == (1, len(b))
    assert peek_length(body[:11]) is None
    assert list(iter_batches(body[: len(a) + HEADER_BYTES - 1])) == [(0, read_header(a))]


def test_decode_batch_ignores_bytes_after_the_batch() -> None:
    a = stamped(encode_values([b"a"], 1), 0)
    b = stamped(encode_values([b"b"], 1), 1)
    assert [m.data for m in decode_batch(a + b)] == [b"a"]
    with pytest.raises(CorruptRecordError):
        decode_batch(a[:-1], header=read_header(a))


# -- integrity: the two checksums cover every byte of a stored batch -------------------------------

def flip(batch: bytes, bit: int) -> bytes:
    buf = bytearray(batch)
    buf[bit // 8] ^= 1 << (bit % 8)
    return bytes(buf)


@pytest.mark.parametrize("compression", list(Compression), ids=[c.name for c in Compression])
def test_every_single_bit_flip_anywhere_in_a_stamped_batch_is_caught(compression: Compression) -> None:
    """Offsets, ids, append time, length, magic, both CRCs, the producer's fields: nothing is unchecked."""
    batch = stamped(encode_messages([Message("t", b"payload", "attr", b"key", [("h", b"v")], 5),
                                     Message("t", b"", timestamp_ms=6)], compression), 40, 1 << 100)
    decode_batch(batch, verify=True)
    for bit in range(len(batch) * 8):
        bad = flip(batch, bit)
        with pytest.raises(CorruptRecordError):
            validate_batch(bad, BIG, BIG)
        with pytest.raises(CorruptRecordError):
            decode_batch(bad, verify=True)


@RECORDS
@given(sent=st.lists(messages("t"), min_size=1, max_size=3), compression=compressions, data=st.data())
def test_random_bit_flip_is_caught(sent: list[Message], compression: Compression, data: st.DataObject) -> None:
    batch = stamped(encode_messages(sent, compression), 0)
    bad = flip(batch, data.draw(st.integers(0, len(batch) * 8 - 1), label="bit"))
    with pytest.raises(CorruptRecordError):
        validate_batch(bad, BIG, BIG)
    with pytest.raises(CorruptRecordError):
        decode_batch(bad, verify=True)


def test_the_header_checksum_is_checked_even_without_body_verification() -> None:
    """verify=False skips only the body CRC: offsets and ids are never taken from an unchecked header."""
    batch = stamped(encode_values([b"a", b"b"], 1), 100)
    bad = flip(batch, 7 * 8 + 4)  # base offset 100 -> 116
    with pytest.raises(CorruptRecordError, match="header"):
        decode_batch(bad, verify=False)
    with pytest.raises(CorruptRecordError):
        list(iter_batches(bad))


def test_stamping_rewrites_the_header_checksum_only() -> None:
    batch = encode_values([b"a", b"b"], 1)
    out = stamped(batch, 1234, 5 << 70, 99)
    assert out[STAMPED_BYTES:] == batch[STAMPED_BYTES:]
    header = read_header(out)
    assert (header.base_offset, header.base_message_id, header.append_time_ms) == (1234, 5 << 70, 99)
    assert header.crc == read_header(batch).crc and header.header_crc != read_header(batch).header_crc
    assert stamp_prefix(read_header(batch), 1234, 5 << 70, 99) == out[:STAMPED_BYTES]


def test_read_header_refuses_short_or_foreign_bytes() -> None:
    batch = encode_values([b"a"], 1)
    for bad in (batch[:HEADER_BYTES - 1], batch[:12] + b"\x03" + batch[13:],
                batch[:8] + (54).to_bytes(4, "big") + batch[12:]):
        with pytest.raises(CorruptRecordError):
            read_header(bad)
    with pytest.raises(CorruptRecordError, match=r"format version 1, written by metaq 0\.1"):
        read_header(batch[:12] + b"\x01" + batch[13:])
    assert rec.is_protocol_error(CorruptRecordError("x"))


@pytest.mark.parametrize("message", [
    Message("t", b"x" * 100),
    Message("t", b""),
    Message("t", b"v", key=b"k" * 30),
    Message("t", b"v", key=b""),
    Message("t", b"v", attribute="tag"),
    Message("t", b"v", headers=[("h", b"1")]),
])
def test_a_one_message_batch_is_checked_as_a_longer_one(message: Message) -> None:
    """One-message batches take a shorter check: the same batches pass, the same size limit and the same
    damage are refused."""
    batch = encode_messages([message])
    size = RECORD_OVERHEAD_BYTES + len(message.key or b"") + len(message.data) + len(
        (message.attribute or "").encode())
    if not message.headers:
        validate_batch(batch, max_message_bytes=size, max_batch_bytes=len(batch))
        with pytest.raises(InvalidArgument):
            validate_batch(batch, max_message_bytes=size - 1, max_batch_bytes=len(batch))
    validate_batch(batch, max_message_bytes=1 << 20, max_batch_bytes=len(batch))
    body = HEADER_BYTES
    for field_at, bad in ((0, (1).to_bytes(4, "little")),                 # offset delta not 0
                          (16, (len(message.data) + 1).to_bytes(4, "little")),  # value length past the end
                          (16, (-1).to_bytes(4, "little", signed=True)),    # negative value length
                          (12, (-2).to_bytes(4, "little", signed=True)),    # key length below -1
                          (22, (len(message.headers or ()) + 1).to_bytes(2, "little"))):  # a header too many
        damaged = bytearray(batch)
        damaged[body + field_at:body + field_at + len(bad)] = bad
        damaged[STAMPED_BYTES - 8:STAMPED_BYTES - 4] = rec.compute_crc(damaged).to_bytes(4, "big")  # body crc
        head = read_header(batch)
        stamp(damaged, head.base_offset, head.base_message_id, head.append_time_ms)  # and header_crc
        with pytest.raises(CorruptRecordError):
            validate_batch(bytes(damaged), max_message_bytes=1 << 20, max_batch_bytes=len(batch))


def _rechecksummed(batch: bytearray) -> bytes:
    """``batch`` with its body crc and header_crc made to match its (edited) bytes again."""
    head = read_header(batch)  # before the crc changes: the header_crc covers it
    batch[STAMPED_BYTES - 8:STAMPED_BYTES - 4] = rec.compute_crc(batch).to_bytes(4, "big")
    stamp(batch, head.base_offset, head.base_message_id, head.append_time_ms)
    return bytes(batch)


@pytest.mark.parametrize("values", [
    [b"x" * 100] * 5,
    [b"", b"a", b"bb"],
    [b"v"] * 32,
])
@pytest.mark.parametrize("keys", [False, True])
def test_a_plain_batch_is_refused_over_the_limit_and_for_damage_in_each_column(values: list[bytes],
                                                                               keys: bool) -> None:
    """Batches of a few plain messages, what producers send most: accepted at the size limit, refused one byte over
    it and for damage in every column."""
    sent = [Message("t", v, key=(b"k" * i if keys else None)) for i, v in enumerate(values)]
    batch = encode_messages(sent)
    n = len(sent)
    largest = max(RECORD_OVERHEAD_BYTES + len(m.key or b"") + len(m.data) for m in sent)
    validate_batch(batch, max_message_bytes=largest, max_batch_bytes=len(batch))
    with pytest.raises(InvalidArgument):
        validate_batch(batch, max_message_bytes=largest - 1, max_batch_bytes=len(batch))
    body = HEADER_BYTES
    last = n - 1
    for field_at, bad in ((4 * last, (last + 1).to_bytes(4, "little")),                    # offset deltas not 0..n-1
                          (16 * n + 4 * last, (len(values[-1]) + 1).to_bytes(4, "little")),  # value past the end
                          (16 * n, (-1).to_bytes(4, "little", signed=True)),               # negative value length
                          (12 * n + 4 * last, (-2).to_bytes(4, "little", signed=True)),    # key length below -1
                          (20 * n + 2 * last, (3).to_bytes(2, "little")),                  # an attribute past the end
                          (22 * n + 2 * last, (1).to_bytes(2, "little"))):                 # a header too many
        damaged = bytearray(batch)
        damaged[body + field_at:body + field_at + len(bad)] = bad
        with pytest.raises(CorruptRecordError):
            validate_batch(_rechecksummed(damaged), max_message_bytes=1 << 20, max_batch_bytes=len(batch))
