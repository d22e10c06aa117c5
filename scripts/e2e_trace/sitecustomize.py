"""Loaded by every Python process started with this directory on PYTHONPATH (scripts/trace_e2e.py sets it):
installs the e2e tracer when METAQ_TRACE_DIR is set. Never imported by metaq itself."""

import os

if os.environ.get("METAQ_TRACE_DIR"):
    import e2e_tracer

    e2e_tracer.install(os.environ["METAQ_TRACE_DIR"])
