"""Measure two attacks on a broker's limits (figures for docs/reliability.md; not a test).

    .venv/bin/python scripts/measure_broker_limits.py [--src DIR] [--frames 16] [--frame-mib 64]

1. Unfinished frames: ``--frames`` connections each send ``--frame-mib`` MiB (less 1 KiB) of a produce
   frame that never completes. Reports the broker's RSS before and after (VmRSS of the process), and
   whether a normal produce is still served.
2. Abandoned long polls: 10 connections pipeline 1,000 long polls each (max_wait 600 s), then close.
   Reports how long a real consumer's long poll keeps getting TOO_MANY_REQUESTS afterwards (up to
   ``--lockout-cap-s``), and how long the attack itself took to lock consumers out.

``--src`` runs the broker from another checkout's ``src`` (e.g. an older commit unpacked with
``git archive``), to compare. Everything is on loopback, bounded in count and time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from metaq.protocol import messages as m
from metaq.protocol.codec import NEED_DATA, ClientConnection
from metaq.protocol.records import encode_values

READY = re.compile(r"metaq broker ready (\S+):(\d+)")


class Broker:
    def __init__(self, data: Path, src: str | None, options: dict[str, str]) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if src:
            env["PYTHONPATH"] = src
        cmd = [sys.executable, "-m", "metaq.broker", "--dataPath", str(data), "--serverPort", "0"]
        for key, value in options.items():
            cmd += [f"--{key}", value]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            match = READY.search(line)
            if match:
                self.host, self.port = match.group(1), int(match.group(2))
                return
        raise SystemExit("broker did not start")

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)


class Conn:
    def __init__(self, broker: Broker) -> None:
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


def partial_frames(args: argparse.Namespace, data: Path) -> dict[str, object]:
    broker = Broker(data, args.src, {})
    try:
        admin = Conn(broker)
        admin.call(m.ProduceRequest("warm", 0, 1, 5000, encode_values([b"x"], 1)))
        before = broker.rss_mib()
        records = args.frame_mib * 1024 * 1024 - 4096  # the frame stays within maxFrameSize
        body = records - 1024  # what is sent of it: the frame never completes
        head = (struct.pack(">hhih", 4, 0, 1, 1) + b"a" + struct.pack(">h", 1) + b"t"
                + struct.pack(">ihii", 0, 1, 5000, records))
        socks = []
        chunk = b"\0" * (1024 * 1024)
        for _ in range(args.frames):
            s = socket.create_connection((broker.host, broker.port), timeout=120)
            s.sendall(struct.pack(">I", len(head) + records) + head)
            sent = 0
            while sent < body:
                n = min(len(chunk), body - sent)
                s.sendall(chunk[:n])
                sent += n
            socks.append(s)
        time.sleep(1.0)  # let the broker read what the kernel holds (a measurement, not a test)
        after = broker.rss_mib()
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
    finally:
        broker.stop()


def abandoned_polls(args: argparse.Namespace, data: Path) -> dict[str, object]:
    broker = Broker(data, args.src, {"numPartitions": "1"})
    try:
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
        while time.monotonic() - closed_at < args.lockout_cap_s:
            r = consumer.call(m.FetchRequest("lp", 0, end, 1024, 1))
            if getattr(r, "error_code", 0) == 0:
                lockout_s = time.monotonic() - closed_at
                break
            time.sleep(0.01)
        return {"locked_out_after_attack_start_s": None if locked_after_s is None else round(locked_after_s, 3),
                "lockout_after_close_s": round(lockout_s, 3) if lockout_s is not None
                else f"> {args.lockout_cap_s} (still locked out)"}
    finally:
        broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", help="run the broker from this src directory (PYTHONPATH)")
    parser.add_argument("--frames", type=int, default=16)
    parser.add_argument("--frame-mib", type=int, default=64)
    parser.add_argument("--lockout-cap-s", type=float, default=30.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="metaq-measure-") as tmp:
        out = {"partial_frames": partial_frames(args, Path(tmp) / "a"),
               "abandoned_long_polls": abandoned_polls(args, Path(tmp) / "b")}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
