"""kazoo's wait for ZooKeeper's answer to a session request, cut short while the client is not connected: a
restarting ZooKeeper that takes a connection and never answers it costs seconds, not the session (the whole
story, against a real ZooKeeper: tests/integration/cluster/test_zookeeper_restart.py)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from metaq.cluster.zookeeper.session import CONNECT_ANSWER_S, ConnectWaitHandler

SHORT_S = 0.05


@pytest.fixture
def silent() -> Iterator[socket.socket]:
    """One end of a connection whose other end never writes."""
    ours, theirs = socket.socketpair()
    yield ours
    ours.close()
    theirs.close()


def waited_s(handler: ConnectWaitHandler, *args: object) -> float:
    started = time.monotonic()
    handler.select(*args)
    return time.monotonic() - started


def test_a_client_not_connected_waits_for_an_answer_a_short_while_at_most(silent: socket.socket) -> None:
    handler = ConnectWaitHandler(answer_wait_s=SHORT_S)
    assert waited_s(handler, [silent], [], [], 30.0) < 5.0
    assert waited_s(handler, [silent], [], [], None) < 5.0  # kazoo never waits forever here, but neither would we


def test_a_connected_client_and_kazoos_other_waits_are_left_alone(silent: socket.socket) -> None:
    handler = ConnectWaitHandler(answer_wait_s=SHORT_S)
    handler.connected = lambda: True
    assert waited_s(handler, [silent], [], [], 0.4) >= 0.35  # the answer to a request: kazoo's own timeout
    handler.connected = lambda: False
    wake_r, wake_w = socket.socketpair()
    try:
        assert waited_s(handler, [silent, wake_r], [], [], 0.4) >= 0.35  # kazoo's loop (its wake-up pipe too)
    finally:
        wake_r.close()
        wake_w.close()
    assert waited_s(ConnectWaitHandler(answer_wait_s=0.5), [silent], [], [], 0.1) >= 0.08  # shorter: as it is


def test_the_default_cap_is_seconds() -> None:
    assert ConnectWaitHandler().answer_wait_s == CONNECT_ANSWER_S
    assert 1.0 <= CONNECT_ANSWER_S <= 5.0
