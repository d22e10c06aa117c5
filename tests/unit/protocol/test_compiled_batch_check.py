"""The broker's per-batch work in compiled code: metaq._speedups.validate_plain, validate_batch's fast accept of what
producers send (header, CRCs, counts, attributes and plain columns in one call), and metaq._speedups.stamp_prefix,
the 45 bytes stamped before an append, against their Python references (validate_batch's Python code,
records.format.stamp_prefix_py). The compiled check gives exactly the header the Python code gives, or None (not
that case: the Python code decides), and never accepts a batch the Python code refuses; the compiled prefix is the
Python one byte for byte. Batches come from the producer's encoders, then are damaged every way the format can
be: bit flips, cuts, extra bytes, fields edited with and without their CRCs recomputed."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import crc32c
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from protocol_strategies import examples

from metaq.errors import CorruptRecordError, InvalidArgument
from metaq.protocol import records as rec
from metaq.protocol.delayed import DELIVER_AT_HEADER, mark_delayed, pack_ms
from metaq.protocol.records import format as record_format
from metaq.protocol.records import validate
from metaq.protocol.records.validate import Columns

COMPILED = pytest.mark.skipif(validate.validate_plain is None, reason="metaq._speedups not in use")
VALIDATE_PLAIN = validate.validate_plain
STAMP_PREFIX = record_format.stamp_prefix_compiled
stamp_prefix_py = record_format.stamp_prefix_py
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
ATTRIBUTE_TEXT = st.text(max_size=6)
HEADERS = st.lists(st.tuples(st.text(max_size=5), st.binary(max_size=8)), max_size=2)


def compiled_check(batch: Any, max_message_bytes: Any, max_batch_bytes: Any) -> rec.BatchHeader | None:
    header: rec.BatchHeader | None = VALIDATE_PLAIN(batch, max_message_bytes, max_batch_bytes, rec.BatchHeader)
    return header


@contextmanager
def python_only(columns: bool = True) -> Iterator[None]:
    """validate_batch, the readers' check and stamp_prefix with their compiled halves switched off; ``columns``: the
    compiled columns check too (it shares its C with validate_plain), as an install without the module: the
    reference."""
    saved = validate.validate_plain, record_format.stamp_prefix_compiled, validate.plain_columns_ok_compiled
    validate.validate_plain = record_format.stamp_prefix_compiled = None
    if columns:
        validate.plain_columns_ok_compiled = None
    try:
        yield
    finally:
        validate.validate_plain, record_format.stamp_prefix_compiled, validate.plain_columns_ok_compiled = saved


def outcome(batch: Any, max_message_bytes: int, max_batch_bytes: int) -> Any:
    """What validate_batch gives: the header (with the types of its fields), or the error's type and words."""
    try:
        header = rec.validate_batch(batch, max_message_bytes, max_batch_bytes)
    except (CorruptRecordError, InvalidArgument) as exc:
        return type(exc), str(exc)
    return type(header), tuple(header), tuple(map(type, header))


def reseal(batch: bytearray, body: bool = True) -> None:
    """Recompute the body crc (when ``body``) and the header_crc of an edited batch, as an encoder would."""
    if len(batch) < rec.HEADER_BYTES:
        return
    if body:
        struct.pack_into(">I", batch, 37, crc32c.crc32c(bytes(batch[rec.STAMPED_BYTES:])))
    struct.pack_into(">I", batch, 41, crc32c.crc32c(bytes(batch[rec.STAMPED_BYTES:rec.HEADER_BYTES]),
                                                    crc32c.crc32c(bytes(batch[:rec.HEADER_CRC_COVERS]))))


@st.composite
def producer_stamps(draw: st.DrawFn) -> rec.ProducerStamp:
    return rec.ProducerStamp(draw(st.integers(1, (1 << 63) - 1)), draw(st.integers(0, (1 << 15) - 1)),
                             draw(st.integers(0, rec.SEQUENCE_LIMIT - 1)))


