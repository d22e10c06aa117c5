"""Harnesses for metaq's own tests and for users testing against metaq: real broker processes."""

from metaq.testing.broker import BrokerProcess, track_brokers, wait_until
from metaq.testing.ports import unused_port

__all__ = ["BrokerProcess", "track_brokers", "unused_port", "wait_until"]
