"""A clock a test moves by hand, for code that takes a ``clock`` argument instead of reading time itself.

One convention: calling the clock gives seconds, as ``time.monotonic`` and ``time.time`` do; code whose
clock counts milliseconds (the group coordinator) is given :meth:`FakeClock.ms`. The time is kept in
whole nanoseconds, so whole milliseconds set or added come back exactly. Units are in every name.
"""

from __future__ import annotations

__all__ = ["FakeClock"]

_NS_PER_S = 1_000_000_000
_NS_PER_MS = 1_000_000


class FakeClock:
    def __init__(self, now_s: float = 100.0) -> None:
        self.now_ns = round(now_s * _NS_PER_S)

    def __call__(self) -> float:
        """The time in seconds."""
        return self.now_ns / _NS_PER_S

    def ms(self) -> float:
        """The time in milliseconds."""
        return self.now_ns / _NS_PER_MS

    @property
    def now_s(self) -> float:
        return self.now_ns / _NS_PER_S

    @now_s.setter
    def now_s(self, seconds: float) -> None:
        self.now_ns = round(seconds * _NS_PER_S)

    @property
    def now_ms(self) -> float:
        return self.now_ns / _NS_PER_MS

    @now_ms.setter
    def now_ms(self, ms: float) -> None:
        self.now_ns = round(ms * _NS_PER_MS)

    def advance_s(self, seconds: float) -> None:
        self.now_ns += round(seconds * _NS_PER_S)

    def advance_ms(self, ms: float) -> None:
        self.now_ns += round(ms * _NS_PER_MS)