@st.composite
def produced(draw: st.DrawFn, plain: bool = False) -> bytes:
    """A batch as a producer sends it: plain values (one timestamp or one each), keyed, with attributes or
    headers, compressed, delayed (attribute bit 7), with the idempotent producer's block or not; ``plain``:
    uncompressed, no attribute or header (keys allowed), what the compiled check must accept."""
    n = draw(st.integers(1, 12))
    values = draw(st.lists(st.binary(max_size=40), min_size=n, max_size=n))
    kind = draw(st.sampled_from(["values", "columns", "keyed"] if plain else
                                ["values", "columns", "keyed", "attributes", "headers", "everything"]))
    compression = rec.Compression.NONE if plain else draw(st.sampled_from(list(rec.Compression)))
    stamps = draw(st.lists(st.integers(0, 1 << 45), min_size=n, max_size=n))
    some = st.one_of(st.none(), st.binary(max_size=10))
    if kind == "values":
        batch = rec.encode_values(values, stamps[0], compression)
    elif kind == "columns":
        batch = rec.encode_columns(values, stamps, compression=compression)
    else:
        keys = draw(st.lists(some, min_size=n, max_size=n)) if kind in ("keyed", "everything") else None
        attrs = (draw(st.lists(st.one_of(st.none(), ATTRIBUTE_TEXT), min_size=n, max_size=n))
                 if kind in ("attributes", "everything") else None)
        hdrs = (draw(st.lists(st.one_of(st.none(), HEADERS), min_size=n, max_size=n))
                if kind in ("headers", "everything") else None)
        batch = rec.encode_columns(values, stamps, keys=keys, attributes=attrs, headers=hdrs, compression=compression)
    if not plain and draw(st.integers(0, 4)) == 0:
        batch = mark_delayed(batch)
    if draw(st.booleans()):
        batch = rec.with_producer_stamp(batch, draw(producer_stamps()))
    return batch


def largest_record(batch: bytes) -> int:
    """The largest record's size as validate_batch measures it against max_message_bytes."""
    return max(rec.batch_columns(batch, verify=False)[1].record_bytes())


def limits(draw: st.DrawFn, batch: bytes) -> tuple[int, int]:
    try:
        biggest = largest_record(batch)
    except Exception:  # a damaged batch: any limit will do
        biggest = 100
    message = draw(st.sampled_from([1 << 20, 1 << 20, biggest, biggest, biggest - 1, 24, 0, -1, 1 << 70]))
    whole = draw(st.sampled_from([1 << 24, 1 << 24, len(batch), len(batch), len(batch) - 1, 0, -(1 << 70), 1 << 70]))
    return message, whole


FIELDS = {"batch_length": (8, ">i"), "magic": (12, ">b"), "attributes": (45, ">h"), "last_offset_delta": (47, ">i"),
          "record_count": (67, ">i")}


def damage(draw: st.DrawFn, batch: bytes) -> bytearray:
    """The batch damaged one of the ways the format can be (or not at all)."""
    out = bytearray(batch)
    how = draw(st.sampled_from(["none", "none", "flip", "flip", "cut", "extra", "field", "field", "column", "stamp"]))
    if how == "flip":
        for _ in range(draw(st.integers(1, 3))):
            at = draw(st.integers(0, len(out) - 1))
            out[at] ^= 1 << draw(st.integers(0, 7))
    elif how == "cut":
        del out[draw(st.integers(0, len(out) - 1)):]
    elif how == "extra":
        out += draw(st.binary(min_size=1, max_size=30))
        if draw(st.booleans()):  # the length field says so too
            struct.pack_into(">i", out, 8, len(out) - rec.LENGTH_PREFIX_BYTES)
            reseal(out)
    elif how == "field":
        name = draw(st.sampled_from(sorted(FIELDS)))
        at, fmt = FIELDS[name]
        size = struct.calcsize(fmt)
        low, high = -(1 << (8 * size - 1)), (1 << (8 * size - 1)) - 1
        (now,) = struct.unpack_from(fmt, out, at)
        value = draw(st.one_of(st.integers(now - 2, now + 2), st.integers(low, high),
                               st.sampled_from([0, 1, 2, 8, 0x80, 0x88, 0x89, 0x100, low, high]))
                     .filter(lambda v: low <= v <= high))
        struct.pack_into(fmt, out, at, value)
        if name == "record_count" and draw(st.booleans()):  # count and delta edited together, as they agree
            struct.pack_into(">i", out, 47, max(min(value - 1, high), low))
        how_sealed = draw(st.sampled_from(["none", "header", "both"]))
        if how_sealed != "none":
            reseal(out, body=how_sealed == "both")
    elif how == "column":  # a byte of the columns or records changed under valid CRCs: the deep checks decide
        at = draw(st.integers(rec.HEADER_BYTES, max(rec.HEADER_BYTES, len(out) - 1)))
        if at < len(out):
            out[at] = draw(st.integers(0, 255))
        reseal(out)
    elif how == "stamp":  # what the broker's append writes: stamped fields, a 128-bit id
        rec.stamp(out, draw(st.integers(0, 1 << 62)), draw(st.integers(0, (1 << 128) - 1)),
                  draw(st.integers(-1, 1 << 45)))
    return out


