"""Golden bytes: every frame of every API and version, pinned in committed hex files.

The round-trip and fuzz tests encode and decode with the same codec, so a change that reorders
fields, changes a type or moves the frame header would pass them all and break every other client.
Here the bytes are fixed:

* the codec must encode the samples (``golden_samples.py``) to exactly the bytes in ``golden/`` and
  decode those bytes back to the samples;
* a small encoder written in this file from docs/protocol.md alone — it reads the frame header
  layout, the primitive types, the nested structs and each API's field tables from the page and
  knows nothing of ``metaq.protocol.schema`` — must produce the same bytes. So the docs, the codec and
  the fixtures agree, and none of them can change alone.

To change the wire format deliberately, regenerate (never in CI; see golden/README.md)::

    METAQ_REGEN_GOLDEN=1 .venv/bin/pytest tests/unit/protocol/test_protocol_golden.py

which rewrites the files from the codec; the docs check still runs against what was written.
"""

from __future__ import annotations

import functools
import os
import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from golden_samples import CLIENT_ID, CORRELATION_ID, SAMPLES

from metaq.protocol import schema
from metaq.protocol.codec import NEED_DATA, ClientConnection, RequestEvent, RequestHeader, ServerConnection
from metaq.protocol.messages import APIS

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
DOC = (Path(__file__).resolve().parents[3] / "docs" / "protocol.md").read_text(encoding="utf-8")
REGENERATE = os.environ.get("METAQ_REGEN_GOLDEN") == "1"

FRAMES = [(spec, version) for _, spec in sorted(APIS.items())
          for version in range(spec.min_version, spec.max_version + 1)]
FRAME_IDS = [f"{spec.name}.v{version}" for spec, version in FRAMES]
KINDS = ("request", "response")


def golden_path(api_name: str, version: int, kind: str) -> Path:
    return GOLDEN_DIR / f"{api_name}.v{version}.{kind}.hex"


def to_hex(data: bytes, title: str) -> str:
    lines = [f"# {title}: {len(data)} bytes, big-endian. Generated from tests/unit/protocol/golden_samples.py;",
             "# do not edit by hand, see README.md in this directory."]
    lines += [" ".join(f"{b:02x}" for b in data[i:i + 16]) for i in range(0, len(data), 16)]
    return "\n".join(lines) + "\n"


def from_hex(text: str) -> bytes:
    body = "".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    return bytes.fromhex(body)


def read_golden(api_name: str, version: int, kind: str) -> bytes:
    path = golden_path(api_name, version, kind)
    if not path.exists():
        pytest.fail(f"{path.name} is missing: add a sample to golden_samples.py and regenerate (golden/README.md)")
    return from_hex(path.read_text(encoding="ascii"))


# -- the codec ----------------------------------------------------------------------------------

def codec_request_frame(api_key: int, version: int, request: Any) -> bytes:
    client = ClientConnection(client_id=CLIENT_ID)
    client.set_versions({api_key: version})
    correlation_id, data = client.send(request)
    assert correlation_id == CORRELATION_ID
    return data


def codec_response_frame(api_key: int, version: int, response: Any) -> bytes:
    return ServerConnection().encode_response(RequestHeader(api_key, version, CORRELATION_ID, CLIENT_ID), response)


def test_every_api_version_has_a_sample_and_fixtures_and_nothing_else_is_there() -> None:
    assert set(SAMPLES) == {(spec.name, version) for spec, version in FRAMES}, \
        "golden_samples.SAMPLES must have exactly one (request, response) per API and version"
    expected = {golden_path(spec.name, version, kind).name for spec, version in FRAMES for kind in KINDS}
    present = {p.name for p in GOLDEN_DIR.glob("*.hex")}
    assert present - expected == set(), f"fixtures of no API version: {sorted(present - expected)}"
    if not REGENERATE:
        assert expected - present == set(), f"missing fixtures (regenerate): {sorted(expected - present)}"


