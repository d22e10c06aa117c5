"""Delayed delivery: the broker's delay store and deliverer (docs/delayed.md)."""

from metaq.broker.delay.store import DELAY_DIR, DelayStore

__all__ = ["DELAY_DIR", "DelayStore"]