def as_buffer(draw: st.DrawFn, data: bytearray) -> Any:
    """The batch as bytes, a bytearray, a memoryview (of all of a buffer, or inside a larger one), or a memoryview
    whose items are not bytes."""
    kind = draw(st.sampled_from(["bytes", "bytes", "bytearray", "memoryview", "inner view", "int view"]))
    if kind == "bytes":
        return bytes(data)
    if kind == "bytearray":
        return data
    if kind == "memoryview":
        return memoryview(bytes(data))
    if kind == "inner view":
        return memoryview(b"\x00" * 3 + bytes(data) + b"\xff" * 5)[3:3 + len(data)]
    cut = len(data) - len(data) % 4
    return memoryview(bytes(data[:cut])).cast("i")


@COMPILED
@settings(max_examples=examples(600), deadline=None)
@given(data=st.data())
def test_the_compiled_check_gives_the_python_header_or_none(data: st.DataObject) -> None:
    """Any produced batch, damaged or not, in any buffer, under any limits: the compiled check says None or exactly
    the header validate_batch's Python code returns (an instance of BatchHeader, every field an int as read_header
    makes it); never a header where the Python code raises. And validate_batch decides the same with the compiled
    checks as without them (the same header or the same error)."""
    batch = damage(data.draw, data.draw(st.one_of(produced(), produced(plain=True))))
    buffer = as_buffer(data.draw, batch)
    max_message, max_batch = limits(data.draw, bytes(batch))
    compiled = compiled_check(buffer, max_message, max_batch)
    with python_only():
        python = outcome(buffer, max_message, max_batch)
    with python_only(columns=False):
        without = outcome(buffer, max_message, max_batch)
    assert without == python
    if compiled is not None:
        assert type(compiled) is rec.BatchHeader
        assert (type(compiled), tuple(compiled), tuple(map(type, compiled))) == python
    event("compiled header" if compiled is not None else "None, Python accepts" if python[0] is rec.BatchHeader
          else "None, Python refuses")
    assert outcome(buffer, max_message, max_batch) == without


@COMPILED
@settings(max_examples=examples(300), deadline=None)
@given(batch=produced(plain=True), as_bytearray=st.booleans())
def test_every_plain_uncompressed_batch_producers_send_is_accepted(batch: bytes, as_bytearray: bool) -> None:
    """The fast path is really taken: plain values (keys or none, the producer block or not), at the limits exactly
    (the largest record, the batch's length) as well as under generous ones; one byte less refuses in Python, None
    here."""
    biggest = largest_record(batch)
    buffer: Any = bytearray(batch) if as_bytearray else batch
    for max_message, max_batch in [(1 << 20, 1 << 24), (biggest, len(batch)), ((1 << 63) - 1, (1 << 63) - 1)]:
        header = compiled_check(buffer, max_message, max_batch)
        assert header is not None
        assert header == rec.read_header(batch)
        with python_only():
            assert rec.validate_batch(buffer, max_message, max_batch) == header
    assert compiled_check(buffer, biggest - 1, len(batch)) is None
    assert compiled_check(buffer, biggest, len(batch) - 1) is None


@COMPILED
def test_a_stamped_batch_is_read_with_its_128_bit_id() -> None:
    """A batch as stored (base offset, a 128-bit id, append time): the same header as read_header's."""
    batch = bytearray(rec.encode_values([b"x" * 10, b"y"], 5))
    rec.stamp(batch, (1 << 63) - 1, (1 << 128) - 1, (1 << 63) - 1)
    header = compiled_check(bytes(batch), 100, 1000)
    assert header == rec.read_header(batch)
    assert header is not None and header.base_message_id == (1 << 128) - 1


