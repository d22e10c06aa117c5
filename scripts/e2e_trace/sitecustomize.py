"""Loaded by every Python process started with this directory on PYTHONPATH (scripts/trace_e2e.py sets it):
installs the e2e tracer when METAQ_TRACE_DIR is set. Never imported by metaq itself.

Two experiments (not settings of metaq), to see what the hand-offs between the broker's loop and its flusher
threads cost: METAQ_TRACE_SWITCH_INTERVAL_US sets ``sys.setswitchinterval`` in every process of the run;
METAQ_TRACE_SYNC_WORKERS sets the flusher's ``sync_workers`` (1: the logs of a round are synced one after
another in the flusher's own thread, no pool); METAQ_TRACE_INLINE_MAX_LOGS sets its ``inline_max_logs`` (the
largest round synced in the flusher's own thread; code from before that option must not be given it)."""

import os
import sys

if os.environ.get("METAQ_TRACE_SWITCH_INTERVAL_US"):
    sys.setswitchinterval(int(os.environ["METAQ_TRACE_SWITCH_INTERVAL_US"]) / 1e6)

if os.environ.get("METAQ_TRACE_SYNC_WORKERS") or os.environ.get("METAQ_TRACE_INLINE_MAX_LOGS"):
    import functools

    import metaq.storage.flush as _flush

    _knobs = {key: int(os.environ[name]) for key, name in (("sync_workers", "METAQ_TRACE_SYNC_WORKERS"),
                                                           ("inline_max_logs", "METAQ_TRACE_INLINE_MAX_LOGS"))
              if os.environ.get(name)}
    _init = _flush.Flusher.__init__

    @functools.wraps(_init)
    def _flusher_init(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        kwargs.update(_knobs)
        _init(self, *args, **kwargs)

    _flush.Flusher.__init__ = _flusher_init  # type: ignore[method-assign]

if os.environ.get("METAQ_TRACE_DIR"):
    import e2e_tracer

    e2e_tracer.install(os.environ["METAQ_TRACE_DIR"])
