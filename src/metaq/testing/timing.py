"""Deadlines that scale with a slow machine: one factor for every test that waits on something slow.

A test's deadline says how long a healthy run may take on a quiet machine. On a machine shared with other
work (a CI runner, a laptop building something, several test runs on two cores) everything takes longer in
proportion to the CPU it does not get, and a fixed deadline turns load into failures that say nothing about
the code. :func:`slowness` is the factor to stretch such deadlines by:

- ``METAQ_TEST_TIME_SCALE`` when set (a number >= 1): CI, or a developer, can pin it;
- otherwise the 1-minute load average per CPU (``os.getloadavg()[0] / os.cpu_count()``), never below 1
  (a quiet machine keeps the deadlines as written) and at most :data:`SLOWNESS_MAX` (a machine 20 times
  overloaded still fails, later, rather than hang a run for hours).

It is read at each call, so a deadline set while the machine is busy is longer than one set when it is
quiet. :func:`scaled` is a deadline times the factor.

What scales: waiting for something that will happen, whose time is CPU the test does not control (a JVM
to start, Spark's first micro-batch, a Python worker to connect back, a broker's ready line). What must
not: a bound that is itself the behaviour under test (a session timeout, a linger, "within one commit
period"), and a sleep, which is never synchronisation in the first place.
"""

from __future__ import annotations

import os

__all__ = ["SLOWNESS_MAX", "TIME_SCALE_ENV", "scaled", "slowness"]

TIME_SCALE_ENV = "METAQ_TEST_TIME_SCALE"
SLOWNESS_MAX = 8.0


def slowness() -> float:
    """How many times slower than a quiet machine this one is now (see the module docstring)."""
    pinned = os.environ.get(TIME_SCALE_ENV, "").strip()
    if pinned:
        try:
            value = float(pinned)
        except ValueError:
            raise ValueError(f"{TIME_SCALE_ENV}={pinned!r}: not a number (a factor >= 1, e.g. 3)") from None
        if not value >= 1:
            raise ValueError(f"{TIME_SCALE_ENV}={pinned!r}: must be >= 1 (1: the deadlines as written)")
        return value
    try:
        load = os.getloadavg()[0]
    except OSError:  # not available on this platform
        return 1.0
    return min(SLOWNESS_MAX, max(1.0, load / (os.cpu_count() or 1)))


def scaled(seconds: float) -> float:
    """``seconds`` stretched by :func:`slowness`: the deadline of a wait whose time is the machine's."""
    return seconds * slowness()
