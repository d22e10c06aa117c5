"""The one door to metaq's compiled module, ``metaq._speedups`` (src/metaq/_speedups.c).

Everything in that module has a plain Python reference elsewhere in the package, and metaq behaves the same
without it: when it was not built (no C compiler at install: setup.py builds it as optional), or when the
environment says ``METAQ_NO_EXTENSIONS=1`` (CI runs the unit tests both ways, as aiokafka does with
``AIOKAFKA_NO_EXTENSIONS``). Modules that have a compiled fast path read :data:`speedups` and nothing else;
nothing but this module imports ``metaq._speedups`` (tests/unit/test_compiled.py holds that). docs/compiled.md
lists what is compiled, why, and where each piece's Python reference is.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import ModuleType

NO_EXTENSIONS_ENV = "METAQ_NO_EXTENSIONS"

NO_EXTENSIONS = os.environ.get(NO_EXTENSIONS_ENV, "") not in ("", "0")
"""Whether the environment turns the compiled module off (any value but empty or ``0``)."""


def _load(name: str = "metaq._speedups") -> ModuleType | None:
    if NO_EXTENSIONS:
        return None
    try:
        return importlib.import_module(name)
    except ImportError:  # not built: the Python references
        return None


speedups = _load()
"""``metaq._speedups``, or None: not built, or turned off by ``METAQ_NO_EXTENSIONS``."""

kafka_speedups = _load("metaq._kafka_speedups")
"""``metaq._kafka_speedups`` (the Kafka listener's record conversions, docs/kafka.md), or None, as :data:`speedups`."""

ENABLED = speedups is not None
