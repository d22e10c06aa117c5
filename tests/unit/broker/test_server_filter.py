"""Server-side group filters: kept messages keep offsets and ids, and the consumer moves past the rest."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest

from metaq.broker.config import TopicConfig
from metaq.broker.filters import filter_fetched, group_filter, load_filter, load_filters
from metaq.errors import ConfigError, InvalidRequestError
from metaq.protocol.records import Compression, decode_fetched, encode_messages, stamp
from metaq.types import Message


def stored(batches: list[list[Message]], compression: Compression = Compression.NONE) -> bytes:
    out = b""
    offset = 100
    for msgs in batches:
        raw = bytearray(encode_messages(msgs, compression, now_ms=1))
        stamp(raw, offset, (7 << 64) + offset, 1234)
        out += bytes(raw)
        offset += len(msgs)
    return out


def msgs(*attrs: str | None) -> list[Message]:
    return [Message("t", f"v{i}".encode(), attribute=a) for i, a in enumerate(attrs)]


@pytest.mark.parametrize("compression", list(Compression))
def test_kept_messages_keep_offsets_ids_and_the_next_offset(compression: Compression) -> None:
    body = stored([msgs("a", "b", "a"), msgs("b", "b"), msgs("a")], compression)
    original, next_before = decode_fetched(body, "t", 0, 100)
    filtered = filter_fetched(body, lambda mm: mm.attribute == "a", "t", 0)
    got, next_after = decode_fetched(filtered, "t", 0, 100)
    assert next_after == next_before == 106
    assert [(m.offset, m.id, m.data) for m in got] == [
        (m.offset, m.id, m.data) for m in original if m.attribute == "a"]
    assert [m.offset for m in got] == [100, 102, 105]
    assert len(filtered) < len(body)


def test_a_wholly_filtered_reply_still_advances_the_consumer() -> None:
    body = stored([msgs("b", "b", "b")], Compression.LZ4)
    got, next_offset = decode_fetched(filter_fetched(body, lambda mm: False), "t", 0, 100)
    assert got == [] and next_offset == 103


def test_fetch_from_inside_a_batch_and_a_cut_off_tail() -> None:
    body = stored([msgs("a", "a", "b", "a"), msgs("a", "a")])
    cut = body[:-5]  # the last batch is cut off by max_bytes
    filtered = filter_fetched(cut, lambda mm: mm.attribute == "a")
    assert filtered.endswith(cut[-(len(body) - 5 - len(stored([msgs("a", "a", "b", "a")]))):])
    got, next_offset = decode_fetched(filtered, "t", 0, 101)
    assert [m.offset for m in got] == [101, 103] and next_offset == 104


def test_a_raising_filter_keeps_the_message() -> None:
    def boom(mm: Message) -> bool:
        raise RuntimeError("bug")
    body = stored([msgs("a", "b")])
    got, _ = decode_fetched(filter_fetched(body, boom), "t", 0, 100)
    assert len(got) == 2


def test_load_filter_forms_and_errors() -> None:
    mod = types.ModuleType("metaq_test_filters")

    class OnlyA:
        def accept(self, mm: Message) -> bool:
            return mm.attribute == "a"

    mod.OnlyA = OnlyA  # type: ignore[attr-defined]
    mod.only_b = lambda mm: mm.attribute == "b"  # type: ignore[attr-defined]
    sys.modules["metaq_test_filters"] = mod
    assert load_filter("metaq_test_filters:OnlyA")(Message("t", b"", "a"))
    assert load_filter("metaq_test_filters:only_b")(Message("t", b"", "b"))
    for bad in ("nocolon", "metaq_no_such_module:x", "metaq_test_filters:missing"):
        with pytest.raises(ConfigError):
            load_filter(bad)


def test_group_filter_from_topic_settings() -> None:
    class Settings:
        group_filters = {"vips": "metaq_test_filters2:only_vip", "broken": "metaq_no_such_module:f"}

    mod = types.ModuleType("metaq_test_filters2")
    mod.only_vip = lambda mm: mm.attribute == "vip"  # type: ignore[attr-defined]
    sys.modules["metaq_test_filters2"] = mod
    filters: dict[str, Any] = {}
    accept = group_filter(filters, Settings(), "vips")
    assert accept is not None and accept(Message("t", b"", "vip")) and not accept(Message("t", b"", "x"))
    assert filters == {"metaq_test_filters2:only_vip": accept}  # loaded once, kept by the broker
    assert group_filter(filters, Settings(), "others") is None
    assert group_filter(filters, Settings(), "") is None
    # a filter that cannot be loaded refuses the group's fetches: never served unfiltered
    with pytest.raises(InvalidRequestError, match=r"cannot import 'metaq_no_such_module'.*refuses group broken"):
        group_filter(filters, Settings(), "broken")


def write_module(directory: Path, name: str, body: str) -> None:
    (directory / f"{name}.py").write_text(body)


@pytest.fixture
def module_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_load_filters_names_the_topic_and_group_of_a_filter_that_cannot_be_loaded(module_dir: Path) -> None:
    write_module(module_dir, "cfg_filters_ok", "def vip(m):\n    return m.attribute == 'vip'\n")
    write_module(module_dir, "cfg_filters_raises", "raise RuntimeError('no database')\n")
    good = TopicConfig("orders", group_filters={"billing": "cfg_filters_ok:vip"})
    assert list(load_filters({"orders": good})) == ["cfg_filters_ok:vip"]
    for ref, why in [("cfg_filters_missing:vip", "cannot import 'cfg_filters_missing'"),
                     ("cfg_filters_ok:gold", "'cfg_filters_ok' has no 'gold'"),
                     ("cfg_filters_raises:vip", "importing 'cfg_filters_raises' failed: RuntimeError: no database")]:
        bad = TopicConfig("audit", group_filters={"ops": ref})
        with pytest.raises(ConfigError, match=rf"^\[topic=audit\] group\.ops: consumer filter '{ref}': {why}"):
            load_filters({"orders": good, "audit": bad})


def test_a_changed_filter_module_is_imported_again_and_a_broken_change_keeps_the_old_one(module_dir: Path) -> None:
    write_module(module_dir, "cfg_filters_edit", "def accept(m):\n    return m.attribute == 'blue'\n")
    blue, gold = Message("t", b"", "blue"), Message("t", b"", "gold")
    first = load_filter("cfg_filters_edit:accept")
    assert first(blue) and not first(gold)
    assert load_filter("cfg_filters_edit:accept") is first  # unchanged: not imported again
    # the same size, most likely in the same second: a .pyc would still look fresh
    write_module(module_dir, "cfg_filters_edit", "def accept(m):\n    return m.attribute == 'gold'\n")
    second = load_filter("cfg_filters_edit:accept")
    assert second(gold) and not second(blue)
    write_module(module_dir, "cfg_filters_edit", "def accept(m)\n    return True\n")
    with pytest.raises(ConfigError, match="importing 'cfg_filters_edit' failed: SyntaxError"):
        load_filter("cfg_filters_edit:accept")
    assert sys.modules["cfg_filters_edit"].accept is second  # the module in force is the last good one
