"""The public client API for record batches handled whole (metaq.client.batches, what the Spark source and sink
use): a fetch reply as checked columns, the next fetch's offset guessed from headers, payloads cut into batches;
the key-hash rule as a function; a named transaction's producer sequences."""

from __future__ import annotations

import zlib

import pytest

from metaq.client import (
    ColumnSpan,
    Compression,
    KeyHashSelector,
    Partition,
    ProducerSequences,
    fetched_columns,
    key_partition,
    next_fetch_offset,
    value_batches,
)
from metaq.errors import CorruptRecordError
from metaq.protocol.records import (
    HEADER_BYTES,
    RECORD_OVERHEAD_BYTES,
    SEQUENCE_LIMIT,
    decode_batch,
    encode_values,
    producer_stamp,
    read_header,
    rebuild_batch,
    stamp,
)
from metaq.types import Message, PartitionId


def _stored(values: list[bytes], base_offset: int) -> bytes:
    raw = bytearray(encode_values(values, 1000))
    stamp(raw, base_offset, (7 << 64) | base_offset, 2000)
    return bytes(raw)


def _reply() -> bytes:
    """Three stored batches of 4 records each: offsets 10..21."""
    return b"".join(_stored([b"%d-%d" % (b, i) for i in range(4)], 10 + 4 * b) for b in range(3))


def _values(span: ColumnSpan) -> list[bytes]:
    cols = span.columns
    body, pos, out = bytes(cols.body), cols.values_at, []
    for i, length in enumerate(cols.vlens):
        if span.lo <= i < span.hi:
            out.append(body[pos:pos + length])
        pos += length
    return out


def test_fetched_columns_gives_the_records_of_the_range_batch_by_batch() -> None:
    fetched = fetched_columns(_reply(), 12, 19)
    assert [(s.header.base_offset, s.lo, s.hi) for s in fetched.spans] == [(10, 2, 4), (14, 0, 4), (18, 0, 1)]
    assert [v for s in fetched.spans for v in _values(s)] == [b"0-2", b"0-3", b"1-0", b"1-1", b"1-2", b"1-3", b"2-0"]
    assert (fetched.next_offset, fetched.first_base_offset, fetched.first_batch) == (19, 10, None)
    assert [s.header.base_message_id + s.columns.deltas[s.lo] for s in fetched.spans] == [(7 << 64) | o
                                                                                          for o in (12, 14, 18)]


def test_a_batch_with_no_record_left_still_moves_the_next_offset() -> None:
    raw = _stored([b"a", b"b", b"c"], 0)
    header = read_header(raw)
    emptied = rebuild_batch(raw, header, [])  # a server-side filter kept none of its records
    fetched = fetched_columns(emptied + _stored([b"d"], 3), 0, 10)
    assert [(s.header.base_offset, _values(s)) for s in fetched.spans] == [(3, [b"d"])]
    assert (fetched.next_offset, fetched.first_base_offset) == (4, 0)


def test_damage_ends_the_reply_after_the_intact_batches_and_raises_only_at_its_start() -> None:
    reply = bytearray(_reply())
    second = len(_stored([b"0-0", b"0-1", b"0-2", b"0-3"], 10))
    reply[second + HEADER_BYTES + 3] ^= 0xFF  # the second batch's body: its header is intact, its CRC fails
    fetched = fetched_columns(bytes(reply), 10, 22)
    assert [s.header.base_offset for s in fetched.spans] == [10]
    assert fetched.next_offset == 14  # the next fetch starts at the damage
    with pytest.raises(CorruptRecordError, match="t:0-0: record batch at offset 14 is damaged") as caught:
        fetched_columns(bytes(reply[second:]), 14, 22, "t:0-0")
    assert (caught.value.offset, caught.value.resume_offset) == (14, 18)


