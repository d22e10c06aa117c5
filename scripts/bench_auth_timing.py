"""Does a login's answer or its time tell which user names exist? Issue 39's hole 6, measured (docs/benchmarks.md).

One broker with authRequired and the HTTP API (HTTP Basic over plain HTTP, httpBasicAuthOverPlaintext): users
``alice`` (4096 PBKDF2 iterations) and ``big`` (``--iterations``, default 100000). Per round, in random order:

- SASL: the time from SaslAuthenticate's first message to the broker's answer (salt and iterations), for
  ``alice`` and for an unknown name; and whether the unknown name's salt is ``sha256(name)[:16]`` (computable
  by anyone: that tells the name is unknown);
- HTTP Basic with a wrong password: the time to the 401 for ``big`` and for an unknown name.

Prints the medians (ms) over ``--rounds``. The same script runs against another checkout with
``PYTHONPATH=/that/checkout/src``.

    PYTHONPATH=src .venv/bin/python scripts/bench_auth_timing.py --rounds 200
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from metaq.broker.launcher import BrokerLauncher
from metaq.net.blocking import BlockingConnection
from metaq.net.codec import ConnectionSettings
from metaq.protocol import messages as m
from metaq.security.scram import ScramClient

METAQ = str(Path(sys.executable).with_name("metaq"))


def sasl_first_ms(address: tuple[str, int], user: str) -> tuple[float, bytes]:
    conn = BlockingConnection.open(address, ConnectionSettings("bench-auth", 10.0, 30.0, 4, 1 << 20))
    try:
        conn.call(m.SaslHandshakeRequest("SCRAM-SHA-256"))
        first = ScramClient(user, "x").first()
        started = time.perf_counter()
        reply = conn.call(m.SaslAuthenticateRequest(first))
        elapsed = (time.perf_counter() - started) * 1000
        attrs = dict(part.split("=", 1) for part in reply.auth_bytes.decode().split(","))
        return elapsed, base64.b64decode(attrs["s"])
    finally:
        conn.close()


def basic_ms(url: str, user: str) -> float:
    token = base64.b64encode(f"{user}:wrong password".encode()).decode()
    req = urllib.request.Request(url + "/topics", headers={"Authorization": f"Basic {token}"})
    started = time.perf_counter()
    try:
        urllib.request.urlopen(req, timeout=30).read()
    except urllib.error.HTTPError as exc:
        exc.read()
    return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--iterations", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-auth-") as tmp:
        data = Path(tmp) / "broker"
        for user, iterations in (("alice", 4096), ("big", args.iterations)):
            subprocess.run([METAQ, "acl", "user", "add", user, "--data-path", str(data), "--iterations",
                            str(iterations)], check=True, capture_output=True,
                           env={**os.environ, "METAQ_PASSWORD": "a password"})
        options = {"authRequired": True, "httpPort": 0, "httpBasicAuthOverPlaintext": True}
        with BrokerLauncher(data, options) as broker:
            address = (broker.host, broker.port)
            url = str(broker.http_url)
            times: dict[str, list[float]] = {"sasl known": [], "sasl unknown": [], "basic known (big)": [],
                                             "basic unknown": []}
            computable = 0
            for n in range(args.rounds):
                unknown = f"nobody{n}"
                steps = [("sasl known", lambda: sasl_first_ms(address, "alice")[0]),
                         ("sasl unknown", lambda u=unknown: sasl_first_ms(address, u)[0]),
                         ("basic known (big)", lambda: basic_ms(url, "big")),
                         ("basic unknown", lambda u=unknown: basic_ms(url, u))]
                random.shuffle(steps)
                for name, step in steps:
                    times[name].append(step())
                if sasl_first_ms(address, unknown)[1] == hashlib.sha256(unknown.encode()).digest()[:16]:
                    computable += 1
            for name, values in times.items():
                ordered = sorted(values)
                print(f"{name:20s} median {statistics.median(values):8.2f} ms  (p10 {ordered[len(values) // 10]:.2f},"
                      f" p90 {ordered[len(values) * 9 // 10]:.2f})", flush=True)
            print(f"unknown names whose salt is sha256(name)[:16]: {computable} of {args.rounds}")


if __name__ == "__main__":
    main()