@COMPILED
@pytest.mark.parametrize("stamped", [False, True], ids=["unstamped", "producer block"])
def test_every_single_bit_flip_is_declined(stamped: bool) -> None:
    """Every byte of a batch is covered by a checksum, so every single-bit flip is refused by the Python code; the
    compiled check must say None for each, position by position."""
    batch = rec.encode_values([b"ab", b"", b"cdef"], 1_700_000_000_000)
    if stamped:
        batch = rec.with_producer_stamp(batch, rec.ProducerStamp(7, 1, 3))
    assert compiled_check(batch, 1 << 20, 1 << 24) is not None
    for at in range(len(batch)):
        for bit in range(8):
            flipped = bytearray(batch)
            flipped[at] ^= 1 << bit
            assert compiled_check(bytes(flipped), 1 << 20, 1 << 24) is None, (at, bit)
            with pytest.raises((CorruptRecordError, InvalidArgument)):
                rec.validate_batch(bytes(flipped), 1 << 20, 1 << 24)


def same_decision(batch: bytes, max_message_bytes: int = 1 << 20, max_batch_bytes: int = 1 << 24) -> Any:
    """Assert the compiled check gives None or the Python code's header (never a header where it raises); return
    the Python outcome."""
    compiled = compiled_check(batch, max_message_bytes, max_batch_bytes)
    with python_only():
        python = outcome(batch, max_message_bytes, max_batch_bytes)
    if compiled is not None:
        assert (type(compiled), tuple(compiled), tuple(map(type, compiled))) == python
    return python


PLAIN_BATCHES = [rec.encode_values([b"abc"], 1), rec.encode_columns([b"", b"xy", b"z" * 30], [3, 1, 2]),
                 rec.encode_columns([b"k?", b"v"], [5, 5], keys=[b"key", None])]
PLAIN_BATCHES += [rec.with_producer_stamp(b, rec.ProducerStamp(9, 2, 100)) for b in PLAIN_BATCHES]


@COMPILED
@pytest.mark.parametrize("field", sorted(FIELDS))
@pytest.mark.parametrize("sealed", ["header crc", "both crcs"])
def test_an_edited_header_field_under_recomputed_crcs(field: str, sealed: str) -> None:
    """Each field a reader navigates by (length, magic, attributes, last offset delta, record count) set to values
    around its own and to the ones that mean something (compression, the producer block, delayed, unknown bits,
    format version 1), the CRCs recomputed so that only the field's own check can refuse it: the compiled check
    accepts only where the Python code does, and accepts the batch as it was."""
    at, fmt = FIELDS[field]
    for batch in PLAIN_BATCHES:
        (now,) = struct.unpack_from(fmt, batch, at)
        assert same_decision(batch)[0] is rec.BatchHeader
        assert compiled_check(batch, 1 << 20, 1 << 24) is not None
        for value in sorted({now - 2, now - 1, now + 1, now + 2, 0, 1, 2, 3, 7, 8, 9, 0x80, 0x81, 0x88, 0x10, 0x100,
                             -1, 127, -128}):
            edited = bytearray(batch)
            try:
                struct.pack_into(fmt, edited, at, value)
            except struct.error:
                continue
            reseal(edited, body=sealed == "both crcs")
            decided = same_decision(bytes(edited))
            if value != now:
                # the count with a matching delta would need other columns; every other edit is refused
                assert decided[0] is not rec.BatchHeader or (field == "attributes" and value in (0x80, 0x88))


@COMPILED
@pytest.mark.parametrize("batch", PLAIN_BATCHES, ids=lambda b: f"{len(b)}B")
def test_an_edited_column_byte_under_recomputed_crcs(batch: bytes) -> None:
    """Every byte after the fixed header (the producer block, the columns, keys and values) set to other values,
    both CRCs recomputed: only the columns check can refuse it, and the compiled one accepts only what the Python
    code accepts."""
    for at in range(rec.HEADER_BYTES, len(batch)):
        for value in {0x00, 0x01, 0x7F, 0x80, 0xFF, batch[at] ^ 0x01}:
            edited = bytearray(batch)
            edited[at] = value
            reseal(edited)
            same_decision(bytes(edited))
            same_decision(bytes(edited), max_message_bytes=largest_record(batch))


