"""Loaded by every Python process started with this directory on PYTHONPATH (scripts/trace_e2e.py sets it):
installs the e2e tracer when METAQ_TRACE_DIR is set. Never imported by metaq itself.

METAQ_TRACE_SWITCH_INTERVAL_US (an experiment, not a setting of metaq): ``sys.setswitchinterval`` in every
process of the run, to see what the GIL hand-offs between the broker's loop and its flusher threads cost."""

import os
import sys

if os.environ.get("METAQ_TRACE_SWITCH_INTERVAL_US"):
    sys.setswitchinterval(int(os.environ["METAQ_TRACE_SWITCH_INTERVAL_US"]) / 1e6)

if os.environ.get("METAQ_TRACE_DIR"):
    import e2e_tracer

    e2e_tracer.install(os.environ["METAQ_TRACE_DIR"])
