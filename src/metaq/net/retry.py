"""The one retry policy: exponential backoff with jitter, a cap, and a bound in attempts and/or time.

Kept apart from the code it retries (kazoo's ``KazooRetry`` shape): a :class:`RetryPolicy` is a frozen
description, a :class:`Backoff` is one run of failures under it. The caller does the attempt, decides
which failures are worth retrying, and sleeps the delay it is given -- ``asyncio.sleep`` in the asyncio
client, ``time.sleep`` in the blocking code -- so this module has no I/O, no asyncio, and a clock and
a random source that a test can inject.

The wait after failure *n* (1 for the first) is::

    min(max_delay_s, initial_delay_s * multiplier ** (n - 1)) * (1 - jitter + jitter * random())

so ``jitter=0.5`` spreads each wait over x0.5 to x1.0 of its nominal value, and ``jitter=0`` makes it exact.
A run gives up (the delay is ``None``) when ``max_attempts`` attempts have failed, or when the failure
comes ``deadline_s`` or more after the run's first failure; a wait never reaches past the deadline.
A success ends the run (:meth:`Backoff.reset`): the next failure starts from ``initial_delay_s`` again.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from metaq.errors import InvalidArgument

Clock = Callable[[], float]
"""Seconds, monotonic (``time.monotonic``)."""
Random = Callable[[], float]
"""A float in [0, 1) (``random.random``)."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """When to try again and when to stop; see the module docstring for the formula."""

    initial_delay_s: float
    """The wait after the first failure."""
    max_delay_s: float
    """No wait is longer (before jitter), even the first."""
    multiplier: float = 2.0
    """Each wait is this many times the one before (1: a constant delay)."""
    jitter: float = 0.0
    """The fraction of each wait that is random: the wait is x(1 - jitter) to x1 of its nominal value."""
    max_attempts: int | None = None
    """Attempts in all, the first one included; None: no bound in attempts."""
    deadline_s: float | None = None
    """How long after a run's first failure it may go on; None: no bound in time."""

    def __post_init__(self) -> None:
        if self.initial_delay_s < 0 or self.max_delay_s < 0:
            raise InvalidArgument(f"retry delays must be >= 0; got initial_delay_s={self.initial_delay_s}, "
                                  f"max_delay_s={self.max_delay_s}")
        if self.multiplier < 1:
            raise InvalidArgument(f"retry multiplier must be >= 1, not {self.multiplier}")
        if not 0 <= self.jitter <= 1:
            raise InvalidArgument(f"retry jitter must be within 0..1, not {self.jitter}")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise InvalidArgument(f"max_attempts must be >= 1 (the first attempt counts), not {self.max_attempts}")
        if self.deadline_s is not None and self.deadline_s < 0:
            raise InvalidArgument(f"deadline_s must be >= 0, not {self.deadline_s}")

    @classmethod
    def constant(cls, delay_s: float, *, max_attempts: int | None = None,
                 deadline_s: float | None = None) -> RetryPolicy:
        """The same wait after every failure, no jitter."""
        return cls(delay_s, delay_s, multiplier=1.0, max_attempts=max_attempts, deadline_s=deadline_s)

    @property
    def bounded(self) -> bool:
        """A run of this policy can give up (it has max_attempts or deadline_s)."""
        return self.max_attempts is not None or self.deadline_s is not None

    def delay_s(self, failures: int, rand: float = 1.0) -> float:
        """The wait after failure number ``failures`` (1 for the first), ``rand`` in [0, 1) the jitter's draw."""
        assert failures >= 1, failures
        # Past the cap the power only grows: stop computing it before it overflows a float.
        steps = failures - 1
        nominal = self.initial_delay_s * self.multiplier ** steps if steps < 1024 else self.max_delay_s
        return min(self.max_delay_s, nominal) * (1.0 - self.jitter + self.jitter * rand)

    def start(self, *, clock: Clock = time.monotonic, rand: Random = random.random) -> Backoff:
        """A new run of failures under this policy."""
        return Backoff(self, clock=clock, rand=rand)


class Backoff:
    """One run of failures under a :class:`RetryPolicy`: counts them and says how long to wait."""

    __slots__ = ("_clock", "_first_failure", "_rand", "failures", "policy")

    def __init__(self, policy: RetryPolicy, *, clock: Clock = time.monotonic, rand: Random = random.random) -> None:
        self.policy = policy
        self.failures = 0
        """Failures since the run started (or was reset)."""
        self._clock = clock
        self._rand = rand
        self._first_failure: float | None = None

    def next_delay_s(self) -> float | None:
        """Count a failure; the wait before the next attempt, or None when the policy gives up."""
        policy = self.policy
        self.failures += 1
        if policy.max_attempts is not None and self.failures >= policy.max_attempts:
            return None
        delay = policy.delay_s(self.failures, self._rand())
        if policy.deadline_s is not None:
            now = self._clock()
            if self._first_failure is None:
                self._first_failure = now
            left = self._first_failure + policy.deadline_s - now
            if left <= 0:
                return None
            delay = min(delay, left)
        return delay

    def next_delay_unbounded_s(self) -> float:
        """:meth:`next_delay_s` under a policy that never gives up (loops that end on a condition of their own)."""
        assert not self.policy.bounded, "a bounded policy can give up: use next_delay_s()"
        delay = self.next_delay_s()
        assert delay is not None
        return delay

    def reset(self) -> None:
        """An attempt succeeded: the next failure starts a new run."""
        self.failures = 0
        self._first_failure = None

    def __repr__(self) -> str:
        return f"<Backoff {self.failures} failure(s) under {self.policy}>"


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait until ``event`` is set (True) or ``timeout_s`` passes (False).

    Not ``asyncio.wait_for(event.wait(), ...)``: on Python 3.11 that swallows a cancellation arriving
    while the event has just been set (the task then runs on), which a loop cancelled on the very change
    that sets its event meets exactly. ``asyncio.timeout`` lets the cancellation through.
    """
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return False
    return True