@COMPILED
def test_what_it_leaves_to_the_python_code() -> None:
    """Compression, attributes, headers, a delayed batch, odd buffers and limits: None, and the Python code
    accepts (or refuses) them as before."""
    values = [b"v" * 30, b"w"]
    for batch in [rec.encode_values(values, 1, rec.Compression.LZ4), rec.encode_values(values, 1, rec.Compression.ZSTD),
                  rec.encode_columns(values, [1, 2], attributes=["a", None]),
                  rec.encode_columns(values, [1, 2], headers=[[("h", b"x")], None]),
                  mark_delayed(rec.encode_columns(values, [1, 2], headers=[[(DELIVER_AT_HEADER, pack_ms(5))]] * 2))]:
        assert compiled_check(batch, 1 << 20, 1 << 24) is None
        assert rec.validate_batch(batch, 1 << 20, 1 << 24) == rec.read_header(batch)
    plain = rec.encode_values(values, 1)
    assert compiled_check(plain, 1 << 20, 1 << 24) is not None
    for odd in [1.0e9, "1000000", None]:
        assert compiled_check(plain, odd, 1 << 24) is None
        assert compiled_check(plain, 1 << 20, odd) is None
    released = memoryview(plain)
    released.release()
    for buffer in [released, memoryview(plain * 2)[::2], plain.decode("latin-1"), list(plain), None]:
        assert compiled_check(buffer, 1 << 20, 1 << 24) is None
    with pytest.raises(TypeError):
        compiled_check(plain, 1 << 20)


@COMPILED
def test_the_header_is_made_as_its_class_makes_it_from_a_tuple() -> None:
    """The header is tuple.__new__(header_type, fields): a BatchHeader, a plain tuple, or any tuple subclass; not a
    class that is not a tuple."""
    from typing import NamedTuple

    class Renamed(NamedTuple):
        a: int
        b: int
        c: int
        d: int
        e: int
        f: int
        g: int
        h: int
        i: int
        j: int
        k: int
        m: int

    batch = rec.encode_values([b"a"], 1)
    header = rec.read_header(batch)
    for cls in (rec.BatchHeader, tuple, Renamed):
        made = VALIDATE_PLAIN(batch, 100, 1000, cls)
        assert type(made) is cls and tuple(made) == tuple(header)
    for cls in (dict, list, rec.BatchHeader(*header)):
        with pytest.raises(TypeError):
            VALIDATE_PLAIN(batch, 100, 1000, cls)
    with pytest.raises(TypeError):
        VALIDATE_PLAIN(batch, 100, 1000)


# -- stamp_prefix --

@st.composite
def headers(draw: st.DrawFn) -> rec.BatchHeader:
    """Headers of real batches, or any fields within what the format packs them into."""
    if draw(st.booleans()):
        return rec.read_header(draw(produced()))
    return rec.BatchHeader(draw(INT64), draw(st.integers(-(1 << 31), (1 << 31) - 1)), 2,
                           draw(st.integers(0, (1 << 128) - 1)), draw(INT64), draw(st.integers(0, (1 << 32) - 1)),
                           draw(st.integers(0, (1 << 32) - 1)), draw(st.integers(-(1 << 15), (1 << 15) - 1)),
                           draw(st.integers(-(1 << 31), (1 << 31) - 1)), draw(INT64), draw(INT64),
                           draw(st.integers(-(1 << 31), (1 << 31) - 1)))


MESSAGE_IDS = st.one_of(st.just(-1), st.just(0), st.integers(0, (1 << 64) - 1), st.integers(0, (1 << 128) - 1),
                        st.integers(-(1 << 127), -1), st.just((1 << 128) - 1))


@COMPILED
@settings(max_examples=examples(500), deadline=None)
@given(header=headers(), base_offset=st.one_of(INT64, st.just(-1), st.just((1 << 63) - 1)), message_id=MESSAGE_IDS,
       append_time=st.one_of(INT64, st.just(-1)))
def test_the_compiled_prefix_is_the_python_one(header: rec.BatchHeader, base_offset: int, message_id: int,
                                               append_time: int) -> None:
    compiled = STAMP_PREFIX(header, base_offset, message_id, append_time)
    assert compiled == stamp_prefix_py(header, base_offset, message_id, append_time)
    assert type(compiled) is bytes and len(compiled) == rec.STAMPED_BYTES
    assert rec.stamp_prefix(header, base_offset, message_id, append_time) == compiled


