"""Signals in a script blocked in the synchronous facade, with real processes and real signals: Ctrl-C in a
long-polling ``SyncPullConsumer.iterate()`` is a KeyboardInterrupt (not "aclose(): asynchronous generator is
already running"), and a SIGTERM handler's ``sys.exit()`` ends the process even when the script catches
``Exception`` around the loop. The script is known to be blocked because the broker counts its long poll."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from metaq.client import Message, connect
from metaq.testing import BrokerProcess, wait_until

SCRIPT = """
import signal, sys
from metaq.client import connect

servers, mode = sys.argv[1], sys.argv[2]
if mode == "sigterm":
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(3))
with connect(servers) as session:
    consumer = session.create_pull_consumer()
    while True:
        try:
            for message in consumer.iterate("waiting", 0, "earliest", max_wait_ms=60_000):
                print("got", bytes(message.data).decode(), flush=True)
        except Exception as exc:  # a robust loop: only the end of the process may stop it
            print("caught", type(exc).__name__, exc, flush=True)
            if mode != "sigterm":
                raise
"""


@pytest.fixture
def polled_broker(broker_factory: Callable[..., BrokerProcess]) -> BrokerProcess:
    broker = broker_factory({"numPartitions": 1, "dashboardHttpPort": 0})
    with connect(broker.servers) as session:
        session.admin().create_topic("waiting", 1)
        assert session.create_producer().send(Message("waiting", b"first")).success
    return broker


def _waiting_fetches(broker: BrokerProcess) -> float:
    (url,) = {match.group(1) for line in broker.log_lines if (match := re.search(r"metrics (http://\S+)", line))}
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    found = re.search(r"^metaq_waiting_fetches ([0-9.]+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def _blocked_script(broker: BrokerProcess, tmp_path: Path, mode: str) -> subprocess.Popen[str]:
    script = tmp_path / "iterate.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), broker.servers, mode], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "got first"  # then it long-polls for more
    wait_until(lambda: _waiting_fetches(broker) >= 1 or proc.poll() is not None, timeout_s=30,
               message="the script's long poll to wait on the broker")
    assert proc.poll() is None
    return proc


def test_ctrl_c_in_a_blocking_iterate_is_a_keyboard_interrupt(polled_broker: BrokerProcess, tmp_path: Path) -> None:
    proc = _blocked_script(polled_broker, tmp_path, "sigint")
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGINT, (out, err)  # Python's exit on an unhandled KeyboardInterrupt
    assert err.rstrip().splitlines()[-1] == "KeyboardInterrupt", err
    assert "RuntimeError" not in err and "caught" not in out, (out, err)


def test_a_sigterm_handlers_exit_is_never_swallowed(polled_broker: BrokerProcess, tmp_path: Path) -> None:
    proc = _blocked_script(polled_broker, tmp_path, "sigterm")
    proc.send_signal(signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, (out, err)
    assert "caught" not in out, (out, err)
