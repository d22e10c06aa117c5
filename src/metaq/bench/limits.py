"""`metaq bench limits`: two attacks on a broker's limits, measured (docs/reliability.md, "Limits"; the behaviour
itself is tested, this gives the figures).

1. Unfinished frames: ``frames`` connections each send ``frame_mib`` MiB (less 1 KiB) of a produce frame that
   never completes. The broker's RSS before and after (``maxPartialFramesSize`` bounds what it holds), and whether
   a normal produce is still served, and how fast.
2. Abandoned long polls: 10 connections pipeline 1,000 long polls each (max_wait 600 s), then close. How long
   the attack took to lock a real consumer's long polls out (TOO_MANY_REQUESTS: ``maxWaitingFetches``), and how
   long they stay locked out once the attackers' connections close (up to ``lockout_cap_s``).

Each attack on a broker of its own, on loopback, bounded in count and time.
"""

from __future__ import annotations

import json
import socket
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

from metaq.bench.processes import rss_mib
from metaq.bench.report import Report, markdown_table
from metaq.broker.launcher import BrokerLauncher
from metaq.protocol import messages as m
from metaq.protocol.codec import NEED_DATA, ClientConnection
from metaq.protocol.records import encode_values


class Conn:
    def __init__(self, broker: BrokerLauncher) -> None:
        self.sock = socket.create_connection((broker.host, broker.port), timeout=60)
        self.codec = ClientConnection("measure")

    def send(self, request: object) -> None:
        self.sock.sendall(self.codec.send(request)[1])

    def receive(self) -> object:
        while (event := self.codec.next_event()) is NEED_DATA:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("closed by the broker")
            self.codec.receive_data(chunk)
        return event.response  # type: ignore[union-attr]

    def call(self, request: object) -> object:
        self.send(request)
        return self.receive()


def partial_frames(frames: int, frame_mib: int, data: Path) -> dict[str, object]:
    with BrokerLauncher(data, {}) as broker:
        admin = Conn(broker)
        admin.call(m.ProduceRequest("warm", 0, 1, 5000, encode_values([b"x"], 1)))
        before = rss_mib(broker.pid)
        records = frame_mib * 1024 * 1024 - 4096  # the frame stays within maxFrameSize
        body = records - 1024  # what is sent of it: the frame never completes
        head = (struct.pack(">hhih", 4, 0, 1, 1) + b"a" + struct.pack(">h", 1) + b"t"
                + struct.pack(">ihii", 0, 1, 5000, records))
        socks = []
        chunk = b"\0" * (1024 * 1024)
        for _ in range(frames):
            s = socket.create_connection((broker.host, broker.port), timeout=120)
            s.sendall(struct.pack(">I", len(head) + records) + head)
            sent = 0
            while sent < body:
                n = min(len(chunk), body - sent)
                s.sendall(chunk[:n])
                sent += n
            socks.append(s)
        time.sleep(1.0)  # let the broker read what the kernel holds (a measurement, not a test)
        after = rss_mib(broker.pid)
        t0 = time.monotonic()
        reply = admin.call(m.ProduceRequest("warm", 0, 1, 5000, encode_values([b"y"], 1)))
        served_s = time.monotonic() - t0
        stats = json.loads(admin.call(m.StatsRequest(None)).stats_json)  # type: ignore[attr-defined]
        for s in socks:
            s.close()
        return {"rss_before_mib": round(before, 1), "rss_after_mib": round(after, 1),
                "produce_after_ok": getattr(reply, "error_code", None) == 0, "produce_after_s": round(served_s, 3),
                "partial_frame_bytes": stats.get("partial_frame_bytes"),
                "partial_frames_refused": stats.get("partial_frames_refused")}


def abandoned_polls(lockout_cap_s: float, data: Path) -> dict[str, object]:
    with BrokerLauncher(data, {"numPartitions": 1}) as broker:
        admin = Conn(broker)
        end = admin.call(m.ProduceRequest("lp", 0, 1, 5000, encode_values([b"x"], 1))).base_offset + 1  # type: ignore[attr-defined]
        t0 = time.monotonic()
        attackers = [Conn(broker) for _ in range(10)]
        for c in attackers:
            frames = b"".join(c.codec.send(m.FetchRequest("lp", 0, end, 1024, 600_000))[1] for _ in range(1000))
            c.sock.sendall(frames)
        consumer = Conn(broker)
        locked_after_s = None
        while time.monotonic() - t0 < 30:
            r = consumer.call(m.FetchRequest("lp", 0, end, 1024, 1))
            if getattr(r, "error_code", 0) == 429:
                locked_after_s = time.monotonic() - t0
                break
        for c in attackers:
            c.sock.close()
        closed_at = time.monotonic()
        lockout_s = None
        while time.monotonic() - closed_at < lockout_cap_s:
            r = consumer.call(m.FetchRequest("lp", 0, end, 1024, 1))
            if getattr(r, "error_code", 0) == 0:
                lockout_s = time.monotonic() - closed_at
                break
            time.sleep(0.01)
        return {"locked_out_after_attack_start_s": None if locked_after_s is None else round(locked_after_s, 3),
                "lockout_after_close_s": round(lockout_s, 3) if lockout_s is not None
                else f"> {lockout_cap_s} (still locked out)"}


def run(frames: int, frame_mib: int, lockout_cap_s: float, report: Report,
        work_dir: str | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="metaq-bench-limits-", dir=work_dir) as tmp:
        report(f"{frames} unfinished frames of {frame_mib} MiB ...")
        partial = partial_frames(frames, frame_mib, Path(tmp) / "a")
        report(json.dumps(partial))
        report("10 connections x 1,000 abandoned long polls ...")
        polls = abandoned_polls(lockout_cap_s, Path(tmp) / "b")
        report(json.dumps(polls))
    return {"frames": frames, "frame_mib": frame_mib, "partial_frames": partial, "abandoned_long_polls": polls}


def table(result: dict[str, Any]) -> str:
    p, a = result["partial_frames"], result["abandoned_long_polls"]
    return markdown_table(["attack", "measured"], [
        [f"{result['frames']} connections, each an unfinished {result['frame_mib']} MiB produce frame",
         f"broker RSS {p['rss_before_mib']} -> {p['rss_after_mib']} MiB; held {p['partial_frame_bytes']} B of "
         f"partial frames, refused {p['partial_frames_refused']}; a normal produce "
         + (f"served in {p['produce_after_s']} s" if p["produce_after_ok"] else "NOT served")],
        ["10 connections x 1,000 long polls, then closed",
         f"a consumer locked out {a['locked_out_after_attack_start_s']} s after the attack began; served again "
         f"{a['lockout_after_close_s']} s after the attackers closed"]])