@COMPILED
@settings(max_examples=examples(200), deadline=None)
@given(header=headers(), data=st.data())
def test_what_the_prefix_leaves_to_the_python_code(header: rec.BatchHeader, data: st.DataObject) -> None:
    """A field out of its range, an id beyond 128 bits, an argument that is not an int, a header that is a plain
    tuple or another NamedTuple: stamp_prefix gives the Python code's bytes or its struct.error, the compiled one may
    say None (a tuple of the twelve fields is a header to it: the bytes of the BatchHeader with those fields)."""
    args: list[Any] = [header, 5, 7, 9]
    where = data.draw(st.sampled_from(["base_offset", "id", "append_time", "field", "type", "tuple"]))
    if where == "base_offset":
        args[1] = data.draw(st.sampled_from([1 << 63, -(1 << 63) - 1, 1 << 100, 5.0]))
    elif where == "id":
        args[2] = data.draw(st.one_of(st.integers(1 << 128, 1 << 200), st.integers(-(1 << 200), -(1 << 127) - 1)))
    elif where == "append_time":
        args[3] = data.draw(st.sampled_from([1 << 63, -(1 << 63) - 1, "9"]))
    elif where == "field":
        index = data.draw(st.sampled_from([1, 5, 7, 8, 9, 10, 11]))
        fields = list(header)
        fields[index] = data.draw(st.sampled_from([1 << 64, -(1 << 64), 1 << 31, -(1 << 31) - 1, 1 << 32, -1,
                                                   1 << 15, -(1 << 15) - 1, 3.0]))
        args[0] = rec.BatchHeader(*fields)
    elif where == "type":
        args[0] = tuple(header)
    else:
        args[0] = header._replace()

    def result(stamp: Any) -> Any:
        try:
            return stamp(*args)
        except (struct.error, AttributeError, TypeError) as exc:
            return type(exc)

    expected = result(stamp_prefix_py)
    compiled = result(STAMP_PREFIX)
    if where == "type":  # the same fields in a tuple: read by position
        args[0] = rec.BatchHeader(*args[0])
        assert compiled == result(stamp_prefix_py)
        return
    assert result(rec.stamp_prefix) == expected
    assert compiled is None or compiled == expected


PACKED = {"batch_length": ">i", "crc": ">I", "attributes": ">h", "last_offset_delta": ">i", "first_timestamp_ms": ">q",
          "max_timestamp_ms": ">q", "record_count": ">i"}
"""The header fields the prefix packs, as struct packs them."""


@COMPILED
@pytest.mark.parametrize("field", sorted(PACKED))
def test_each_header_field_at_and_beyond_its_range(field: str) -> None:
    """Every field the prefix packs, at both ends of its struct range (the same bytes) and one beyond each (the
    Python code's struct.error, the compiled one's None)."""
    fmt = PACKED[field]
    bits = 8 * struct.calcsize(fmt)
    low, high = (0, (1 << bits) - 1) if fmt[1].isupper() else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    base = rec.read_header(PLAIN_BATCHES[0])
    for value in (low, high, low - 1, high + 1):
        header = base._replace(**{field: value})
        args = (header, 1, (1 << 128) - 1, -1)
        if low <= value <= high:
            assert STAMP_PREFIX(*args) == stamp_prefix_py(*args)
        else:
            assert STAMP_PREFIX(*args) is None
            with pytest.raises(struct.error):
                rec.stamp_prefix(*args)


@COMPILED
def test_stamped_fields_at_and_beyond_their_range() -> None:
    header = rec.read_header(PLAIN_BATCHES[0])
    int64 = [-(1 << 63), (1 << 63) - 1]
    for base_offset, message_id, append_time in [(int64[0], -(1 << 127), int64[1]), (int64[1], (1 << 128) - 1, -1),
                                                 (0, 1 << 64, 0), (-1, (1 << 64) - 1, int64[0])]:
        assert (STAMP_PREFIX(header, base_offset, message_id, append_time)
                == stamp_prefix_py(header, base_offset, message_id, append_time))
    for base_offset, append_time in [(int64[0] - 1, 0), (int64[1] + 1, 0), (0, int64[0] - 1), (0, int64[1] + 1)]:
        assert STAMP_PREFIX(header, base_offset, 0, append_time) is None
        with pytest.raises(struct.error):
            rec.stamp_prefix(header, base_offset, 0, append_time)


@COMPILED
@settings(max_examples=examples(150), deadline=None)
@given(batch=produced(plain=True), base_offset=st.integers(0, 1 << 62), message_id=st.integers(0, (1 << 128) - 1),
       append_time=st.integers(-1, 1 << 45))
