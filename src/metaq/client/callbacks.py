"""How the client calls a user's function whose second argument is optional (a listener's
``(message[, ctx])``, a transaction checker's ``([message, ]transaction_id)``): by its signature."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any


def takes_two(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` takes two positional arguments (two required ones, or ``*args``). Parameters with
    defaults (``lambda msg, box=box: ...``) are the caller's own, not a second argument."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    required = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    return len(required) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)