def _same_type_fields_differ(obj: Any, where: str, version: int = 0) -> list[str]:
    """Same-type fields with equal values; only the fields the version carries (nested structs have none)."""
    problems = []
    seen: dict[str, dict[str, Any]] = {}
    for f in type(obj).FIELDS:
        if f.since > version:
            continue
        value = getattr(obj, f.name)
        for other, other_value in seen.get(f.type.name, {}).items():
            if value == other_value:
                problems.append(f"{where}: {other} and {f.name} ({f.type.name}) are both {value!r}")
        seen.setdefault(f.type.name, {})[f.name] = value
        items = value if isinstance(f.type, schema.Array) and value is not None else [value]
        for i, item in enumerate(items):
            if hasattr(type(item), "FIELDS"):
                problems += _same_type_fields_differ(item, f"{where}.{f.name}[{i}]")
    return problems


@pytest.mark.parametrize(("spec", "version"), FRAMES, ids=FRAME_IDS)
def test_samples_would_show_two_fields_swapped(spec: Any, version: int) -> None:
    request, response = SAMPLES[(spec.name, version)]
    assert type(request) is spec.request and type(response) is spec.response
    problems = _same_type_fields_differ(request, type(request).__name__, version) + \
        _same_type_fields_differ(response, type(response).__name__, version)
    assert not problems, "give these fields different sample values:\n" + "\n".join(problems)


@pytest.mark.parametrize(("spec", "version"), FRAMES, ids=FRAME_IDS)
def test_codec_encodes_the_samples_to_the_golden_bytes(spec: Any, version: int) -> None:
    request, response = SAMPLES[(spec.name, version)]
    produced = {"request": codec_request_frame(spec.key, version, request),
                "response": codec_response_frame(spec.key, version, response)}
    if REGENERATE:
        if os.environ.get("CI"):
            pytest.fail("golden fixtures are never regenerated in CI: unset METAQ_REGEN_GOLDEN")
        GOLDEN_DIR.mkdir(exist_ok=True)
        for kind, data in produced.items():
            golden_path(spec.name, version, kind).write_text(
                to_hex(data, f"{spec.name} v{version} {kind} frame"), encoding="ascii")
    for kind, data in produced.items():
        golden = read_golden(spec.name, version, kind)
        assert data.hex(" ", 1) == golden.hex(" ", 1), f"{spec.name} v{version} {kind}: the codec's bytes changed"


@pytest.mark.parametrize(("spec", "version"), FRAMES, ids=FRAME_IDS)
def test_codec_decodes_the_golden_bytes_to_the_samples(spec: Any, version: int) -> None:
    request, response = SAMPLES[(spec.name, version)]
    server = ServerConnection()
    server.receive_data(read_golden(spec.name, version, "request"))
    event = server.next_event()
    assert isinstance(event, RequestEvent), event
    assert event.header == RequestHeader(spec.key, version, CORRELATION_ID, CLIENT_ID)
    assert event.request == request
    assert server.next_event() is NEED_DATA

    client = ClientConnection(client_id=CLIENT_ID)
    client.set_versions({spec.key: version})
    client.send(request)
    client.receive_data(read_golden(spec.name, version, "response"))
    answer = client.next_event()
    assert answer is not NEED_DATA and answer.correlation_id == CORRELATION_ID  # type: ignore[union-attr]
    assert answer.response == response  # type: ignore[union-attr]


def test_a_sendfile_head_plus_the_records_is_the_golden_fetch_response() -> None:
    for spec, version in FRAMES:
        fields = spec.response.FIELDS
        if not fields or fields[-1].type is not schema.RECORDS:
            continue
        response = SAMPLES[(spec.name, version)][1]
        header = RequestHeader(spec.key, version, CORRELATION_ID, CLIENT_ID)
        head = ServerConnection().encode_response_head(header, response, len(response.records))
        assert head + bytes(response.records) == read_golden(spec.name, version, "response")


# -- an encoder that knows only docs/protocol.md -------------------------------------------------

