"""The offset storages as the docs show them: every constructor call written in docs/ binds to the class's
real signature (a keyword the class does not take is a TypeError for the user who copies it)."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from metaq.client import group

DOCS = Path(__file__).resolve().parents[4] / "docs"
CALL = re.compile(r"`(\w+OffsetStorage\(.*?\))`")


def _calls() -> list[tuple[str, str]]:
    out = []
    for page in sorted(DOCS.glob("*.md")):
        for line in page.read_text(encoding="utf-8").splitlines():
            out += [(page.name, call) for call in CALL.findall(line)]
    return out


def test_the_docs_show_the_storages() -> None:
    assert any(call.startswith("LocalFileOffsetStorage(") for _page, call in _calls())


@pytest.mark.parametrize(("page", "call"), _calls())
def test_every_storage_constructor_in_the_docs_binds_to_its_signature(page: str, call: str) -> None:
    expr = ast.parse(call, mode="eval").body
    assert isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name)
    cls = getattr(group, expr.func.id)
    positional = [object()] * len(expr.args)
    keywords = {kw.arg: object() for kw in expr.keywords if kw.arg is not None}
    inspect.signature(cls).bind(*positional, **keywords)  # TypeError names what the docs got wrong


def test_a_wrong_keyword_is_a_type_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="'dir'"):
        group.LocalFileOffsetStorage(dir=tmp_path)  # type: ignore[call-arg]
    assert group.LocalFileOffsetStorage(directory=tmp_path).directory == tmp_path
