"""`metaq bench auth-timing`: does a login's answer or its time tell which user names exist?

One broker with authRequired and the HTTP API (HTTP Basic over plain HTTP: httpBasicAuthOverPlaintext); users
``alice`` (4096 PBKDF2 iterations) and ``big`` (``iterations``). Per round, in a random order:

- SASL: the time from SaslAuthenticate's first message to the broker's answer (salt and iterations), for ``alice``
  and for a name that does not exist; and whether the unknown name's salt is ``sha256(name)[:16]`` (which anyone can
  compute, and so tell the name is unknown);
- HTTP Basic with a wrong password: the time to the 401 for ``big`` and for a name that does not exist.

The figures are the medians (and 10th and 90th percentiles) over the rounds, known beside unknown.
"""

from __future__ import annotations

import base64
import hashlib
import random
import statistics
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from metaq.bench.report import Report, markdown_table
from metaq.broker.launcher import BrokerLauncher
from metaq.net.blocking import BlockingConnection
from metaq.net.codec import ConnectionSettings
from metaq.protocol import messages as m
from metaq.security.credentials import USERS_FILE_NAME, UsersFile
from metaq.security.scram import ScramClient, make_credential

PASSWORD = "a password"
STEPS = ("sasl known", "sasl unknown", "basic known (big)", "basic unknown")


def _sasl_first_ms(address: tuple[str, int], user: str) -> tuple[float, bytes]:
    """(ms to the answer of SaslAuthenticate's first message, the salt it gives)."""
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


def _sasl_ms(address: tuple[str, int], user: str) -> float:
    return _sasl_first_ms(address, user)[0]


def _basic_ms(url: str, user: str) -> float:
    """ms to the answer of an HTTP request with a wrong password."""
    token = base64.b64encode(f"{user}:wrong password".encode()).decode()
    req = urllib.request.Request(url + "/topics", headers={"Authorization": f"Basic {token}"})
    started = time.perf_counter()
    try:
        urllib.request.urlopen(req, timeout=30).read()
    except urllib.error.HTTPError as exc:
        exc.read()
    return (time.perf_counter() - started) * 1000


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"median": round(statistics.median(values), 3), "p10": round(ordered[len(values) // 10], 3),
            "p90": round(ordered[len(values) * 9 // 10], 3)}


def run(rounds: int, iterations: int, report: Report, work_dir: str | None = None) -> dict[str, Any]:
    times: dict[str, list[float]] = {step: [] for step in STEPS}
    computable = 0
    with tempfile.TemporaryDirectory(prefix="metaq-bench-auth-", dir=work_dir) as tmp:
        data = Path(tmp) / "broker"
        users = UsersFile(data / USERS_FILE_NAME)
        for user, count in (("alice", 4096), ("big", iterations)):
            users.put(user, make_credential(PASSWORD, iterations=count))
        options = {"authRequired": True, "httpPort": 0, "httpBasicAuthOverPlaintext": True}
        with BrokerLauncher(data, options) as broker:
            address = (broker.host, broker.port)
            url = str(broker.http_url)
            for n in range(rounds):
                unknown = f"nobody{n}"
                steps: list[tuple[str, Callable[[], float]]] = [
                    ("sasl known", partial(_sasl_ms, address, "alice")),
                    ("sasl unknown", partial(_sasl_ms, address, unknown)),
                    ("basic known (big)", partial(_basic_ms, url, "big")),
                    ("basic unknown", partial(_basic_ms, url, unknown)),
                ]
                random.shuffle(steps)
                for name, step in steps:
                    times[name].append(step())
                if _sasl_first_ms(address, unknown)[1] == hashlib.sha256(unknown.encode()).digest()[:16]:
                    computable += 1
                if (n + 1) % max(1, rounds // 5) == 0:
                    report(f"round {n + 1}: " + ", ".join(f"{k} {statistics.median(v):.2f} ms"
                                                          for k, v in times.items()))
    return {"rounds": rounds, "iterations": iterations, "ms": {k: _summary(v) for k, v in times.items()},
            "unknown_salts_computable": computable}


def table(result: dict[str, Any]) -> str:
    ms = result["ms"]
    rows = [[what, f"{ms[known]['median']:.2f} (p10 {ms[known]['p10']:.2f}, p90 {ms[known]['p90']:.2f})",
             f"{ms[unknown]['median']:.2f} (p10 {ms[unknown]['p10']:.2f}, p90 {ms[unknown]['p90']:.2f})"]
            for what, known, unknown in (("SASL SCRAM, first message to its answer", "sasl known", "sasl unknown"),
                                         (f"HTTP Basic, a wrong password (known: {result['iterations']} iterations)",
                                          "basic known (big)", "basic unknown"))]
    return (markdown_table(["login", "known user, ms median", "unknown user, ms median"], rows, right=[1, 2])
            + f"\n\nunknown names whose salt is sha256(name)[:16]: {result['unknown_salts_computable']} of "
              f"{result['rounds']}")