def doc_section(heading: str, level: int = 3) -> str:
    """The text under a heading, up to the next heading of the same or a higher level."""
    hashes = "#" * level
    match = re.search(rf"^{hashes} {re.escape(heading)}\s*$(.*?)(?=^#{{1,{level}}} |\Z)", DOC, re.M | re.S)
    assert match, f"docs/protocol.md has no '{hashes} {heading}' section"
    return match.group(1)


def code_block_fields(text: str) -> list[tuple[str, str]]:
    """(type, name) of each line in the first fenced block of ``text``, up to its ``...`` line."""
    block = re.search(r"```(?:text)?\n(.*?)```", text, re.S)
    assert block, "no layout block"
    out = []
    for line in block.group(1).splitlines():
        wire_type, name = line.split()[:2]
        if wire_type == "...":
            break
        out.append((wire_type, name))
    return out


FIXED = {"int8": ">b", "int16": ">h", "int32": ">i", "int64": ">q", "u32": ">I", "i16": ">h", "i32": ">i"}
"""The docs write the frame header in short names (u32, i16, i32) and the field tables in long ones."""


def encode_string(value: str | None, nullable: bool) -> bytes:
    if value is None:
        assert nullable, "null in a non-nullable string"
        return struct.pack(">h", -1)
    raw = value.encode("utf-8")
    return struct.pack(">h", len(raw)) + raw


def encode_bytes(value: bytes | None, nullable: bool) -> bytes:
    if value is None:
        assert nullable, "null in non-nullable bytes"
        return struct.pack(">i", -1)
    return struct.pack(">i", len(value)) + bytes(value)


PRIMITIVES: dict[str, Callable[[Any], bytes]] = {
    **{name: functools.partial(struct.pack, fmt) for name, fmt in FIXED.items()},
    "bool": lambda v: b"\x01" if v else b"\x00",
    "uint128": lambda v: ((1 << 128) - 1 if v == -1 else v).to_bytes(16, "big"),
    "string": lambda v: encode_string(v, nullable=False),
    "nullable_string": lambda v: encode_string(v, nullable=True),
    "bytes": lambda v: encode_bytes(v, nullable=False),
    "nullable_bytes": lambda v: encode_bytes(v, nullable=True),
    "records": lambda v: struct.pack(">i", len(v)) + bytes(v),
}

TYPE_WORD = (r"(?:nullable )?(?:array\[\w+\]|int8|int16|int32|int64|bool|uint128|nullable_string|string"
             r"|nullable_bytes|bytes|records|[A-Z]\w*)")
"""A type as the docs write it: a primitive, an array, or a struct (capitalised)."""


def documented_primitives() -> set[str]:
    table = doc_section("Primitive types", level=2)
    names: set[str] = set()
    for row in re.findall(r"^\| ([^|]+) \|", table, re.M):
        if row.strip() in ("type", "---") or row.strip().startswith("struct"):
            continue
        names.update(re.findall(r"`([^`]+)`", row))
    return names


def documented_structs() -> dict[str, list[tuple[str, str]]]:
    """Struct name -> its (field, type) in order, from the '### Nested structs' paragraphs."""
    text = doc_section("Nested structs")
    structs = {}
    for name, body in re.findall(r"^`(\w+)` — (.*?)(?:\n\n|\Z)", text, re.M | re.S):
        body = body.replace("\n", " ")
        structs[name] = re.findall(rf"`(\w+)` ({TYPE_WORD})(?=[;,:. ]|$)", body)
    return structs


def table_rows(text: str) -> list[tuple[str, str, int]]:
    """(field, type, since version) of each `| \\`field\\` | type | meaning |` row."""
    rows = []
    for name, wire_type, meaning in re.findall(r"^\| `(\w+)` \| ([^|]+?) \| (.*?) \|$", text, re.M):
        since = re.search(r"\bsince v(\d+)\b", meaning)
        rows.append((name, wire_type.strip(), int(since.group(1)) if since else 0))
    return rows


