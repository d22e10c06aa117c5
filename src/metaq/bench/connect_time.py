"""`metaq bench connect`: how long opening one connection takes: plaintext (the baseline), TLS, and TLS with
SCRAM-SHA-256, against a running broker that serves both ports.

Each connection is opened (TCP connect, the TLS handshake, ApiVersions, the SASL exchange when a user is given,
its password from METAQ_PASSWORD) and closed, ``count`` times per kind, one after another.
"""

from __future__ import annotations

import os
import time
from typing import Any

from metaq.bench.baselines import percentiles
from metaq.bench.report import Report, markdown_table
from metaq.net.blocking import BlockingConnection
from metaq.net.codec import ConnectionSettings
from metaq.net.servers import parse_servers
from metaq.net.tls import client_context


def run(plain: str, tls: str, ca_file: str, user: str | None, count: int, report: Report) -> dict[str, Any]:
    context = client_context(ca_file)
    kinds = {"plaintext": (plain, ConnectionSettings("bench", 10, 10, 1, 1 << 20)),
             "TLS": (tls, ConnectionSettings("bench", 10, 10, 1, 1 << 20, ssl_context=context))}
    if user:
        kinds["TLS + SCRAM-SHA-256"] = (tls, ConnectionSettings(
            "bench", 10, 10, 1, 1 << 20, ssl_context=context, sasl_username=user,
            sasl_password=os.environ.get("METAQ_PASSWORD", "")))
    runs: dict[str, dict[str, float]] = {}
    for name, (server, settings) in kinds.items():
        address = parse_servers(server)[0]
        times = []
        for _ in range(count):
            started = time.perf_counter()
            BlockingConnection.open(address, settings).close()
            times.append((time.perf_counter() - started) * 1000)
        runs[name] = percentiles(times)
        report(f"{name}: p50 {runs[name]['p50']} ms, p99 {runs[name]['p99']} ms")
    return {"count": count, "connect_ms": runs}


def table(result: dict[str, Any]) -> str:
    return (f"{result['count']} connections of each kind, opened and closed one after another:\n\n"
            + markdown_table(["connection", "p50 ms", "p99 ms"],
                             [[name, p["p50"], p["p99"]] for name, p in result["connect_ms"].items()], right=[1, 2]))
