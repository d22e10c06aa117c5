"""Harnesses for metaq's own tests and for users testing against metaq: real broker processes."""

from metaq.testing.broker import BrokerProcess, wait_until
from metaq.testing.ports import unused_port

__all__ = ["BrokerProcess", "unused_port", "wait_until"]