def documented_api(api_key: int, name: str) -> tuple[list[tuple[str, str, int]], list[tuple[str, str, int]]]:
    text = doc_section(f"{api_key} {name}")
    request_text, response_text = text.split("\nResponse:", 1)
    request = [] if "Request: no fields" in request_text else table_rows(request_text)
    prefix = table_rows(doc_section("APIs", level=2).split("They are written as")[0].split("same two fields:")[1])
    if "error prefix only" in response_text.split("\n\n")[0]:
        response = prefix
    else:
        assert "error prefix, then" in response_text.split("\n\n")[0], f"{name}: how does the response start?"
        response = prefix + table_rows(response_text)
    return request, response


def documented_versions(api_key: int, name: str) -> list[int]:
    row = re.search(rf"^\| {api_key} \| {name} \| ([^|]+)\|", DOC, re.M)
    assert row, f"{name} is not in the API table"
    low, _, high = row.group(1).strip().partition("-")
    return list(range(int(low.lstrip("v")), int((high or low).lstrip("v")) + 1))


class DocEncoder:
    """Encodes values by the layouts docs/protocol.md gives, and nothing else."""

    def __init__(self) -> None:
        self.structs = documented_structs()

    def value(self, wire_type: str, value: Any) -> bytes:
        nullable = wire_type.startswith("nullable array[")
        array = re.fullmatch(r"(?:nullable )?array\[(\w+)\]", wire_type)
        if array:
            if value is None:
                assert nullable, f"null in a non-nullable {wire_type}"
                return struct.pack(">i", -1)
            return struct.pack(">i", len(value)) + b"".join(self.value(array.group(1), v) for v in value)
        if wire_type in self.structs:
            return b"".join(self.value(t, getattr(value, f)) for f, t in self.structs[wire_type])
        assert wire_type in PRIMITIVES, f"docs/protocol.md uses a type this encoder does not know: {wire_type}"
        return PRIMITIVES[wire_type](value)

    def fields(self, rows: list[tuple[str, str, int]], obj: Any, version: int) -> bytes:
        return b"".join(self.value(t, getattr(obj, name)) for name, t, since in rows if since <= version)

    def frame(self, payload: bytes) -> bytes:
        (size_type, size_name), = code_block_fields(doc_section("Framing", level=2))
        assert size_name == "size"
        return self.value(size_type, len(payload)) + payload

    def request_frame(self, api_key: int, name: str, version: int, request: Any) -> bytes:
        header_values = {"api_key": api_key, "api_version": version, "correlation_id": CORRELATION_ID,
                         "client_id": CLIENT_ID}
        header = b"".join(self.value(t, header_values[n]) for t, n in code_block_fields(doc_section("Request header")))
        return self.frame(header + self.fields(documented_api(api_key, name)[0], request, version))

    def response_frame(self, api_key: int, name: str, version: int, response: Any) -> bytes:
        header_values = {"correlation_id": CORRELATION_ID}
        header = b"".join(self.value(t, header_values[n]) for t, n in code_block_fields(doc_section("Response header")))
        return self.frame(header + self.fields(documented_api(api_key, name)[1], response, version))


def test_the_doc_encoder_knows_every_documented_primitive_type() -> None:
    known = set(PRIMITIVES) - {"u32", "i16", "i32"} | {"array[T]"}
    assert documented_primitives() == known
    structs = documented_structs()
    assert structs and all(structs.values()), structs


@pytest.mark.parametrize(("spec", "version"), FRAMES, ids=FRAME_IDS)
def test_docs_describe_the_golden_bytes(spec: Any, version: int) -> None:
    assert version in documented_versions(spec.key, spec.name)
    request, response = SAMPLES[(spec.name, version)]
    encoder = DocEncoder()
    by_docs = {"request": encoder.request_frame(spec.key, spec.name, version, request),
               "response": encoder.response_frame(spec.key, spec.name, version, response)}
    for kind, data in by_docs.items():
        golden = read_golden(spec.name, version, kind)
        assert data.hex(" ", 1) == golden.hex(" ", 1), \
            f"{spec.name} v{version} {kind}: docs/protocol.md and the golden bytes disagree"
