"""docs/protocol.md keeps up with the code: every API, field, struct and error code is described."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from metaq.errors import all_error_classes
from metaq.protocol import schema
from metaq.protocol.messages import APIS

DOC_PATH = Path(__file__).resolve().parents[3] / "docs" / "protocol.md"
DOC = DOC_PATH.read_text(encoding="utf-8")


def section(heading: str) -> str:
    """The text under a '### heading' line, up to the next heading of the same or a higher level."""
    match = re.search(rf"^### {re.escape(heading)}\s*$(.*?)(?=^#{{1,3}} |\Z)", DOC, re.M | re.S)
    assert match, f"docs/protocol.md has no '### {heading}' section"
    return match.group(1)


def structs() -> dict[str, type]:
    found: dict[str, type] = {}

    def walk(wire_type: object) -> None:
        if isinstance(wire_type, schema.Array):
            walk(wire_type.item)
        elif isinstance(wire_type, schema.Struct):
            found[wire_type.cls.__name__] = wire_type.cls
            for f in wire_type.cls.FIELDS:
                walk(f.type)

    for spec in APIS.values():
        for cls in (spec.request, spec.response):
            for f in cls.FIELDS:
                walk(f.type)
    return found


def test_every_api_name_appears() -> None:
    for spec in APIS.values():
        assert spec.name in DOC, f"API {spec.name} is not in docs/protocol.md"


@pytest.mark.parametrize("api_key", sorted(APIS), ids=[APIS[k].name for k in sorted(APIS)])
def test_every_field_of_every_api_is_described(api_key: int) -> None:
    spec = APIS[api_key]
    text = section(f"{spec.key} {spec.name}")
    overview = re.search(rf"^\| {spec.key} \| {spec.name} \| (v[^|]*)\|", DOC, re.M)
    assert overview, f"{spec.name} is missing from the API overview table"
    versions = f"v{spec.min_version}" + ("" if spec.min_version == spec.max_version else f"-v{spec.max_version}")
    assert overview.group(1).strip() == versions
    assert "\nResponse:" in text, f"the {spec.name} section has no 'Response:' part"
    request_text, response_text = text.split("\nResponse:", 1)
    for cls, part in ((spec.request, request_text), (spec.response, response_text)):
        for f in cls.FIELDS:
            if f.name in ("error_code", "error_message") and cls is spec.response:
                continue  # the shared error prefix, described once
            row = re.search(rf"^\| `{f.name}` \| ([^|]+) \|", part, re.M)
            assert row, f"{cls.__name__}.{f.name} is not in the {spec.name} section"
            documented = row.group(1).replace("nullable array", "array").strip()
            assert documented == f.type.name, f"{cls.__name__}.{f.name}: doc says {documented}, code {f.type.name}"
    if not spec.request.FIELDS:
        assert "no fields" in request_text
    if len(spec.response.FIELDS) == 2:
        assert "error prefix only" in response_text


def test_every_struct_and_its_fields_are_described() -> None:
    for name, cls in structs().items():
        line = re.search(rf"^`{name}` — (.*?)(?:\n\n|\Z)", DOC, re.M | re.S)
        assert line, f"struct {name} is not described"
        for f in cls.FIELDS:
            assert f"`{f.name}` {f.type.name}" in line.group(1).replace("\n", " "), f"{name}.{f.name}"


def test_error_table_matches_errors_module() -> None:
    yes_no = {True: "yes", False: "no"}
    for cls in all_error_classes():
        flags = f"{yes_no[cls.retriable]} | {yes_no[cls.refresh_metadata]}"
        row = f"| {cls.code} | `{cls.name}` | `{cls.__name__}` | {flags} |"
        assert row in DOC, f"error table row missing or wrong: {row}"
    documented = re.findall(r"^\| (-?\d+) \| `[A-Z_]+` \|", DOC, re.M)
    assert sorted(map(int, documented)) == [c.code for c in all_error_classes()]
