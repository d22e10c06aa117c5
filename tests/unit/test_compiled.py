"""The compiled module behind its one switch (metaq._compiled): CI builds it, so it must be in use unless the
environment turns it off (``METAQ_NO_EXTENSIONS``), and every fast path must then be off too. `make test` runs the
unit tests both ways; a silent fallback to the Python references would go unnoticed otherwise."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import metaq.types
from metaq import _compiled
from metaq.protocol.records import decode, encode, validate
from metaq.protocol.records import format as record_format


def fast_paths() -> dict[str, object]:
    return {"SendResult": metaq.types.SPEEDUPS or None, "message builder": decode._build is not decode.build_messages
            or None, "plain_region": encode.plain_region_compiled, "validate_plain": validate.validate_plain,
            "plain_columns_ok": validate.plain_columns_ok_compiled, "stamp_prefix": record_format.stamp_prefix_compiled}


def test_the_module_is_built_and_in_use_unless_turned_off() -> None:
    if os.environ.get(_compiled.NO_EXTENSIONS_ENV, "") not in ("", "0"):
        assert _compiled.NO_EXTENSIONS and _compiled.speedups is None and not _compiled.ENABLED
        assert all(path is None for path in fast_paths().values()), fast_paths()
        return
    assert _compiled.speedups is not None, "metaq._speedups was not built (a C compiler and Python.h are needed)"
    assert all(path is not None for path in fast_paths().values()), fast_paths()


@pytest.mark.parametrize("value, enabled", [("1", False), ("yes", False), ("0", True), ("", True)])
def test_the_switch_is_read_from_the_environment(value: str, enabled: bool) -> None:
    if _compiled.speedups is None and not _compiled.NO_EXTENSIONS:
        pytest.skip("metaq._speedups is not built")
    code = "from metaq import _compiled, types; print(_compiled.ENABLED, types.SendResult.__module__, types.SPEEDUPS)"
    env = {**os.environ, _compiled.NO_EXTENSIONS_ENV: value}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         timeout=60).stdout.split()
    assert out == [str(enabled), "metaq.types", str(enabled)]


def test_only_the_door_imports_the_module() -> None:
    """metaq._compiled is the one importer of metaq._speedups (with importlib: import-linter cannot see a compiled
    module, so this test holds the rule); the producer's resolving pass is the one exception left, retired with its
    rework."""
    import ast
    from pathlib import Path

    root = Path(metaq.types.__file__).parent
    importers = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                     [f"{node.module}.{alias.name}" for alias in node.names] if isinstance(node, ast.ImportFrom)
                     and node.module else [])
            if any(name == "metaq._speedups" or name.startswith("metaq._speedups.") for name in names):
                importers.add(path.relative_to(root).as_posix())
    assert importers <= {"client/producer.py"}, importers
