"""The API reference (docs/api, built by ``make docs``) covers every public name, and every public name says
what it does: a name in a public module's ``__all__`` (and each public method and property of a public class)
without a docstring would show in the reference as a bare signature, and a name no page pulls in would be
missing from it altogether. Sphinx itself cannot tell: autodoc skips undocumented members silently."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

API_DIR = Path(__file__).resolve().parents[2] / "docs" / "api"

PUBLIC_MODULES = ["metaq", "metaq.client", "metaq.client.group", "metaq.client.sync", "metaq.errors",
                  "metaq.logging", "metaq.client.xa"]
"""Modules whose names users import: their ``__all__`` (or, without one, every class and function they
define that does not start with ``_``)."""

EXTRA_CLASSES = ["metaq.client.sync.SyncProducer", "metaq.client.sync.SyncPullConsumer",
                 "metaq.client.sync.SyncAdmin", "metaq.client.sync.SyncGroupConsumer",
                 "metaq.client.config.ClientConfig", "metaq.client.config.ProducerConfig",
                 "metaq.client.transaction.TransactionResult", "metaq.client.transaction.TransactionChecker",
                 "metaq.client.transaction.Xid", "metaq.client.admin.TopicDescription",
                 "metaq.client.admin.MessageLocation", "metaq.client.admin.FindResult", "metaq.net.retry.Backoff"]
"""Classes not exported by name that public calls return (the sync facade's objects, the results)."""


def _public_names(module_name: str) -> dict[str, Any]:
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n, v in vars(module).items() if not n.startswith("_")
                 and (inspect.isclass(v) or inspect.isfunction(v)) and v.__module__ == module_name]
    return {f"{module_name}.{n}": getattr(module, n) for n in names if not n.startswith("__")}


def _public_objects() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for module_name in PUBLIC_MODULES:
        found.update(_public_names(module_name))
    for path in EXTRA_CLASSES:
        module_name, _, name = path.rpartition(".")
        found[path] = getattr(importlib.import_module(module_name), name)
    return found


def _own_docstring(obj: Any) -> str:
    if inspect.ismodule(obj):
        return obj.__doc__ or ""
    if inspect.isclass(obj):
        doc = vars(obj).get("__doc__") or ""
        # A dataclass without a docstring gets its signature as __doc__: that says nothing.
        if dataclasses.is_dataclass(obj) and doc.startswith(obj.__name__ + "("):
            return ""
        return doc
    target = obj.fget if isinstance(obj, property) else getattr(obj, "__func__", obj)
    return getattr(target, "__doc__", None) or ""


def _member_docstring(cls: type, name: str) -> str:
    """A member's docstring, or the one it overrides (autodoc shows the base class's, as ``help()`` does)."""
    for klass in cls.__mro__:
        if name in vars(klass) and (doc := _own_docstring(vars(klass)[name])).strip():
            return doc
    return ""


def _public_members(cls: type) -> dict[str, Any]:
    """Methods and properties a class defines itself (what autodoc's ``:members:`` shows)."""
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    members = {}
    for name, value in vars(cls).items():
        if name.startswith("_") or name in fields:
            continue
        if isinstance(value, (staticmethod, classmethod, property)) or inspect.isfunction(value):
            members[name] = value
    return members


def test_every_public_name_and_member_has_a_docstring() -> None:
    missing = []
    for path, obj in _public_objects().items():
        if not (inspect.isclass(obj) or inspect.isfunction(obj) or inspect.ismodule(obj)):
            continue  # data (a type alias, a constant): documented beside it, checked by the build
        if not _own_docstring(obj).strip():
            missing.append(path)
        if inspect.isclass(obj) and not issubclass(obj, BaseException):
            missing += [f"{path}.{name}" for name, member in _public_members(obj).items()
                        if not _member_docstring(obj, name).strip()]
    assert not missing, f"public names without a docstring: {missing}"


def _directives() -> tuple[set[str], set[str]]:
    """Objects named by an auto directive in docs/api/*.rst, and modules pulled in whole with ``:members:``."""
    objects: set[str] = set()
    whole: set[str] = set()
    for page in API_DIR.glob("*.rst"):
        text = page.read_text()
        for match in re.finditer(r"^\.\. auto(\w+):: ([\w.]+)\n((?:   .*\n)*)", text, re.M):
            kind, name, options = match.groups()
            objects.add(name)
            if kind == "module" and ":members:" in options:
                whole.add(name)
    return objects, whole


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_every_public_name_is_on_a_reference_page(module_name: str) -> None:
    objects, whole = _directives()
    aliases = {id(obj): path for path, obj in _public_objects().items()}
    missing = []
    for path, obj in _public_names(module_name).items():
        module, _, name = path.rpartition(".")
        defined_in = getattr(obj, "__module__", None) if not inspect.ismodule(obj) else obj.__name__
        candidates = {path, f"{defined_in}.{name}", defined_in if inspect.ismodule(obj) else ""}
        # Re-exports (metaq.client.Message is metaq.Message) count where any of their public names is documented.
        candidates |= {p for p, o in _public_objects().items() if o is obj}
        if candidates & objects or module in whole or defined_in in whole:
            continue
        missing.append(aliases.get(id(obj), path))
    assert not missing, f"public names on no page of docs/api: {missing}"
