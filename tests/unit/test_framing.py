"""Framed records (metaq.framing): every byte of a small file of records, flipped in turn, costs the record
that holds it and nothing else; the lost record is named whenever its key's checksum vouches for it; a cut
or damaged last record is a torn tail."""

from __future__ import annotations

import random

import pytest

from metaq import framing
from metaq.framing import Damage, Record

KEYS = [b"group-a", b"", b"txid-\xe2\x82\xac", b"g" * 40, b"last"]
BODIES = [b'{"o":[1,2,3]}', b"x" * 300, b"", b"\x00\xff" * 20, b"tail body"]


def _file() -> tuple[bytes, list[tuple[int, int]]]:
    out = b""
    spans = []
    for key, body in zip(KEYS, BODIES, strict=True):
        record = framing.encode_bytes(key, body)
        spans.append((len(out), len(out) + len(record)))
        out += record
    return out, spans


def _records(data: bytes) -> list[tuple[bytes, bytes]]:
    return [(r.key, data[r.body_at:r.end]) for r in framing.scan(data) if isinstance(r, Record)]


def test_an_intact_file_reads_back_whole() -> None:
    data, _ = _file()
    assert _records(data) == list(zip(KEYS, BODIES, strict=True))
    pieces = framing.encode(b"k", b"ab", memoryview(b"cd"))
    assert _records(b"".join(bytes(p) for p in pieces)) == [(b"k", b"abcd")]


@pytest.mark.parametrize("mask", [0xFF, 0x01, 0x80, 0x20])
def test_every_flipped_byte_costs_only_the_record_that_holds_it(mask: int) -> None:
    data, spans = _file()
    for i in range(len(data)):
        damaged = bytearray(data)
        damaged[i] ^= mask
        k = next(n for n, (a, b) in enumerate(spans) if a <= i < b)
        items = framing.scan(bytes(damaged))
        got = [(r.key, bytes(damaged[r.body_at:r.end])) for r in items if isinstance(r, Record)]
        expected = [(key, body) for n, (key, body) in enumerate(zip(KEYS, BODIES, strict=True)) if n != k]
        losses = [d for d in items if isinstance(d, Damage)]
        offset = i - spans[k][0]
        if offset < 4:  # the magic alone: the head's checksum still vouches for the record
            assert got == list(zip(KEYS, BODIES, strict=True)) and not losses, i
            continue
        assert got == expected, f"byte {i}"
        assert len(losses) == 1, f"byte {i}: {losses}"
        loss = losses[0]
        assert (loss.position, loss.end) == spans[k], f"byte {i}"
        assert loss.tail == (k == len(KEYS) - 1), f"byte {i}"
        in_key_or_its_check = 8 <= offset < 14 or 18 <= offset < 18 + len(KEYS[k])
        if not in_key_or_its_check:
            assert loss.key == KEYS[k], f"byte {i} ({offset} into record {k}): {loss}"


def test_a_cut_tail_is_a_tail_and_names_its_key() -> None:
    data, spans = _file()
    for cut in range(spans[-1][0] + 1, len(data)):
        items = framing.scan(data[:cut])
        assert [r.key for r in items if isinstance(r, Record)] == KEYS[:-1]
        (loss,) = [d for d in items if isinstance(d, Damage)]
        assert loss.tail and loss.position == spans[-1][0] and loss.end == cut
        if cut - spans[-1][0] >= framing.HEAD_BYTES + len(KEYS[-1]):
            assert loss.key == b"last"


def test_random_damage_never_invents_a_record() -> None:
    rng = random.Random(7)
    data, _ = _file()
    originals = set(zip(KEYS, BODIES, strict=True))
    for _ in range(2000):
        damaged = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            at = rng.randrange(len(data))
            n = rng.randint(1, 20)
            damaged[at:at + n] = bytes(rng.randrange(256) for _ in range(len(damaged[at:at + n])))
        assert set(_records(bytes(damaged))) <= originals


def _key_of(obj: dict) -> str:
    return str(obj["name"])


def _lines() -> tuple[bytes, list[tuple[int, int]], list[dict]]:
    objs = [{"name": f"user{i}", "value": "v" * i, "n": i} for i in range(5)]
    out = b""
    spans = []
    for obj in objs:
        line = framing.encode_line(obj, _key_of(obj))
        spans.append((len(out), len(out) + len(line)))
        out += line
    return out, spans, objs


@pytest.mark.parametrize("mask", [0xFF, 0x01, 0x20, 0x40])
def test_every_flipped_byte_of_a_text_file_costs_only_its_line(mask: int) -> None:
    data, spans, objs = _lines()
    assert framing.parse_lines(data, _key_of) == (objs, [])
    for i in range(len(data)):
        damaged = bytearray(data)
        damaged[i] ^= mask
        k = next(n for n, (a, b) in enumerate(spans) if a <= i < b)
        records, losses = framing.parse_lines(bytes(damaged), _key_of)
        if i == spans[k][1] - 1 and k < len(objs) - 1:  # a newline: split again where the next line starts
            assert (records, losses) == (objs, []), f"byte {i}"
            continue
        assert records == objs[:k] + objs[k + 1:], f"byte {i}"
        assert len(losses) == 1, f"byte {i}: {losses}"
        if i - spans[k][0] < 8:  # the line's checksum: the key's own checksum names it
            assert losses[0].key == f"user{k}", f"byte {i}"


def test_text_lines_name_a_line_damaged_in_its_value() -> None:
    data, spans, objs = _lines()
    damaged = bytearray(data)
    at = data.index(b'"v', spans[3][0]) + 2
    damaged[at] ^= 0x01
    records, (loss,) = framing.parse_lines(bytes(damaged), _key_of)
    assert records == objs[:3] + objs[4:] and loss.key == "user3" and loss.number == 4


def test_an_earlier_whole_json_document_is_told_apart() -> None:
    assert not framing.is_text_lines(b'  {"users": {}}')
    assert not framing.is_text_lines(b'["a-0"]')
    assert framing.is_text_lines(_lines()[0]) and framing.is_text_lines(b"")