def test_a_stamped_prefix_makes_a_batch_that_reads_back(batch: bytes, base_offset: int, message_id: int,
                                                        append_time: int) -> None:
    """What the append writes (the prefix, then the produced bytes after 45) is a batch with those fields, and
    the same bytes as stamping in place."""
    header = rec.validate_batch(batch, 1 << 20, 1 << 24)
    stored = rec.stamp_prefix(header, base_offset, message_id, append_time) + batch[rec.STAMPED_BYTES:]
    in_place = bytearray(batch)
    rec.stamp(in_place, base_offset, message_id, append_time)
    assert stored == bytes(in_place)
    assert rec.validate_batch(stored, 1 << 20, 1 << 24) == header._replace(
        base_offset=base_offset, base_message_id=message_id, append_time_ms=append_time,
        header_crc=rec.read_header(stored).header_crc)


def test_stamp_prefix_without_the_compiled_one_gives_the_same_bytes() -> None:
    batch = rec.encode_values([b"abc"] * 3, 11)
    header = rec.validate_batch(batch, 1 << 20, 1 << 24)
    args = (header, 1 << 40, (3 << 112) | (0xABC << 64) | (1 << 40), 1_700_000_000_000)
    with_compiled = rec.stamp_prefix(*args)
    with python_only():
        assert rec.stamp_prefix(*args) == with_compiled
        assert rec.validate_batch(batch, 1 << 20, 1 << 24) == header


# -- the reader's side: a stored batch checked and split into columns by the same compiled check ------------------

COLUMN_FIELDS = ("n", "dense", "deltas", "timestamps", "klens", "vlens", "alens", "hcounts", "keys_at", "values_at",
                 "attrs_at", "headers_at", "no_keys", "no_attrs", "no_headers")


def read_back(buffer: Any, from_offset: int) -> Any:
    """What a reader gets from a stored batch: its columns, its Messages, a fetch body's batches and next offset;
    or the error's type and words."""
    try:
        header, cols = rec.batch_columns(buffer)
        columns = tuple(header), tuple(getattr(cols, f) for f in COLUMN_FIELDS), bytes(cols.body)
        messages = rec.decode_batch(buffer, "t", 3, broker_id=2)
    except CorruptRecordError as exc:
        columns = messages = (type(exc), str(exc))
    try:
        batches, next_offset = rec.decode_fetched_batches(buffer, "t", 3, from_offset, broker_id=2)
        fetched = [list(b) for b in batches], next_offset
    except CorruptRecordError as exc:
        fetched = type(exc), str(exc), exc.offset
    return columns, messages, fetched


@COMPILED
@settings(max_examples=examples(400), deadline=None)
@given(data=st.data())
def test_a_reader_gets_the_same_columns_and_messages_with_the_compiled_check_as_without(data: st.DataObject) -> None:
    """Stored batches (stamped as the broker's append does, then damaged or not) read with the compiled check:
    the same columns, Messages, fetched batches and next offset, or the same error, as the Python check gives."""
    batch = bytearray(data.draw(st.one_of(produced(), produced(plain=True))))
    base = data.draw(st.integers(0, 1 << 40))
    rec.stamp(batch, base, (7 << 112) | base, data.draw(st.integers(0, 1 << 41)))
    buffer = as_buffer(data.draw, damage(data.draw, bytes(batch)))
    if isinstance(buffer, memoryview) and buffer.format != "B":
        buffer = memoryview(bytes(buffer))
    from_offset = base + data.draw(st.integers(-1, 3))
    compiled = read_back(buffer, max(from_offset, 0))
    with python_only():
        python = read_back(buffer, max(from_offset, 0))
    assert compiled == python
    event("read" if compiled[0][0] is not CorruptRecordError else "refused")


@COMPILED
def test_a_caught_up_reader_takes_the_compiled_path(monkeypatch: pytest.MonkeyPatch) -> None:
    batch = bytearray(rec.encode_values([b"a" * 100, b"b" * 7], 1_700_000_000_000))
    rec.stamp(batch, 40, (5 << 112) | 40, 1_700_000_000_001)
    monkeypatch.setattr(Columns, "parse", None)  # the general check would fail if it ran
    batches, next_offset = rec.decode_fetched_batches(memoryview(bytes(batch)), "t", 0, 41)
    assert next_offset == 42 and [(m.offset, m.data) for b in batches for m in b] == [(41, b"b" * 7)]
