"""Harnesses for metaq's own tests and for users testing against metaq: real broker processes."""

from metaq.testing.broker import BrokerProcess, wait_until

__all__ = ["BrokerProcess", "wait_until"]
