"""kill -9 a process that appends with unflushThreshold=1: every batch it reported durable survives.

The child appends batches as fast as it can (a bounded number in flight) and prints a batch's base
offset only once its durable future resolved. The parent reads those lines, SIGKILLs the child
mid-stream, reopens the data directory and reads every reported batch back, byte for byte.
"""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from metaq.protocol.records import decode_fetched
from metaq.storage import LogConfig, LogManager

CHILD = textwrap.dedent("""
    import sys, threading
    from pathlib import Path
    from metaq.protocol.records import encode_values
    from metaq.storage import LogConfig, LogManager

    def payloads(seq):
        return [f"batch {seq} message {j} ".encode() * (1 + (seq + j) % 7) for j in range(1 + seq % 5)]

    manager = LogManager(Path(sys.argv[1]), 1, LogConfig(unflush_threshold=1, segment_bytes_max=64 * 1024))
    manager.open()
    log = manager.get_or_create("crash", 0)
    in_flight = threading.BoundedSemaphore(32)
    out = threading.Lock()

    def report(seq, base_offset):
        def done(future):
            in_flight.release()
            if future.exception() is None:
                with out:
                    sys.stdout.write(f"{seq} {base_offset}\\n")
                    sys.stdout.flush()
        return done

    seq = 0
    while True:
        in_flight.acquire()
        result = log.append(encode_values(payloads(seq), 1000 + seq))
        result.durable.add_done_callback(report(seq, result.base_offset))
        seq += 1
""")


def payloads(seq: int) -> list[bytes]:
    return [f"batch {seq} message {j} ".encode() * (1 + (seq + j) % 7) for j in range(1 + seq % 5)]


@pytest.mark.slow
@pytest.mark.parametrize("reports_before_kill", [50, 400])
def test_acked_batches_survive_sigkill(tmp_path: Path, reports_before_kill: int) -> None:
    data_dir = tmp_path / "data"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(data_dir)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    reported: dict[int, int] = {}
    deadline = time.monotonic() + 60
    try:
        while len(reported) < reports_before_kill:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            if line is None:
                pytest.fail(f"the child died early: {child.stderr.read() if child.stderr else ''}")
            seq, base_offset = map(int, line.split())
            reported[seq] = base_offset
            assert time.monotonic() < deadline, "the child reported too slowly"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    while (line := lines.get(timeout=30)) is not None:  # acks printed before the kill count too
        seq, base_offset = map(int, line.split())
        reported[seq] = base_offset

    with LogManager(data_dir, 1, LogConfig()) as manager:
        log = manager.get("crash", 0)
        assert log is not None and not log.recovery.clean
        for seq, base_offset in sorted(reported.items()):
            expected = payloads(seq)
            assert base_offset + len(expected) <= log.log_end_offset, f"batch {seq} was acked and lost"
            data = log.read_bytes(base_offset, 1)
            messages, _ = decode_fetched(data, "crash", 0, base_offset)
            assert [m.data for m in messages] == expected, f"batch {seq} differs"
