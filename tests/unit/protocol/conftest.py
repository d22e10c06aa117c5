"""Shared settings for the protocol tests.

The strategies live in ``protocol_strategies.py`` beside this file; this directory is put on
``sys.path`` so the test modules can import it under any pytest import mode.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
