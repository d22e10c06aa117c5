"""The code blocks of README.md and docs/*.md, and what each says about how it runs.

A fenced block is run by tests/integration/docs/test_doc_snippets.py when its language is one a reader pastes and
runs: ``python``, ``bash`` or ``sh`` (a shell session), ``ini`` (a server.ini, loaded by the broker's reader).
Every fenced block names a language: ``text`` for output, diagrams, listings and other things not run (a block
without one fails the test, so nothing is left unclassified). A comment on the line before the fence says more:

``<!-- snippet: skip: WHY -->``
    not run (a fragment, a signature list, a block that needs another machine); the reason is required.
``<!-- snippet: no-broker -->``
    the test starts no broker for it: the block starts what it needs, or needs none.
``<!-- snippet: broker NAME=VALUE ... -->``
    the broker on 127.0.0.1:8123 runs with these server.ini options (e.g. ``kafkaPort=9092``).
``<!-- snippet: timeout SECONDS -->``
    a longer deadline than the default.

Several (not ``skip``, whose reason runs to the end) are joined with ``;``. Blocks of a page run in order, in
one working directory, so a later block may use what an earlier one made (a topic, a file).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
RUNNABLE = {"python", "bash", "sh", "ini"}
"""Languages a block is run in; any other named language (text, console, json, yaml, ...) is shown, not run."""

_FENCE = re.compile(r"^(?P<indent> *)```(?P<info>[^`]*)$")
_MARKER = re.compile(r"^\s*<!--\s*snippet:\s*(?P<body>.*?)\s*-->\s*$")


@dataclass
class Block:
    page: str
    line: int
    """1-based line of the opening fence."""
    lang: str
    code: str
    skip: str | None = None
    no_broker: bool = False
    broker_options: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 120.0

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def runnable(self) -> bool:
        return self.lang in RUNNABLE and self.skip is None


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page`` with its marker; ValueError for a malformed marker or an open fence."""
    lines = page.read_text().split("\n")
    found: list[Block] = []
    name = str(page.relative_to(ROOT))
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        indent = len(fence.group("indent"))
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise ValueError(f"{name}:{i + 1}: a code block that is never closed")
        code = "\n".join(line[indent:] for line in lines[i + 1:end]) + "\n"
        block = Block(name, i + 1, fence.group("info").strip().split(" ")[0].lower(), code)
        previous = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = _MARKER.match(previous)
        if marker is not None:
            _apply(block, marker.group("body"))
        found.append(block)
        i = end + 1
    return found


def _apply(block: Block, body: str) -> None:
    if body.startswith("skip:"):  # the rest is the reason, whatever it holds
        block.skip = body[5:].strip()
        if not block.skip:
            raise ValueError(f"{block.where}: 'skip:' needs a reason")
        return
    for part in (p.strip() for p in body.split(";")):
        if part == "no-broker":
            block.no_broker = True
        elif part.startswith("broker "):
            for option in part[7:].split():
                key, sep, value = option.partition("=")
                if not sep:
                    raise ValueError(f"{block.where}: broker option {option!r} is not NAME=VALUE")
                block.broker_options[key] = value
        elif part.startswith("timeout ") and part[8:].strip().isdigit():
            block.timeout_s = float(part[8:])
        else:
            raise ValueError(f"{block.where}: unknown snippet marker {part!r} (skip: WHY, no-broker, broker K=V, "
                             "timeout N)")