def test_a_reply_cut_inside_its_first_batch_says_how_large_that_batch_is() -> None:
    batch = _stored([b"x" * 100] * 3, 40)
    fetched = fetched_columns(batch[:50], 40, 100)
    assert (fetched.spans, fetched.next_offset, fetched.first_base_offset) == ([], 40, -1)
    assert fetched.first_batch == (40, len(batch))
    assert fetched_columns(b"", 40, 100).first_batch is None


def test_next_fetch_offset_reads_headers_only() -> None:
    reply = _reply()
    assert next_fetch_offset(reply, 11, 100) == 22
    assert next_fetch_offset(reply, 11, 16) == 16
    assert next_fetch_offset(reply[:-5], 11, 100) == 18  # a cut-off last batch is the next fetch's
    damaged = bytearray(reply)
    damaged[-3] ^= 0xFF  # a body: the headers do not tell
    assert next_fetch_offset(bytes(damaged), 11, 100) == 22
    damaged = bytearray(reply)
    damaged[0:8] = (99).to_bytes(8, "big")  # a header: no guess
    assert next_fetch_offset(bytes(damaged), 11, 100) == 11


@pytest.mark.parametrize("compression", list(Compression))
def test_value_batches_cut_payloads_into_batches_of_at_most_batch_bytes(compression: Compression) -> None:
    values = [b"v" * (i % 37) for i in range(500)] + [b"w" * 5000] + [b"z"] * 3
    batches = list(value_batches(values, 1234, 1024, compression))
    assert sum(count for _, count in batches) == len(values)
    got, i = [], 0
    for records, count in batches:
        messages = decode_batch(records)
        assert len(messages) == count and {m.timestamp_ms for m in messages} == {1234}
        got += [bytes(m.data) for m in messages]
        size = HEADER_BYTES + sum(RECORD_OVERHEAD_BYTES + len(v) for v in values[i:i + count])
        assert size <= 1024 or count == 1  # a payload larger than a batch goes alone
        if i + count < len(values):  # and each batch is as full as the next payload lets it be
            assert size + RECORD_OVERHEAD_BYTES + len(values[i + count]) > 1024
        i += count
    assert got == values


def test_key_partition_is_the_key_hash_selectors_rule() -> None:
    partitions = [Partition(b, p) for b in (1, 2) for p in range(3)]
    selector = KeyHashSelector()
    for key in (b"", b"user-7", b"\xff" * 20, *(b"k%d" % i for i in range(100))):
        chosen = key_partition(partitions, key)
        assert chosen == selector("t", partitions, Message("t", b"v", key=key))
        assert chosen == partitions[zlib.crc32(key) % 6]
    ids = [PartitionId(p.broker_id, p.partition) for p in partitions]  # any sequence: the sink's PartitionIds
    assert key_partition(ids, b"user-7") == key_partition(partitions, b"user-7")


def test_producer_sequences_count_per_partition_and_wrap() -> None:
    sequences = ProducerSequences(producer_id=42)

    def sequence_of(records: bytes) -> tuple[int, ...]:
        found = producer_stamp(records, read_header(records))
        assert found is not None
        return tuple(found)

    batch = encode_values([b"a", b"b", b"c"], 1)
    assert sequence_of(sequences.stamp("t", 0, batch, 3)) == (42, 0, 0)
    assert sequence_of(sequences.stamp("t", 0, batch, 3)) == (42, 0, 3)
    assert sequence_of(sequences.stamp("t", 1, batch, 3)) == (42, 0, 0)  # each partition from 0
    assert sequence_of(sequences.stamp("u", 0, batch, 3)) == (42, 0, 0)
    sequences.stamp("t", 2, batch, SEQUENCE_LIMIT - 2)  # a count is all a sequence moves by
    assert sequence_of(sequences.stamp("t", 2, batch, 3)) == (42, 0, SEQUENCE_LIMIT - 2)
    assert sequence_of(sequences.stamp("t", 2, batch, 3)) == (42, 0, 1)  # past the limit: from 0 again
    assert 0 < ProducerSequences().producer_id <= 1 << 62
