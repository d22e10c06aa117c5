"""Harnesses for metaq's own tests and for users testing against metaq: real broker processes, waits on
conditions, a clock moved by hand, and a helper that puts messages into a topic."""

from metaq.testing.broker import BrokerProcess, track_brokers
from metaq.testing.clock import FakeClock
from metaq.testing.ports import unused_port
from metaq.testing.produce import Stored, produce, produce_blocking
from metaq.testing.waits import until, wait_until

__all__ = ["BrokerProcess", "FakeClock", "Stored", "produce", "produce_blocking", "track_brokers", "until",
           "unused_port", "wait_until"]
