"""Loopback ports for tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def unused_port() -> int:
    """A 127.0.0.1 port nothing listens on right now (the kernel picked it, then it was released).

    For a server a test starts later on a known port, or a port that must refuse connections. Prefer
    ``--serverPort 0`` where the server can report its own port: this one can race with other processes.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_broker_on_a_taken_port(data_dir: str | os.PathLike[str], option: str,
                                 *args: str) -> tuple[int, subprocess.CompletedProcess[str]]:
    """Run ``metaq broker --dataPath DATA --<option> P ...`` while another socket listens on P (the broker
    should refuse to start); (P, the finished process). Any other port option is 0 unless ``args`` set it."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        command = [sys.executable, "-m", "metaq.broker", "--dataPath", str(data_dir), f"--{option}", str(port)]
        if option != "serverPort" and "--serverPort" not in args:
            command += ["--serverPort", "0"]
        result = subprocess.run([*command, *args], capture_output=True, text=True, timeout=60,
                                stdin=subprocess.DEVNULL)
    return port, result
