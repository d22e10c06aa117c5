"""metaq: a distributed, persistent, pull-based message queue after Taobao's MetaQ.

The names below are imported on first use (module ``__getattr__``), so ``import metaq`` (what every
``metaq`` command does first, ``metaq --version`` included) costs nothing beyond this file.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from metaq.allocator import tune_allocator
    from metaq.errors import MetaqError
    from metaq.types import Message, MessageId, SendResult

__all__ = ["Message", "MessageId", "MetaqError", "SendResult", "__version__", "tune_allocator"]
__version__ = "0.1.0"

_EXPORTS = {"Message": "metaq.types", "MessageId": "metaq.types", "MetaqError": "metaq.errors",
            "SendResult": "metaq.types", "tune_allocator": "metaq.allocator"}
"""Public name -> the module defining it."""

if not TYPE_CHECKING:  # type checkers see the imports above; a visible __getattr__ would hide typos from them

    def __getattr__(name: str) -> Any:
        """Import a public name's module on first use and cache the name in the package."""
        try:
            module = _EXPORTS[name]
        except KeyError:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
